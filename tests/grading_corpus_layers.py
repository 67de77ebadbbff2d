"""Corpus, part 1: the attention-bearing items (ex01-ex05), written the way widely used public
Transformer code writes them, renamed to the exercise contract but with their own maths.

Each implementation is independent of ``coursepkg``. :mod:`grading_corpus` lists them with the
verdict the exercise's docstring calls for and, for the wrong ones, the mistake to be named.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------
# ex01: scaled dot-product attention
# --------------------------------------------------------------------------------------------


def sdpa_annotated(query, key, value, mask=None):
    """The Annotated Transformer's habit: fill with -1e9, keep p_attn."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(p_attn, value), p_attn


def sdpa_nan_to_num(query, key, value, mask=None):
    """-inf fill, then NaN rows turned into zeros."""
    scores = query @ key.transpose(-1, -2) * query.size(-1) ** -0.5  # (..., L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return weights @ value, weights


def sdpa_finfo_then_zero(query, key, value, mask=None):
    """The dtype's most negative number, then masked weights zeroed (HF habit + fix)."""
    q = query / math.sqrt(query.shape[-1])
    scores = torch.einsum("...ld,...sd->...ls", q, key)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return torch.einsum("...ls,...sd->...ld", weights, value), weights


def sdpa_unscaled(query, key, value, mask=None):
    """Dot-product attention without the 1/sqrt(d_k) (Luong-style habit)."""
    scores = torch.matmul(query, key.transpose(-2, -1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ value, weights


def sdpa_where_minus_1e4(query, key, value, mask=None):
    """A finite fill of -1e4 through torch.where (the fp16-friendly habit)."""
    scores = query @ key.transpose(-2, -1) / query.size(-1) ** 0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, -1e4))
    weights = scores.softmax(-1)
    return weights @ value, weights


# --------------------------------------------------------------------------------------------
# ex02: multi-head attention
# --------------------------------------------------------------------------------------------


def _attend(q, k, v, mask, fill=float("-inf"), zero_rows=True):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    w = torch.softmax(scores, dim=-1)  # (B, H, L, S)
    if mask is not None and zero_rows:
        w = w.masked_fill(~mask, 0.0)
    return w @ v, w  # (B, H, L, Dk)


class MHAStoresWeights(nn.Module):
    """Keeps the last attention weights on self (to plot them), as many tutorials do."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn = None

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = (
            proj(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
            for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value))
        )
        x, self.attn = _attend(q, k, v, mask)
        x = x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.out_proj(x)


class MHALinearsList(nn.Module):
    """The Annotated Transformer's four clones in one ModuleList."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = (
            lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        )
        x, _ = _attend(q, k, v, mask)
        x = x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linears[-1](x)


class MHAFusedCAttn(nn.Module):
    """GPT-2's fused c_attn / c_proj; only ever attends to its own input."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_head = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        b, t, c = query.size()
        q, k, v = self.c_attn(query).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y, _ = _attend(q, k, v, mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MHASelfOnly(nn.Module):
    """Contract names, but key and value are projected from the query (self-attention only)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        b, n, d = query.shape
        split = lambda t: t.view(b, n, self.h, d // self.h).transpose(1, 2)  # noqa: E731
        q = split(self.q_proj(query))
        k = split(self.k_proj(query))
        v = split(self.v_proj(query))
        out, _ = _attend(q, k, v, mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class MHAMinus1e9(nn.Module):
    """Per-head einsum with the -1e9 fill and no zeroing of fully masked rows."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        h = self.n_heads
        q = self.q_proj(query).view(b, n_q, h, -1)  # (B, L, H, Dk)
        k = self.k_proj(key).view(b, key.size(1), h, -1)  # (B, S, H, Dk)
        v = self.v_proj(value).view(b, value.size(1), h, -1)  # (B, S, H, Dk)
        s = torch.einsum("blhd,bshd->bhls", q, k) / math.sqrt(d // h)  # (B, H, L, S)
        if mask is not None:
            s = s.masked_fill(mask.logical_not(), -1e9)
        w = s.softmax(-1)
        return self.out_proj(torch.einsum("bhls,bshd->blhd", w, v).reshape(b, n_q, d))


class MHALazy(nn.Module):
    """nn.LazyLinear projections: the input size is found on the first call."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.LazyLinear(d_model)
        self.k_proj = nn.LazyLinear(d_model)
        self.v_proj = nn.LazyLinear(d_model)
        self.out_proj = nn.LazyLinear(d_model)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        q = self.q_proj(query).reshape(b, n_q, self.h, -1).permute(0, 2, 1, 3)
        k = self.k_proj(key).reshape(b, key.size(1), self.h, -1).permute(0, 2, 1, 3)
        v = self.v_proj(value).reshape(b, value.size(1), self.h, -1).permute(0, 2, 1, 3)
        out, _ = _attend(q, k, v, mask)
        return self.out_proj(out.permute(0, 2, 1, 3).reshape(b, n_q, d))


class MHAKeyPaddingConvention(nn.Module):
    """nn.MultiheadAttention's convention carried over: True = padding (blocked)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        b, n_q, d = query.shape
        sh = lambda t: t.reshape(b, t.size(1), self.h, -1).transpose(1, 2)  # noqa: E731
        q, k, v = sh(self.q_proj(query)), sh(self.k_proj(key)), sh(self.v_proj(value))
        out, _ = _attend(q, k, v, None if mask is None else ~mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n_q, d))


class MHAKwargs(nn.Module):
    """Correct attention whose forward calls the mask `attn_mask` (its own keyword name)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, q_in, k_in, v_in, attn_mask=None):
        b, n_q, d = q_in.shape
        sh = lambda t: t.reshape(b, t.size(1), self.h, -1).transpose(1, 2)  # noqa: E731
        q, k, v = sh(self.q_proj(q_in)), sh(self.k_proj(k_in)), sh(self.v_proj(v_in))
        out, _ = _attend(q, k, v, attn_mask)
        return self.out_proj(out.transpose(1, 2).reshape(b, n_q, d))


# --------------------------------------------------------------------------------------------
# ex03: positional encoding
# --------------------------------------------------------------------------------------------


def pe_annotated(max_len, d_model):
    """exp/log frequencies, sin into 0::2 and cos into 1::2."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def pe_tensor2tensor(max_len, d_model):
    """tensor2tensor's get_timing_signal_1d: sines then cosines, log-spaced timescales."""
    num_timescales = d_model // 2
    log_inc = math.log(10000.0) / max(num_timescales - 1, 1)
    inv = torch.exp(torch.arange(num_timescales, dtype=torch.float32) * -log_inc)
    scaled = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


def pe_halves_paper_freqs(max_len, d_model):
    """The paper's frequencies, but sines in the first half and cosines in the second."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    freqs = 1.0 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.cat([torch.sin(pos * freqs), torch.cos(pos * freqs)], -1).float()


def pe_numpy_style(max_len, d_model):
    """The angle-rates table of many Keras tutorials, built with Python loops."""
    table = torch.empty(max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model):
            angle = pos / (10000 ** ((2 * (i // 2)) / d_model))
            table[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


# --------------------------------------------------------------------------------------------
# ex04: LayerNorm, feed-forward, encoder layer
# --------------------------------------------------------------------------------------------


class LNAnnotated(nn.Module):
    """a_2 * (x - mean) / (std + eps) + b_2 with torch's (unbiased) std."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias


class LNNoEps(nn.Module):
    """Stores eps but never uses it."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mu = x.mean(dim=-1, keepdim=True)
        sigma = ((x - mu) ** 2).mean(dim=-1, keepdim=True).sqrt()
        return (x - mu) / sigma * self.weight + self.bias


class LNBert(nn.Module):
    """BERT's LayerNorm: eps defaults to 1e-12 (the exercise's default is 1e-5)."""

    def __init__(self, d_model, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class LNRsqrt(nn.Module):
    """Correct: var_mean and rsqrt."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class LNStdPlusEps(nn.Module):
    """Biased variance, but eps added to the standard deviation."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        std = x.var(-1, unbiased=False, keepdim=True).sqrt()
        return self.weight * (x - x.mean(-1, keepdim=True)) / (std + self.eps) + self.bias


class FFNAnnotated(nn.Module):
    """w_1 / w_2 names and a dropout that does nothing at p=0."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class FFNDropout(nn.Module):
    """Contract names, functional ReLU, dropout in eval mode."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(0.1)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.dropout(F.relu(self.linear1(x))))


def _encoder_class(name, attn, norm, pre_ln=False, kwargs_call=False):
    class Layer(nn.Module):
        def __init__(self, d_model, n_heads, d_ff):
            super().__init__()
            self.self_attn = attn(d_model, n_heads)
            self.ffn = FFNDropout(d_model, d_ff)
            self.norm1 = norm(d_model)
            self.norm2 = norm(d_model)

        def forward(self, x, mask=None):
            def attend(h):
                if kwargs_call:
                    return self.self_attn(h, h, h, attn_mask=mask)
                return self.self_attn(h, h, h, mask)

            if pre_ln:
                x = x + attend(self.norm1(x))
                return x + self.ffn(self.norm2(x))
            x = self.norm1(x + attend(x))
            return self.norm2(x + self.ffn(x))

    Layer.__name__ = Layer.__qualname__ = name
    return Layer


EncoderStoresWeights = _encoder_class("EncoderStoresWeights", MHAStoresWeights, LNRsqrt)
EncoderPreLNStoresWeights = _encoder_class(
    "EncoderPreLNStoresWeights", MHAStoresWeights, LNRsqrt, pre_ln=True
)
EncoderMinus1e9 = _encoder_class("EncoderMinus1e9", MHAMinus1e9, LNRsqrt)
EncoderKwargsUnbiasedNorm = _encoder_class(
    "EncoderKwargsUnbiasedNorm", MHAKwargs, LNAnnotated, kwargs_call=True
)
EncoderKwargs = _encoder_class("EncoderKwargs", MHAKwargs, LNRsqrt, kwargs_call=True)


# --------------------------------------------------------------------------------------------
# ex05: causal mask and decoder layer
# --------------------------------------------------------------------------------------------


def mask_subsequent_float(length):
    """The Annotated Transformer's triu(ones, 1) returned as it is: a float, 1 = blocked."""
    return torch.triu(torch.ones(length, length), diagonal=1)


def mask_tril_bool(length):
    return torch.tril(torch.ones(length, length)).bool()


def mask_batched(length):
    """subsequent_mask(size) with its leading batch axis: (1, L, L)."""
    attn_shape = (1, length, length)
    return torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8) == 0


def _decoder_class(name, attn, norm, pre_ln=False):
    class Layer(nn.Module):
        def __init__(self, d_model, n_heads, d_ff):
            super().__init__()
            self.self_attn = attn(d_model, n_heads)
            self.cross_attn = attn(d_model, n_heads)
            self.ffn = FFNDropout(d_model, d_ff)
            self.norm1, self.norm2, self.norm3 = norm(d_model), norm(d_model), norm(d_model)

        def forward(self, x, memory, self_mask=None, cross_mask=None):
            if pre_ln:
                h = self.norm1(x)
                x = x + self.self_attn(h, h, h, self_mask)
                h = self.norm2(x)
                x = x + self.cross_attn(h, memory, memory, cross_mask)
                return x + self.ffn(self.norm3(x))
            x = self.norm1(x + self.self_attn(x, x, x, self_mask))
            x = self.norm2(x + self.cross_attn(x, memory, memory, cross_mask))
            return self.norm3(x + self.ffn(x))

    Layer.__name__ = Layer.__qualname__ = name
    return Layer


DecoderStoresWeights = _decoder_class("DecoderStoresWeights", MHAStoresWeights, LNRsqrt)
DecoderPreLN = _decoder_class("DecoderPreLN", MHAStoresWeights, LNRsqrt, pre_ln=True)
DecoderMinus1e9 = _decoder_class("DecoderMinus1e9", MHAMinus1e9, LNRsqrt)
DecoderSelfOnly = _decoder_class("DecoderSelfOnly", MHASelfOnly, LNRsqrt)
DecoderLazy = _decoder_class("DecoderLazy", MHALazy, LNRsqrt)
