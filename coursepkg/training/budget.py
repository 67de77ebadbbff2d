"""Sizing ``coursepkg pipeline``'s training to its time budget: the machine measured, then steps.

The costs are measured on this machine, at the moment the run needs them (a loaded machine
measures slower and plans fewer steps): one training step of the pipeline's model at its batch
and window (:func:`step_seconds`), one fine-tuning step at the chat examples' length, and one
greedy token (:func:`token_seconds`) for the evaluation's answers. :func:`size_steps` then
spends what is left of the budget: what the later stages need is set aside, the rest split
between pretraining and fine-tuning. Pretraining is sized when it starts and fine-tuning again
when it starts, from the time really left, so that an estimate that was off is corrected once.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "TrainingCosts",
    "fixed_or",
    "measure",
    "parse_budget",
    "plan",
    "size_finetuning",
    "size_pretraining",
    "size_steps",
    "step_seconds",
    "token_seconds",
]

#: Pretraining's share of the time left for the two training stages (fine-tuning gets the rest).
PRETRAIN_SHARE = 0.7
#: What a training step costs in ``train`` beyond its forward, backward and update (its
#: held-out evaluations every tenth of the run, checkpoints, the log): measured 10-20% here.
LOOP_OVERHEAD = 1.15
MIN_STEPS = 3
#: A chat example's length in tokens (a question, its answer and the markers), the greedy
#: tokens the evaluation asks per answer, and the seconds of loading models and writing files.
CHAT_LENGTH, ANSWER_TOKENS, SETTLE = 24, 8, 3.0
#: The serve stage: seconds to start ``coursepkg serve`` in a process of its own (an estimate:
#: its imports and the model's loading), and the rounds of its requests of each kind.
SERVER_START, SERVE_ROUNDS = 10.0, 2
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """``"90s"``, ``"5m"``, ``"1h"`` or ``"1.5h"`` (a bare number is seconds) as seconds.

    Raises:
        ValueError: text that is not a positive number with an optional s/m/h unit.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"budget must be a positive time such as 90s, 5m or 1h, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def plan(budget: float) -> dict[str, Any]:
    """Every stage's size for a run of ``budget`` seconds but the training steps, which
    :func:`size_steps` sets from the machine's measured costs. Budgets under a minute are smoke
    runs (a tiny batch and window).

    Returns:
        merges, tokenizer_chars, pretrain_chars (the most; the steps may need less),
        eval_chars, model, block_size, batch_size, conversations and heldout (per task),
        serve_requests and serve_tokens (the serve stage's held-out prompts and each one's
        token limit).
    """
    large, smoke = budget >= 1800, budget < 60
    model = (
        dict(d_model=128, n_heads=4, d_ff=512, n_layers=4)
        if large
        else dict(d_model=64, n_heads=4, d_ff=256, n_layers=2)
    )
    return {
        "merges": int(min(4000, max(50, budget))),
        "tokenizer_chars": int(min(2_000_000, max(20_000, budget * 500))),
        "pretrain_chars": int(min(20_000_000, max(20_000, budget * 4000))),
        "eval_chars": int(min(200_000, max(400, budget * 60))),
        "model": {**model, "positional": "rope", "activation": "gelu", "dropout": 0.0},
        "block_size": 32 if smoke else 128 if large else 64,
        "batch_size": 2 if smoke else 16,
        "conversations": int(min(2000, max(8, budget))),
        "heldout": int(min(100, max(2, budget / 20))),
        "serve_requests": int(min(16, max(2, budget / 60))),
        "serve_tokens": 24,
    }


def _model(options: dict[str, Any], vocab_size: int, max_len: int) -> Any:
    from coursepkg import DecoderOnlyLM, TransformerConfig
    from coursepkg.training.settings import GPT_DEFAULTS

    config = {**GPT_DEFAULTS, **options, "vocab_size": vocab_size, "max_len": max_len}
    return DecoderOnlyLM(TransformerConfig.from_dict(config))


def step_seconds(
    options: dict[str, Any], vocab_size: int, batch: int, length: int, repeats: int = 3
) -> float:
    """Seconds of one training step (forward, loss, backward, AdamW update) of a fresh model.

    Args:
        options: the model's options (``coursepkg train --model``'s).
        vocab_size: V.
        batch, length: the step's windows, (B, L).
        repeats: timed steps after one untimed (the median is returned).
    """
    from coursepkg.optim import AdamW, param_groups

    torch.manual_seed(0)
    model = _model(options, vocab_size, length).train()
    optimizer = AdamW(param_groups(model, 0.1), lr=1e-3)
    ids = torch.randint(vocab_size, (batch, length + 1))  # (B, L + 1)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        logits = model(ids[:, :-1])  # (B, L, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def token_seconds(options: dict[str, Any], vocab_size: int, length: int, new: int = 8) -> float:
    """Seconds per greedy token of a fresh model answering a prompt of ``length`` tokens (the
    evaluation's ``generate``, prompt included)."""
    from coursepkg.serving.generate import generate

    model = _model(options, vocab_size, length + new).eval()
    prompt = torch.zeros(1, length, dtype=torch.long)  # (1, L)
    generate(model, prompt, 2)  # untimed: first calls allocate
    start = time.perf_counter()
    generate(model, prompt, new)
    return (time.perf_counter() - start) / new


@dataclass(frozen=True)
class TrainingCosts:
    """What the stages still to run cost on this machine, in seconds.

    Attributes:
        pretrain_step: one pretraining step (:func:`step_seconds`), 0 when pretraining is done.
        finetune_step: one fine-tuning step.
        fixed: everything else still to run whose size the budget does not change (tokenising
            the text, the evaluation's answers and bits per byte, the report).
    """

    pretrain_step: float
    finetune_step: float
    fixed: float


def size_steps(left: float, costs: TrainingCosts) -> dict[str, int]:
    """The pretraining and fine-tuning steps that spend ``left`` seconds.

    What the fixed work needs is set aside; :data:`PRETRAIN_SHARE` of the rest goes to
    pretraining (unless it is done), the remainder to fine-tuning, each step costing
    :data:`LOOP_OVERHEAD` times its measured time. A stage gets at least :data:`MIN_STEPS`
    steps, so a budget too small for the work runs a smoke run past it.

    Args:
        left: seconds left in the budget.
        costs: the measured costs.

    Returns:
        ``{"pretrain_steps": ..., "finetune_steps": ...}`` (pretraining 0 when it is done).
    """
    for name in ("pretrain_step", "finetune_step", "fixed"):
        if not getattr(costs, name) >= 0:
            raise ValueError(f"costs.{name} must be >= 0 seconds, got {getattr(costs, name)}")
    training = max(0.0, left - costs.fixed)
    share = PRETRAIN_SHARE if costs.pretrain_step > 0 else 0.0
    pretrain = share * training / (LOOP_OVERHEAD * costs.pretrain_step) if share else 0
    finetune = (1 - share) * training / (LOOP_OVERHEAD * max(costs.finetune_step, 1e-9))
    return {
        "pretrain_steps": max(MIN_STEPS, int(pretrain)) if share else 0,
        "finetune_steps": max(MIN_STEPS, int(finetune)),
    }


def measure(sizes: dict[str, Any], tokenizer: Any, sample: str) -> dict[str, float]:
    """This machine's costs for a run of :func:`plan`'s ``sizes``, in seconds.

    Args:
        sizes: the run's plan (model, batch, window).
        tokenizer: the model's tokenizer (its size; its encoding speed on ``sample``).
        sample: some of the training text.

    Returns:
        ``pretrain_step``, ``finetune_step`` (4 more ids: the chat tokens), ``token`` (one
        greedy token) and ``encode_char`` (tokenising one character).
    """
    vocab, batch, model = len(tokenizer), sizes["batch_size"], sizes["model"]
    start = time.perf_counter()
    tokenizer.encode(sample)
    encode_char = (time.perf_counter() - start) / max(1, len(sample))
    return {
        "pretrain_step": step_seconds(model, vocab, batch, sizes["block_size"]),
        "finetune_step": step_seconds(model, vocab + 4, batch, CHAT_LENGTH),
        "token": token_seconds(model, vocab + 4, CHAT_LENGTH),
        "encode_char": encode_char,
    }


def _evaluation_seconds(sizes: dict[str, Any], measured: dict[str, float], bpt: float) -> float:
    """The evaluation: two models' greedy answers to the held-out prompts (3 tasks), and bits
    per byte of the held-out text (a forward pass: a third of a training step per window)."""
    answers = 2 * 3 * sizes["heldout"] * ANSWER_TOKENS * measured["token"]
    windows = sizes["eval_chars"] / bpt / (sizes["batch_size"] * sizes["block_size"])
    return answers + 2 * max(1.0, windows) * measured["pretrain_step"] / 3


def _serving_seconds(sizes: dict[str, Any], measured: dict[str, float]) -> float:
    """The serve stage: a server started, the answers generated offline once, then
    :data:`SERVE_ROUNDS` rounds of them one at a time and all at once (each counted as one at a
    time, at most ``serve_tokens`` greedy tokens an answer: an upper bound)."""
    answers = sizes["serve_requests"] * sizes["serve_tokens"] * measured["token"]
    return SERVER_START + answers * (1 + 2 * SERVE_ROUNDS)


def size_pretraining(
    left: float, sizes: dict[str, Any], measured: dict[str, float], bpt: float
) -> dict[str, Any]:
    """Pretraining's steps and text, and the plan of every later stage, for ``left`` seconds.

    The text is what the steps read once over and a tenth (``bpt`` bytes per token), at least
    20,000 characters and at most the plan's; tokenising it is part of the cost.

    Returns:
        ``pretrain_steps``, ``pretrain_chars``, ``finetune_steps`` (the plan's; fine-tuning is
        sized again when it starts) and ``seconds`` (each stage's planned seconds).
    """
    batch = sizes["batch_size"] * sizes["block_size"]
    evaluation = _evaluation_seconds(sizes, measured, bpt)
    serving = _serving_seconds(sizes, measured)
    after = evaluation + serving + SETTLE + measured["pretrain_step"]  # + its bits per byte
    costs = TrainingCosts(measured["pretrain_step"], measured["finetune_step"], after)
    steps = size_steps(left, costs)["pretrain_steps"]
    chars = int(min(sizes["pretrain_chars"], max(20_000, 1.1 * steps * batch * bpt)))
    encoding = chars * measured["encode_char"]
    steps = size_steps(
        left, TrainingCosts(costs.pretrain_step, costs.finetune_step, after + encoding)
    )
    pre = steps["pretrain_steps"] * LOOP_OVERHEAD * costs.pretrain_step + encoding
    fine = steps["finetune_steps"] * LOOP_OVERHEAD * costs.finetune_step
    seconds = {"pretrain": pre, "finetune": fine, "evaluate": evaluation, "serve": serving}
    seconds["other"] = SETTLE
    return {**steps, "pretrain_chars": chars, "seconds": seconds}


def size_finetuning(
    left: float, sizes: dict[str, Any], measured: dict[str, float], bpt: float
) -> dict[str, Any]:
    """Fine-tuning's steps for the ``left`` seconds really left when it starts.

    Returns:
        ``finetune_steps`` and ``seconds`` (fine-tuning's, the evaluation's and the serve
        stage's planned).
    """
    evaluation = _evaluation_seconds(sizes, measured, bpt)
    serving = _serving_seconds(sizes, measured)
    costs = TrainingCosts(0.0, measured["finetune_step"], evaluation + serving + SETTLE)
    steps = size_steps(left, costs)["finetune_steps"]
    fine = steps * LOOP_OVERHEAD * costs.finetune_step
    seconds = {"finetune": fine, "evaluate": evaluation, "serve": serving}
    return {"finetune_steps": steps, "seconds": seconds}


def fixed_or(
    sizes: dict[str, Any], stage: str, size: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``stage``'s sizing: the steps ``sizes`` fixes (``pretrain_steps``, ``finetune_steps``: a
    run that is the same on every machine, the book's), else ``size()`` (measured, sized).

    Args:
        sizes: the run's plan (:func:`plan`), with the fixed steps when there are any.
        stage: ``"pretrain"`` or ``"finetune"``.
        size: what sizes the stage from the machine.

    Returns:
        ``<stage>_steps``, ``pretrain_chars`` and ``seconds`` (None for fixed steps: no plan).
    """
    key = f"{stage}_steps"
    if key not in sizes:
        return size()
    return {key: sizes[key], "pretrain_chars": sizes["pretrain_chars"], "seconds": {stage: None}}
