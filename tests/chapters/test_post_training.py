"""The post-training chapter's runs (:mod:`coursepkg.chapters.post_training`): the task's pieces as
properties, and the whole run with a step or two per stage."""

from __future__ import annotations

import copy

import pytest
import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.chapters.post_training import (
    ALPHABET,
    LENGTHS,
    SETTINGS,
    accuracy,
    answers_of,
    chat_prompt,
    conversation,
    near_miss,
    post_training_run,
    response_kl,
    reversal_reward,
    task_tokenizer,
    word_split,
)
from coursepkg.posttrain.chat import END_OF_TURN, encode_chat
from coursepkg.posttrain.packing import pad_batch

TINY = dict(
    n_test=8,
    pretrain_steps=2,
    sft_steps=2,
    sft_seeds=[0, 1],
    weak_sft_steps=1,
    betas=[0.5],
    dpo_steps=2,
    dpo_pairs=8,
    grpo_sft_chunk=2,
    grpo_sft_max=2,
    grpo_steps=2,
    grpo_seeds=[0, 1],
    grpo_runs=[[2, 2, 0.04], [2, 2, 0.0]],
)


@pytest.fixture(scope="module")
def tokenizer():
    return task_tokenizer()


def tiny_model(seed: int = 0) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=260, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32, dropout=0.0
    )
    return DecoderOnlyLM(config).eval()


def test_a_words_letters_are_its_ids_and_chat_tokens_are_one_id_each(tokenizer):
    assert tokenizer.encode("abcde") == [ord(c) for c in "abcde"]
    ids = tokenizer.encode("<|user|>reverse ab<|end|>")
    assert len(ids) == 1 + len("reverse ab") + 1 and min(ids[0], ids[-1]) >= 256


def test_the_split_is_disjoint_complete_and_seeded():
    train, test = word_split(50, seed=3)
    assert len(test) == 50 and not set(train) & set(test)
    assert len(train) + len(test) == sum(len(ALPHABET) ** n for n in LENGTHS)
    assert word_split(50, seed=3) == (train, test) != word_split(50, seed=4)


def test_a_near_miss_is_wrong_and_as_long_as_the_answer():
    generator = torch.Generator().manual_seed(0)
    train, _ = word_split(0)
    for word in train[:300] + ["aaa", "bbbbb"]:
        wrong = near_miss(word, generator)
        assert wrong != word[::-1] and len(wrong) == len(word)


def test_the_reward_is_one_only_for_the_reversal_closed_by_end_of_turn(tokenizer):
    reward = reversal_reward(tokenizer)
    prompt = chat_prompt(tokenizer, "abcd")
    end = tokenizer.encode(END_OF_TURN)
    assert reward(prompt, tokenizer.encode("dcba") + end) == 1.0
    assert reward(prompt, tokenizer.encode("dcba")) == 0.0  # not finished
    assert reward(prompt, tokenizer.encode("dcab") + end) == 0.0
    assert reward(prompt, end) == 0.0
    with pytest.raises(ValueError, match="asks for no reversal"):
        reward(tokenizer.encode("hello"), end)


def test_answers_stop_at_end_of_turn_and_accuracy_counts_exact_answers(tokenizer):
    model = tiny_model()
    words = ["abc", "abcd", "cab"]
    answers = answers_of(model, tokenizer, words)
    assert len(answers) == 3 and all(END_OF_TURN not in a for a in answers)
    expected = sum(a == w[::-1] for a, w in zip(answers, words, strict=True)) / 3
    assert accuracy(model, tokenizer, words) == expected


def test_the_drift_is_zero_against_itself_and_positive_after_a_change(tokenizer):
    model = tiny_model()
    end = tokenizer.encode(END_OF_TURN)[0]
    batch = pad_batch([encode_chat(tokenizer, conversation(w)) for w in ("abc", "dcbae")], end)
    assert response_kl(model, model, batch) == pytest.approx(0.0, abs=1e-6)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.lm_head.weight.add_(0.5 * torch.randn_like(moved.lm_head.weight))
    assert response_kl(moved, model, batch) > 1e-3


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_run_measures_every_stage_and_reuses_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    run = post_training_run(cache="save", **TINY)
    sft = run["sft"]
    assert sft["lora_trainable"] == sft["lora_closed_form"] < sft["full_trainable"]
    assert len(sft["pretrain_loss"]) == 2 and len(sft["full_loss"]) == 2
    for key in ("base_plain_accuracy", "base_chat_accuracy", "full_accuracy", "lora_accuracy"):
        assert 0.0 <= sft[key] <= 1.0
    for kind in ("full", "lora"):  # one accuracy per seed, and their mean
        assert len(sft[f"{kind}_accuracies"]) == 2
        assert sft[f"{kind}_accuracy"] == pytest.approx(sum(sft[f"{kind}_accuracies"]) / 2)
    dpo = run["dpo"]["beta=0.5"]
    assert len(dpo["train_margins"]) == 2 and dpo["kl"] >= 0.0
    # GRPO starts after at most grpo_sft_max more SFT steps, whole chunks of them
    assert run["sft"]["grpo_start_steps"] in (TINY["weak_sft_steps"], TINY["weak_sft_steps"] + 2)
    assert 0.0 <= run["sft"]["grpo_start_accuracy"] <= 1.0
    grpo = run["grpo"]["P=2,G=2,kl=0.04"]
    assert len(grpo["rewards"]) == 2 and all(0.0 <= r <= 1.0 for r in grpo["rewards"])
    assert len(grpo["accuracies"]) == 2  # the first run once per seed, the others once
    assert grpo["accuracy"] == pytest.approx(sum(grpo["accuracies"]) / 2)
    assert len(run["grpo"]["P=2,G=2,kl=0.0"]["accuracies"]) == 1
    assert post_training_run(cache="reuse", **TINY) == run
    assert len(list(tmp_path.glob("posttrain-*.pt"))) == 1


def test_an_unknown_setting_is_named():
    with pytest.raises(ValueError, match="unknown settings.*'steps'"):
        post_training_run(steps=3)
    assert "grpo_runs" in SETTINGS
