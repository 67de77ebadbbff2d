"""Tests of coursepkg.chapters.posttrain_verdicts: every name chapter 20 quotes is glued (by
figures() or by the page itself), the robustness script's names among them, and the verdicts and
windowed means against their definitions on a made-up run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coursepkg.chapters.posttrain_verdicts import (
    WINDOW,
    compared,
    figures,
    first_and_last,
    grpo_keys,
)

PAGE = Path(__file__).parents[2] / "book" / "20_post_training.md"
SETTINGS = dict(
    pretrain_steps=6,
    sft_steps=3,
    lora_r=2,
    betas=[0.1, 0.5, 2.0],
    weak_sft_steps=2,
    grpo_start_accuracy=0.3,
    grpo_sft_chunk=1,
    grpo_steps=30,
    grpo_runs=[[4, 2, 0.04], [2, 4, 0.04], [4, 2, 0.0]],
)
HELD_OUT = ["abc", "ba"]


def _run(lora=(0.5, 0.7), kls=(0.3, 0.2, 0.1)):
    sft = dict(
        parameters=1000,
        base_plain_accuracy=0.9,
        base_chat_accuracy=0.1,
        full_accuracy=0.6,
        full_accuracies=[0.5, 0.7],
        base_answers=["cbaxx", "ab"],
        full_answers=["cba", "ab"],
        full_trainable=1000,
        lora_trainable=100,
        lora_closed_form=100,
        lora_accuracy=sum(lora) / 2,
        lora_accuracies=list(lora),
        lora_seconds=2.0,
        full_seconds=1.0,
        weak_accuracy=0.2,
        grpo_start_accuracy=0.3,
        grpo_start_steps=12,
    )
    dpo = {"reference_preference": 0.4}
    for i, beta in enumerate(SETTINGS["betas"]):
        dpo[f"beta={beta}"] = dict(
            preference=0.6 + 0.1 * i,
            kl=kls[i],
            accuracy=0.25,
            rejected_change=-1.0,
            chosen_change=0.1 - 0.1 * i,
        )
    rewards = [0.1] * WINDOW + [0.5] * 10 + [0.9] * WINDOW  # first window 0.1, last 0.9
    grpo = {
        key: dict(
            rewards=rewards,
            accuracy=0.5,
            accuracies=[0.4, 0.6],
            heldout_kl=0.2,
            heldout_kls=[0.1, 0.3],
        )
        for key in grpo_keys(SETTINGS)
    }
    return {"settings": SETTINGS, "sft": sft, "dpo": dpo, "grpo": grpo}


def test_every_name_the_page_quotes_is_glued():
    text = PAGE.read_text()
    quoted = set(re.findall(r"\{glue:text\}`([a-z_0-9]+)", text))
    on_page = set(re.findall(r'glue\("([a-z_0-9]+)"', text))
    glued = set(figures(_run(), HELD_OUT))
    assert quoted - on_page <= glued, sorted(quoted - on_page - glued)
    robust = {
        "base_plain",
        "sft_gain",
        "lora_gain",
        "dpo_pref_gain",
        "dpo_kl_fall",
        "nokl_kl_ratio",
        "grpo_min_gain",
        "grpo_reward_rise",
        "base_chat",
    }
    assert robust <= glued


def test_the_figures_follow_their_definitions():
    out = figures(_run(), HELD_OUT)
    assert out["sft_gain"] == pytest.approx(50.0) and out["sft_verdict"] == "raised"
    assert (out["base_stopped"], out["sft_stopped"], out["sft_right"]) == (1, 2, 2)
    assert out["lora_gap"] == pytest.approx(0.0) and "within 5 points" in out["lora_gap_verdict"]
    assert out["dpo_kl_fall"] == pytest.approx(3.0) and out["kl_trend"].startswith("fell")
    assert out["dpo_pref_gain"] == pytest.approx(20.0) and out["chosen_fell"] == "1 of the 3"
    assert (out["grpo_first_a"], out["grpo_last_a"]) == pytest.approx((10.0, 90.0))
    assert out["grpo_reward_rise"] == pytest.approx(80.0) and out["reward_a_verdict"] == "rose"
    assert out["informative"] == pytest.approx(100 * (1 - 0.3**2 - 0.7**2))
    assert out["nokl_kl_ratio"] == pytest.approx(2.0)
    assert out["grpo_seeds_verdict"] == "every seed ended above the start"


def test_the_lora_story_and_the_kl_trend_take_each_branch():
    apart = figures(_run(lora=(0.1, 0.2)), HELD_OUT)["lora_story"]
    assert apart.startswith("every LoRA seed ended below")
    overlap = figures(_run(lora=(0.3, 0.65)), HELD_OUT)["lora_story"]
    assert overlap.startswith("the seeds disagree")
    assert figures(_run(kls=(0.3, 0.4, 0.1)), HELD_OUT)["kl_trend"].startswith("was larger")
    assert figures(_run(kls=(0.1, 0.2, 0.3)), HELD_OUT)["kl_trend"].startswith("did not fall")
    assert figures(_run(kls=(0.3, 0.2, 0.0)), HELD_OUT)["dpo_kl_fall"] == float("inf")


def test_compared_and_the_windows():
    words = ("below", "level", "above")
    assert [compared(x, 1.0, 0.1, words) for x in (0.8, 0.95, 1.1, 1.2)] == [
        "below",
        "level",
        "level",
        "above",
    ]
    assert first_and_last([1.0] * 3 + [0.0] * (2 * WINDOW)) == pytest.approx((0.3, 0.0))
