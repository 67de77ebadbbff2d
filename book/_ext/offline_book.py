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
"""

from __future__ import annotations


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


def _colour_mode(app, config) -> None:
    # pydata-sphinx-theme reads the default mode from the template context, not theme options.
    context = dict(config.html_context or {})
    context.setdefault("default_mode", "light")
    config.html_context = context


def setup(app):
    app.connect("config-inited", _colour_mode)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("html-page-context", _fix_citation_roles)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
