"""The curation pipeline: documents in, the kept text out, with a count of what each filter removed.

The order is the usual one, cheapest first: text from bytes and HTML, language, the Gopher rules,
the quality classifier, the PII masks (which change text but remove nothing), then the two steps
that need the whole corpus: near-duplicate documents (each group's first is kept), then lines
repeated across the documents left (boilerplate). A document that cannot be
read (binary, empty, broken) is skipped and counted under its reason, never an exception.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from .dedup import exact_line_dedup, near_duplicate_clusters
from .extract import ExtractionError, to_text
from .gopher import gopher_failures
from .language import identify_language
from .pii import mask_pii
from .quality import default_quality_classifier

__all__ = ["CurationResult", "curate", "read_documents"]

log = logging.getLogger(__name__)

#: The reasons a document is removed, in pipeline order (the summary's rows).
STAGES = (
    "binary",
    "empty",
    "unreadable",
    "language",
    "gopher",
    "quality",
    "near_duplicate",
    "empty_after_line_dedup",
)


@dataclass
class CurationResult:
    """What :func:`curate` kept and why it removed the rest.

    Attributes:
        kept: (name, text) of each kept document, in input order.
        removed: documents removed, by stage (:data:`STAGES`).
        details: further counts: ``mixed_encoding`` (decoded by the fallback), ``gopher:<rule>``
            for each rule broken, ``masked:<kind>`` for each PII span, ``lines_removed``.
        documents_in: how many documents came in.
    """

    kept: list[tuple[str, str]]
    removed: Counter = field(default_factory=Counter)
    details: Counter = field(default_factory=Counter)
    documents_in: int = 0

    def summary(self) -> list[str]:
        """One line per stage and per detail, for a person to read."""
        lines = [f"documents in: {self.documents_in}"]
        lines += [f"removed by {stage}: {self.removed[stage]}" for stage in STAGES]
        lines += [f"{name}: {count}" for name, count in sorted(self.details.items())]
        lines.append(f"documents kept: {len(self.kept)}")
        return lines


def read_documents(path: str | Path) -> Iterator[tuple[str, bytes]]:
    """The files under ``path`` (or the file itself), as (name relative to ``path``, bytes).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no file or folder at {path}")
    if path.is_file():
        yield path.name, path.read_bytes()
        return
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        yield str(file.relative_to(path)), file.read_bytes()


def _filter_one(text: str, language: str, min_language_prob: float, min_quality: float | None):
    """The first filter ``text`` fails (a stage name) and the Gopher rules it breaks."""
    found, probability = identify_language(text)
    if found != language or probability < min_language_prob:
        return "language", []
    failures = gopher_failures(text)
    if failures:
        return "gopher", failures
    if min_quality is not None and default_quality_classifier().probability(text) < min_quality:
        return "quality", []
    return None, []


def curate(
    documents: Iterable[tuple[str, bytes | str]],
    *,
    language: str = "en",
    min_language_prob: float = 0.5,
    min_quality: float | None = 0.5,
    dedup_threshold: float = 0.8,
    line_min_chars: int = 0,
    progress: bool = False,
) -> CurationResult:
    """Filter, mask and deduplicate a corpus.

    Args:
        documents: (name, content) pairs; content is a file's bytes or a string, text or HTML.
        language: the ISO 639-1 code to keep.
        min_language_prob: the language identifier's least probability for ``language``.
        min_quality: the quality classifier's least probability of good text; None skips it.
        dedup_threshold: the n-gram Jaccard similarity from which documents are near-duplicates.
        line_min_chars: repeated lines shorter than this are kept (:func:`exact_line_dedup`).
        progress: show a progress bar over the documents.

    Returns:
        The kept documents and the counts of what was removed (:class:`CurationResult`).
    """
    result = CurationResult(kept=[])
    names, texts = [], []
    for name, content in tqdm(documents, desc="curate", unit="doc", disable=not progress):
        result.documents_in += 1
        try:
            text, fallback = to_text(content)
        except ExtractionError as err:
            result.removed[err.reason] += 1
            continue
        except Exception as err:  # a third-party parser's failure on one hostile file
            log.warning("skipping %s: %s", name, err)
            result.removed["unreadable"] += 1
            continue
        result.details["mixed_encoding"] += fallback
        stage, failures = _filter_one(text, language, min_language_prob, min_quality)
        result.details.update(f"gopher:{rule}" for rule in failures)
        if stage is not None:
            result.removed[stage] += 1
            continue
        text, masked = mask_pii(text)
        result.details.update({f"masked:{kind}": n for kind, n in masked.items()})
        names.append(name)
        texts.append(text)
    clusters = near_duplicate_clusters(texts, threshold=dedup_threshold)
    duplicates = {i for cluster in clusters for i in cluster[1:]}  # keep each cluster's first
    result.removed["near_duplicate"] = len(duplicates)
    names = [name for i, name in enumerate(names) if i not in duplicates]
    texts = [text for i, text in enumerate(texts) if i not in duplicates]
    texts, result.details["lines_removed"] = exact_line_dedup(texts, min_chars=line_min_chars)
    result.kept = [(n, t.strip()) for n, t in zip(names, texts, strict=True) if t.strip()]
    result.removed["empty_after_line_dedup"] = len(texts) - len(result.kept)
    result.removed = Counter({k: v for k, v in result.removed.items() if v})
    result.details = Counter({k: v for k, v in result.details.items() if v})
    return result
