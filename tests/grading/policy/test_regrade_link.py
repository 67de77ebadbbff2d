"""The feedback's regrade links (issue 62, P11): a box beside each graded part whose text becomes
the downloaded request file's reason, so that no student edits JSON by hand. The section is made
into a page by nbconvert, as the feedback is, and typed into in a headless Chromium; the file
its link then downloads is the one ``coursepkg regrade request`` writes, with that reason.
"""

from __future__ import annotations

import base64
import json

import nbformat
import pytest
from browser import Browser, chromium_or_skip
from nbconvert import HTMLExporter

from coursepkg.grading.policy.regrade import KIND, feedback_text

AID = "ex01_attention"
PARTS = ["test_additive_score_visible", "written_sqrt_dk"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell(feedback_text([], AID, "bob", PARTS))]
    )
    html, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)  # no CDN scripts
    path = tmp_path_factory.mktemp("feedback") / "feedback.html"
    path.write_text(html, encoding="utf-8")
    return path


def _file_of(href: str) -> dict:
    prefix = "data:application/json;base64,"
    assert href.startswith(prefix)
    return json.loads(base64.b64decode(href[len(prefix) :]).decode("utf-8"))


def test_each_part_has_a_box_and_a_link_whose_file_lacks_only_the_reason(page):
    text = page.read_text(encoding="utf-8")
    assert text.count('class="regrade-reason"') == len(PARTS)
    for part in PARTS:
        assert f'download="regrade-bob-{AID}-{part}.json"' in text


def test_what_the_student_types_becomes_the_files_reason(page):
    with Browser(chromium_or_skip()) as browser:
        browser.goto(page.as_uri())
        assert browser.errors == []
        reason = "My scaling is in the softmax's \u201ctemperature\u201d: please look again."
        hrefs = browser.evaluate(
            "(() => { const box = document.querySelectorAll('textarea.regrade-reason')[1];"
            f"box.value = {json.dumps('  ' + reason + ' ')};"
            "box.dispatchEvent(new Event('input', {bubbles: true}));"
            "return [...document.querySelectorAll('span.regrade-request a')]"
            ".map(a => a.getAttribute('href')); })()"
        )
        again = browser.evaluate(
            "(() => { const box = document.querySelectorAll('textarea.regrade-reason')[1];"
            "box.value = 'Second thoughts.';"
            "box.dispatchEvent(new Event('input', {bubbles: true}));"
            "return box.parentNode.querySelector('a').getAttribute('href'); })()"
        )
        assert browser.errors == []
    assert _file_of(again)["reason"] == "Second thoughts."  # the box's text now, not appended
    untouched, typed = (_file_of(h) for h in hrefs)
    assert untouched["reason"] == "" and untouched["part"] == PARTS[0]
    assert typed["reason"] == reason  # trimmed, the quotes kept (UTF-8)
    assert {k: typed[k] for k in ("kind", "assignment", "student", "part")} == {
        "kind": KIND,
        "assignment": AID,
        "student": "bob",
        "part": PARTS[1],
    }
