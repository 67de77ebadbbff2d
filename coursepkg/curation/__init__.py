"""Data curation: from raw web pages to text worth training on.

Each step is its own small module, written to be read: :mod:`~coursepkg.curation.extract` (bytes
and HTML to text), :mod:`~coursepkg.curation.language` (language identification),
:mod:`~coursepkg.curation.pii` (masking e-mail addresses, phone numbers, IPv4 addresses),
:mod:`~coursepkg.curation.gopher` (the Gopher quality rules), :mod:`~coursepkg.curation.quality`
(a small quality classifier trained on shipped examples), :mod:`~coursepkg.curation.dedup` (exact
line deduplication, MinHash with LSH banding) and :mod:`~coursepkg.curation.pipeline`, which runs
them in order and counts what each removed (``coursepkg curate IN OUT``).
"""

from .dedup import MinHasher, band_keys, exact_line_dedup, near_duplicate_clusters, shingles
from .extract import ExtractionError, html_to_text, to_text
from .gopher import gopher_failures
from .language import identify_language
from .pii import mask_emails, mask_ipv4, mask_phone_numbers, mask_pii
from .pipeline import CurationResult, curate, read_documents
from .quality import QualityClassifier, default_quality_classifier

__all__ = [
    "CurationResult",
    "ExtractionError",
    "MinHasher",
    "QualityClassifier",
    "band_keys",
    "curate",
    "default_quality_classifier",
    "exact_line_dedup",
    "gopher_failures",
    "html_to_text",
    "identify_language",
    "mask_emails",
    "mask_ipv4",
    "mask_phone_numbers",
    "mask_pii",
    "near_duplicate_clusters",
    "read_documents",
    "shingles",
    "to_text",
]
