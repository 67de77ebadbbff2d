"""The engine room above :mod:`coursepkg.attention`: the models' attention and dropout, which
compute the same numbers as the plain classes by faster routes.

:class:`FastMultiHeadAttention` overrides the two steps of
:class:`~coursepkg.attention.MultiHeadAttention` that have faster routes, the projection and the
attention kernel; :class:`FastDropout` skips the call of a dropout that is off. This module
imports the plain one, never the reverse, and a property test holds the two classes equal
(outputs, gradients, cached decoding) over the options.

Dimension legend: B batch, H heads, Hkv key/value heads, L queries, S keys, D d_model, Dk/Dv
per-head sizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention, fused_attention
from .kv_cache import LayerCache
from .masks import PackedMask, causal_mask

__all__ = ["FUSE_MIN_ROWS", "FastDropout", "FastMultiHeadAttention", "stacked_qkv"]

# Below this many query rows (B * L), the projections stay three separate matmuls.
FUSE_MIN_ROWS = 32


class FastMultiHeadAttention(MultiHeadAttention):
    """:class:`~coursepkg.attention.MultiHeadAttention` with faster routes to the same values.

    Same arguments, submodules, parameter names and state dict as the plain class, so weights
    move between the two by name. It overrides two steps:

    :meth:`_project` takes one of three routes to Q, K and V, or falls back to the plain three
    projections when none applies. Why each exists, and when it is not taken:

    1. Cross-attention while decoding (a static cache, filled on the first step): the memory's
       keys and values are the same at every step, so only Q is projected.
    2. Self-attention while generating (a growing cache, no gradients): W^Q, W^K, W^V are
       stacked into one matrix kept on the module, and each step runs one matmul instead of
       three (benchmarks/decode_hf.py). The stack is made again only when a source weight has
       changed since (its ``_version``, bumped by every in-place write: an optimizer step,
       ``load_state_dict``; its storage, dtype and device: ``.to()``), so it is made once
       per model, not once per ``generate`` call (that was 6% of the large speculative pair's
       run, benchmarks/serve.py). Its cost is memory: one more copy of the Q/K/V weights per
       layer while the model generates (for a Llama-shaped D=1024 layer with 4 key/value
       heads of 64, 1.5 M floats, 6 MB: 60% of the attention's weights, 13% of the
       layer's). Training drops it: a forward pass with gradients frees the stack, so a
       model being trained holds no stale copy, and only inference pays for it. Not
       taken with gradients, which must reach the three weights, nor for cross-attention.
    3. Many query rows (at least :data:`FUSE_MIN_ROWS`: training, a whole prompt):
       self-attention runs its three projections as one matmul and cross-attention its W^K,
       W^V as one, on weights concatenated for this call: fewer, larger GEMMs
       (benchmarks/train_step.py). Not taken for a few rows, where concatenating the weights
       costs more than the small matmuls it saves, nor for three distinct inputs.

    Routes 2 and 3 read the projections' weights, so they are taken only when the three are
    plain ``nn.Linear`` layers holding plain weights: a wrapped one (a LoRA adapter), or one
    whose weight is a tensor subclass (``torchao``'s quantized weights, which cannot be
    concatenated), is called as it is.

    :meth:`_attend` uses the fused kernel without re-checking its arguments, skips the head
    repeat without grouping, and with grouped queries reads each K/V head in place (as
    transformers' ``pack_gqa``: the group's query heads become rows of one K/V head) instead of
    copying it H/Hkv times: for one decoded token without a mask, and when generating (no
    gradients, no dropout) whenever every head shares the mask (a causal (L, S) one, a token
    mask (B, 1, 1, S): speculative decoding's verify pass, batched decoding). Given a
    :class:`~coursepkg.masks.PackedMask` (requests laid end to end in one row: the packed
    serving step) when generating, it attends by request, never scoring a token against another
    request's keys (:meth:`_attend_by_request`). With ``record_weights`` it runs the plain
    (textbook) kernel, which keeps the weights.
    """

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, cache: LayerCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The plain projections' values by routes 1-3 (see the class docstring).

        Shape:
            query (B, L, D), key (B, S, D), value (B, S, D) -> (B, H, L, Dk), (B, Hkv, S, Dk),
            (B, Hkv, S, Dv); K and V do not include what the cache held before this call.
        """
        fixed = None if cache is None else cache.fixed_kv()
        if fixed is not None:  # 1.
            return self._split(self.q_proj(query), self.d_k), *fixed
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if not all(_plain_linear(p) for p in projs):  # wrapped (LoRA), quantized: as they are
            return super()._project(query, key, value, cache)
        self_attention = query is key and key is value
        if torch.is_grad_enabled():
            self.__dict__.pop("_qkv_stack", None)  # training holds no stale copy (route 2)
        elif self_attention and cache is not None:  # 2.
            return self._stacked_qkv(query)  # (a growing cache: a filled fixed one is 1.)
        if query.numel() // self.d_model < FUSE_MIN_ROWS or not (self_attention or key is value):
            return super()._project(query, key, value, cache)
        if self_attention:  # 3.
            projs, x, q = (self.q_proj, self.k_proj, self.v_proj), query, ()
        else:
            projs, x, q = (self.k_proj, self.v_proj), key, (self.q_proj(query),)
        weight = torch.cat([p.weight for p in projs])  # (sum of widths, D)
        bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])
        q, k, v = (*q, *F.linear(x, weight, bias).split([p.out_features for p in projs], dim=-1))
        return self._split_qkv(q, k, v)

    def _split_qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # Projected Q, K, V split into heads: (B, n, H*Dk), (B, n, Hkv*Dk), (B, n, Hkv*Dv)
        # -> (B, H, n, Dk), (B, Hkv, n, Dk), (B, Hkv, n, Dv).
        g = self.n_kv_heads
        return self._split(q, self.d_k), self._split(k, self.d_k, g), self._split(v, self.d_v, g)

    def _stacked_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Route 2: W^Q, W^K, W^V as one matmul per step, on the stack :func:`stacked_qkv`
        keeps on the module (made again when a source weight changed).

        Shape:
            x (B, L, D) -> (B, H, L, Dk), (B, Hkv, L, Dk), (B, Hkv, L, Dv).
        """
        stacked = stacked_qkv(self)
        qkv = F.linear(x, *stacked)  # (B, L, (H + Hkv)*Dk + Hkv*Dv)
        h, g, b, n = self.n_heads, self.n_kv_heads, x.size(0), x.size(1)
        if self.d_k == self.d_v:  # one view splits all three into heads
            return qkv.view(b, n, h + 2 * g, self.d_k).transpose(1, 2).split((h, g, g), dim=1)
        return self._split_qkv(*qkv.split((h * self.d_k, g * self.d_k, g * self.d_v), dim=-1))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The plain :meth:`_attend`'s values with the fused kernel (see the class docstring).

        Shape:
            q (B, H, L, Dk), k (B, Hkv, S, Dk), v (B, Hkv, S, Dv) -> (B, H, L, Dv).
        """
        p = self.dropout if self.training else 0.0
        b, h, n_q, dk = q.shape
        if isinstance(mask, PackedMask):  # requests end to end: each against its own keys
            if b == 1 and not self.record_weights and self._packs(mask.dense, n_q, p):
                return self._attend_by_request(q, k, v, mask)  # (1, H, T, Dv)
            mask = mask.dense  # (T, S): the same numbers by the dense mask
        if self.record_weights:
            return super()._attend(q, k, v, mask)
        group = self.n_heads // self.n_kv_heads
        if group > 1 and self._packs(mask, n_q, p):
            # The group's query heads become rows of its K/V head: (B, H, L) queries are
            # (B, Hkv, group * L), and a mask the heads share repeats its L rows per head.
            q = q.reshape(b, self.n_kv_heads, group * n_q, dk)  # (B, Hkv, group*L, Dk)
            if mask is not None and mask.dim() >= 2 and mask.size(-2) > 1:
                mask = torch.cat([mask] * group, dim=-2)  # (..., group*L, S); 5x .repeat speed
            return fused_attention(q, k, v, mask, p).reshape(b, h, n_q, -1)  # (B, H, L, Dv)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)  # (B, H, S, Dk)
            v = v.repeat_interleave(group, dim=1)  # (B, H, S, Dv)
        return fused_attention(q, k, v, mask, p)  # (B, H, L, Dv)

    def _attend_by_request(self, q: Tensor, k: Tensor, v: Tensor, mask: PackedMask) -> Tensor:
        """Requests packed end to end (a :class:`~coursepkg.masks.PackedMask`), each scored
        against its own keys only: the requests with one new token as one left-padded batch (a
        decode step), each longer run as a causal prefill of its own. The dense mask's values
        without its scores between requests, which are most of them (benchmarks/serve.py).

        Shape:
            q (1, H, T, Dk), k (1, Hkv, S, Dk), v (1, Hkv, S, Dv) -> (1, H, T, Dv).
        """
        out = q.new_empty(*q.shape[:-1], v.size(-1))  # (1, H, T, Dv)
        rows, keys, real = mask.one_token_rows()  # (Bd,), (Bd, W), (Bd, 1, 1, W)
        if rows.numel():  # a decode step's batch, attended as any batched decoding is
            n, index = rows.numel(), keys.flatten()  # index: (Bd*W,)
            q_d = q[0].index_select(1, rows).transpose(0, 1)[:, :, None]  # (Bd, H, 1, Dk)
            k_d = k[0].index_select(1, index).view(k.size(1), n, -1, k.size(-1))  # (Hkv, Bd, W, Dk)
            v_d = v[0].index_select(1, index).view(v.size(1), n, -1, v.size(-1))  # (Hkv, Bd, W, Dv)
            o_d = self._attend(
                q_d, k_d.transpose(0, 1), v_d.transpose(0, 1), real
            )  # (Bd, H, 1, Dv)
            out[0][:, rows] = o_d[:, :, 0].transpose(0, 1)  # (H, Bd, Dv)
        for q0, q1, k0, k1 in mask.runs():
            if q1 - q0 > 1:  # a prompt: a causal prefill over its own keys
                causal = causal_mask(q1 - q0, k1 - k0, device=q.device)  # (n, n_keys)
                out[:, :, q0:q1] = self._attend(
                    q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], causal
                )  # (1, H, n, Dv)
        return out

    @staticmethod
    def _packs(mask: Tensor | None, n_q: int, dropout: float) -> bool:
        # Whether grouped query heads may be read as rows of their K/V head: one decoded token
        # without a mask (always), or, when generating (no gradients, no dropout), any query
        # block whose mask every head shares (no head dimension, or a head dimension of 1).
        if mask is None and n_q == 1:
            return True
        if torch.is_grad_enabled() or dropout > 0:
            return False
        return mask is None or mask.dim() < 3 or mask.size(-3) == 1


def _plain_linear(module: nn.Module) -> bool:
    # An nn.Linear whose weight is an ordinary tensor: routes 2 and 3 may concatenate it.
    return type(module) is nn.Linear and type(module.weight) in (nn.Parameter, Tensor)


def stacked_qkv(attention: FastMultiHeadAttention) -> tuple[Tensor, Tensor | None]:
    """The stacked (W^Q; W^K; W^V) weight and bias of route 2, kept on ``attention`` and made
    again when one of the six source tensors changed since (a new ``_version``: any in-place
    write; a new storage, dtype or device). A write through ``.data`` escapes the version
    counter (what sets ``.data`` apart from ``.detach()``): coursepkg writes none; after one,
    ``del attention.__dict__["_qkv_stack"]``.

    For route 2, and for benchmarks that replay the same generation steps by hand.

    Shape:
        -> ((H + Hkv)*Dk + Hkv*Dv, D), ((H + Hkv)*Dk + Hkv*Dv,) or None.
    """
    projs = (attention.q_proj, attention.k_proj, attention.v_proj)
    sources = [t for p in projs for t in (p.weight, p.bias) if t is not None]
    stamp = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in sources)
    kept = attention.__dict__.get("_qkv_stack")
    if kept is not None and kept[0] == stamp:
        return kept[1]
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable outside too
        # Stored (D, widths) and used transposed: one input row times this layout is the
        # faster matrix-vector product (benchmarks/decode_hf.py).
        weight = torch.cat([p.weight.t() for p in projs], dim=1).t()  # (widths, D)
        bias = None if projs[0].bias is None else torch.cat([p.bias for p in projs])  # (widths,)
    attention.__dict__["_qkv_stack"] = (stamp, (weight, bias))
    return weight, bias


class FastDropout(nn.Dropout):
    """``nn.Dropout`` that returns its input untouched, without a kernel call, when it is off
    (evaluation mode or ``p == 0``): generation calls a dozen of them per token.

    Kept because it is measurable: greedy ``DecoderOnlyLM.generate`` (the decode benchmark's
    shape, D=256, 4 layers, batch 1, 2 threads, eval mode, 128 tokens) took 1.08x and 1.21x as
    long with plain ``nn.Dropout`` in two alternated runs on a shared machine (same tokens).
    """

    def forward(self, x: Tensor) -> Tensor:
        """Shape: any -> same."""
        return super().forward(x) if self.training and self.p > 0 else x
