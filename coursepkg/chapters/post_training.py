"""The post-training chapter's runs: a tiny model that reverses words, from base model to assistant.

The task is small enough for a CPU and every answer can be checked: the user writes
``reverse abc`` and the right answer is ``cba`` (words of 3 to 5 letters over ``a`` to ``e``).
The tokenizer is byte-level (one id per character) plus the chat template's four special tokens,
so a word's letters are its tokens.

:func:`post_training_run` runs the whole chapter once and keeps its numbers with
:mod:`coursepkg.chapters.run_cache`:

1. **pre-training**: the base model learns the plain text ``reverse abc: cba`` (no chat tokens);
2. **SFT**, from the base: the same task as a conversation, every weight trained, and again with
   LoRA adapters only;
3. **DPO**, from a briefly fine-tuned model, on pairs whose rejected answer swaps two letters of
   the right one, at several betas;
4. **GRPO**, from that model fine-tuned further until it is right about a third of the time, with
   the exact-match reward, at two group sizes and without the KL penalty.

Dimension legend: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import copy
import itertools
import re
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import TransformerConfig
from ..decoder_only import DecoderOnlyLM
from ..posttrain.chat import END_OF_TURN, ChatExample, encode_chat, render_chat, with_chat_tokens
from ..posttrain.dpo import (
    PreferencePair,
    dpo_step,
    encode_preference,
    frozen_copy,
    sequence_logprobs,
)
from ..posttrain.grpo import grpo_step
from ..posttrain.lora import add_lora, lora_parameter_count
from ..posttrain.packing import Batch, pad_batch
from ..posttrain.sft import sft_step
from ..tokenizer import Tokenizer
from .run_cache import cache_file, check_cache_mode, reuse_run, save_run

__all__ = [
    "ALPHABET",
    "LENGTHS",
    "LORA_TARGETS",
    "MODEL",
    "SETTINGS",
    "accuracy",
    "answers_of",
    "chat_prompt",
    "conversation",
    "near_miss",
    "plain_text",
    "post_training_run",
    "response_kl",
    "reversal_reward",
    "task_tokenizer",
    "word_split",
]

#: The letters words are made of.
ALPHABET = "abcde"
#: The word lengths.
LENGTHS = (3, 4, 5)
#: The model: today's block (RMSNorm, RoPE, SwiGLU), 2 layers of width 64.
MODEL: dict[str, Any] = dict(
    d_model=64,
    n_heads=4,
    d_ff=128,
    n_layers=2,
    dropout=0.0,
    max_len=32,
    norm_first=True,
    norm="rmsnorm",
    positional="rope",
    activation="swiglu",
    bias=False,
)
#: The layers LoRA adapts: every linear layer of every block.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2", "linear3")


def task_tokenizer() -> Tokenizer:
    """One id per byte (0-255) and the chat tokens (256-259): a word's letters are its ids."""
    return with_chat_tokens(Tokenizer({i: bytes([i]) for i in range(256)}, []))


def word_split(n_test: int = 200, seed: int = 0) -> tuple[list[str], list[str]]:
    """Every word of :data:`LENGTHS` letters over :data:`ALPHABET`, shuffled, split in two.

    Args:
        n_test: how many words are held out (never trained on).
        seed: the shuffle's seed.

    Returns:
        The training words and the held-out words.
    """
    words = ["".join(letters) for n in LENGTHS for letters in itertools.product(ALPHABET, repeat=n)]
    order = torch.randperm(len(words), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [words[i] for i in order]
    return shuffled[n_test:], shuffled[:n_test]


def plain_text(word: str) -> str:
    """The pre-training text of a word: ``"reverse abc: cba\\n"``."""
    return f"reverse {word}: {word[::-1]}\n"


def conversation(word: str, answer: str | None = None) -> list[dict[str, str]]:
    """The task as a conversation: the user asks, the assistant answers (right by default)."""
    reply = word[::-1] if answer is None else answer
    return [
        {"role": "user", "content": f"reverse {word}"},
        {"role": "assistant", "content": reply},
    ]


def near_miss(word: str, generator: torch.Generator) -> str:
    """A wrong answer close to the right one: the reversal with two neighbouring letters swapped
    (a letter replaced when all letters are the same)."""
    right = word[::-1]
    spots = [i for i in range(len(right) - 1) if right[i] != right[i + 1]]
    if not spots:
        return ALPHABET[(ALPHABET.index(right[0]) + 1) % len(ALPHABET)] + right[1:]
    i = spots[int(torch.randint(len(spots), (1,), generator=generator))]
    return right[:i] + right[i + 1] + right[i] + right[i + 2 :]


def reversal_reward(tokenizer: Tokenizer):
    """The verifiable reward: 1.0 when the answer is the prompt's word reversed, else 0.0.

    Args:
        tokenizer: the tokenizer the ids come from.

    Returns:
        ``reward(prompt_ids, answer_ids)`` for :func:`~coursepkg.posttrain.grpo.grpo_step`; the
        word is read from the prompt's text ``reverse WORD``.
    """
    end = tokenizer.encode(END_OF_TURN)[0]

    def reward(prompt: Sequence[int], answer: Sequence[int]) -> float:
        found = re.findall(r"reverse (\w+)", tokenizer.decode(prompt))
        if not found:
            raise ValueError(f"the prompt {tokenizer.decode(prompt)!r} asks for no reversal")
        done = bool(answer) and answer[-1] == end
        text = tokenizer.decode(answer[:-1] if done else answer)
        return float(done and text == found[-1][::-1])

    return reward


def chat_prompt(tokenizer: Tokenizer, word: str) -> list[int]:
    """The ids of the user's request followed by the cue ``<|assistant|>``."""
    return tokenizer.encode(render_chat(conversation(word)[:1], add_generation_prompt=True))


@torch.no_grad()
def answers_of(
    model: DecoderOnlyLM, tokenizer: Tokenizer, words: Sequence[str], chat: bool = True
) -> list[str]:
    """The model's greedy answers to ``reverse WORD``, as a conversation or as plain text.

    Args:
        model: the model.
        tokenizer: :func:`task_tokenizer`.
        words: the words to reverse.
        chat: ask in the chat template (the answer ends at ``<|end|>``) or continue the plain
            text ``reverse WORD: `` (the answer ends at the newline).

    Returns:
        One answer per word, in order.
    """
    model.eval()
    stop = tokenizer.encode(END_OF_TURN if chat else "\n")[0]
    answers: dict[str, str] = {}
    for n in sorted({len(w) for w in words}):
        group = [w for w in words if len(w) == n]
        if chat:
            prompts = [chat_prompt(tokenizer, w) for w in group]
        else:
            prompts = [tokenizer.encode(f"reverse {w}: ") for w in group]
        rows = torch.tensor(prompts)  # (B, P): one word length, one prompt length
        out = model.generate(rows, n + 1)[:, rows.size(1) :]  # (B, n + 1)
        for word, ids in zip(group, out.tolist(), strict=True):
            ids = ids[: ids.index(stop)] if stop in ids else ids
            answers[word] = tokenizer.decode(ids)
    return [answers[w] for w in words]


def accuracy(
    model: DecoderOnlyLM, tokenizer: Tokenizer, words: Sequence[str], chat: bool = True
) -> float:
    """The fraction of ``words`` that :func:`answers_of` reverses exactly."""
    answers = answers_of(model, tokenizer, words, chat)
    return sum(a == w[::-1] for a, w in zip(answers, words, strict=True)) / len(words)


@torch.no_grad()
def response_kl(policy: nn.Module, reference: nn.Module, batch: Batch) -> float:
    """The mean KL(policy || reference) of the next-token distributions at the response's
    positions: how far the policy has drifted from where it started, in nats per token.

    Shape:
        batch (B, L) -> a float.
    """
    logp = F.log_softmax(policy(batch.tokens, batch.token_mask)[:, :-1], dim=-1)  # (B, L-1, V)
    logq = F.log_softmax(reference(batch.tokens, batch.token_mask)[:, :-1], dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(dim=-1)  # (B, L-1)
    return float(kl[batch.loss_mask[:, 1:]].mean())


def _train(
    model: nn.Module,
    examples: Sequence[ChatExample],
    steps: int,
    lr: float,
    pad_id: int,
    generator: torch.Generator,
    batch_size: int = 32,
) -> list[float]:
    """Adam on the trainable parameters, batches drawn at random; the loss of each step."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    # foreach (here and below): the numbers of the per-parameter loop, in fewer calls
    optimizer = torch.optim.Adam(trainable, lr=lr, foreach=True)
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        batch = pad_batch([examples[i] for i in rows], pad_id)
        losses.append(sft_step(model, optimizer, *batch))
    return losses


def _stage_sft(settings: dict, tokenizer: Tokenizer, train: list[str], test: list[str]) -> dict:
    """Pre-train the base, then fine-tune it fully and with LoRA; the models and the numbers."""
    torch.manual_seed(settings["seed"])
    generator = torch.Generator().manual_seed(settings["seed"])
    pad = tokenizer.encode(END_OF_TURN)[0]
    base = DecoderOnlyLM(TransformerConfig(vocab_size=len(tokenizer.vocab), **MODEL))
    plain = [tokenizer.encode(plain_text(w)) for w in train]
    plain = [ChatExample(ids, [True] * len(ids)) for ids in plain]  # every token is learned
    out: dict[str, Any] = {}
    out["pretrain_loss"] = _train(base, plain, settings["pretrain_steps"], 3e-3, pad, generator)
    out["base_plain_accuracy"] = accuracy(base, tokenizer, test, chat=False)
    out["base_chat_accuracy"] = accuracy(base, tokenizer, test)
    out["base_answers"] = answers_of(base, tokenizer, test[:6])
    chats = [encode_chat(tokenizer, conversation(w)) for w in train]
    models = {}
    for kind in ("full", "lora"):
        out[f"{kind}_accuracies"], out[f"{kind}_seconds"] = [], 0.0
        for seed in settings["sft_seeds"]:  # each seed: its own batches (and LoRA's own A)
            torch.manual_seed(seed)
            model = copy.deepcopy(base)
            if kind == "lora":
                add_lora(model, LORA_TARGETS, r=settings["lora_r"], alpha=2.0 * settings["lora_r"])
            start = time.perf_counter()
            losses = _train(
                model,
                chats,
                settings["sft_steps"],
                settings[f"{kind}_lr"],
                pad,
                torch.Generator().manual_seed(seed + 100),
            )
            out[f"{kind}_seconds"] += time.perf_counter() - start
            out[f"{kind}_accuracies"].append(accuracy(model, tokenizer, test))
            if seed == settings["sft_seeds"][0]:  # the first seed's curve and model are shown
                out[f"{kind}_loss"], models[kind] = losses, model
        out[f"{kind}_accuracy"] = sum(out[f"{kind}_accuracies"]) / len(settings["sft_seeds"])
        out[f"{kind}_trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out["full_answers"] = answers_of(models["full"], tokenizer, test[:6])
    out["lora_closed_form"] = lora_parameter_count(base.config, LORA_TARGETS, settings["lora_r"])
    out["parameters"] = sum(p.numel() for p in base.parameters())
    weak = copy.deepcopy(base)  # the start of DPO: a short SFT leaves room to improve
    _train(weak, chats, settings["weak_sft_steps"], settings["full_lr"], pad, generator)
    out["weak_accuracy"] = accuracy(weak, tokenizer, test)
    start = _grpo_start(settings, tokenizer, weak, chats, train)
    out["grpo_start_steps"] = settings["weak_sft_steps"] + start["steps"]
    out["grpo_start_accuracy"] = accuracy(start["model"], tokenizer, test)
    return {"numbers": out, "weak": weak, "grpo_start": start["model"]}


def _grpo_start(settings, tokenizer, weak, chats, train) -> dict[str, Any]:
    """GRPO's start: ``weak`` fine-tuned on, ``grpo_sft_chunk`` steps at a time, until it reverses
    ``grpo_start_accuracy`` of 200 training words (a group of 4 then often holds a right and a
    wrong answer, the only groups that teach); how fast SFT gets there differs between CPUs.

    Args:
        settings: the run's settings (``seed``, ``grpo_sft_chunk``, ``grpo_sft_max``,
            ``grpo_start_accuracy``, ``full_lr``).
        tokenizer: the task's tokenizer.
        weak: the briefly fine-tuned model DPO starts from; copied, never changed.
        chats: the SFT training conversations.
        train: the training words (the first 200 are the probe).

    Returns:
        ``{"model": the start, "steps": SFT steps taken beyond weak's}``.
    """
    pad = tokenizer.encode(END_OF_TURN)[0]
    generator = torch.Generator().manual_seed(settings["seed"] + 7)
    model, steps, probe = copy.deepcopy(weak), 0, train[:200]
    while steps < settings["grpo_sft_max"] and (
        accuracy(model, tokenizer, probe) < settings["grpo_start_accuracy"]
    ):
        _train(model, chats, settings["grpo_sft_chunk"], settings["full_lr"], pad, generator)
        steps += settings["grpo_sft_chunk"]
    return {"model": model, "steps": steps}


def _pairs(model, tokenizer: Tokenizer, words: Sequence[str], generator: torch.Generator) -> list:
    """Each word's (chosen, rejected) examples: the right reversal, and the model's own greedy
    answer when it is wrong (a near miss when it is right)."""
    own = answers_of(model, tokenizer, words)
    pairs = []
    for word, answer in zip(words, own, strict=True):
        wrong = answer if answer != word[::-1] else near_miss(word, generator)
        pair = PreferencePair(conversation(word)[:1], word[::-1], wrong)
        pairs.append(encode_preference(tokenizer, pair))
    return pairs


def _stage_dpo(settings, tokenizer, start, train, test) -> dict:
    """DPO from ``start`` at each of ``settings["betas"]``: preference accuracy, drift, answers."""
    generator = torch.Generator().manual_seed(settings["seed"] + 1)
    pad = tokenizer.encode(END_OF_TURN)[0]
    train_pairs = _pairs(start, tokenizer, train[: settings["dpo_pairs"]], generator)
    test_pairs = _pairs(start, tokenizer, test, generator)
    chosen = pad_batch([c for c, _ in test_pairs], pad)
    rejected = pad_batch([r for _, r in test_pairs], pad)
    reference = frozen_copy(start)
    with torch.no_grad():
        ref_chosen = sequence_logprobs(reference, chosen)  # (B,)
        ref_rejected = sequence_logprobs(reference, rejected)  # (B,)
    out: dict[str, Any] = {
        "reference_preference": float((ref_chosen > ref_rejected).float().mean())
    }
    for beta in settings["betas"]:
        torch.manual_seed(settings["seed"])
        policy = copy.deepcopy(start)
        optimizer = torch.optim.Adam(policy.parameters(), lr=settings["dpo_lr"], foreach=True)
        rows_of = lambda: torch.randint(len(train_pairs), (32,), generator=generator)  # noqa: E731
        margins = []
        for _ in range(settings["dpo_steps"]):
            rows = rows_of().tolist()
            batch_c = pad_batch([train_pairs[i][0] for i in rows], pad)
            batch_r = pad_batch([train_pairs[i][1] for i in rows], pad)
            margins.append(dpo_step(policy, reference, optimizer, batch_c, batch_r, beta)["margin"])
        policy.eval()
        with torch.no_grad():
            pol_chosen = sequence_logprobs(policy, chosen)  # (B,)
            pol_rejected = sequence_logprobs(policy, rejected)  # (B,)
        reward_margin = beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))  # (B,)
        out[f"beta={beta}"] = {
            "train_margins": margins,
            "preference": float((pol_chosen > pol_rejected).float().mean()),
            "reward_accuracy": float((reward_margin > 0).float().mean()),
            "heldout_margin": float(reward_margin.mean()),
            "chosen_change": float((pol_chosen - ref_chosen).mean()),
            "rejected_change": float((pol_rejected - ref_rejected).mean()),
            "kl": response_kl(policy, reference, chosen),
            "accuracy": accuracy(policy, tokenizer, test),
        }
    return out


def _grpo_run(settings, tokenizer, start, train, run, seed) -> tuple[nn.Module, nn.Module, dict]:
    """One GRPO run from ``start`` with ``run`` = (prompts a step, group size, KL weight)."""
    prompts_per_step, group, kl_coef = run
    end = tokenizer.encode(END_OF_TURN)[0]
    reward = reversal_reward(tokenizer)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 2)
    policy, reference = copy.deepcopy(start), frozen_copy(start)
    optimizer = torch.optim.Adam(policy.parameters(), lr=settings["grpo_lr"], foreach=True)
    rewards, kls = [], []
    for _ in range(settings["grpo_steps"]):
        rows = torch.randint(len(train), (prompts_per_step,), generator=generator).tolist()
        prompts = [chat_prompt(tokenizer, train[i]) for i in rows]
        step = grpo_step(
            policy,
            reference,
            optimizer,
            prompts,
            reward,
            group_size=group,
            max_new_tokens=max(LENGTHS) + 1,
            end_id=end,
            pad_id=end,
            kl_coef=kl_coef,
            generator=generator,
        )
        rewards.append(step["reward"])
        kls.append(step["kl"])
    return policy, reference, {"rewards": rewards, "kl": kls}


def _stage_grpo(settings, tokenizer, start, train, test) -> dict:
    """GRPO from ``start``: one run per (prompts, group size, KL weight) of ``settings``; the
    first run once per seed of ``settings["grpo_seeds"]``, the others with the first seed."""
    end = tokenizer.encode(END_OF_TURN)[0]
    heldout = pad_batch([encode_chat(tokenizer, conversation(w)) for w in test], end)
    out: dict[str, Any] = {}
    for index, run in enumerate(settings["grpo_runs"]):
        seeds = settings["grpo_seeds"] if index == 0 else settings["grpo_seeds"][:1]
        found: dict[str, Any] = {"accuracies": [], "heldout_kls": []}
        for seed in seeds:
            policy, reference, curves = _grpo_run(settings, tokenizer, start, train, run, seed)
            found["accuracies"].append(accuracy(policy, tokenizer, test))
            found["heldout_kls"].append(response_kl(policy, reference, heldout))
            if seed == seeds[0]:  # the first seed's curves are drawn
                found.update(curves)
        found["accuracy"] = sum(found["accuracies"]) / len(seeds)
        found["heldout_kl"] = sum(found["heldout_kls"]) / len(seeds)
        prompts_per_step, group, kl_coef = run
        out[f"P={prompts_per_step},G={group},kl={kl_coef}"] = found
    return out


#: The chapter's settings (every number that shapes a run; the cache's key).
SETTINGS: dict[str, Any] = dict(
    seed=0,
    n_test=200,
    pretrain_steps=600,
    sft_steps=300,
    sft_seeds=[0, 1],
    full_lr=1e-3,
    lora_lr=1e-2,
    weak_sft_steps=40,
    lora_r=4,
    betas=[0.1, 0.5, 2.0],
    dpo_steps=40,
    dpo_lr=3e-4,
    dpo_pairs=1000,
    grpo_start_accuracy=0.3,
    grpo_sft_chunk=10,
    grpo_sft_max=300,
    grpo_steps=80,
    grpo_lr=1e-3,
    grpo_seeds=[0, 1, 2],
    grpo_runs=[[16, 4, 0.04], [4, 16, 0.04], [16, 4, 0.0]],
)


def post_training_run(cache: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Run the chapter's four stages (see the module's docstring) and return what they measured.

    Args:
        cache: ``None``, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).
        **overrides: settings to change from :data:`SETTINGS` (tests make the runs short).

    Returns:
        A dictionary of plain numbers, lists and strings: ``"sft"`` (pre-training and fine-tuning:
        accuracies, losses, seconds, trainable parameters, sample answers, GRPO's starting point),
        ``"dpo"`` (one entry per beta, ``"beta=0.1"``: margins, preference accuracy, KL, accuracy)
        and ``"grpo"`` (one entry per run, ``"P=16,G=4,kl=0.04"``: rewards and KL per step,
        held-out accuracy), and ``"settings"``.
    """
    check_cache_mode(cache)
    unknown = sorted(set(overrides) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown settings {unknown}; the settings are {sorted(SETTINGS)}")
    settings = {**SETTINGS, **overrides}
    key = dict(settings, model=asdict(TransformerConfig(vocab_size=260, **MODEL)))
    path = cache_file(key, "posttrain") if cache is not None else None
    saved: dict[str, Any] = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return saved
    tokenizer = task_tokenizer()
    train, test = word_split(settings["n_test"], settings["seed"])
    sft = _stage_sft(settings, tokenizer, train, test)
    result = {
        "settings": settings,
        "sft": sft["numbers"],
        "dpo": _stage_dpo(settings, tokenizer, sft["weak"], train, test),
        "grpo": _stage_grpo(settings, tokenizer, sft["grpo_start"], train, test),
    }
    if path is not None:
        save_run(path, result, "the post-training run")
    return result
