"""Text from bytes and HTML, and language identification: bad input gets a named outcome."""

import pytest

from coursepkg.curation.extract import ExtractionError, decode_bytes, html_to_text, to_text
from coursepkg.curation.language import identify_language

_PAGE = """<!doctype html><html><head><title>t</title><style>p {{color: red}}</style></head>
<body><nav><ul><li><a href="/">Home</a></li><li><a href="/a">About</a></li></ul></nav>
<article><h1>The mill</h1><p>{body}</p><p>A second paragraph follows here.</p></article>
<script>var tracking = 1;</script><footer>Copyright 2026</footer></body></html>"""


def test_the_page_text_is_kept_and_script_and_style_are_not():
    text = html_to_text(_PAGE.format(body="The old mill stands by the river."))
    assert "The old mill stands by the river." in text
    assert "A second paragraph follows here." in text
    assert "tracking" not in text and "color" not in text


@pytest.mark.parametrize(
    "html",
    [
        "<html><body><p>unclosed <div><b>bold</i> words here</p>",
        "<p>Text <<<>>> with stray brackets</p></html></body>",
        "<div><div><div><p>deep text",
    ],
)
def test_malformed_html_still_gives_its_text(html):
    text, _ = to_text(html)
    assert "text" in text.lower() or "words" in text


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        (bytes(range(1, 32)) * 10, "binary"),
        (b"", "empty"),
        (b" \n\t \n", "empty"),
        (b"<html><body><script>x=1</script></body></html>", "empty"),
    ],
)
def test_binary_and_empty_documents_are_refused_with_their_reason(data, reason):
    with pytest.raises(ExtractionError) as err:
        to_text(data)
    assert err.value.reason == reason


def test_mixed_encodings_are_decoded_line_by_line():
    data = "Café au lait\n".encode() + "déjà vu à Noël\n".encode("cp1252")
    text, fallback = decode_bytes(data)
    assert (text, fallback) == ("Café au lait\ndéjà vu à Noël\n", True)
    assert decode_bytes("naïve".encode()) == ("naïve", False)


def test_a_byte_order_mark_is_dropped():
    assert to_text("\ufeffhello there".encode()) == ("hello there", False)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("The weather was cold and the roads were covered in snow for most of the week.", "en"),
        (
            "Le temps était froid et les routes sont restées couvertes de neige toute la semaine.",
            "fr",
        ),
        (
            "Das Wetter war kalt, und die Straßen waren fast die ganze Woche mit Schnee bedeckt.",
            "de",
        ),
        (
            "El tiempo fue frío y las carreteras estuvieron cubiertas de nieve toda la semana.",
            "es",
        ),
    ],
)
def test_languages_are_identified_confidently(text, language):
    found, probability = identify_language(text)
    assert found == language and probability > 0.9


@pytest.mark.parametrize("text", ["", "   \n", "12345 67890 + 42 = 3.14 !!!"])
def test_text_in_no_language_gets_no_confident_language(text):
    found, probability = identify_language(text)
    assert found == "zxx" or probability < 0.5
    assert 0.0 <= probability <= 1.0
