"""The misconception dashboard counts the mistakes of issue 34 (public code's habits): for a
batch of students whose answers are the corpus's habits, each check's message names exactly
its own id (as the per-student report reads it), and ``reports/dashboard.html`` lists each id
with its description, its count and who made it, assignment by assignment."""

from __future__ import annotations

import html
import json
import re

import grading_corpus as corpus
import pytest

from coursepkg.grading import registered_checks
from coursepkg.grading.checks import ex12_tiled_attention_mistakes as tiled_catalogue
from coursepkg.grading.checks import ex13_training_pieces_mistakes as pieces_catalogue
from coursepkg.grading.classroom.dashboard import build_dashboard
from coursepkg.grading.classroom.reports import diagnoses_in

HABITS = [e for e in corpus.CORPUS if e.id.startswith("habit.")]
ASSIGNMENT = {entry.name: entry.assignment for entry in registered_checks()}


@pytest.fixture(scope="module")
def messages() -> dict[str, str]:
    """Each habit's message from its visible check ("" when it passes)."""
    return {e.id: corpus.run(e, thorough=False).message for e in HABITS}


def test_the_habits_cover_every_new_id():
    named = {e.named for e in HABITS if not e.passes}
    assert {
        "mha.no_bias",
        "mha.no_qkv_bias",
        "ffn.no_bias",
        "ffn.fixed_width_4d",
        "ffn.gelu_instead_of_relu",
        "sdpa.builtin",
        "mha.builtin_sdpa",
        "mha.builtin_multihead_attention",
        "ln.builtin_module",
        "ln.builtin_function",
        "enc.builtin_encoder_layer",
        "enc.builtin_multihead_attention",
        "decoder_layer.builtin_decoder_layer",
        "decoder_layer.builtin_multihead_attention",
        "decoder_layer.builtin_sdpa",
        "enc.builtin_sdpa",
        "label_smoothing.builtin_cross_entropy",
        "parameter_count.builds_torch_transformer",
    } <= named


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_each_message_names_exactly_its_own_id(messages):
    for entry in HABITS:
        found = [d["id"] for d in diagnoses_in(messages[entry.id])]
        assert found == ([] if entry.passes else [entry.named]), (entry.id, found)


def _report(student: str, aid: str, message: str) -> dict:
    ids = sorted({d["id"] for d in diagnoses_in(message)})
    return {
        "student": student,
        "assignment": aid,
        "autograded_points": 0.0 if message else 1.0,
        "autograded_max_points": 1.0,
        "graded": True,
        "reason": "",
        "notes": [],
        "review_flags": [],
        "diagnoses": ids,
    }


def _dashboard_counts(entries, messages, tmp_path, prefix):
    """Each entry's report written as a student's; the dashboard lists each named id with its
    description, its count and who made it."""
    for entry in entries:
        aid = ASSIGNMENT[entry.check]
        folder = tmp_path / "reports" / aid
        folder.mkdir(parents=True, exist_ok=True)
        student = entry.id.removeprefix(prefix)
        report = _report(student, aid, messages[entry.id])
        (folder / f"{student}.json").write_text(json.dumps(report), encoding="utf-8")
    page = build_dashboard(tmp_path).read_text(encoding="utf-8")
    sections = dict(re.findall(r"<h2>(ex\d\d_\w+)</h2>(.*?)(?=<h2>|$)", page, re.S))
    expected: dict[tuple[str, str], list[str]] = {}
    for entry in entries:
        if not entry.passes:
            key = (ASSIGNMENT[entry.check], entry.named)
            expected.setdefault(key, []).append(entry.id.removeprefix(prefix))
    descriptions = {b.id: b.description for e in registered_checks() for b in e.bugs}
    for (aid, bug_id), students in expected.items():
        row = re.search(
            rf"<tr><td><code>{re.escape(bug_id)}</code></td><td>([^<]*)</td><td>(\d+)</td>"
            r"<td>([^<]*)</td></tr>",
            sections[aid],
        )
        assert row, (aid, bug_id)
        assert row.group(1) == html.escape(descriptions[bug_id])
        assert int(row.group(2)) == len(students)
        assert sorted(row.group(3).split(", ")) == sorted(students)


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_dashboard_counts_the_new_ids(messages, tmp_path):
    _dashboard_counts(HABITS, messages, tmp_path, "habit.")


TILED = [e for e in corpus.CORPUS if e.check == "check_tiled_attention"]


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_dashboard_counts_the_tiled_attention_ids(tmp_path):
    """ex12's corpus names each of its ids exactly once, and the dashboard counts them."""
    messages = {e.id: corpus.run(e, thorough=False).message for e in TILED}
    for entry in TILED:
        found = [d["id"] for d in diagnoses_in(messages[entry.id])]
        assert found == ([] if entry.passes else [entry.named]), (entry.id, found)
    assert len({e.named for e in TILED if not e.passes}) == len(tiled_catalogue.BUGS)
    _dashboard_counts(TILED, messages, tmp_path, "tiled.")


PIECES = [e for e in corpus.CORPUS if e.id.startswith("pieces.")]


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_dashboard_counts_the_training_pieces_ids(tmp_path):
    """ex13's corpus names each of its ids exactly once, and the dashboard counts them."""
    messages = {e.id: corpus.run(e, thorough=False).message for e in PIECES}
    for entry in PIECES:
        found = [d["id"] for d in diagnoses_in(messages[entry.id])]
        assert found == ([] if entry.passes else [entry.named]), (entry.id, found)
    named = [e.named for e in PIECES if not e.passes]
    assert len(named) == len(set(named)) == len(pieces_catalogue.BUGS)
    _dashboard_counts(PIECES, messages, tmp_path, "pieces.")
