"""``make book``'s parallel build (``scripts/build_book.py`` with ``book/_ext/parallel_pages.py``):
a small Jupyter Book with the course's extensions, built as ``make book`` builds (warnings as
errors), has its pages executed by two processes, numbered like a serial build, each page's
cold time printed and recorded (``_build/page_times.json``), and a bad
``BOOK_JOBS`` is refused naming the variable."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import processes
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGES = 6  # Sphinx reads in parallel only when more than five documents are new

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _book(where: Path) -> Path:
    """A numbered book of ``PAGES`` pages, each printing the process id that executes it."""
    (where / "book" / "_ext").mkdir(parents=True)
    for name in ("parallel_pages.py", "offline_book.py", "execution_watchdog.py"):
        shutil.copy(ROOT / "book" / "_ext" / name, where / "book" / "_ext" / name)
    shutil.copytree(ROOT / "book" / "_static", where / "book" / "_static")  # offline_book's CSS
    (where / "book" / "index.md").write_text("# A small book\n\nIts pages follow.\n")
    for i in range(1, PAGES + 1):
        (where / "book" / f"page{i}.md").write_text(
            "---\njupytext:\n  text_representation:\n    format_name: myst\n"
            "kernelspec:\n  name: python3\n  display_name: Python 3\n---\n"
            f"# Page {i}\n\n```{{code-cell}} ipython3\nimport os\n\n"
            f"print('page {i} read by process', os.getppid())\n```\n"
        )
    chapters = "".join(f"      - file: book/page{i}\n" for i in range(1, PAGES + 1))
    (where / "_toc.yml").write_text(
        "format: jb-book\nroot: book/index\nparts:\n  - caption: Pages\n"
        f"    numbered: true\n    chapters:\n{chapters}"
    )
    (where / "_config.yml").write_text(
        "title: A small book\nonly_build_toc_files: true\n"
        "execute:\n  execute_notebooks: cache\n  timeout: 300\n"
        "sphinx:\n  local_extensions:\n    offline_book: book/_ext\n"
        "    execution_watchdog: book/_ext\n    parallel_pages: book/_ext\n"
        "  extra_extensions:\n    - sphinx-mathjax-offline\n"
    )
    return where


def _build(where: Path, jobs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BOOK_JOBS": jobs, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return processes.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "build_book.py"),
            "build",
            ".",
            "-W",
            "-n",
            "--keep-going",
        ],
        cwd=where,
        env=env,
        idle=540,
    )


def _readers(where: Path) -> dict[int, str]:
    """Each page's reader process (the kernel's parent), from the built HTML."""
    found = {}
    for i in range(1, PAGES + 1):
        html = (where / "_build" / "html" / "book" / f"page{i}.html").read_text()
        found[i] = re.search(rf"page {i} read by process (\d+)", html).group(1)
    return found


def test_two_jobs_execute_the_pages_in_two_processes_with_warnings_as_errors(tmp_path):
    book = _book(tmp_path)
    run = _build(book, "2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "doing serial read" not in run.stdout + run.stderr
    readers = _readers(book)
    assert len(set(readers.values())) >= 2, readers  # Sphinx forks one reader per chunk
    # Numbered as a serial build numbers them: every page's table of contents says "j. Page j".
    for i in range(1, PAGES + 1):
        html = (book / "_build" / "html" / "book" / f"page{i}.html").read_text()
        for j in range(1, PAGES + 1):
            assert f">{j}. Page {j}<" in html, f"page{i}'s contents do not number page {j} as {j}"
    # Each page's cold time, printed and recorded for tests/book/test_page_budget.py.
    times = json.loads((book / "_build" / "page_times.json").read_text())["pages"]
    expected = sorted(f"book/page{i}.md" for i in range(1, PAGES + 1))
    assert sorted(times) == expected, (times, run.stdout[-3000:], run.stderr[-3000:])
    assert all(t["seconds"] > 0 and t["factor"] >= 1 for t in times.values()), times
    assert "cold time of each page this build executed" in run.stdout, run.stdout[-3000:]
    assert all(f"book/page{i}.md" in run.stdout for i in range(1, PAGES + 1)), run.stdout[-3000:]


def test_a_bad_job_count_is_refused_naming_the_variable(tmp_path):
    run = _build(tmp_path, "two")
    assert run.returncode != 0
    assert "BOOK_JOBS must be a whole number >= 1, got 'two'" in run.stderr
