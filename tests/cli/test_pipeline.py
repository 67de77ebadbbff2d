"""``coursepkg pipeline``: budgets, the generated tasks, bits per byte, and a real run killed
between stages and resumed without redoing them (its own processes: ``slow``)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from coursepkg import cli
from coursepkg.training.budget import (
    LOOP_OVERHEAD,
    MIN_STEPS,
    TrainingCosts,
    fixed_or,
    parse_budget,
    plan,
    size_pretraining,
    size_steps,
)
from coursepkg.training.pipeline import (
    STAGES,
    PipelineSettings,
    chat_tasks,
    heldout_bits_per_byte,
    run_pipeline,
)
from coursepkg.training.report_card import _serving_lines

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("5m", 300), ("1.5h", 5400), ("7", 7)])
def test_parse_budget(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "-1m", "0s", "m"])
def test_parse_budget_refuses_and_names_the_text(text):
    with pytest.raises(ValueError, match="budget") as err:
        parse_budget(text)
    assert repr(text) in str(err.value)


@given(st.floats(1, 20_000), st.floats(1, 20_000))
def test_a_larger_budget_never_plans_less(a, b):
    small, large = plan(min(a, b)), plan(max(a, b))
    for key in ("merges", "pretrain_chars", "conversations", "heldout", "serve_requests"):
        assert large[key] >= small[key] >= 1, key
    assert large["model"]["positional"] == "rope"  # coursepkg serve batches rotary models only


seconds = st.floats(0.001, 10.0)


@given(st.floats(0, 1e5), st.floats(0, 1e5), seconds, seconds, st.floats(0, 100))
def test_more_time_never_buys_fewer_steps_and_the_steps_fit(a, b, pre, fine, fixed):
    costs = TrainingCosts(pre, fine, fixed)
    small, large = size_steps(min(a, b), costs), size_steps(max(a, b), costs)
    for key in ("pretrain_steps", "finetune_steps"):
        assert large[key] >= small[key] >= MIN_STEPS
    cost = LOOP_OVERHEAD * (pre * large["pretrain_steps"] + fine * large["finetune_steps"])
    if large["pretrain_steps"] > MIN_STEPS and large["finetune_steps"] > MIN_STEPS:
        assert fixed + cost <= max(a, b) * (1 + 1e-9)  # never planned past the time left


@given(st.floats(60, 7200), seconds, st.floats(0, 1e-4))
def test_pretraining_is_planned_within_the_time_left(left, step, encode):
    sizes = plan(left)
    measured = {
        "pretrain_step": step,
        "finetune_step": step / 2,
        "token": step / 10,
        "encode_char": encode,
    }
    sized = size_pretraining(left, sizes, measured, bpt=4.0)
    if min(sized["pretrain_steps"], sized["finetune_steps"]) > MIN_STEPS:
        assert sum(sized["seconds"].values()) <= left * 1.001
    assert 20_000 <= sized["pretrain_chars"] <= sizes["pretrain_chars"]


@given(st.sampled_from(["pretrain", "finetune"]), st.integers(1, 10_000))
def test_fixed_steps_are_taken_as_they_are_and_nothing_is_measured(stage, steps):
    def measuring():
        raise AssertionError("a stage with fixed steps measured the machine")

    sizes = {**plan(300), f"{stage}_steps": steps}
    sized = fixed_or(sizes, stage, measuring)
    assert sized[f"{stage}_steps"] == steps and sized["seconds"] == {stage: None}
    assert fixed_or(plan(300), stage, lambda: {"sized": True}) == {"sized": True}


@pytest.mark.slow  # the whole pipeline, a server and its client: `make test`, not test-fast
def test_a_run_of_fixed_sizes_takes_those_steps_and_reports_no_plan(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text((ROOT / "coursepkg/data/tinyshakespeare.txt").read_text()[:20_000])
    sizes = dict(
        merges=20,
        tokenizer_chars=5000,
        pretrain_chars=5000,
        eval_chars=400,
        conversations=4,
        heldout=1,
        block_size=64,
        batch_size=2,
        pretrain_steps=4,
        finetune_steps=3,
    )
    settings = PipelineSettings(
        out=str(tmp_path / "run"), budget=1, corpus=str(corpus), device="cpu", sizes=sizes
    )
    figures = run_pipeline(settings, say=lambda line: None)
    assert (figures["pretrain"]["steps"], figures["finetune"]["steps"]) == (4, 3)
    assert figures["tokenizer"]["merges"] == 20
    assert figures["pretrain"]["planned_seconds"] is None
    assert sum(figures["evaluate"]["heldout_prompts"].values()) == 3  # one per task
    report = (tmp_path / "run" / "report.md").read_text()
    assert "4 steps" in report and "sized from this machine" not in report
    # the serve stage: the chat model behind `coursepkg serve`, through the openai client
    serve = figures["serve"]
    assert serve["requests"] == plan(1)["serve_requests"] == 2  # of the 3 held-out prompts
    assert serve["greedy_equal"] == 2, serve
    for kind in ("one at a time", "all at once"):
        assert 0 < serve[kind]["latency_p50"] <= serve[kind]["latency_p99"]
        assert serve[kind]["ttft_p50"] <= serve[kind]["latency_p50"] + 1e-9
    assert "**2 of 2** served answers equal" in report
    assert f"**{serve['ratio']:.2f}x**" in report


def test_a_run_that_skips_serving_says_so_in_its_report(tmp_path):
    figures = {"serve": {"skipped": "PipelineSettings.serve is False", "seconds": 0.0}}
    assert _serving_lines(figures["serve"]) == [
        "Not measured in this run (PipelineSettings.serve is False)."
    ]


def test_the_full_budget_learns_a_few_thousand_merges():
    assert 2000 <= plan(3600)["merges"] <= 4000


def test_every_generated_answer_is_right():
    tasks = chat_tasks("the lord said unto the lord and the king said unto moses " * 3)
    for question, answer in tasks["arithmetic"]:
        a, b = question.removeprefix("What is ").removesuffix("?").split(" + ")
        assert int(answer) == int(a) + int(b)
    for question, answer in tasks["spelling"]:
        assert answer.replace(" ", "") == question.split()[-1].rstrip(".")
    assert {q.split()[-1] for q, _ in tasks["spelling"]} >= {"lord.", "said.", "unto."}
    dates = dict(tasks["dates"])
    assert len(dates) == 365
    assert dates["What date comes after 31 December?"] == "1 January"
    assert dates["What date comes after 28 February?"] == "1 March"
    assert dates["What date comes after 9 May?"] == "10 May"


class _Uniform(torch.nn.Module):
    """Next-token logits all zero: every token has probability 1 / vocab."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, ids):
        return torch.zeros(*ids.shape, self.vocab)  # (B, T, V)


class _Bytes:
    """One token per byte: ids are the bytes."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")


@given(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=2, max_size=60),
    st.integers(1, 16),
)
def test_bits_per_byte_of_a_uniform_byte_model_is_eight(text, block):
    assert heldout_bits_per_byte(_Uniform(256), _Bytes(), text, block) == pytest.approx(8.0)
    # a model that spreads its guess over twice the ids pays one bit more per byte
    wider = heldout_bits_per_byte(_Uniform(512), _Bytes(), text, block)
    assert wider == pytest.approx(math.log2(512))


def _pipeline(run: Path, corpus: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = ["pipeline", "--out", str(run), "--budget", "10s", "--corpus", corpus, "--device", "cpu"]
    return subprocess.Popen(
        [sys.executable, "-m", "coursepkg.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_missing_corpus_is_named(tmp_path, capsys):
    missing = str(tmp_path / "nowhere.txt")
    assert cli.main(["pipeline", "--out", str(tmp_path / "run"), "--corpus", missing]) == 2
    err = capsys.readouterr().err
    assert "nowhere.txt" in err and "not found" in err


@pytest.mark.slow
def test_killed_between_stages_it_resumes_without_redoing_them(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text((ROOT / "coursepkg/data/tinyshakespeare.txt").read_text()[:30_000])
    run = tmp_path / "run"
    first = _pipeline(run, str(corpus))
    deadline = time.monotonic() + 600
    while not (run / "pretrain" / "done.json").exists():  # wait for the stage, then kill
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "pretraining never finished"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    done = {
        s: (run / s / "done.json").stat().st_mtime_ns
        for s in STAGES
        if (run / s / "done.json").exists()
    }
    assert {"corpus", "tokenizer", "pretrain"} <= done.keys()
    assert "report" not in done

    second = _pipeline(run, str(corpus))
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    for stage in STAGES:
        verdict = "done already, skipped" if stage in done else "running"
        assert f"{stage}: {verdict}" in out
    for stage, mtime in done.items():
        assert (run / stage / "done.json").stat().st_mtime_ns == mtime, stage
    report = (run / "report.md").read_text()
    assert "held-out bits per byte" in report and "| arithmetic |" in report
    for stage in ("pretrain", "finetune"):  # sized once, kept by the resumed run
        steps = json.loads((run / stage / "budget.json").read_text())[f"{stage}_steps"]
        assert json.loads((run / stage / "done.json").read_text())["steps"] == steps
        assert f"- {stage}: {steps} steps, sized from this machine's measured" in report
    assert "</table>" in (run / "report.html").read_text()
    trained = {
        json.loads(line)["messages"][0]["content"]
        for line in (run / "chat_data" / "train.jsonl").open()
    }
    heldout = {json.loads(line)["prompt"] for line in (run / "chat_data" / "heldout.jsonl").open()}
    assert heldout and not heldout & trained

    from coursepkg.posttrain.chat import CHAT_TOKENS
    from coursepkg.serving.http.engine import load_served_model

    served = load_served_model(run / "finetune")
    model_tok = json.loads((run / "pretrain" / "done.json").read_text())["tokenizer"]
    assert f"{model_tok['vocab_size']:,} ids, {model_tok['bytes_per_token']:.2f} held-out" in report
    assert served.chat and len(served.tokenizer) == model_tok["vocab_size"] + len(CHAT_TOKENS)
    probe = (run / "corpus" / "val.txt").read_text()[:300]
    assert served.tokenizer.decode(served.tokenizer.encode(probe)) == probe


@pytest.mark.parametrize("mode", ["gpt2", "learned"])
def test_the_model_is_trained_on_the_tokenizer_chosen(tmp_path, monkeypatch, mode):
    from coursepkg.training import pipeline

    (tmp_path / "tokenizer").mkdir()
    figures = {"bytes_per_token": 3.5, "gpt2_bytes_per_token": 4.25}
    (tmp_path / "tokenizer" / "done.json").write_text(json.dumps(figures))
    monkeypatch.setattr(pipeline, "MODEL_TOKENIZER", mode)
    spec, bpt = pipeline._model_tokenizer(tmp_path)
    if mode == "gpt2":
        assert (spec, bpt) == ("bpe", 4.25)
    else:
        assert (Path(spec), bpt) == ((tmp_path / "tokenizer").resolve(), 3.5)
