"""The text-to-chat chapter's pieces: the words for an accuracy's change, the glued figures and
the loss figure (the run itself is ``coursepkg pipeline``'s, tested in ``cli/test_pipeline.py``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coursepkg.chapters.shipped import load_results
from coursepkg.chapters.text_to_chat import (
    SIZES,
    accuracy_change,
    glued,
    loss_figure,
    nanogpt_glued,
)

accuracies = st.integers(0, 20).map(lambda n: n / 20)


@given(accuracies, accuracies)
def test_the_words_follow_the_direction_and_quote_both_accuracies(before, after):
    words = accuracy_change(before, after)
    if after > before:
        assert words == f"rose from {before:.0%} to {after:.0%}"
    elif after < before:
        assert words == f"fell from {before:.0%} to {after:.0%}"
    else:
        assert words == f"stayed at {after:.0%}"


@pytest.mark.parametrize(("before", "after"), [(-0.1, 0.5), (0.5, 1.5)])
def test_an_accuracy_outside_zero_to_one_is_named(before, after):
    with pytest.raises(ValueError, match="must be an accuracy in"):
        accuracy_change(before, after)


def _run(before: dict[str, float], after: dict[str, float], bpb: tuple[float, float]) -> dict:
    tasks = list(before)
    return {
        "sources": {"kjv": 30, "shakespeare": 50, "milton": 20},
        "exchange": {"prompt": "What date comes after 9 May?", "base": "", "chat": "10 May"},
        "figures": {
            "corpus": {"splits": {"train": {"bytes": 2_000_000}, "val": {"bytes": 300_000}}},
            "tokenizer": {
                "merges": 300,
                "trained_on_chars": 6000,
                "bytes_per_token": 2.5,
                "gpt2_bytes_per_token": 4.0,
            },
            "pretrain": {
                "parameters": 1000,
                "steps": 7,
                "val_loss": 3.0,
                "heldout_bits_per_byte": bpb[0],
            },
            "finetune": {"steps": 5, "final_loss": 1.0},
            "chat_data": {
                "tasks": {t: {"train": 40 + i, "heldout": 4} for i, t in enumerate(tasks)}
            },
            "evaluate": {
                "accuracy": {"before": before, "after": after},
                "heldout_prompts": dict.fromkeys(tasks, 4),
                "heldout_bits_per_byte": {"before": bpb[0], "after": bpb[1]},
            },
        },
    }


def test_the_glued_figures_are_the_runs_and_the_words_are_measured():
    run = _run({"dates": 0.0, "spelling": 0.25}, {"dates": 0.5, "spelling": 0.25}, (2.0, 2.5))
    figures = glued(run)
    assert all(name.startswith("tc_") for name in figures)
    assert figures["tc_change_dates"] == "rose from 0% to 50%"
    assert figures["tc_change_spelling"] == "stayed at 25%"
    assert figures["tc_train_spelling"] == 41 and figures["tc_n_dates"] == 4
    assert figures["tc_bpt_ratio"] == pytest.approx(2.5 / 4.0)
    assert figures["tc_tokens_seen"] == 7 * SIZES["batch_size"] * SIZES["block_size"]
    assert figures["tc_one_answer"] == pytest.approx(0.25)
    assert figures["tc_said_base"] == "(nothing)" and figures["tc_said_chat"] == "10 May"
    assert figures["tc_bpb_word"] == "above"  # 2.5 bits per byte after against 2.0 before
    same = glued(_run({"dates": 0.0}, {"dates": 0.0}, (2.0, 2.01)))
    assert same["tc_bpb_word"] == "about the same as"


def test_the_loss_figure_draws_each_curve_it_is_given():
    curves = {
        "pretrain": [[1, 5.0], [2, 4.0], [3, 3.5]],
        "pretrain_heldout": [[1, 5.1], [3, 3.7]],
        "finetune": [[1, 2.0], [2, 1.0]],
    }
    fig = loss_figure(curves)
    pre, fine = fig.axes
    drawn = [[list(map(list, zip(*line.get_data(), strict=True)))] for line in pre.lines]
    assert drawn == [[curves["pretrain"]], [curves["pretrain_heldout"]]]
    assert [list(line.get_ydata()) for line in fine.lines] == [[2.0, 1.0]]
    plt.close(fig)


def test_the_nanogpt_figures_are_the_shipped_runs():
    result = load_results("nanogpt")["result"]
    figures = nanogpt_glued(result)
    assert all(name.startswith("tc_nano_") for name in figures)
    base, fixed = result["runs"]["nanoGPT"], result["runs"]["ours:no-scale-no-bias"]
    assert figures["tc_nano_loss"] == base["heldout"][0]
    assert figures["tc_nano_fixed_ratio"] == pytest.approx(
        fixed["time_to_target_s"] / base["time_to_target_s"]
    )
    # what the page's prose says of them: the book's defaults end above nanoGPT, without the
    # embedding scale and biases below it, and the untrained model starts above uniform guessing
    assert figures["tc_nano_ours_loss"] > figures["tc_nano_loss"] > figures["tc_nano_fixed_loss"]
    assert figures["tc_nano_init_ours"] > figures["tc_nano_uniform"]
    assert figures["tc_nano_std_ours"] > figures["tc_nano_std_theirs"]
