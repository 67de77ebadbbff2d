"""``coursepkg finetune``: supervised fine-tuning (optionally with LoRA) or DPO of a trained model,
with the checkpoints, exact resume and ``torchrun`` ranks of ``coursepkg train``.

The base is a ``coursepkg train`` run trained with ``--tokenizer bpe`` (its folder or its
``checkpoint.pt``), an earlier ``coursepkg finetune`` (its folder or its ``model.pt``), or a
Hugging Face Llama or Qwen3 folder (``save_pretrained``'s ``config.json`` and weights), read
offline and converted through :mod:`coursepkg.interop`. The text is tokenised with the course's
byte-level BPE (GPT-2's vocabulary) plus the chat template's four special tokens
(:func:`~coursepkg.posttrain.chat.with_chat_tokens`); a model whose vocabulary stops at GPT-2's
gets four new embedding rows for them, started at the mean embedding.

The base is only ever read: the run writes into its own folder, ``OUT/checkpoint.pt`` (weights,
adapters, optimiser, data position and random states: ``--resume`` continues bit for bit),
``OUT/log.csv`` and, at the end, ``OUT/model.pt`` (the weights with any adapter merged in, a
base for the next fine-tune: SFT, then DPO from the SFT model).

Every rank draws the same examples for a step and computes its share; the loss of each share is
scaled so that the averaged gradient is the one a single process gets from the whole batch
(SFT: the sum of the response tokens' losses over the batch's response-token count; DPO: the
mean over the pairs).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import TransformerConfig
from ..decoder_only import DecoderOnlyLM
from ..optim import AdamW, clip_grad_norm_, param_groups, warmup_cosine_lr
from ..parallel.ddp import NaiveDDP
from ..tokenizer import Tokenizer
from ..training.checkpoint import (
    CheckpointError,
    check_compatible,
    load_checkpoint,
    save_checkpoint,
)
from ..training.distributed import Dist, setup, teardown
from .chat import CHAT_TOKENS, END_OF_TURN, ChatExample, chat_records, encode_chat, with_chat_tokens
from .dpo import dpo_pairs_loss, encode_preference, frozen_copy, preference_records
from .grpo import group_advantages, grpo_loss, per_token_logprobs, sample_groups
from .lora import add_lora, lora_modules, merge_lora
from .packing import Batch, pad_batch
from .per_token import masked_normalize
from .rewards import GRPOPrompt, load_reward, prompt_records, score
from .sft import token_losses

__all__ = ["FinetuneResult", "FinetuneSettings", "chat_tokenizer", "finetune", "load_base"]

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
#: The tokenizer name ``model.pt`` records: GPT-2's BPE with the chat tokens.
CHAT_BPE = "bpe-chat"
SFT_FIELDS = ("step", "lr", "loss")
DPO_FIELDS = ("step", "lr", "loss", "margin", "accuracy")
GRPO_FIELDS = ("step", "lr", "loss", "reward", "kl")


@dataclass
class FinetuneSettings:
    """Everything that defines a fine-tuning run.

    Attributes:
        base: the model to start from (see the module's docstring); only read.
        data: a JSONL file: ``{"messages": [...]}`` (or ``{"prompt", "response"}``) a line for
            SFT, ``{"prompt", "chosen", "rejected"}`` a line for DPO.
        out: the run's folder (not the base's).
        dpo: train with DPO on preference pairs instead of SFT.
        beta: DPO's beta (the pull towards the reference, the frozen base).
        grpo: train with GRPO on prompts (``{"prompt": ..., ...}`` a line) scored by ``reward``
            (a name of :data:`~coursepkg.posttrain.rewards.BUILT_IN` or ``module:function``).
        group_size, max_new_tokens, temperature: answers sampled per prompt, their longest,
            the sampling temperature.
        kl_coef: GRPO's weight of the KL penalty towards the frozen base (0: none).
        lora_rank: 0 trains every weight; r >= 1 freezes them and trains LoRA adapters of rank r
            on ``lora_targets`` (comma-separated layer names).
        lora_alpha: LoRA's alpha (the change is scaled by alpha / r).
        steps, batch_size: optimiser steps; examples (or pairs) per step over all ranks.
        lr, min_lr, warmup_steps: warm-up then cosine decay from lr to min_lr.
        weight_decay, clip_norm: AdamW's decay of the matrices; the global gradient norm's cap
            (0: none).
        checkpoint_every: steps between checkpoints (one is written at the end too).
        stop_after: end this job after that step, with a checkpoint (0: run to the end).
        seed: seeds the adapters' initialisation and the examples drawn.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    base: str = ""
    data: str = ""
    out: str = "runs/finetune"
    dpo: bool = False
    beta: float = 0.1
    grpo: bool = False
    reward: str = "exact"
    group_size: int = 4
    max_new_tokens: int = 16
    temperature: float = 1.0
    kl_coef: float = 0.04
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: str = "q_proj,v_proj"
    steps: int = 100
    batch_size: int = 8
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 10
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    checkpoint_every: int = 50
    stop_after: int = 0
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "checkpoint_every", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int):
            raise ValueError(f"lora_rank must be an int >= 0, got {self.lora_rank!r}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be an int >= 0, got {self.lora_rank!r}")
        if self.dpo and self.grpo:
            raise ValueError("dpo and grpo are two ways to train: choose one")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise ValueError(f"group_size must be an int >= 2, got {self.group_size!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be an int >= 2, got {self.group_size!r}")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef!r}")
        for name in ("beta", "lora_alpha", "lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}"
            )
        if not 0 <= self.stop_after <= self.steps:
            raise ValueError(
                f"stop_after must be in [0, steps={self.steps}], got {self.stop_after}"
            )
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {self.device!r}")
        if not self.base or not self.data:
            raise ValueError(f"base and data must both be given, got {self.base!r}, {self.data!r}")

    @property
    def targets(self) -> list[str]:
        """The LoRA targets as a list."""
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def identity(self) -> dict[str, Any]:
        """The settings a checkpoint must agree with to be resumed."""
        skip = ("out", "steps", "checkpoint_every", "stop_after", "device", "base", "data")
        if not self.grpo:  # so that an SFT or DPO run's identity is what it was before GRPO
            skip += ("grpo", "reward", "group_size", "max_new_tokens", "temperature", "kl_coef")
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class FinetuneResult:
    """What a run produced: the model (adapters merged, eval mode, CPU), the log rows (rank 0)
    and the run's folder."""

    model: DecoderOnlyLM
    rows: list[dict[str, float]] = field(default_factory=list)
    out: Path = Path(".")


@functools.lru_cache(maxsize=1)
def chat_tokenizer() -> Tokenizer:
    """The fine-tuning tokenizer: GPT-2's byte-level BPE with the chat tokens (ids 50257-50260);
    built once per process (it is never changed)."""
    return with_chat_tokens(Tokenizer.gpt2())


def _sha256(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _course_model(path: Path) -> tuple[DecoderOnlyLM, str]:
    """A ``coursepkg train`` checkpoint or a ``coursepkg finetune`` model.pt, and its tokenizer."""
    saved = load_checkpoint(path)
    identity = saved.get("identity", {})
    if "tokenizer" not in identity:  # a fine-tune's checkpoint.pt: model.pt comes at its end
        raise ValueError(
            f"base {str(path)!r} is the checkpoint of an unfinished coursepkg finetune run; "
            f"finish it with --resume and start from its {MODEL}"
        )
    model = DecoderOnlyLM(TransformerConfig.from_dict(identity["config"]))
    model.load_state_dict(saved["model"])
    return model, identity.get("tokenizer", "char")


def _hf_model(folder: Path) -> DecoderOnlyLM:
    """A Llama or Qwen3 saved with ``save_pretrained`` in ``folder``, read offline."""
    import transformers

    from ..interop import from_hf_llama, from_hf_qwen3

    kind = transformers.AutoConfig.from_pretrained(folder, local_files_only=True).model_type
    convert = {"llama": from_hf_llama, "qwen3": from_hf_qwen3}.get(kind)
    if convert is None:
        raise ValueError(f"base {str(folder)!r} is a {kind!r} model; expected 'llama' or 'qwen3'")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return convert(hf.float()).float()


def base_file(base: str | Path) -> Path:
    """The file (or HF folder) ``base`` names: a folder's ``model.pt``, else its
    ``checkpoint.pt``, else the folder itself when it holds a ``config.json``."""
    path = Path(base)
    if path.is_dir():
        for candidate in (MODEL, CHECKPOINT, "config.json"):
            if (path / candidate).is_file():
                return path if candidate == "config.json" else path / candidate
        raise ValueError(
            f"base {str(path)!r} holds no {MODEL}, {CHECKPOINT} or config.json: expected a "
            "coursepkg train or finetune folder, or a Hugging Face model folder"
        )
    if not path.is_file():
        raise ValueError(
            f"base must be a checkpoint file or a folder, got {str(path)!r} (not found)"
        )
    return path


def load_base(base: str | Path, tokenizer: Tokenizer) -> tuple[DecoderOnlyLM, str]:
    """The base model, its vocabulary fitted to ``tokenizer``, and its files' SHA-256.

    Raises:
        ValueError: a base trained with a tokenizer that cannot hold the chat tokens (the
            character one), or a vocabulary smaller than GPT-2's.
    """
    path = base_file(base)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
        return fit_vocabulary(_hf_model(path), tokenizer, str(path)), _sha256(*files)
    model, kind = _course_model(path)
    if kind == "char":
        raise ValueError(
            f"base {str(path)!r} was trained with the char tokenizer, which has no special "
            f"tokens for the chat template's markers {list(CHAT_TOKENS)} (it knows only the "
            "corpus' characters and <pad> <bos> <eos> <unk>); train the base with --tokenizer bpe"
        )
    return fit_vocabulary(model, tokenizer, str(path)), _sha256(path)


@torch.no_grad()
def fit_vocabulary(model: DecoderOnlyLM, tokenizer: Tokenizer, where: str) -> DecoderOnlyLM:
    """``model`` with an embedding row (and head row) for every id of ``tokenizer``: the
    chat tokens a GPT-2-sized vocabulary lacks start at the mean embedding (and head row)."""
    have, need = model.config.vocab_size, len(tokenizer)
    extra = len(tokenizer.special_tokens) - 1  # GPT-2's own <|endoftext|> aside
    if have >= need:
        return model
    if have < need - extra:
        raise ValueError(
            f"base {where!r} has a vocabulary of {have} ids, fewer than the tokenizer's "
            f"{need - extra} (GPT-2's BPE): its ids cannot be the tokenizer's"
        )
    grown = DecoderOnlyLM(model.config.replace(vocab_size=need))
    state = model.state_dict()
    for name, old in state.items():
        new = grown.state_dict()[name]
        if old.shape != new.shape:  # the embedding and the head: (V, D) -> (V + k, D)
            state[name] = torch.cat([old, old.mean(dim=0, keepdim=True).expand(need - have, -1)])
    grown.load_state_dict(state)
    return grown


def load_examples(
    settings: FinetuneSettings, tokenizer: Tokenizer, max_len: int
) -> list[ChatExample] | list[tuple[ChatExample, ChatExample]]:
    """The data file's examples (SFT), pairs (DPO) or prompts (GRPO), tokenised; an error names
    the line."""
    if settings.grpo:
        longest = max_len - settings.max_new_tokens
        if longest < 1:
            raise ValueError(
                f"max_new_tokens={settings.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {max_len}"
            )
        prompts = list(prompt_records(settings.data, tokenizer, longest))
        if not prompts:
            raise ValueError(f"data {settings.data!r} holds no example")
        return prompts
    records = preference_records if settings.dpo else chat_records
    examples: list[Any] = []
    for record, where in records(settings.data):
        try:
            if settings.dpo:
                examples.append(encode_preference(tokenizer, record, max_len))
            else:
                examples.append(encode_chat(tokenizer, record, max_len))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    if not examples:
        raise ValueError(f"data {settings.data!r} holds no example")
    return examples


@dataclass
class _Run:
    """The pieces of a run in progress."""

    settings: FinetuneSettings
    dist: Dist
    net: DecoderOnlyLM
    model: nn.Module
    reference: nn.Module | None
    optimizer: AdamW
    examples: list[Any]
    pad_id: int
    identity: dict[str, Any]
    batches: torch.Generator
    step: int = 0
    rows: list[dict[str, float]] = field(default_factory=list)
    reward: Any = None

    @property
    def fields(self) -> tuple[str, ...]:
        s = self.settings
        return DPO_FIELDS if s.dpo else GRPO_FIELDS if s.grpo else SFT_FIELDS


def finetune(
    settings: FinetuneSettings, resume: bool = False, progress: bool = True
) -> FinetuneResult:
    """Fine-tune as ``settings`` say, on this process or on every rank ``torchrun`` started.

    Args:
        settings: the run.
        resume: continue from ``OUT/checkpoint.pt`` (a fresh start if there is none).
        progress: show a progress bar (rank 0).

    Returns:
        The :class:`FinetuneResult`.

    Raises:
        ValueError: bad data (naming the line), a base the chat template cannot use, or an
            ``out`` that is the base's folder.
        CheckpointError: a checkpoint from other settings, or one there without ``resume``.
    """
    dist = setup(settings.device)
    try:
        run = _start(settings, dist, resume)
        _loop(run, progress)
        return _finish(run)
    finally:
        teardown()


def _check_out(settings: FinetuneSettings) -> Path:
    out, base = Path(settings.out).resolve(), base_file(settings.base).resolve()
    if base.is_relative_to(out):
        raise ValueError(
            f"out={settings.out!r} holds the base {str(base)!r}: fine-tune into another folder "
            "(the base is never written)"
        )
    return out


def _start(settings: FinetuneSettings, dist: Dist, resume: bool) -> _Run:
    """Base, data, adapters, reference and optimiser: fresh, or as the checkpoint left them."""
    out = _check_out(settings)
    if settings.batch_size % dist.world_size:
        raise ValueError(
            f"batch_size={settings.batch_size} must be divisible by the {dist.world_size} ranks"
        )
    tokenizer = chat_tokenizer()
    reward = load_reward(settings.reward) if settings.grpo else None
    net, base_digest = load_base(settings.base, tokenizer)
    examples = load_examples(settings, tokenizer, net.config.max_len)
    frozen = settings.dpo or settings.grpo
    reference = frozen_copy(net).to(dist.device) if frozen else None
    torch.manual_seed(settings.seed)  # the adapters' initialisation, and dropout's masks
    if settings.lora_rank:
        add_lora(net, settings.targets, settings.lora_rank, settings.lora_alpha)
    optimizer = AdamW(param_groups(net, settings.weight_decay), lr=settings.lr)
    identity = {
        **settings.identity(),
        "config": dataclasses.asdict(net.config),
        "base": base_digest,
        "data": _sha256(Path(settings.data)),
    }
    pad_id = tokenizer.encode(END_OF_TURN)[0]  # any id: padding is masked out everywhere
    batches = torch.Generator().manual_seed(settings.seed + 1)
    run = _Run(settings, dist, net, net, reference, optimizer, examples, pad_id, identity, batches)
    run.reward = reward
    path = out / CHECKPOINT
    if path.exists() and not resume:
        raise CheckpointError(
            f"{path} exists; pass --resume to continue that run, or choose another --out"
        )
    if path.exists():
        _restore(run, load_checkpoint(path), path)
    net.to(dist.device)
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(dist.device)
    if dist.distributed:
        run.model = NaiveDDP(net)
    return run


def _restore(run: _Run, saved: dict[str, Any], path: Path) -> None:
    check_compatible(saved["identity"], run.identity, path)
    run.net.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.batches.set_state(saved["data_rng"])
    run.step = int(saved["step"])
    run.rows = [dict(zip(run.fields, row, strict=True)) for row in saved["rows"]]
    states = saved["rng"]
    torch.set_rng_state(states[run.dist.rank % len(states)])
    log.info("resumed from %s at step %d", path, run.step)


def _checkpoint(run: _Run) -> None:
    rng = run.dist.gather(torch.get_rng_state())
    if run.dist.is_main:
        payload = {
            "identity": run.identity,
            "model": run.net.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "data_rng": run.batches.get_state(),
            "rng": rng,
            "step": run.step,
            "rows": [[row[k] for k in run.fields] for row in run.rows],
        }
        save_checkpoint(Path(run.settings.out) / CHECKPOINT, payload)
        with open(Path(run.settings.out) / "log.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(run.fields)
            writer.writerows([repr(row[k]) for k in run.fields] for row in run.rows)


def _loop(run: _Run, progress: bool) -> None:
    from tqdm import tqdm

    s = run.settings
    if run.dist.is_main:
        Path(s.out).mkdir(parents=True, exist_ok=True)
    show = progress and run.dist.is_main
    bar = tqdm(total=s.steps, initial=run.step, desc="finetune", disable=not show)
    end = s.stop_after or s.steps
    while run.step < end:
        lr = warmup_cosine_lr(run.step, s.lr, s.warmup_steps, s.steps, s.min_lr)
        numbers = _step(run, lr)
        if not all(torch.isfinite(torch.tensor(list(numbers.values())))):
            raise FloatingPointError(f"the loss became {numbers['loss']} at step {run.step + 1}")
        run.step += 1
        run.rows.append({"step": run.step, "lr": lr, **numbers})
        if run.step % s.checkpoint_every == 0 or run.step == end:
            _checkpoint(run)
        bar.update(1)
    bar.close()


def _step(run: _Run, lr: float) -> dict[str, float]:
    """One optimiser step on ``batch_size`` examples drawn at random (this rank's share)."""
    s, dist = run.settings, run.dist
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    drawn = torch.randint(len(run.examples), (s.batch_size,), generator=run.batches)  # (B,)
    share = s.batch_size // dist.world_size
    mine = [run.examples[i] for i in drawn[dist.rank * share : (dist.rank + 1) * share].tolist()]
    run.model.train()
    if s.dpo:
        loss, extra = _dpo_loss(run, mine)
    elif s.grpo:
        loss, extra = _grpo_loss(run, mine)
    else:
        every = [run.examples[i] for i in drawn.tolist()]
        loss, extra = _sft_loss(run, mine, every)
    loss.backward()
    if isinstance(run.model, NaiveDDP):
        run.model.sync_gradients()
    trainable = [p for p in run.net.parameters() if p.requires_grad]
    if s.clip_norm > 0:
        clip_grad_norm_(trainable, s.clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    # each rank's loss is its share of the global one, times the ranks: their mean is the loss
    return {"loss": dist.mean(loss.detach()), **{k: dist.mean(v) for k, v in extra.items()}}


def _sft_loss(
    run: _Run, mine: list[ChatExample], every: list[ChatExample]
) -> tuple[Tensor, dict[str, Tensor]]:
    """This rank's part of the SFT loss over the whole batch's response tokens, times the
    number of ranks (their gradients are averaged)."""
    batch = pad_batch(mine, run.pad_id)
    tokens, loss_mask, token_mask = (x.to(run.dist.device) for x in batch)  # (b, L) each
    losses = token_losses(run.model(tokens, token_mask), tokens)  # (b, L-1)
    count = sum(sum(example.response_mask[1:]) for example in every)  # the whole batch's
    return masked_normalize(losses, loss_mask[:, 1:], count / run.dist.world_size), {}


def _dpo_loss(
    run: _Run, mine: list[tuple[ChatExample, ChatExample]]
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO's loss on this rank's pairs: chosen and rejected answers in one padded batch."""
    out = dpo_pairs_loss(run.model, run.reference, mine, run.pad_id, run.settings.beta)
    accuracy = (out.margins > 0).float().mean()
    return out.loss, {"margin": out.margins.mean(), "accuracy": accuracy}


def _grpo_loss(run: _Run, mine: list[GRPOPrompt]) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO on this rank's prompts: a group of answers sampled for each (from this rank's random
    state), scored, and the clipped objective with the KL penalty; one update per sample, so the
    ratio is 1 and the loss's gradient is the policy gradient."""
    s, device = run.settings, run.dist.device
    end = run.pad_id  # the end-of-turn id, which also pads
    rollouts = sample_groups(
        run.net, [p.ids for p in mine], s.group_size, s.max_new_tokens, end, end, s.temperature
    )
    tokenizer = chat_tokenizer()
    rewards = [
        score(
            run.reward, tokenizer.decode(a[:-1] if a[-1:] == [end] else a), mine[i // s.group_size]
        )
        for i, a in enumerate(rollouts.answers)
    ]
    rewards = torch.tensor(rewards).view(len(mine), s.group_size)  # (P, G)
    advantages = group_advantages(rewards).flatten().to(device)  # (B,) with B = P G
    batch = Batch(*(x.to(device) for x in rollouts.batch))  # (B, L) each
    with torch.no_grad():
        ref = per_token_logprobs(run.reference, batch)  # (B, L-1)
    run.model.train()
    logprobs = per_token_logprobs(run.model, batch)  # (B, L-1)
    mask = batch.loss_mask[:, 1:]  # (B, L-1): the answers' tokens as targets
    out = grpo_loss(logprobs, logprobs.detach(), ref, advantages, mask, kl_coef=s.kl_coef)
    return out.loss, {"reward": rewards.mean().to(device), "kl": out.kl}


def _finish(run: _Run) -> FinetuneResult:
    """Merge the adapters and write ``model.pt`` (rank 0, when the run reached its end)."""
    done = run.step == run.settings.steps
    if lora_modules(run.net):
        merge_lora(run.net)
    plain = DecoderOnlyLM(run.net.config)
    state = {
        name.replace(".base.", "."): value
        for name, value in run.net.state_dict().items()
        if "lora_" not in name
    }
    plain.load_state_dict(state)
    if done and run.dist.is_main:
        identity = {"tokenizer": CHAT_BPE, "config": dataclasses.asdict(plain.config)}
        save_checkpoint(Path(run.settings.out) / MODEL, {"identity": identity, "model": state})
    rows = run.rows if run.dist.is_main else []
    return FinetuneResult(plain.eval().cpu(), rows, Path(run.settings.out))
