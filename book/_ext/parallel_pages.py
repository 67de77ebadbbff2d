"""A local Sphinx extension that lets the book's pages be read, and so executed, in parallel.

``make book`` runs Jupyter Book with ``BOOK_JOBS`` reader processes (``scripts/build_book.py``;
Jupyter Book 1.x's command line has no ``-j``). Sphinx reads in parallel only when every loaded
extension declares that it may; three extensions Jupyter Book 1.x loads declare nothing, so Sphinx
would warn (an error under ``-W``) and read serially. None of them keeps state a reader process
would have to share, so they are declared safe here, where the reason is written down:

* ``sphinx_multitoc_numbering`` replaces ``TocTreeCollector.assign_section_numbers``, which Sphinx
  calls in the main process after it has merged the readers' environments;
* ``sphinx-mathjax-offline`` copies MathJax into the site at ``build-finished`` (main process);
* ``sphinx_jupyterbook_latex`` sets LaTeX options at ``config-inited``, and its transforms change
  only the document being read (and do their real work for LaTeX builders only).

The readers share jupyter-cache's database of executed pages. On a first build it does not exist
yet, and two readers creating it at once collide ("table settings already exists"), so it is
created here, in the main process, before they start.

Sphinx hands its readers chunks of consecutive names (``make_chunks``), which put chapters 11-20,
the GPT's training among them, in one process and the cheap first chapters in the other: the
book took as long as that one reader. :func:`book_chunks` replaces it for this book (the one
place Sphinx's chunking is changed): the pages linked by a saved run (:data:`REUSES`: chapter 9
loads chapter 8's models, chapters 13 and 18 the GPT of chapter 12, chapter 18 the modern decoder
of chapter 16) form one chunk, the run's maker first, so a reader never trains a run another is
training; every other page is a chunk of its own. The groups go first, the longest first, and
each reader takes the next chunk as soon as it is free, so the two finish close together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

UNDECLARED_BUT_SAFE = (
    "sphinx_multitoc_numbering",
    "sphinx-mathjax-offline",
    "sphinx_jupyterbook_latex",
)


#: page -> the pages whose saved runs (``coursepkg.chapters.run_cache``) it loads
REUSES = {
    "book/09_decoding": ("book/08_training",),
    "book/13_inside_the_model": ("book/12_decoder_only",),
    "book/18_serving": ("book/12_decoder_only", "book/16_modern_decoder"),
}


def book_chunks(docnames: Sequence[str], nproc: int, maxbatch: int = 10) -> list[list[str]]:
    """The book's chunks for Sphinx's parallel reading, in place of ``make_chunks``.

    Args:
        docnames: the pages to read.
        nproc: the number of reader processes (unused: readers take chunks as they free up).
        maxbatch: unused; ``make_chunks``'s signature.

    Returns:
        One chunk per group of pages linked by :data:`REUSES` (makers before the pages that
        load their runs, the largest group first), then one chunk per other page, in name
        order; every page exactly once.
    """
    names = sorted(docnames)
    group = {name: {name} for name in names}
    for reader, makers in REUSES.items():
        for maker in makers:
            if reader in group and maker in group and group[reader] is not group[maker]:
                merged = group[reader] | group[maker]
                for name in merged:
                    group[name] = merged
    makers = {maker for found in REUSES.values() for maker in found}
    groups = {id(members): members for members in group.values() if len(members) > 1}
    linked = [
        sorted(members, key=lambda name: (name not in makers, name))
        for members in sorted(groups.values(), key=lambda members: (-len(members), min(members)))
    ]
    return linked + [[name] for name in names if len(group[name]) == 1]


def _declare_safe(app, config) -> None:
    for name in UNDECLARED_BUT_SAFE:
        extension = app.extensions.get(name)
        if extension is not None and extension.parallel_read_safe is None:
            extension.parallel_read_safe = True
            extension.parallel_write_safe = True


def _create_the_cache(app, env, docnames) -> None:
    config = getattr(env, "mystnb_config", None)
    if config is None or config.execution_mode != "cache" or not config.execution_cache_path:
        return
    from jupyter_cache import get_cache  # myst-nb's own dependency, in cache mode only

    Path(config.execution_cache_path).mkdir(parents=True, exist_ok=True)
    get_cache(config.execution_cache_path).db  # the database, created if missing  # noqa: B018


def setup(app):
    import sphinx.builders

    sphinx.builders.make_chunks = book_chunks  # read by Builder._read_parallel
    # config-inited: after every extension of conf has been set up, before any reading.
    app.connect("config-inited", _declare_safe)
    # env-before-read-docs: in the main process, after myst-nb has set the cache's path.
    app.connect("env-before-read-docs", _create_the_cache)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
