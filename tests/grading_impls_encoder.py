"""Independent correct implementations of the ex01-ex04 exercise items, used by the grading tests
to show that the checks accept solutions other than the reference.

Each item has two versions, written differently from each other and from ``coursepkg``
(einsum, per-head loops, explicit formulas, a hand-written softmax). They live here, in
``tests/``, never in the package (students can import the package).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# --------------------------------------------------------------------------------------------
# ex01: scaled dot-product attention
# --------------------------------------------------------------------------------------------


def sdpa_einsum(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None):
    """einsum scores, -inf fill, NaN of empty rows replaced afterwards."""
    scores = torch.einsum("...ld,...sd->...ls", query, key) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))  # (..., L, S)
    weights = scores.softmax(dim=-1).nan_to_num(nan=0.0)  # (..., L, S)
    return torch.einsum("...ls,...sv->...lv", weights, value), weights  # (..., L, Dv)


def sdpa_manual_softmax(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None):
    """Scale the queries first; softmax written out with a masked exponential."""
    q = query * query.size(-1) ** -0.5
    scores = torch.matmul(q, key.transpose(-1, -2))  # (..., L, S)
    allowed = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.expand_as(scores)
    top = scores.masked_fill(~allowed, -math.inf).amax(-1, keepdim=True)  # (..., L, 1)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(scores - top) * allowed  # (..., L, S)
    weights = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    return torch.matmul(weights, value), weights  # (..., L, Dv), (..., L, S)


def additive_score_einsum(query, keys, W_q, W_k, v):  # noqa: N803
    hidden = torch.einsum("aq,bq->ba", W_q, query)[:, None] + torch.einsum("ak,bsk->bsa", W_k, keys)
    return torch.einsum("bsa,a->bs", torch.tanh(hidden), v)  # (B, S)


def additive_score_loop(query, keys, W_q, W_k, v):  # noqa: N803
    rows = []
    for b in range(keys.size(0)):
        s = W_q @ query[b]  # (A,)
        rows.append(torch.stack([v @ torch.tanh(s + W_k @ h) for h in keys[b]]))  # (S,)
    return torch.stack(rows)  # (B, S)


# --------------------------------------------------------------------------------------------
# ex02: multi-head attention
# --------------------------------------------------------------------------------------------


class HeadLoopMHA(nn.Module):
    """One head at a time, slicing the projections; the heads are concatenated at the end."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        if mask is not None:
            mask = mask.expand(q.size(0), self.n_heads, q.size(1), k.size(1))  # (B, H, L, S)
        heads = []
        for i in range(self.n_heads):
            cols = slice(i * self.d_head, (i + 1) * self.d_head)
            head_mask = None if mask is None else mask[:, i]  # (B, L, S)
            out, _ = sdpa_manual_softmax(q[..., cols], k[..., cols], v[..., cols], head_mask)
            heads.append(out)  # (B, L, Dk)
        return self.out_proj(torch.cat(heads, dim=-1))  # (B, L, D)


class WeightViewMHA(nn.Module):
    """Projects straight into heads with einsum over the weights viewed as (H, Dk, D)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor, proj: nn.Linear) -> Tensor:
        d = x.size(-1)
        w = proj.weight.view(self.h, d // self.h, d)  # (H, Dk, D)
        b = proj.bias.view(self.h, 1, d // self.h)  # (H, 1, Dk)
        return torch.einsum("bnd,hkd->bhnk", x, w) + b  # (B, H, n, Dk)

    def forward(self, query, key, value, mask=None):
        out, _ = sdpa_einsum(
            self._heads(query, self.q_proj),
            self._heads(key, self.k_proj),
            self._heads(value, self.v_proj),
            mask,
        )  # (B, H, L, Dk)
        w = self.out_proj.weight.view(query.size(-1), self.h, -1)  # (D, H, Dk)
        return torch.einsum("bhlk,dhk->bld", out, w) + self.out_proj.bias  # (B, L, D)


# --------------------------------------------------------------------------------------------
# ex03: positional encoding
# --------------------------------------------------------------------------------------------


def pe_python_loops(max_len: int, d_model: int) -> Tensor:
    """The formula entry by entry, in Python floats."""
    rows = []
    for pos in range(max_len):
        row = []
        for col in range(d_model):
            angle = pos / 10000 ** ((col - col % 2) / d_model)
            row.append(math.sin(angle) if col % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows)  # (max_len, D)


def pe_pow_stack(max_len: int, d_model: int) -> Tensor:
    """float32 throughout, frequencies with torch.pow, columns interleaved by stack."""
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
    freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    angles = pos * freq  # (max_len, D/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)  # (max_len, D)


# --------------------------------------------------------------------------------------------
# ex04: LayerNorm, feed-forward, encoder layer
# --------------------------------------------------------------------------------------------


class VarMeanLayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)  # (..., 1)
        return torch.addcmul(self.bias, (x - mean) * torch.rsqrt(var + self.eps), self.weight)


class SquaresLayerNorm(nn.Module):
    """Variance as E[x^2] - E[x]^2, in float64 inside for stability of nearly constant rows."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        x64 = x.double()
        mean = x64.mean(-1, keepdim=True)  # (..., 1)
        var = (x64 * x64).mean(-1, keepdim=True) - mean * mean  # (..., 1)
        y = ((x64 - mean) / (var + self.eps).sqrt()).to(x.dtype)
        return y * self.weight + self.bias


class ClampFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.linear1(x).clamp(min=0))  # (B, L, D)


class SequentialishFFN(nn.Module):
    """ReLU as a module, applied through a loop over the two layers."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act = nn.ReLU()

    def forward(self, x):
        for layer, act in ((self.linear1, self.act), (self.linear2, nn.Identity())):
            x = act(layer(x))
        return x  # (B, L, D)


class EncoderLayerA(nn.Module):
    """Built, as in a student's notebook, from classes defined earlier in the same file."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = HeadLoopMHA(d_model, n_heads)
        self.ffn = ClampFFN(d_model, d_ff)
        self.norm1 = VarMeanLayerNorm(d_model)
        self.norm2 = VarMeanLayerNorm(d_model)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask))  # (B, L, D)
        return self.norm2(x + self.ffn(x))  # (B, L, D)


class EncoderLayerB(nn.Module):
    """Same layer, sub-layers applied in a loop, other pieces."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = WeightViewMHA(d_model, n_heads)
        self.ffn = SequentialishFFN(d_model, d_ff)
        self.norm1 = SquaresLayerNorm(d_model)
        self.norm2 = SquaresLayerNorm(d_model)

    def forward(self, x, mask=None):
        for sublayer, norm in (
            (lambda h: self.self_attn(h, h, h, mask=mask), self.norm1),
            (self.ffn, self.norm2),
        ):
            x = norm(x + sublayer(x))  # (B, L, D)
        return x
