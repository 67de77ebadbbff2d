"""``jupyter-book build`` with the pages read, and so executed, by several processes.

Jupyter Book 1.x builds through Sphinx but its command line has no ``-j``: every page is executed
one after another, though a page mostly keeps one core busy. This runs the same command with
Sphinx's parallel reading (``BOOK_JOBS`` processes, default 2); the arguments are
``jupyter-book``'s own (``make book`` passes ``build . -W -n --keep-going``). The extension
``book/_ext/parallel_pages.py`` says why the three extensions that declare nothing are safe.

At the end it prints each page executed by this build (its cold time, as the book's execution
watchdog records it: ``book/_ext/execution_watchdog.py`` appends a line to
``_build/page_runs.jsonl`` for each page it executes, in whichever reader process) with the
machine factor while it ran (``tests/fixtures/processes.py``, sampled every 30 s by a process of
its own), and writes them to ``_build/page_times.json``, which ``tests/book/test_page_budget.py``
holds to ``tests/budget.toml``.

Usage: ``python scripts/build_book.py build . -W -n --keep-going``
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _book() -> Path:
    """The book's folder: ``build PATH``'s path (``make book``: ``.``, the repository)."""
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    return (Path.cwd() / args[1]).resolve() if args[:1] == ["build"] and len(args) > 1 else ROOT


BOOK = _book()
RUNS = BOOK / "_build" / "page_runs.jsonl"
TIMES = BOOK / "_build" / "page_times.json"
SAMPLES = BOOK / "_build" / "machine_factor.txt"


def jobs() -> int:
    """The number of reader processes: ``BOOK_JOBS``, a whole number >= 1 (default 2)."""
    value = os.environ.get("BOOK_JOBS", "2")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"build_book: BOOK_JOBS must be a whole number >= 1, got {value!r}")
    return int(value)


def page_times(samples: list[tuple[float, float]]) -> dict[str, dict]:
    """Each page this build executed (:data:`RUNS`, emptied when the build starts): its cold
    seconds (the attempt that counted: an attempt the watchdog gave up, a stall or a kernel that
    never answered, is not the page's cost), the mean machine factor sampled while it ran (1
    without samples) and, where there were any, the attempts given up (``given_up``: seconds
    and why)."""
    if not RUNS.is_file():
        return {}
    pages = {}
    for line in RUNS.read_text(encoding="utf-8").splitlines():
        run = json.loads(line)
        total, end, given_up = run["seconds"], run["end"], run.get("given_up", [])
        seconds = max(0.0, total - sum(attempt["seconds"] for attempt in given_up))
        during = [f for t, f in samples if end - seconds - 30 <= t <= end + 30]
        page = Path(run["page"])
        name = page.relative_to(BOOK).as_posix() if page.is_relative_to(BOOK) else str(page)
        factor = sum(during) / len(during) if during else 1.0
        pages[name] = {"seconds": round(seconds, 1), "factor": round(max(1.0, factor), 2)}
        if given_up:
            pages[name]["given_up"] = given_up
    return pages


def _samples() -> list[tuple[float, float]]:
    if not SAMPLES.is_file():
        return []
    rows = (line.split() for line in SAMPLES.read_text().splitlines())
    return [(float(t), float(f)) for t, f in (r for r in rows if len(r) == 2)]


def report() -> None:
    """Print the pages this build executed, slowest first, and write :data:`TIMES`."""
    pages = page_times(_samples())
    if not pages:
        print("build_book: no page was executed (all from the cache)")
        return
    TIMES.write_text(json.dumps({"pages": pages}, indent=1), encoding="utf-8")
    print(f"build_book: cold time of each page this build executed ({TIMES}):")
    for name, row in sorted(pages.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"  {row['seconds']:7.1f} s  {name}  (machine factor {row['factor']:.1f})")
    for name, row in pages.items():
        for attempt in row.get("given_up", []):
            seconds, why = attempt["seconds"], attempt["why"]
            print(f"build_book: {name}: gave up an attempt of {seconds:.1f} s ({why})")


def main() -> int:
    from jupyter_book import sphinx as jb_sphinx
    from jupyter_book.cli import main as cli

    # The command imports `build_sphinx` from its module when it runs: give that module the same
    # function with `jobs` set.
    jb_sphinx.build_sphinx = functools.partial(jb_sphinx.build_sphinx, jobs=jobs())
    SAMPLES.parent.mkdir(parents=True, exist_ok=True)
    SAMPLES.unlink(missing_ok=True)
    RUNS.unlink(missing_ok=True)
    os.environ["COURSEPKG_BOOK_PAGE_RUNS"] = str(RUNS)  # read by book/_ext/execution_watchdog.py
    sampler = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "fixtures" / "processes.py"),
            "--sample",
            str(SAMPLES),
            "30",
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        cli.main(standalone_mode=False)
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    finally:
        sampler.terminate()
        sampler.wait()
    report()
    return status


if __name__ == "__main__":
    sys.exit(main())
