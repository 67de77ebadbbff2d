"""`make publish` (ghp-import to a gh-pages branch), tested as a dry run in a scratch repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_publish_dry_run_commits_the_site_to_gh_pages_without_pushing(tmp_path):
    repo = tmp_path / "repo"
    site = repo / "_build" / "html"
    (site / "_static").mkdir(parents=True)
    (site / "index.html").write_text("<html><body>The book</body></html>")
    (site / "_static" / "style.css").write_text("body {}")
    _git(repo, "init", "-q", "-b", "main")
    _git(
        repo,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    )
    run = subprocess.run(
        ["make", "-f", str(ROOT / "Makefile"), "publish", "PUSH=", f"BIN={BIN}"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={
            "PATH": f"{BIN}:/usr/bin:/bin",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(tmp_path),
        },
    )
    assert run.returncode == 0, run.stderr
    files = set(_git(repo, "ls-tree", "-r", "--name-only", "gh-pages").split())
    assert files == {".nojekyll", "index.html", "_static/style.css"}
    assert _git(repo, "show", "gh-pages:index.html") == "<html><body>The book</body></html>"
    assert _git(repo, "remote") == ""  # nothing to push to, and nothing was pushed


def test_publish_refuses_without_a_built_site(tmp_path):
    run = subprocess.run(
        ["make", "-f", str(ROOT / "Makefile"), "publish", "PUSH=", f"BIN={BIN}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert "run `make book` first" in run.stderr
