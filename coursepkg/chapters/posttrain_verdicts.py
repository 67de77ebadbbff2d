"""The figures and verdicts chapter 20 (post-training) glues into its prose, computed from its run.

The page trains with one call (``post_training_run``) and glues every number its sentences quote;
the arithmetic that turns the run's measurements into those numbers and into the words the
sentences use ("raised", "within 5 points of") lives here, so that the page's visible code is the
method. :func:`figures` returns every glued name with its value; the page glues them in one loop.

Fractions are glued as percentages (0.25 -> 25.0); a verdict is a word or a clause chosen by
comparing two measurements with a stated tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .measure import verdict

__all__ = [
    "LORA_TOLERANCE",
    "WINDOW",
    "compared",
    "figures",
    "first_and_last",
    "grpo_keys",
    "window_mean",
]

#: Points: the gap between LoRA's and the full fine-tune's accuracy the page calls "as well as".
LORA_TOLERANCE = 5
#: Steps: the rewards at the start and the end of a GRPO run are the means of this many steps.
WINDOW = 10

Figures = dict[str, Any]


def compared(
    a: float,
    b: float,
    tol: float,
    words: Sequence[str] = ("lower than", "about the same as", "higher than"),
) -> str:
    """``a`` against ``b`` in words: ``words[1]`` when they are within ``tol``."""
    return words[0] if a < b - tol else words[2] if a > b + tol else words[1]


def window_mean(values: Sequence[float], start: int, n: int = WINDOW) -> float:
    """The mean of ``n`` values from ``start`` (fewer at the end)."""
    part = values[start : start + n]
    return sum(part) / len(part)


def first_and_last(rewards: Sequence[float]) -> tuple[float, float]:
    """The mean reward of a run's first and of its last :data:`WINDOW` steps."""
    return window_mean(rewards, 0), window_mean(rewards, len(rewards) - WINDOW)


def _percent(fraction: float) -> float:
    return 100 * float(fraction)


def _ratio(a: float, b: float) -> float:
    """a / b, infinite when b is 0 (a drift of 0 nats: nothing moved)."""
    return float(a) / float(b) if b else math.inf


def _base_and_sft(sft: dict, settings: dict, held_out: Sequence[str]) -> Figures:
    def stopped(answers: Sequence[str]) -> int:  # answers that ended themselves
        return sum(len(a) <= len(w) for a, w in zip(answers, held_out, strict=True))

    full = sft["full_accuracies"]
    return {
        "n_parameters": sft["parameters"],
        "pretrain_steps": settings["pretrain_steps"],
        "base_plain": _percent(sft["base_plain_accuracy"]),
        "base_chat": _percent(sft["base_chat_accuracy"]),
        "full_accuracy": _percent(sft["full_accuracy"]),
        "full_min": _percent(min(full)),
        "full_max": _percent(max(full)),
        "n_seeds": len(full),
        "sft_gain": _percent(sft["full_accuracy"] - sft["base_chat_accuracy"]),
        "sft_steps": settings["sft_steps"],
        "sft_verdict": compared(
            sft["full_accuracy"],
            sft["base_chat_accuracy"],
            0.02,
            ("lowered", "left unchanged", "raised"),
        ),
        "n_shown": len(held_out),
        "base_stopped": stopped(sft["base_answers"]),
        "sft_stopped": stopped(sft["full_answers"]),
        "sft_right": sum(a == w[::-1] for a, w in zip(sft["full_answers"], held_out, strict=True)),
    }


def _lora_story(sft: dict, gap: float) -> str:
    lows, highs = ([f(sft[f"{k}_accuracies"]) for k in ("lora", "full")] for f in (min, max))
    if gap <= LORA_TOLERANCE:
        return (
            "with a tenth of the trainable numbers LoRA learned this task about as well as "
            "a fine-tune of every weight"
        )
    if lows[0] > highs[1] or lows[1] > highs[0]:  # one side wholly past the other
        side = "above" if lows[0] > highs[1] else "below"
        return (
            f"every LoRA seed ended {side} every full fine-tuning seed: at this learning "
            "rate and number of steps the two recipes differ"
        )
    return (
        "the seeds disagree: the two ranges overlap, so another seed could reverse the "
        "order, and this run cannot say whether LoRA matches a fine-tune of every weight "
        "here, only that it learns the format too"
    )


def _lora(sft: dict, settings: dict) -> Figures:
    gap = 100 * abs(float(sft["lora_accuracy"] - sft["full_accuracy"]))
    time_ratio = float(sft["lora_seconds"] / sft["full_seconds"])
    words = ("LoRA was faster", "about as fast", "LoRA was slower here")
    return {
        "lora_r": settings["lora_r"],
        "lora_trainable": sft["lora_trainable"],
        "lora_closed_form": sft["lora_closed_form"],
        "full_trainable": sft["full_trainable"],
        "lora_share": _percent(sft["lora_trainable"] / sft["full_trainable"]),
        "lora_accuracy": _percent(sft["lora_accuracy"]),
        "lora_min": _percent(min(sft["lora_accuracies"])),
        "lora_max": _percent(max(sft["lora_accuracies"])),
        "lora_tolerance": LORA_TOLERANCE,
        "lora_gap": gap,
        "lora_vs_full": compared(sft["lora_accuracy"], sft["full_accuracy"], 0.005),
        "lora_gap_verdict": f"within {LORA_TOLERANCE} points of"
        if gap <= LORA_TOLERANCE
        else f"more than {LORA_TOLERANCE} points away from",
        "lora_gain": _percent(sft["lora_accuracy"] - sft["base_chat_accuracy"]),
        "lora_story": _lora_story(sft, gap),
        "lora_time_ratio": time_ratio,
        "lora_time_verdict": verdict(time_ratio, 1.15, words),
    }


def _kl_trend(kls: Sequence[float]) -> str:
    if all(a > b for a, b in zip(kls, kls[1:], strict=False)):
        return (
            "fell as beta grew, as the loss predicts: a larger beta holds the policy closer "
            "to the reference"
        )
    if _ratio(kls[0], kls[-1]) > 1:
        return (
            "was larger at the smallest beta than at the largest, as the loss predicts, "
            "though not smaller at every step between"
        )
    return (
        "did not fall as beta grew, though the loss predicts that a larger beta holds the "
        "policy closer (one short run each)"
    )


def _dpo(dpo: dict, sft: dict, settings: dict) -> Figures:
    betas = settings["betas"]
    rows = [dpo[f"beta={beta}"] for beta in betas]
    kls = [row["kl"] for row in rows]
    pref_gain = 100 * float(min(row["preference"] for row in rows) - dpo["reference_preference"])
    best = max(row["accuracy"] for row in rows)
    out: Figures = {
        "weak_steps": settings["weak_sft_steps"],
        "weak_accuracy": _percent(sft["weak_accuracy"]),
        "ref_preference": _percent(dpo["reference_preference"]),
        "dpo_kl_fall": _ratio(kls[0], kls[-1]),  # robustness.py: stays above 1
        "kl_trend": _kl_trend(kls),
        "dpo_pref_gain": pref_gain,
        "pref_verdict": "raised" if pref_gain > 2 else "did not reliably raise",
        "rej_change_1": float(rows[1]["rejected_change"]),
        "cho_change_1": float(rows[1]["chosen_change"]),
        "chosen_fell": f"{sum(row['chosen_change'] < 0 for row in rows)} of the {len(betas)}",
        "dpo_best_accuracy": _percent(best),
        "dpo_acc_verdict": compared(best, sft["weak_accuracy"], 0.02),
    }
    for i, (beta, row) in enumerate(zip(betas, rows, strict=True)):
        out |= {
            f"dpo_pref_{i}": _percent(row["preference"]),
            f"dpo_kl_{i}": float(row["kl"]),
            f"dpo_beta_{i}": beta,
        }
    return out


def grpo_keys(settings: dict) -> list[str]:
    """The names of the chapter's GRPO runs in the run's ``"grpo"`` entry, in settings order."""
    return [f"P={p},G={g},kl={k}" for p, g, k in settings["grpo_runs"]]


def _grpo(grpo: dict, sft: dict, settings: dict) -> Figures:
    (p_a, g_a, kl_a), (p_b, g_b, _), _ = settings["grpo_runs"]
    if p_a * g_a != p_b * g_b:
        raise ValueError("the two group sizes must spend the same samples a step")
    a, b, c = (grpo[key] for key in grpo_keys(settings))
    start = sft["grpo_start_accuracy"]
    out: Figures = {
        "p_a": p_a,
        "g_a": g_a,
        "p_b": p_b,
        "g_b": g_b,
        "kl_a": kl_a,
        "grpo_steps": settings["grpo_steps"],
        "samples": p_a * g_a,
        "start_chunk": settings["grpo_sft_chunk"],
        "start_target": _percent(settings["grpo_start_accuracy"]),
        "start_steps": sft["grpo_start_steps"],
        "start_accuracy": _percent(start),
        "window": WINDOW,
        "n_grpo_seeds": len(a["accuracies"]),
    }
    for tag, r in zip("abc", (a, b, c), strict=True):
        first, last = first_and_last(r["rewards"])
        out |= {
            f"grpo_first_{tag}": _percent(first),
            f"grpo_last_{tag}": _percent(last),
            f"grpo_acc_{tag}": _percent(r["accuracy"]),
            f"grpo_kl_{tag}": float(r["heldout_kl"]),
        }
    first, last = first_and_last(a["rewards"])
    kl_a0 = float(a["heldout_kls"][0])  # the seed of the run without the KL term
    out |= {
        "grpo_min_a": _percent(min(a["accuracies"])),
        "grpo_max_a": _percent(max(a["accuracies"])),
        "grpo_change": _percent(a["accuracy"] - start),
        "grpo_min_gain": _percent(min(a["accuracies"]) - start),  # robustness.py: >= 5
        "grpo_reward_rise": _percent(last - first),  # robustness.py: >= 10
        "grpo_seeds_verdict": "every seed ended above the start"
        if min(a["accuracies"]) > start
        else "not every seed ended above the start",
        # a group teaches when it holds both outcomes
        "informative": _percent(1 - start**g_a - (1 - start) ** g_a),
        "grpo_kl_a0": kl_a0,
        "nokl_kl_ratio": _ratio(c["heldout_kl"], kl_a0),  # robustness.py: > 1
        "reward_a_verdict": compared(last, first, 0.02, ("fell", "stayed flat", "rose")),
        "acc_a_verdict": compared(a["accuracy"], start, 0.02),
        "group_verdict": compared(b["accuracy"], a["accuracy"], 0.03),
        "nokl_kl_verdict": compared(
            c["heldout_kl"], kl_a0, 0.02, ("smaller than", "about the same as", "larger than")
        ),
        "nokl_acc_verdict": compared(c["accuracy"], a["accuracy"], 0.03),
    }
    return out


def figures(run: dict, held_out: Sequence[str]) -> Figures:
    """Every number and verdict chapter 20 glues, by its glue name.

    Args:
        run: what ``post_training_run`` returned (``"sft"``, ``"dpo"``, ``"grpo"``,
            ``"settings"``).
        held_out: the held-out words whose answers the page shows (the first few), in the
            order of the run's ``base_answers`` and ``full_answers``.

    Returns:
        ``{glue name: value}``: numbers (fractions as percentages) and verdicts (words).
    """
    sft, settings = run["sft"], run["settings"]
    return (
        _base_and_sft(sft, settings, held_out)
        | _lora(sft, settings)
        | _dpo(run["dpo"], sft, settings)
        | _grpo(run["grpo"], sft, settings)
    )
