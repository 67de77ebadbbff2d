"""The console of ``coursepkg grade``: the progress bar, the summary and coursepkg's own
warnings for the instructor; everything else the grading prints (Dask's workers, nbgrader,
SQLAlchemy, the kernels) in the grader's log, ``reports/<assignment>/grade.log``."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["quiet_console"]


@contextlib.contextmanager
def quiet_console(log: Path | None) -> Iterator[TextIO]:
    """The console while grading: the stream for the progress bar and coursepkg's own warnings.

    With ``log``, everything else written to stderr (Dask's workers, nbgrader, SQLAlchemy,
    the kernels, any process started meanwhile, all of which inherit the file descriptor) goes
    to that file instead, with the grader's INFO messages; without it (``-v``), all of it
    shows on the console as it comes.

    Args:
        log: the grader's log file (appended to), or None to keep stderr as it is.

    Yields:
        The console's stream (the terminal's stderr as it was before).
    """
    root = logging.getLogger()
    if log is None:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
        yield sys.stderr
        return
    made = [d for d in (log.parent, *log.parent.parents) if not d.exists()]  # outermost last
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)
    with log.open("a", encoding="utf-8") as file:
        os.dup2(file.fileno(), 2)  # for this process and every process it starts
        kept = logging.StreamHandler(file)  # everything at INFO and above, into the log
        kept.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        shown = logging.StreamHandler(console)  # coursepkg's warnings, for the instructor
        shown.setLevel(logging.WARNING)
        shown.setFormatter(logging.Formatter("coursepkg grade: %(message)s"))
        shown.addFilter(logging.Filter("coursepkg"))
        level = root.level
        root.setLevel(logging.INFO)
        root.addHandler(kept)
        root.addHandler(shown)
        try:
            yield console
        except Exception:
            if made and [p for p in made[-1].rglob("*") if p.is_file()] == [log]:
                _forget(made, log)  # stopped before any work: the course folder stays as it was
            raise
        finally:
            sys.stderr.flush()
            for handler in (kept, shown):
                root.removeHandler(handler)
            root.setLevel(level)
            os.dup2(console.fileno(), 2)
            console.close()


def _forget(made: list[Path], log: Path) -> None:
    """Remove ``log`` and the folders ``made`` for it (innermost first), when nothing else
    was written there: an error before any grading leaves no trace in the course folder."""
    log.unlink(missing_ok=True)
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()
