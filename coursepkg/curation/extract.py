"""From raw bytes to text: refusing binary files, decoding mixed encodings, extracting HTML's text.

Web pages arrive as bytes in whatever encoding their server used, sometimes several in one page
(a UTF-8 template around text pasted from Windows-1252). The decoding here is plain: the whole
file as UTF-8 when it is valid, otherwise line by line, each line as UTF-8 or else as
Windows-1252. Text is taken out of HTML by Resiliparse (``resiliparse.extract.html2text``), a
well-kept extractor that parses malformed markup as a browser would and can drop the page's
menus and footers (``main_content``).
"""

from __future__ import annotations

import re

__all__ = ["ExtractionError", "decode_bytes", "html_to_text", "looks_like_html", "to_text"]

_HTML = re.compile(r"<\s*(?:!doctype|html|head|body|p|div|span|a|br|table|ul|li|h[1-6])\b", re.I)
_CONTROL = frozenset(range(32)) - {9, 10, 12, 13}  # control bytes that text never holds


class ExtractionError(ValueError):
    """A document that yields no text; ``reason`` names why (``binary``, ``empty``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def decode_bytes(data: bytes) -> tuple[str, bool]:
    """Decode a file's bytes, refusing binary data.

    Args:
        data: the file's content.

    Returns:
        The text and whether it needed the fallback (some lines not UTF-8: mixed encodings).

    Raises:
        ExtractionError: ``binary`` when the bytes hold a NUL or more than 5% control bytes.
    """
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    head = data[:65536]
    if b"\x00" in head or sum(byte in _CONTROL for byte in head) > 0.05 * max(len(head), 1):
        raise ExtractionError("binary", "binary data (NUL or control bytes), not text")
    try:
        return data.decode("utf-8-sig"), False
    except UnicodeDecodeError:
        pass
    lines = []
    for line in data.splitlines(keepends=True):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(line.decode("cp1252", errors="replace"))
    return "".join(lines), True


def looks_like_html(text: str) -> bool:
    """True when the text holds an HTML tag of the common kinds (a doctype, html, p, div, ...)."""
    return bool(_HTML.search(text[:4096]))


def html_to_text(html: str, *, main_content: bool = True) -> str:
    """The readable text of an HTML page, by Resiliparse.

    Args:
        html: the page (malformed markup is fine).
        main_content: drop what looks like navigation, headers and footers.

    Returns:
        The text, one block per line, stripped; empty when the page has none.
    """
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=main_content, alt_texts=False).strip()


def to_text(data: bytes | str) -> tuple[str, bool]:
    """A document's text, whatever it arrived as: bytes are decoded, HTML is extracted.

    Args:
        data: a file's bytes or a string.

    Returns:
        The text and whether decoding needed the fallback (mixed encodings).

    Raises:
        ExtractionError: ``binary`` for binary data, ``empty`` when no text is left.
    """
    fallback = False
    text = data
    if isinstance(data, bytes | bytearray):
        text, fallback = decode_bytes(data)
    elif not isinstance(data, str):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    if looks_like_html(text):
        text = html_to_text(text)
    if not text.strip():
        raise ExtractionError("empty", "the document holds no text")
    return text.strip(), fallback
