"""Small mixtures of experts and their dense peers, trained alike on Tiny Shakespeare (the
chapter on experts and latent attention).

The chapter compares a decoder whose feed-forward networks are mixtures of experts with a dense
decoder that spends the same parameters per token, and the same mixture trained with and without
the load-balancing loss. :func:`train_experts_run` trains one of them (the same windows, steps,
schedule and seed for every run; kept on disk with :mod:`coursepkg.chapters.run_cache` when asked);
:func:`expert_loads` measures how a trained model spreads held-out tokens over its experts, and
:func:`token_routes` which experts each character of a text goes to.

Dimension legend: B windows, L characters per window, E experts, k experts per token, V
vocabulary.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.train import History, fit_warmup_decay, seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.config_groups import LatentConfig, MoEConfig
from coursepkg.data.text import char_lm_batches, load_tinyshakespeare
from coursepkg.data.vocab import CharVocab
from coursepkg.decoder_only import DecoderOnlyLM
from coursepkg.moe import expert_load

from .run_cache import cache_file, check_cache_mode, restore_run, reuse_run, run_record, save_run

__all__ = [
    "ATTENTION",
    "DENSE",
    "MOE",
    "ExpertsRun",
    "expert_loads",
    "token_routes",
    "train_experts_run",
]

#: The mixture: today's block (RMSNorm, RoPE, SwiGLU), 2 layers of width 32, 8 experts of
#: width 32, each character sent to 2 of them.
MOE: dict[str, Any] = dict(
    d_model=32,
    n_heads=4,
    d_ff=64,
    n_layers=2,
    dropout=0.0,
    max_len=128,
    norm_first=True,
    norm="rmsnorm",
    positional="rope",
    activation="swiglu",
    bias=False,
    moe=MoEConfig(n_experts=8, top_k=2, d_ff=32),
)

#: Its dense peer: one feed-forward of width k x 32 = 64, the width a token's two experts add
#: up to, so a token meets as many feed-forward weights in either model (less the router).
DENSE: dict[str, Any] = {k: v for k, v in MOE.items() if k != "moe"}

#: The attentions the chapter compares on :data:`DENSE`, changes to its config. Multi-head
#: attention caches 2 x 4 heads x 8 = 64 numbers per token and layer; multi-query attention
#: 2 x 1 x 8 = 16; latent attention a latent of 12 and a rotated key part of 4, 16 too: the
#: same cache as multi-query attention, a quarter of multi-head's.
ATTENTION: dict[str, dict[str, Any]] = {
    "MHA": {},
    "MQA": dict(n_kv_heads=1),
    "MLA": dict(latent=LatentConfig(kv_rank=12, d_rope=4)),
}  # the end of ATTENTION


@dataclass
class ExpertsRun:
    """One trained model of the chapter and what its training measured.

    Attributes:
        model: the :class:`~coursepkg.DecoderOnlyLM`, in eval mode.
        vocab: Tiny Shakespeare's characters plus the special ids.
        history: the run's :class:`~coursepkg.chapters.train.History` (``loss``: the training loss
            of every step, without the auxiliary term; ``metrics["held-out"]``: the mean loss on
            fixed held-out windows; ``seconds``: the training's wall-clock time).
        heldout: the fixed held-out batches, (x, y) pairs of (B, L) ids.
    """

    model: DecoderOnlyLM
    vocab: CharVocab
    history: History
    heldout: list[tuple[Tensor, Tensor]] = field(repr=False)

    @property
    def parameters(self) -> int:
        """The model's distinct trainable parameters."""
        return sum(p.numel() for p in self.model.parameters())


@functools.lru_cache(maxsize=2)
def _corpus(block_size: int) -> tuple[CharVocab, Tensor, list[tuple[Tensor, Tensor]]]:
    # The characters, the first 90% encoded for training, 2 fixed batches of the last 10%;
    # encoded once per process (the chapter trains a dozen runs on them; none writes to them).
    text = load_tinyshakespeare()
    vocab = CharVocab.from_corpus(text)
    ids = torch.tensor(vocab.encode(text))  # (N,)
    split = int(0.9 * len(ids))
    gen = torch.Generator().manual_seed(1)
    heldout = list(char_lm_batches(ids[split:], vocab, block_size, 64, gen, num_batches=2))
    return vocab, ids[:split], heldout


def _lm_loss(model: DecoderOnlyLM, batch: tuple[Tensor, Tensor]) -> Tensor:
    x, y = batch  # (B, L), (B, L)
    logits = model(x)  # (B, L, V)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def _check_run_args(attention: str, aux_loss_coef: float, cache: str | None) -> None:
    check_cache_mode(cache)
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {sorted(ATTENTION)}, got {attention!r}")
    if isinstance(aux_loss_coef, bool) or not aux_loss_coef >= 0:
        raise ValueError(f"aux_loss_coef must be a number >= 0, got {aux_loss_coef!r}")


def train_experts_run(
    dense: bool = False,
    *,
    attention: str = "MHA",
    aux_loss_coef: float = 0.01,
    steps: int = 150,
    block_size: int = 64,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    cache: str | None = None,
) -> ExpertsRun:
    """Train :data:`MOE` (or :data:`DENSE`) on Tiny Shakespeare's characters, with one of the
    :data:`ATTENTION` variants.

    Adam at ``lr``, a linear warm-up over the first 10% of the steps and a linear decay to 10%
    at the last, gradients clipped at norm 1, random windows of the first 90% of the corpus
    (seeded by ``seed``). The loss minimised is the next-character loss plus ``aux_loss_coef``
    times the load-balancing loss (a mixture only); the held-out loss is measured every 25
    steps on 2 fixed batches of 64 windows of the last 10%.

    Args:
        dense: train the dense peer instead of the mixture.
        attention: a key of :data:`ATTENTION` (``"MHA"``: the configs as written).
        aux_loss_coef: the load-balancing loss's weight (0: without it).
        steps: optimisation steps.
        block_size: characters per window (L).
        batch_size: windows per step (B).
        lr: peak learning rate.
        seed: seeds the initialisation and the windows.
        cache: ``None``, ``"save"`` or ``"reuse"``, as ablations' ``train_variant``.

    Returns:
        An :class:`ExpertsRun` with the model in eval mode.

    Raises:
        ValueError: for a negative ``aux_loss_coef``, an unknown ``attention`` or ``cache``
            mode.
    """
    _check_run_args(attention, aux_loss_coef, cache)
    vocab, train_ids, heldout = _corpus(block_size)
    base = DENSE if dense else MOE
    config = TransformerConfig(vocab_size=len(vocab), **base, **ATTENTION[attention])
    coef = 0.0 if dense else float(aux_loss_coef)
    settings = dict(config=asdict(config), aux=coef, steps=steps, block=block_size)
    settings.update(batch=batch_size, lr=lr, seed=seed)
    path = cache_file(settings, "experts") if cache is not None else None
    generator = seed_everything(seed)
    run = ExpertsRun(DecoderOnlyLM(config), vocab, History(), heldout)
    if cache == "reuse" and reuse_run(path, functools.partial(restore_run, run)):
        return run
    lm_losses: list[float] = []

    def loss_fn(model: DecoderOnlyLM, batch: tuple[Tensor, Tensor]) -> Tensor:
        loss = _lm_loss(model, batch)
        lm_losses.append(loss.item())
        return loss + coef * model.load_balancing_loss() if coef else loss

    run.history = fit_warmup_decay(
        run.model,
        char_lm_batches(train_ids, vocab, block_size, batch_size, generator=generator),
        loss_fn,
        _lm_loss,
        heldout,
        steps=steps,
        lr=lr,
        warmup=max(1, steps // 10),
        eval_every=25,
    )
    run.history.loss = lm_losses[: len(run.history.loss)]  # without the auxiliary term
    if path is not None:
        save_run(path, run_record(run), "the experts run")
    return run


@torch.no_grad()
def expert_loads(run: ExpertsRun) -> Tensor:
    """How the trained mixture spreads its held-out characters over the experts.

    Returns:
        (layers, E): each MoE layer's share of the (character, choice) assignments per expert;
        each row sums to 1 (an even spread is 1 / E each).
    """
    if run.model.config.moe is None:
        raise ValueError("expert_loads needs a mixture of experts: the run's config.moe is None")
    n = run.model.config.moe.n_experts
    total = None
    for x, _ in run.heldout:
        run.model(x)
        load = torch.stack([expert_load(r, n) for r in run.model.routings()])  # (layers, E)
        total = load if total is None else total + load
    return total / total.sum(dim=-1, keepdim=True)  # (layers, E)


@torch.no_grad()
def token_routes(run: ExpertsRun, text: str, layer: int = 0) -> tuple[list[str], Tensor]:
    """The experts each character of ``text`` is sent to in one MoE layer, best first.

    Args:
        run: a trained mixture.
        text: characters of the corpus's alphabet.
        layer: which MoE layer (0: the first).

    Shape:
        -> characters (L,), experts (L, k) integer ids.
    """
    ids = torch.tensor([run.vocab.encode(text)])  # (1, L)
    run.model(ids)
    routings = run.model.routings()
    if not 0 <= layer < len(routings):
        raise ValueError(f"layer must be in [0, {len(routings)}), got {layer}")
    return list(text), routings[layer].experts  # (L, k)
