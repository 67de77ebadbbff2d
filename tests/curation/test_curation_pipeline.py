"""The pipeline and ``coursepkg curate`` on a small corpus of every kind of input: each document
ends kept or counted under the stage that removed it, never an exception."""

import json

import pytest

from coursepkg.cli import main
from coursepkg.curation import curate, read_documents
from coursepkg.curation.pii import EMAIL_TOKEN
from coursepkg.curation.quality import load_quality_examples

_BANNER = "Accept all cookies | Manage settings"


def _corpus() -> dict[str, bytes]:
    texts, labels = load_quality_examples()
    good = [t for t, y in zip(texts, labels, strict=True) if y == 1]
    story = [f"{good[i]}\n{good[i + 1]}" for i in range(0, 10, 2)]  # five documents, 70+ words
    edited = story[0].replace("forty miles", "fifty miles")
    return {
        "a.html": (f"<html><body><div>{_BANNER}</div><p>{story[0]}</p></body></html>".encode()),
        "b.txt": f"{_BANNER}\n{story[1]}\nWrite to ann.lee@example.org.".encode(),
        "c.htm": f"<div>{_BANNER}</div><p>{story[2]}<div><b>unclosed </i> words".encode(),
        "d.txt": story[3].encode() + "\nCaf\xe9 cr\xe8me.\n".encode("cp1252"),
        "e.txt": story[4].encode(),
        "f_copy.html": f"<html><p>{edited}</p></html>".encode(),
        "g_fr.txt": (
            "Le village se trouve au bord de la rivière, et les enfants vont à l'école à pied "
            "chaque matin. " * 6
        ).encode(),
        "h_spam.txt": "\n".join(["Click here to read more about the best deals..."] * 12).encode(),
        "h_seo.txt": ("cheap flights and cheap hotels, best price, book now. " * 20).encode(),
        "i.bin": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)),
        "j_empty.txt": b"",
        "k_menu.txt": "\n".join(["Home", "About", "Contact"] * 20).encode(),
    }


def test_every_document_is_kept_or_counted_under_its_stage():
    result = curate(sorted(_corpus().items()))
    kept = dict(result.kept)
    assert sorted(kept) == ["a.html", "b.txt", "c.htm", "d.txt", "e.txt"]
    assert result.documents_in == 12
    assert dict(result.removed) == {
        "binary": 1,
        "empty": 1,
        "language": 2,  # the French page, and the menu (English, but not confidently)
        "gopher": 1,  # the lines that end in an ellipsis
        "quality": 1,  # the SEO text, which passes every Gopher rule
        "near_duplicate": 1,
    }
    assert result.details["mixed_encoding"] == 1 and "Café crème." in kept["d.txt"]
    assert result.details["masked:email"] == 1 and EMAIL_TOKEN in kept["b.txt"]
    assert result.details["lines_removed"] == 3  # the banner, in three documents
    assert all(_BANNER not in text for text in kept.values())
    assert "unclosed" in kept["c.htm"]


def test_an_empty_corpus_gives_an_empty_result():
    result = curate([])
    assert result.kept == [] and result.documents_in == 0 and sum(result.removed.values()) == 0


def test_the_command_writes_the_kept_documents_and_the_summary(tmp_path, capsys):
    source = tmp_path / "in"
    (source / "site").mkdir(parents=True)
    for name, data in _corpus().items():
        (source / "site" / name).write_bytes(data)
    out = tmp_path / "out"
    assert main(["curate", str(source), str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["documents_in"] == 12 and summary["documents_kept"] == 5
    assert summary["removed"]["near_duplicate"] == 1
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt"))
    assert written == [f"site/{n}.txt" for n in ["a.html", "b.txt", "c.htm", "d.txt", "e.txt"]]
    printed = capsys.readouterr().out
    assert "removed by binary: 1" in printed and "documents kept: 5" in printed
    assert len(list(read_documents(source))) == 12


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--min-quality", "1.5"], "--min-quality must be in [0, 1], got 1.5"),
        (["--dedup-threshold", "-1"], "--dedup-threshold must be in [0, 1]"),
    ],
)
def test_the_command_refuses_bad_settings_by_name(tmp_path, capsys, argv, message):
    (tmp_path / "in.txt").write_text("hello")
    assert main(["curate", str(tmp_path / "in.txt"), str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_command_refuses_a_missing_input(tmp_path, capsys):
    assert main(["curate", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "input: no file or folder" in capsys.readouterr().err
