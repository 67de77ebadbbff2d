"""``jupyter-book build`` with the pages read, and so executed, by several processes.

Jupyter Book 1.x builds through Sphinx but its command line has no ``-j``: every page is executed
one after another, though a page mostly keeps one core busy. This runs the same command with
Sphinx's parallel reading (``BOOK_JOBS`` processes, default 2); the arguments are
``jupyter-book``'s own (``make book`` passes ``build . -W -n --keep-going``). The extension
``book/_ext/parallel_pages.py`` says why the three extensions that declare nothing are safe.

Usage: ``python scripts/build_book.py build . -W -n --keep-going``
"""

from __future__ import annotations

import functools
import os
import sys

from jupyter_book import sphinx as jb_sphinx
from jupyter_book.cli import main as cli


def jobs() -> int:
    """The number of reader processes: ``BOOK_JOBS``, a whole number >= 1 (default 2)."""
    value = os.environ.get("BOOK_JOBS", "2")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"build_book: BOOK_JOBS must be a whole number >= 1, got {value!r}")
    return int(value)


if __name__ == "__main__":
    # The command imports `build_sphinx` from its module when it runs: give that module the same
    # function with `jobs` set.
    jb_sphinx.build_sphinx = functools.partial(jb_sphinx.build_sphinx, jobs=jobs())
    sys.exit(cli.main())
