"""A Jupyter server extension that lets nbgrader's formgrader typeset math without a network.

The formgrader renders a submission with nbgrader's ``formgrade/index.html.j2``, which calls
nbconvert's ``mathjax()`` macro: MathJax 2 from a CDN. Offline, MathJax is missing, nbgrader's
``formgrade.js`` (written against MathJax 2's ``MathJax.Hub``) stops, and no score can be saved.
This extension gives the formgrader's exporter a ``mathjax.html.j2`` of its own whose macro loads
the MathJax 2 that ``jupyter-server-mathjax`` serves from the same server
(``{base_url}static/jupyter_server_mathjax/MathJax.js``), with nbconvert's TeX settings.

``make install`` enables it in the course's environment (``jupyter/jupyter_server_config.d/``,
copied into ``.venv/etc/jupyter``; a non-editable ``pip install`` installs it as a data file), as
``jupyter-server-mathjax`` enables itself. It does nothing in a server without the formgrader.
"""

from __future__ import annotations

import logging
from typing import Any

import jinja2

__all__ = ["offline_mathjax_template", "use_local_mathjax"]

log = logging.getLogger(__name__)

# The configuration file that jupyter-server-mathjax ships (its copy of MathJax has no other).
_MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"

_TEMPLATE = """\
{%- macro mathjax(url=None) -%}
    <script src="__URL__"></script>
    <script type="text/x-mathjax-config">
    if (window.MathJax && window.MathJax.Hub) {
        MathJax.Hub.Config({
            TeX: {equationNumbers: {autoNumber: "AMS", useLabelIds: true}},
            tex2jax: {
                inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]],
                displayMath: [["$$", "$$"], ["\\\\[", "\\\\]"]],
                processEscapes: true,
                processEnvironments: true
            },
            displayAlign: "center",
            messageStyle: "none",
            CommonHTML: {linebreaks: {automatic: true}}
        });
        MathJax.Hub.Queue(["Typeset", MathJax.Hub]);
    }
    </script>
{%- endmacro %}
"""


def offline_mathjax_template(mathjax_js: str) -> str:
    """The text of a ``mathjax.html.j2`` whose ``mathjax()`` macro loads MathJax 2 from
    ``mathjax_js`` (whatever URL a caller passes, such as nbconvert's CDN default, is ignored).

    Args:
        mathjax_js: URL of ``MathJax.js``, without a query string.

    Returns:
        The Jinja template text.
    """
    if any(c in mathjax_js for c in "\"'<>?"):
        raise ValueError(f"not a plain URL path for MathJax.js: {mathjax_js!r}")
    return _TEMPLATE.replace("__URL__", f"{mathjax_js}?config={_MATHJAX_CONFIG}")


def use_local_mathjax(settings: dict[str, Any]) -> bool:
    """Point the formgrader's exporter in the Tornado ``settings`` at the server's own MathJax.

    Args:
        settings: the Jupyter server's ``web_app.settings``.

    Returns:
        False when the server has no formgrader (nothing to change), else True.
    """
    exporter = settings.get("nbgrader_exporter")
    if exporter is None:
        return False
    base_url = settings.get("base_url", "/")
    mathjax_js = settings.get("mathjax_url") or (
        base_url.rstrip("/") + "/static/jupyter_server_mathjax/MathJax.js"
    )
    loader = jinja2.DictLoader({"mathjax.html.j2": offline_mathjax_template(mathjax_js)})
    exporter.extra_loaders = [loader, *exporter.extra_loaders]
    exporter.mathjax_url = f"{mathjax_js}?config={_MATHJAX_CONFIG}"
    return True


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "coursepkg.grading.formgrader_offline"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Nothing to do yet: the formgrader may load after this extension."""


async def _start_jupyter_server_extension(serverapp: Any) -> None:
    """Once every extension has loaded, give the formgrader the local MathJax."""
    settings = serverapp.web_app.settings
    if not use_local_mathjax(settings):
        return
    if "mathjax_url" not in settings:
        serverapp.log.warning(
            "jupyter-server-mathjax is not enabled: the formgrader's MathJax will not load"
        )
    serverapp.log.info("The formgrader typesets math with the server's own MathJax")
