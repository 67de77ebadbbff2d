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
from ..tokenizer import Tokenizer
from ..training import lifecycle
from ..training.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from ..training.distributed import Dist, setup, teardown
from ..training.schemes import make_scheme
from ..training.settings import PARALLEL
from .chat import (
    CHAT_BPE,
    CHAT_TOKENS,
    END_OF_TURN,
    ChatExample,
    chat_records,
    encode_chat,
    recorded_chat_tokenizer,
    with_chat_tokens,
)
from .dpo import dpo_pairs_loss, encode_preference, frozen_copy, preference_records
from .grpo import group_advantages, grpo_loss, per_token_logprobs, sample_groups
from .lora import add_lora, lora_modules, merge_lora
from .packing import Batch, pad_batch
from .per_token import masked_normalize
from .rewards import GRPOPrompt, load_reward, prompt_records, score
from .sft import token_losses

__all__ = ["FinetuneResult", "FinetuneSettings", "chat_tokenizer", "finetune", "load_base"]

log = logging.getLogger(__name__)

MODEL = "model.pt"
SFT_FIELDS = ("step", "lr", "loss")
DPO_FIELDS = ("step", "lr", "loss", "margin", "accuracy")
GRPO_FIELDS = ("step", "lr", "loss", "reward", "kl")
#: The column SFT of a mixture of experts adds: the load-balancing loss (before its coefficient).
MOE_FIELDS = ("aux_loss",)


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
        parallel, compile: how ranks under ``torchrun`` share the work, and ``torch.compile``,
            as ``coursepkg train``'s (:mod:`coursepkg.training.schemes`); LoRA and GRPO keep
            the whole model on every rank (no ``fsdp``).
        beta1, beta2: AdamW's moment decay rates.
        aux_loss_coef: SFT of a mixture of experts adds its load-balancing loss times this to
            the loss (0: none, Hugging Face's default for fine-tuning Mixtral).
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
    parallel: str = "course-ddp"
    compile: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    aux_loss_coef: float = 0.0

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
        self._check_parallel()
        if not self.base or not self.data:
            raise ValueError(f"base and data must both be given, got {self.base!r}, {self.data!r}")

    def _check_parallel(self) -> None:
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, got {self.parallel!r}")
        if "fsdp" in self.parallel and (self.lora_rank or self.grpo):
            raise ValueError(
                f"parallel={self.parallel!r} shards the model; LoRA (lora_rank="
                f"{self.lora_rank}) and GRPO (grpo={self.grpo}) need it whole on every rank: "
                "choose a ddp or zero1 scheme"
            )
        if not self.aux_loss_coef >= 0:
            raise ValueError(f"aux_loss_coef must be >= 0, got {self.aux_loss_coef!r}")

    @property
    def targets(self) -> list[str]:
        """The LoRA targets as a list."""
        return [t.strip() for t in self.lora_targets.split(",") if t.strip()]

    def identity(self) -> dict[str, Any]:
        """The settings a checkpoint must agree with to be resumed."""
        skip = ("out", "steps", "checkpoint_every", "stop_after", "device", "base", "data")
        skip += ("parallel", "compile")  # a checkpoint says its optimizer state's layout
        if not self.grpo:  # so that an SFT or DPO run's identity is what it was before GRPO
            skip += ("grpo", "reward", "group_size", "max_new_tokens", "temperature", "kl_coef")
        # Settings added later are written only when not at the default every earlier run had.
        later = {"beta1": 0.9, "beta2": 0.999, "aux_loss_coef": 0.0}
        skip += tuple(k for k, v in later.items() if getattr(self, k) == v)
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
        for candidate in (MODEL, lifecycle.CHECKPOINT, "config.json"):
            if (path / candidate).is_file():
                return path if candidate == "config.json" else path / candidate
        raise ValueError(
            f"base {str(path)!r} holds no {MODEL}, {lifecycle.CHECKPOINT} or config.json: "
            "expected a coursepkg train or finetune folder, or a Hugging Face model folder"
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
class _FineTuning:
    """What fine-tuning adds to a :class:`~coursepkg.training.lifecycle.Run`."""

    settings: FinetuneSettings
    run: lifecycle.Run
    reference: nn.Module | None
    examples: list[Any]
    pad_id: int
    reward: Any = None
    tokenizer: Any = None  # the base's own BPE with the chat tokens
    tokenizer_name: str = CHAT_BPE  # what model.pt records

    @property
    def net(self) -> DecoderOnlyLM:
        return self.run.net

    @property
    def model(self) -> nn.Module:
        return self.run.model

    @property
    def dist(self) -> Dist:
        return self.run.dist


def _fields(settings: FinetuneSettings, config: TransformerConfig) -> tuple[str, ...]:
    """The log's columns; SFT of a mixture of experts adds its load-balancing loss."""
    if settings.dpo or settings.grpo:
        return DPO_FIELDS if settings.dpo else GRPO_FIELDS
    return SFT_FIELDS + (MOE_FIELDS if config.moe is not None else ())


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
        job = _start(settings, dist, resume)
        s = settings
        schedule = lifecycle.Schedule(s.steps, s.lr, s.warmup_steps, s.min_lr)
        step = functools.partial(_step, job)
        lifecycle.run_steps(
            job.run, step, schedule, s.stop_after, s.checkpoint_every, "finetune", progress
        )
        return _finish(job)
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


def _start(settings: FinetuneSettings, dist: Dist, resume: bool) -> _FineTuning:
    """Base, data, adapters, reference and optimiser: fresh, or as the checkpoint left them."""
    out = _check_out(settings)
    if settings.batch_size % dist.world_size:
        raise ValueError(
            f"batch_size={settings.batch_size} must be divisible by the {dist.world_size} ranks"
        )
    try:  # the base's own tokenizer: GPT-2's, or the BPE its run learned
        tokenizer, name, _ = recorded_chat_tokenizer(base_file(settings.base))
    except ValueError:  # a base without a saved BPE: load_base says why it cannot be used
        tokenizer, name = chat_tokenizer(), CHAT_BPE
    reward = load_reward(settings.reward) if settings.grpo else None
    net, base_digest = load_base(settings.base, tokenizer)
    examples = load_examples(settings, tokenizer, net.config.max_len)
    frozen = settings.dpo or settings.grpo
    reference = frozen_copy(net).to(dist.device) if frozen else None
    torch.manual_seed(settings.seed)  # the adapters' initialisation, and dropout's masks
    if settings.lora_rank:
        add_lora(net, settings.targets, settings.lora_rank, settings.lora_alpha)
    identity = {
        **settings.identity(),
        "config": dataclasses.asdict(net.config),
        "base": base_digest,
        "data": _sha256(Path(settings.data)),
    }
    pad_id = tokenizer.encode(END_OF_TURN)[0]  # any id: padding is masked out everywhere
    batches = torch.Generator().manual_seed(settings.seed + 1)
    saved = lifecycle.open_checkpoint(out, resume)
    if saved is not None:  # the weights go in before the scheme shards them
        check_compatible(saved["identity"], identity, out / lifecycle.CHECKPOINT)
        net.load_state_dict(saved["model"])
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    net.to(dist.device)
    scheme = make_scheme(net, settings, dist)
    run = lifecycle.Run(out, dist, net, scheme, batches, identity, _fields(settings, net.config))
    if saved is not None:
        lifecycle.restore(run, saved)
    return _FineTuning(settings, run, reference, examples, pad_id, reward, tokenizer, name)


def _step(job: _FineTuning, lr: float) -> dict[str, float]:
    """One optimiser step on ``batch_size`` examples drawn at random (this rank's share)."""
    s, dist, run = job.settings, job.dist, job.run
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    drawn = torch.randint(len(job.examples), (s.batch_size,), generator=run.batches)  # (B,)
    share = s.batch_size // dist.world_size
    mine = [job.examples[i] for i in drawn[dist.rank * share : (dist.rank + 1) * share].tolist()]
    run.model.train()
    with lifecycle.autocast(dist.device):
        if s.dpo:
            loss, extra = _dpo_loss(job, mine)
        elif s.grpo:
            loss, extra = _grpo_loss(job, mine)
        else:
            every = [job.examples[i] for i in drawn.tolist()]
            loss, extra = _sft_loss(job, mine, every)
    lifecycle.with_aux(loss, extra.get("aux_loss"), s.aux_loss_coef).backward()
    run.scheme.sync()  # the course's DDP averages when asked
    if s.clip_norm > 0:
        run.scheme.clip(s.clip_norm)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    # each rank's loss is its share of the global one, times the ranks: their mean is the loss
    numbers = {"loss": loss, **extra}
    return {k: dist.mean(v.detach()) for k, v in numbers.items()}


def _sft_loss(
    job: _FineTuning, mine: list[ChatExample], every: list[ChatExample]
) -> tuple[Tensor, dict[str, Tensor]]:
    """This rank's part of the SFT loss over the whole batch's response tokens, times the
    number of ranks (their gradients are averaged); a mixture of experts' load-balancing
    loss (``aux_loss``), returned by the model's forward."""
    batch = pad_batch(mine, job.pad_id)
    tokens, loss_mask, token_mask = (x.to(job.dist.device) for x in batch)  # (b, L) each
    logits, aux = job.model(tokens, token_mask, return_aux=True)  # (b, L, V), None if dense
    losses = token_losses(logits, tokens)  # (b, L-1)
    count = sum(sum(example.response_mask[1:]) for example in every)  # the whole batch's
    loss = masked_normalize(losses, loss_mask[:, 1:], count / job.dist.world_size)
    return loss, {} if aux is None else {"aux_loss": aux}


def _dpo_loss(
    job: _FineTuning, mine: list[tuple[ChatExample, ChatExample]]
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO's loss on this rank's pairs: chosen and rejected answers in one padded batch."""
    out = dpo_pairs_loss(job.model, job.reference, mine, job.pad_id, job.settings.beta)
    accuracy = (out.margins > 0).float().mean()
    return out.loss, {"margin": out.margins.mean(), "accuracy": accuracy}


def _grpo_loss(job: _FineTuning, mine: list[GRPOPrompt]) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO on this rank's prompts: a group of answers sampled for each (from this rank's random
    state), scored, and the clipped objective with the KL penalty; one update per sample, so the
    ratio is 1 and the loss's gradient is the policy gradient."""
    s, device = job.settings, job.dist.device
    end = job.pad_id  # the end-of-turn id, which also pads
    rollouts = sample_groups(
        job.net, [p.ids for p in mine], s.group_size, s.max_new_tokens, end, end, s.temperature
    )
    tokenizer = job.tokenizer
    rewards = [
        score(
            job.reward, tokenizer.decode(a[:-1] if a[-1:] == [end] else a), mine[i // s.group_size]
        )
        for i, a in enumerate(rollouts.answers)
    ]
    rewards = torch.tensor(rewards).view(len(mine), s.group_size)  # (P, G)
    advantages = group_advantages(rewards).flatten().to(device)  # (B,) with B = P G
    batch = Batch(*(x.to(device) for x in rollouts.batch))  # (B, L) each
    with torch.no_grad():
        ref = per_token_logprobs(job.reference, batch)  # (B, L-1)
    job.model.train()
    logprobs = per_token_logprobs(job.model, batch)  # (B, L-1)
    mask = batch.loss_mask[:, 1:]  # (B, L-1): the answers' tokens as targets
    out = grpo_loss(logprobs, logprobs.detach(), ref, advantages, mask, kl_coef=s.kl_coef)
    return out.loss, {"reward": rewards.mean().to(device), "kl": out.kl}


def _finish(job: _FineTuning) -> FinetuneResult:
    """Merge the adapters and write ``model.pt`` (rank 0, when the run reached its end)."""
    run = job.run
    done = run.step == job.settings.steps
    net = run.scheme.plain_model()  # a collective when sharded
    if lora_modules(net):
        merge_lora(net)
    plain = DecoderOnlyLM(net.config)
    state = {
        name.replace(".base.", "."): value.cpu()
        for name, value in net.state_dict().items()
        if "lora_" not in name
    }
    plain.load_state_dict(state)
    if done and run.dist.is_main:
        identity = {"tokenizer": job.tokenizer_name, "config": dataclasses.asdict(plain.config)}
        save_checkpoint(run.out / MODEL, {"identity": identity, "model": state})
    rows = run.rows if run.dist.is_main else []
    return FinetuneResult(plain.eval().cpu(), rows, Path(job.settings.out))
