"""The PII masks on generated held-out inputs: what they must mask and what they must leave."""

from hypothesis import given, settings
from hypothesis import strategies as st

from coursepkg.curation.pii import (
    EMAIL_TOKEN,
    IP_TOKEN,
    PHONE_TOKEN,
    mask_emails,
    mask_ipv4,
    mask_phone_numbers,
    mask_pii,
)

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8)
_prose = st.lists(_word, min_size=1, max_size=6).map(" ".join)
_emails = st.builds(
    lambda user, sep, rest, domain, tld: f"{user}{sep}{rest}@{domain}.{tld}",
    _word,
    st.sampled_from([".", "_", "+", "-", ""]),
    _word,
    _word,
    st.sampled_from(["com", "org", "co.uk", "info"]),
)
_d = st.integers(0, 9).map(str)
_phones = st.builds(
    lambda area, mid, end, form: form.format(area, mid, end),
    st.integers(200, 999),
    st.integers(200, 999),
    st.integers(0, 9999).map("{:04d}".format),
    st.sampled_from(["({}) {}-{}", "{}-{}-{}", "{}.{}.{}", "{}{}{}", "+1 {} {} {}", "1-{}-{}-{}"]),
)
_dates = st.builds(
    lambda y, m, d, form: form.format(y=y, m=m, d=d),
    st.integers(1900, 2099),
    st.integers(1, 12).map("{:02d}".format),
    st.integers(1, 28).map("{:02d}".format),
    st.sampled_from(["{y}-{m}-{d}", "{d}/{m}/{y}", "{m}/{d}/{y}", "{d}.{m}.{y}", "{y}{m}{d}"]),
)
_octet = st.integers(0, 255).map(str)
_ips = st.lists(_octet, min_size=4, max_size=4).map(".".join)


@settings(max_examples=60, deadline=None)
@given(_prose, _emails, _prose)
def test_every_email_is_masked_and_the_prose_kept(before, email, after):
    masked, count = mask_emails(f"{before} {email} {after}")
    assert (masked, count) == (f"{before} {EMAIL_TOKEN} {after}", 1)


@settings(max_examples=60, deadline=None)
@given(_prose, _phones, _prose)
def test_every_phone_format_is_masked(before, phone, after):
    masked, count = mask_phone_numbers(f"{before} {phone}, {after}")
    assert (masked, count) == (f"{before} {PHONE_TOKEN}, {after}", 1)


@settings(max_examples=60, deadline=None)
@given(_prose, _dates)
def test_dates_are_not_phone_numbers(before, date):
    text = f"{before} on {date}."
    assert mask_phone_numbers(text) == (text, 0)


@settings(max_examples=60, deadline=None)
@given(_prose, _ips)
def test_every_ipv4_address_is_masked_even_before_a_full_stop(before, ip):
    masked, count = mask_ipv4(f"{before} {ip}.")
    assert (masked, count) == (f"{before} {IP_TOKEN}.", 1)


@settings(max_examples=40, deadline=None)
@given(st.integers(256, 999), st.lists(_octet, min_size=3, max_size=3))
def test_an_octet_above_255_or_a_fifth_part_is_no_address(big, rest):
    assert mask_ipv4(f"to {big}.{'.'.join(rest)} now")[1] == 0
    assert mask_ipv4(f"version {'.'.join(rest)}.1.2 now")[1] == 0


@settings(max_examples=40, deadline=None)
@given(_prose)
def test_text_without_pii_is_unchanged(text):
    assert mask_pii(text) == (text, {"email": 0, "phone": 0, "ip": 0})


def test_the_masks_together_count_each_kind():
    text = "Mail ann.lee@example.org from 192.168.0.12 or call (555) 201-3344 by 2026-11-29."
    masked, counts = mask_pii(text)
    assert counts == {"email": 1, "phone": 1, "ip": 1}
    assert masked == (f"Mail {EMAIL_TOKEN} from {IP_TOKEN} or call {PHONE_TOKEN} by 2026-11-29.")
