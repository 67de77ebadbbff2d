"""Who a regrade answer is signed by (issue 62, P11): ``coursepkg regrade answer`` signs with
``--by``, else the course's ``c.RegradeNote.answered_by``, else the login, and then says how to
sign otherwise (students once read "Answered by root"). A real gradebook; the commands run
in-process.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import pytest
import real_parts

from coursepkg.cli import main
from coursepkg.grading.policy.regrade import requests

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
AID, PART = "ex01_attention", "written_sqrt_dk"


def _coursepkg(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(args)) == 0
    return out.getvalue()


@pytest.mark.parametrize(
    ("setting", "by", "signed"),
    [
        ('c.RegradeNote.answered_by = "Dr. Turing"\n', None, "Dr. Turing"),
        ('c.RegradeNote.answered_by = "Dr. Turing"\n', "TA Ada", "TA Ada"),
        ("", None, "login"),
    ],
)
@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_an_answer_is_signed_with_the_courses_name(tmp_path, monkeypatch, setting, by, signed):
    from nbgrader.api import Gradebook

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # alembic
    monkeypatch.setenv("USER", "root")
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8") + setting
    (tmp_path / "nbgrader_config.py").write_text(config, encoding="utf-8")
    url = real_parts.new_sqlite_gradebook(tmp_path / "gradebook.db")
    with Gradebook(url, "transformers") as gb:
        gb.update_or_create_assignment(AID)
        gb.update_or_create_notebook(AID, AID)
        gb.update_or_create_grade_cell(PART, AID, AID, max_score=2.0, cell_type="markdown")
        gb.update_or_create_student("bob")
        gb.update_or_create_submission(AID, "bob")
    request = tmp_path / "request.json"
    root = ("--root", str(tmp_path))
    _coursepkg(
        "regrade",
        "request",
        AID,
        PART,
        "--student",
        "bob",
        "--reason",
        "Please.",
        "--output",
        str(request),
    )
    _coursepkg("regrade", "add", str(request), *root)
    said = _coursepkg(
        "regrade",
        "answer",
        "1",
        "--score",
        "2",
        "--why",
        "Yes.",
        *(("--by", by) if by else ()),
        *root,
    )
    who = "root" if signed == "login" else signed
    assert f"answered request 1 as {who!r}" in said
    assert ("c.RegradeNote.answered_by" in said) == (signed == "login")  # how to sign otherwise
    (found,) = requests(f"sqlite:///{tmp_path / 'gradebook.db'}", AID, "bob")
    assert found.log[-1]["who"] == who
