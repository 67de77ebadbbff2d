"""The built book, offline and in a real browser.

Two parts:

* a scan of every built HTML page (and the theme's CSS) for resources loaded from another host:
  scripts, styles, fonts, images and frames must all come from the site itself;
* headless Chromium (Debian's ``chromium``) visiting every page served on loopback: math is
  typeset (no raw TeX left), every image loads, nothing is logged as an error, no request leaves
  the machine, no code cell or output needs a horizontal scrollbar in a 1280-pixel window, the
  sidebar reaches every chapter, a renamed chapter's old address opens it at the same anchor, and
  an exploration's slider changes its figure.
  A screenshot of each page is saved in ``_build/screenshots/``.

Both need the built book (``make book``); they skip without it unless ``COURSE_REQUIRE_BOOK`` is
set, as in CI. The browser part skips without Chromium unless ``COURSE_REQUIRE_BROWSER`` is set.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from browser import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
try:
    from redirects import RENAMED  # the renamed chapters' old addresses -> their pages
finally:
    sys.path.remove(str(ROOT / "book" / "_ext"))
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"

# Resource-loading attributes: src anywhere, href on <link> (stylesheets, icons, preloads).
_RESOURCE = re.compile(
    r"<(?:script|img|iframe|source|audio|video|embed)\b[^>]*\ssrc=[\"']([^\"']+)"
    r"|<link\b[^>]*\shref=[\"']([^\"']+)",
    re.I,
)
_CSS_URL = re.compile(r"url\(\s*[\"']?((?:https?:)?//[^)\"']+)")


def _require_built() -> None:
    if not (HTML / "index.html").exists():
        if os.environ.get("COURSE_REQUIRE_BOOK"):
            pytest.fail(
                "COURSE_REQUIRE_BOOK is set but _build/html does not exist: run `make book`"
            )
        pytest.skip("the book is not built (run `make book`)")


def _pages() -> list[Path]:
    skip = ("_static", "_sources", "_images", "reports")
    return sorted(
        p
        for p in HTML.rglob("*.html")
        if not any(part in skip for part in p.relative_to(HTML).parts)
    )


def _external(url: str) -> bool:
    return url.startswith(("http://", "https://", "//"))


def external_references() -> dict[str, list[str]]:
    """Every resource a page or stylesheet would fetch from another host, by file."""
    found: dict[str, list[str]] = {}
    for page in _pages():
        urls = [a or b for a, b in _RESOURCE.findall(page.read_text(errors="replace"))]
        bad = [u for u in urls if _external(u)]
        if bad:
            found[str(page.relative_to(HTML))] = bad
    for css in (HTML / "_static").rglob("*.css"):
        bad = _CSS_URL.findall(css.read_text(errors="replace"))
        if bad:
            found[str(css.relative_to(HTML))] = bad
    return found


def test_no_page_loads_anything_from_another_host():
    _require_built()
    assert len(_pages()) >= 14
    assert external_references() == {}


def test_mathjax_is_served_by_the_site():
    _require_built()
    scripts = re.findall(
        r"<script[^>]*src=\"([^\"]*mathjax[^\"]*)\"",
        (HTML / "book" / "03_self_attention.html").read_text(),
        re.I,
    )
    assert scripts, "no MathJax script on a page with math"
    for src in scripts:
        assert not _external(src)
        assert (HTML / "book" / src.split("?")[0]).resolve().exists(), src


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def site():
    """The built site served on loopback; yields its base URL."""
    _require_built()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        if os.environ.get("COURSE_REQUIRE_BROWSER"):
            pytest.fail("COURSE_REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with Browser(executable) as b:
        b.send("Network.setCacheDisabled", cacheDisabled=True)
        yield b


_MATH_DONE = """
(async () => {
  if (!document.querySelector('.math')) return true;
  for (let i = 0; i < 100 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
    await new Promise(r => setTimeout(r, 100));
  if (!(window.MathJax && MathJax.startup)) return false;
  await MathJax.startup.promise;
  return true;
})()
"""
_RAW_MATH = """
Array.from(document.querySelectorAll('.math')).filter(e => !e.querySelector('mjx-container'))
  .map(e => e.textContent.slice(0, 60))
"""
_BROKEN_IMAGES = """
(async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  const settle = i => new Promise(r => { i.onload = i.onerror = r; });
  await Promise.all(imgs.map(i => i.complete ? null : settle(i)));
  return imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80));
})()
"""

# Code cells and their outputs that need a horizontal scrollbar: wider content than box. (Package
# code shown with literalinclude keeps the package's own line length and is not counted.)
_SCROLLING_CELLS = """
Array.from(document.querySelectorAll('div.cell pre, div.cell_output pre, div.output pre'))
  .filter(e => e.scrollWidth > e.clientWidth + 1)
  .map(e => {
    const lines = e.textContent.split('\\n');
    const longest = lines.reduce((a, l) => (l.length > a.length ? l : a), '');
    const where = e.closest('.cell_output, div.output') ? 'output' : 'code';
    return `${where} (${e.scrollWidth} > ${e.clientWidth} px): ${longest.slice(0, 90)}`;
  })
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_page_reads_well_offline(site, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    failures = []
    outside = []
    redirects = {f"{old}.html" for old in RENAMED}  # followed in their own test below
    for page in _pages():
        rel = page.relative_to(HTML).as_posix()
        if rel in redirects:
            continue
        browser.goto(f"{site}/{rel}")
        assert browser.evaluate(_MATH_DONE, timeout=30), f"{rel}: MathJax did not load"
        raw = browser.evaluate(_RAW_MATH)
        broken = browser.evaluate(_BROKEN_IMAGES)
        requests = [
            e["params"]["request"]["url"]
            for e in browser._events
            if e.get("method") == "Network.requestWillBeSent"
        ]
        outside += [
            f"{rel}: {u}"
            for u in requests
            if urlparse(u).scheme in ("http", "https") and urlparse(u).hostname != "127.0.0.1"
        ]
        if raw:
            failures.append(f"{rel}: untypeset math {raw[:3]}")
        if broken:
            failures.append(f"{rel}: images that do not load {broken[:3]}")
        if browser.errors:
            failures.append(f"{rel}: errors {browser.errors[:3]}")
        assert browser.evaluate("window.innerWidth") == 1280, "the test reads at 1280 pixels"
        scrolling = browser.evaluate(_SCROLLING_CELLS)
        if scrolling:
            failures.append(f"{rel}: code wider than the column {scrolling[:3]}")
        browser.screenshot(SHOTS / (rel.replace("/", "__").removesuffix(".html") + ".png"))
    assert not outside, f"requests left the machine: {outside[:5]}"
    assert not failures, "\n".join(failures)


def _toc_chapters() -> list[str]:
    """The numbered chapters the table of contents lists (``book/NN_name``)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [f for f in files if re.match(r"book/\d\d_", f)]


def test_sidebar_reaches_every_chapter(site, browser):
    # The site's index.html redirects to the landing page, book/index.html.
    browser.goto(f"{site}/index.html")
    assert browser.wait_for(
        "location.pathname.endsWith('/book/index.html') && "
        "document.querySelectorAll('nav.bd-docs-nav a.reference.internal').length > 0"
    ), "index.html does not lead to the landing page and its sidebar"
    links = browser.evaluate(
        "Array.from(document.querySelectorAll('nav.bd-docs-nav a.reference.internal'))"
        ".map(a => a.href)"
    )
    reached = {urlparse(u).path.lstrip("/").split("#")[0]: u for u in links}
    chapters = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))
    # every page of the table of contents is a chapter file, and the other way round
    assert {f"book/{c}" for c in chapters} == set(_toc_chapters()), chapters
    for stem in [*chapters, "setup", "assignments"]:
        path = f"book/{stem}.html"
        assert path in reached, f"the sidebar does not link {stem}"
        # follow the link: the page loads and has its title
        browser.goto(reached[path])
        # wait for this very page (a load event of the page before can arrive late)
        assert browser.wait_for(
            f"location.pathname.endsWith('/{path}') && "
            "(document.querySelector('article h1')?.textContent || '').trim().length > 0"
        ), f"{stem}: the sidebar's link does not open a page with a title"


def test_the_old_address_of_a_renamed_chapter_opens_it_at_the_same_anchor(site, browser):
    for old, new in RENAMED.items():
        assert (HTML / f"{old}.html").is_file(), f"no redirect page at {old}.html"
        # a section below the title, so that the anchor is one a link could point at
        sections = re.findall(r'<section\b[^>]*\sid="([\w-]+)"', (HTML / f"{new}.html").read_text())
        anchor = sections[1]
        browser.goto(f"{site}/{old}.html#{anchor}")
        assert browser.wait_for(
            f"location.pathname.endsWith('/{new}.html') && location.hash === '#{anchor}' && "
            "(document.querySelector('article h1')?.textContent || '').trim().length > 0"
        ), f"{old}.html#{anchor} does not open {new}.html at the same anchor"
        assert not browser.errors, f"{old}: {browser.errors[:3]}"


def test_an_exploration_slider_changes_its_figure(site, browser):
    pages = [p for p in _pages() if "coursepkg-exploration" in p.read_text(errors="replace")]
    assert len(pages) >= 3, "explorations are missing from the built book"
    for page in pages:
        browser.goto(f"{site}/{page.relative_to(HTML).as_posix()}")
        changed = browser.evaluate(
            """
            (() => {
              const root = document.querySelector('.coursepkg-exploration');
              const input = root.querySelector('input[type=range]');
              const img = root.querySelector('img');
              const before = img.src;
              input.value = input.value === input.max ? input.min : input.max;
              input.dispatchEvent(new Event('input'));
              return img.src !== before && img.naturalWidth >= 0;
            })()
            """
        )
        assert changed, f"{page.name}: moving the slider did not change the figure"
