"""A local Sphinx extension that keeps the built book self-contained and quiet in a browser.

* Jupyter Book 1.x always loads sphinx-thebe, which adds an inline script naming a CDN
  (unpkg.com) and, on some pages, adds it twice (a JavaScript redeclaration error). The book has
  no launch buttons and never starts a remote kernel, so its scripts and styles are dropped.
* pydata-sphinx-theme logs a console error when no colour mode is configured; set one.
* docutils writes a bibliography (sphinxcontrib-bibtex's ``{bibliography}``) as
  ``<div role="list">`` holding ``<div role="doc-biblioentry">`` entries. DPUB-ARIA 1.1 deprecated
  ``doc-biblioentry``, and accessibility checkers (axe-core's ``aria-required-children``) no longer
  count it as a list item, so the list has no items: a critical violation on the references page.
  The entries are given the plain ``listitem`` role instead; the list keeps its own.
* The theme's download menu offers a page's executed notebook only when a launch provider
  (Binder, Colab, ...) is configured, which an offline book has none of. Each page that was
  executed gets its ``.ipynb`` (with its outputs) copied next to its source in ``_sources/`` and
  offered in that menu, before the theme builds it.
* Three controls name themselves with words other than the ones they show, which fails WCAG
  2.5.3 "Label in Name" (axe-core's ``label-content-name-mismatch``, serious, on every page):
  the theme's search field (labelled "Search", showing "Search Ctrl+K"), its colour-mode switch
  (labelled "Color mode", its icons titled Light, Dark, System Settings) and MyST-NB's hidden-code
  toggle (labelled "Toggle hidden content", showing "Show code cell source"). After the build,
  each page's HTML gets names that contain what is shown (:data:`LABEL_IN_NAME`).
* ``book/_static/print.css`` hides the "#" link beside each heading when a page is printed, so
  the PDF's bookmarks (``make pdf``) read as the titles alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def _is_thebe(asset) -> bool:
    name = getattr(asset, "filename", None) or ""
    body = getattr(asset, "attributes", {}).get("body", "") or ""
    return "thebe" in name or "THEBE_JS_URL" in body


def _drop_thebe(app, pagename, templatename, context, doctree) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [asset for asset in context[key] if not _is_thebe(asset)]


BIBLIOENTRY = 'role="doc-biblioentry"'
LISTITEM = 'role="listitem"'


def citations_as_list_items(body: str) -> str:
    """The page's HTML with each bibliography entry's role changed to ``listitem``."""
    return body.replace(BIBLIOENTRY, LISTITEM)


def _fix_citation_roles(app, pagename, templatename, context, doctree) -> None:
    if BIBLIOENTRY in context.get("body", ""):
        context["body"] = citations_as_list_items(context["body"])


#: (what the theme or MyST-NB writes, what the page gets instead): each accessible name contains
#: the text a reader sees (the search field and the toggle are named by their own text; the
#: colour switch, which shows icons, by its label and its modes' titles).
LABEL_IN_NAME = (
    (
        'search-button-field search-button__button pst-js-only" title="Search" aria-label="Search"',
        'search-button-field search-button__button pst-js-only" title="Search"',
    ),
    (
        'theme-switch-button pst-js-only" aria-label="Color mode"',
        'theme-switch-button pst-js-only" aria-label="Color mode: Light, Dark, System Settings"',
    ),
    ('<summary aria-label="Toggle hidden content">', "<summary>"),
)


def label_in_name(html: str) -> str:
    """The page's HTML with the controls of :data:`LABEL_IN_NAME` named by what they show."""
    for written, fixed in LABEL_IN_NAME:
        html = html.replace(written, fixed)
    return html


def _label_in_name_pages(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        fixed = label_in_name(html)
        if fixed != html:
            page.write_text(fixed, encoding="utf-8")


def executed_notebook(outdir: str | Path, pagename: str) -> Path:
    """Where MyST-NB left the executed notebook of ``pagename`` for the builder writing to
    ``outdir`` (``_build/html`` -> ``_build/jupyter_execute/<pagename>.ipynb``)."""
    return Path(outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"


def _offer_notebook(app, pagename, templatename, context, doctree) -> None:
    executed = executed_notebook(app.outdir, pagename)
    if app.builder.name != "html" or not executed.exists():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def _colour_mode(app, config) -> None:
    # pydata-sphinx-theme reads the default mode from the template context, not theme options.
    context = dict(config.html_context or {})
    context.setdefault("default_mode", "light")
    config.html_context = context


STATIC = Path(__file__).resolve().parents[1] / "_static"


def _print_style(app, config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    app.add_css_file("print.css")


def setup(app):
    app.connect("config-inited", _colour_mode)
    app.connect("config-inited", _print_style)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("html-page-context", _fix_citation_roles)
    # before the theme's header buttons (priority 501) read ipynb_source
    app.connect("html-page-context", _offer_notebook, priority=500)
    app.connect("build-finished", _label_in_name_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
