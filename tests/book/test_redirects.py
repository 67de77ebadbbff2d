"""The redirect pages at the renamed chapters' old addresses (``book/_ext/redirects.py``): each old
name leads to a page of the book, each redirect written points to it with relative URLs only, and
(in headless Chromium, where it is installed) an old URL opens the new page at the same anchor.

The writer runs on a temporary folder: no book build is needed. ``e2e/test_browser.py`` follows
an old URL of the built book."""

from __future__ import annotations

import functools
import http.server
import posixpath
import re
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(ROOT / "book" / "_ext"))
try:
    import redirects
finally:
    sys.path.remove(str(ROOT / "book" / "_ext"))


def _toc_pages() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return {toc["root"]} | {c["file"] for part in toc["parts"] for c in part["chapters"]}


def _hrefs(text: str) -> dict[str, list[str]]:
    """The URLs a redirect page names, by where: the refresh, the canonical link, the plain link
    and the script."""
    return {
        "refresh": re.findall(r'http-equiv="refresh" content="0; url=([^"]+)"', text),
        "canonical": re.findall(r'<link rel="canonical" href="([^"]+)"', text),
        "link": re.findall(r'<a href="([^"]+)"', text),
        "script": re.findall(r'location\.replace\("([^"]+)" \+ location\.hash\)', text),
    }


def test_every_old_name_leads_to_a_page_of_the_book_and_none_is_a_page_again():
    pages = _toc_pages()
    assert len(redirects.RENAMED) == 7
    for old, new in redirects.RENAMED.items():
        assert new in pages, f"{old} -> {new}: not in _toc.yml"
        assert (ROOT / f"{new}.md").is_file(), new
        assert old not in pages and not (ROOT / f"{old}.md").exists(), f"{old} is a page again"
    assert len(set(redirects.RENAMED.values())) == len(redirects.RENAMED)  # no two onto one


def test_the_renamed_chapters_carry_their_numbers():
    """The reason for the renames: a numbered chapter's file starts with its place in the book."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    numbered = [
        c["file"] for part in toc["parts"] if part.get("numbered") for c in part["chapters"]
    ]
    assert [int(posixpath.basename(f)[:2]) for f in numbered] == list(range(1, len(numbered) + 1))


def test_each_redirect_points_to_its_new_page_with_relative_urls(tmp_path):
    written = redirects.write_redirects(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        f"{old}.html" for old in redirects.RENAMED
    ]
    for path, new in zip(written, redirects.RENAMED.values(), strict=True):
        found = _hrefs(path.read_text(encoding="utf-8"))
        assert all(len(urls) == 1 for urls in found.values()), (path, found)
        urls = {urls[0] for urls in found.values()}
        assert len(urls) == 1, f"{path.name}: its URLs differ {found}"
        url = urls.pop()
        assert not re.match(r"[a-z]+:|/", url), f"{path.name}: {url} is not relative"
        assert (path.parent / url).resolve() == (tmp_path / f"{new}.html").resolve()


def test_a_redirect_between_folders_climbs_out_of_the_old_one(tmp_path):
    table = {"book/old/deep": "book/new"}
    (path,) = redirects.write_redirects(tmp_path, table)
    assert redirects.relative_url("book/old/deep", "book/new") == "../new.html"
    assert "url=../new.html" in path.read_text(encoding="utf-8")


def test_a_rebuild_replaces_its_redirects_but_never_a_page(tmp_path):
    redirects.write_redirects(tmp_path)
    redirects.write_redirects(tmp_path)  # an incremental build writes them again
    old = next(iter(redirects.RENAMED))
    (tmp_path / f"{old}.html").write_text("<html><body>a chapter</body></html>")
    with pytest.raises(FileExistsError, match=re.escape(repr(old))):
        redirects.write_redirects(tmp_path)
    assert "a chapter" in (tmp_path / f"{old}.html").read_text()


def test_a_page_an_earlier_build_left_at_an_old_address_is_replaced(tmp_path):
    """An incremental build after a rename: the page's old file is still in the output."""
    old, new = next(iter(redirects.RENAMED.items()))
    (tmp_path / f"{old}.html").parent.mkdir(parents=True)
    (tmp_path / f"{old}.html").write_text("<html><body>the chapter before it moved</body></html>")
    redirects.write_redirects(tmp_path, {old: new}, pages={new, "book/index"})
    assert redirects.MARK in (tmp_path / f"{old}.html").read_text()
    with pytest.raises(FileExistsError, match=re.escape(repr(old))):  # a page again: refused
        redirects.write_redirects(tmp_path, {old: new}, pages={old, new})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_old_url_opens_the_new_page_at_the_same_anchor(tmp_path):
    from browser import Browser, chromium_or_skip

    executable = chromium_or_skip()
    old, new = next(iter(redirects.RENAMED.items()))
    redirects.write_redirects(tmp_path, {old: new})
    (tmp_path / f"{new}.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><title>New</title></head><body>'
        '<h1>New</h1><p style="margin-top: 3000px" id="a-section">here</p></body></html>'
    )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output clean
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Browser(executable) as browser:
            browser.goto(f"http://127.0.0.1:{server.server_address[1]}/{old}.html#a-section")
            assert browser.wait_for(
                f"location.pathname === '/{new}.html' && location.hash === '#a-section' && "
                "document.readyState === 'complete'"
            ), browser.evaluate("location.href")
            assert browser.evaluate("document.querySelector('h1').textContent") == "New"
            assert not browser.errors, browser.errors
    finally:
        server.shutdown()
