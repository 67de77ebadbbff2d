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

Pages are handed to the readers in Sphinx's own chunks of consecutive names, so a page that reuses
a run another page saved (chapter 9 reuses chapter 8's models, chapter 13 chapter 12's GPT) is
read after it in the same process; were it not, it would train the run itself
(``coursepkg.run_cache`` writes a run whole or not at all).
"""

from __future__ import annotations

from pathlib import Path

UNDECLARED_BUT_SAFE = (
    "sphinx_multitoc_numbering",
    "sphinx-mathjax-offline",
    "sphinx_jupyterbook_latex",
)


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
    # config-inited: after every extension of conf has been set up, before any reading.
    app.connect("config-inited", _declare_safe)
    # env-before-read-docs: in the main process, after myst-nb has set the cache's path.
    app.connect("env-before-read-docs", _create_the_cache)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
