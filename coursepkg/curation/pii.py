"""Masking personal information: e-mail addresses, phone numbers and IPv4 addresses.

Each mask is one regular expression and one call of :func:`re.subn`, so that a reader sees the
whole rule: what it matches, and what it must leave alone (a date such as 2026-11-29 is not a
phone number; 256.1.1.1 is not an address). Every function returns the masked text and how many
spans it replaced, which the curation summary counts.
"""

from __future__ import annotations

import re

__all__ = [
    "EMAIL_TOKEN",
    "IP_TOKEN",
    "PHONE_TOKEN",
    "mask_emails",
    "mask_ipv4",
    "mask_phone_numbers",
    "mask_pii",
]

EMAIL_TOKEN = "|||EMAIL_ADDRESS|||"
PHONE_TOKEN = "|||PHONE_NUMBER|||"
IP_TOKEN = "|||IP_ADDRESS|||"

# local part @ domain labels . top-level domain of two letters or more
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")

# North American numbers: an optional +1, a 3-digit area code (bare or in brackets), then 3 and 4
# digits, separated by nothing, a space, a dot or a hyphen. Digits or hyphens on either side
# mean a longer number or a date (2026-11-29 has groups of 4, 2, 2 and never matches).
_PHONE = re.compile(
    r"(?<![\w+-])"
    r"(?:\+?1[ .-]?)?"
    r"(?:\(\d{3}\) ?|\d{3}[ .-]?)"
    r"\d{3}[ .-]?\d{4}"
    r"(?![\w-])"
)

# one octet: 250-255, 200-249, 100-199, 10-99 or 0-9 (no leading zero)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# four octets, not part of a longer dotted run of digits (a version 1.2.3.4.5, 1.2.3.4567)
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)")


def mask_emails(text: str) -> tuple[str, int]:
    """Replace every e-mail address with :data:`EMAIL_TOKEN`.

    Args:
        text: any text.

    Returns:
        The masked text and the number of addresses replaced.
    """
    return _EMAIL.subn(EMAIL_TOKEN, text)


def mask_phone_numbers(text: str) -> tuple[str, int]:
    """Replace every (North American) phone number with :data:`PHONE_TOKEN`.

    ``(555) 123-4567``, ``555-123-4567``, ``555.123.4567``, ``5551234567`` and ``+1 555 123 4567``
    are phone numbers; dates (``2026-11-29``, ``29/11/2026``) and longer digit runs are not.

    Args:
        text: any text.

    Returns:
        The masked text and the number of phone numbers replaced.
    """
    return _PHONE.subn(PHONE_TOKEN, text)


def mask_ipv4(text: str) -> tuple[str, int]:
    """Replace every IPv4 address (four octets 0-255) with :data:`IP_TOKEN`.

    Args:
        text: any text.

    Returns:
        The masked text and the number of addresses replaced.
    """
    return _IPV4.subn(IP_TOKEN, text)


def mask_pii(text: str) -> tuple[str, dict[str, int]]:
    """Apply the three masks in turn: e-mail addresses first (their digits are not phone numbers).

    Args:
        text: any text.

    Returns:
        The masked text and the count of each kind replaced (``email``, ``phone``, ``ip``).
    """
    text, emails = mask_emails(text)
    text, ips = mask_ipv4(text)
    text, phones = mask_phone_numbers(text)
    return text, {"email": emails, "phone": phones, "ip": ips}
