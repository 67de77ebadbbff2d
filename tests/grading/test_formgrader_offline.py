"""The formgrader's exporter loads MathJax 2 from the server, never from a CDN (the browser
test, tests/e2e/test_student_journey.py, shows the page working offline)."""

import asyncio
import json
import types
from pathlib import Path

import pytest
from nbconvert.exporters import HTMLExporter

from coursepkg.grading import formgrader_offline as fo

ROOT = Path(__file__).resolve().parents[2]


def _macro(exporter: HTMLExporter, *args: str) -> str:
    template = exporter.environment.get_template("mathjax.html.j2")
    return str(template.module.mathjax(*args))


@pytest.mark.parametrize("base_url", ["/", "/user/alice/"])
def test_macro_loads_the_servers_mathjax_whatever_url_it_is_given(base_url):
    exporter = HTMLExporter()
    cdn = _macro(exporter)
    assert "cdnjs.cloudflare.com" in cdn  # nbconvert's own macro, before
    assert fo.use_local_mathjax({"nbgrader_exporter": exporter, "base_url": base_url})
    local = f'<script src="{base_url}static/jupyter_server_mathjax/MathJax.js?config='
    for html in (_macro(exporter), _macro(exporter, "https://cdnjs.cloudflare.com/x.js")):
        assert local in html
        assert "cdnjs" not in html and "MathJax.Hub.Config" in html
        assert r'["\\(", "\\)"]' in html  # the same inline delimiters as nbconvert's
    assert exporter.mathjax_url.startswith(f"{base_url}static/jupyter_server_mathjax/")


def test_url_from_jupyter_server_mathjax_wins():
    exporter = HTMLExporter()
    url = "/base/static/jupyter_server_mathjax/MathJax.js"
    fo.use_local_mathjax({"nbgrader_exporter": exporter, "base_url": "/", "mathjax_url": url})
    assert f'src="{url}?config=' in _macro(exporter)


def test_server_without_formgrader_is_left_alone():
    settings = {"base_url": "/"}
    assert not fo.use_local_mathjax(settings)
    app = types.SimpleNamespace(web_app=types.SimpleNamespace(settings=settings), log=None)
    asyncio.run(fo._start_jupyter_server_extension(app))
    assert settings == {"base_url": "/"}


def test_odd_url_is_refused():
    with pytest.raises(ValueError, match="MathJax.js"):
        fo.offline_mathjax_template('/static/"><script>')


def test_extension_and_mathjax_are_enabled_in_the_environment():
    import sys

    import jupyter_server_mathjax  # noqa: F401  (the course environment installs it)
    from jupyter_server.extension.manager import ExtensionPackage

    name = "coursepkg.grading.formgrader_offline"
    shipped = json.loads((ROOT / "jupyter/jupyter_server_config.d/coursepkg.json").read_text())
    assert shipped == {"ServerApp": {"jpserver_extensions": {name: True}}}
    installed = Path(sys.prefix, "etc/jupyter/jupyter_server_config.d/coursepkg.json")
    assert installed.exists(), "run `make install`"
    assert json.loads(installed.read_text()) == shipped
    assert ExtensionPackage(name=name).validate()
    assert fo._jupyter_server_extension_points() == [{"module": fo.__name__}]
