"""Assignment ex11_modern_block: today's decoder block (Llama, Mistral, Qwen): RMSNorm, rotary
positions, the SwiGLU feed-forward, grouped-query attention with a KV cache, and the pre-norm
block that assembles them.

Masks follow the course convention: boolean, True = may attend. No linear layer has a bias.
"""

from __future__ import annotations

import math  # noqa: F401  (you will need it)

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019):
    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * weight, over the last axis.

    Unlike LayerNorm it subtracts no mean and adds no shift. Write it yourself: the check
    rejects ``nn.RMSNorm`` and ``F.rms_norm``.

    Args:
        d_model: width D of the last axis.
        eps: added to the mean of the squares, inside the square root.

    Parameters (the check copies the reference's into them by name): ``weight`` (D,),
    initialised to ones. No bias.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each row by its root mean square, then scale it.

        Shape:
            x (..., D) -> (..., D).

        Returns:
            ``x`` divided by its root mean square over the last axis, times ``weight``.
        """
        raise NotImplementedError


def apply_rope(
    x: Tensor, positions: Tensor, theta: float = 10000.0, pairs: str = "halves"
) -> Tensor:
    """Rotary position embedding (Su et al., 2021): split each head's Dh columns into Dh/2
    pairs and turn pair i of the row at position p by the angle p * w_i, with
    w_i = theta^(-2i/Dh), i = 0 .. Dh/2 - 1.

    The dot product of a query rotated at position m and a key rotated at position n then
    depends only on m - n. A pair (a, b) turned by the angle t becomes
    (a cos t - b sin t, a sin t + b cos t).

    Args:
        x: queries or keys, split into heads.
        positions: the absolute position of each row, integers (with a KV cache they start
            at the number of cached positions).
        theta: the base of the frequencies (10000 in the paper, 500000 in Llama 3).
        pairs: ``"halves"`` pairs column i with column i + Dh/2 (Hugging Face's rotate-half
            layout: Llama, Qwen); ``"interleaved"`` pairs columns 2i and 2i+1 (the RoFormer
            paper). Either way the output keeps each rotated pair in the columns it came from.

    Shape:
        x (B, H, L, Dh) with Dh even, positions (L,) -> (B, H, L, Dh).

    Returns:
        ``x`` rotated, in ``x``'s dtype.
    """
    raise NotImplementedError


class SwiGLU(nn.Module):
    """The gated feed-forward of Llama and Qwen (Shazeer, 2020):
    SwiGLU(x) = W2 (SiLU(W1 x) * W3 x), with SiLU(z) = z * sigmoid(z).

    Args:
        d_model: width D of input and output.
        d_ff: hidden width F of each of the two branches.

    Submodules (the check copies the reference weights into them by these names), all
    ``nn.Linear`` without bias: ``linear1`` (W1, D -> F, the gate that goes through SiLU:
    Hugging Face's ``gate_proj``), ``linear3`` (W3, D -> F, the linear branch: ``up_proj``),
    ``linear2`` (W2, F -> D: ``down_proj``).
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        """Apply the gated feed-forward at each position.

        Shape:
            x (B, L, D) -> (B, L, D).

        Returns:
            linear2(silu(linear1(x)) * linear3(x)).
        """
        raise NotImplementedError


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention with rotary positions (Ainslie et al., 2023): H query
    heads share Hkv key/value heads, query head h reading key/value head h // (H / Hkv).
    Hkv = H is multi-head attention, Hkv = 1 multi-query attention.

    Each head has Dh = D // H columns. Rotate the queries and the keys (never the values)
    with your ``apply_rope``, then repeat each key/value head H / Hkv times so that heads
    h*r .. h*r + r - 1 share head h (r = H / Hkv), and attend with scores divided by
    sqrt(Dh). Write the attention yourself: the check rejects
    ``torch.nn.functional.scaled_dot_product_attention`` and ``coursepkg``'s classes.

    Args:
        d_model: width D.
        n_heads: number of query heads H (D divisible by H, Dh even).
        n_kv_heads: number of key/value heads Hkv (H divisible by Hkv).
        rope_theta: ``theta`` of the rotary frequencies.
        rope_pairs: ``pairs`` of the rotation (``"halves"`` or ``"interleaved"``).

    Submodules (the check copies the reference weights into them by these names), all
    ``nn.Linear`` without bias: ``q_proj`` (D -> H*Dh), ``k_proj`` and ``v_proj``
    (D -> Hkv*Dh, head g in output features g*Dh .. (g+1)*Dh - 1), ``out_proj`` (H*Dh -> D).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        rope_theta: float = 10000.0,
        rope_pairs: str = "halves",
    ) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        """Self-attention of ``x`` over itself and, with a cache, over the cached positions.

        Args:
            x: the new positions.
            mask: None or a bool tensor broadcastable to (B, H, L, S), **True = may attend**,
                S counting the cached keys too (a causal mask (L, L), a padding mask
                (B, 1, 1, S)). A query that may attend no key gets a zero attention output,
                never NaN.
            cache: None, or a dict this module fills: ``cache["k"]`` and ``cache["v"]`` hold
                the rotated keys and the values of every position seen so far, shape
                (B, Hkv, S, Dh) (Hkv heads, not H: that is what GQA saves). An empty dict
                starts a sequence; each call rotates its new positions starting after the
                cached ones, appends its keys and values, and attends over all of them.

        Shape:
            x (B, L, D) -> (B, L, D).

        Returns:
            out_proj of the H heads' attention outputs, concatenated.
        """
        raise NotImplementedError


class ModernDecoderBlock(nn.Module):
    """The pre-norm decoder block of Llama and Qwen: each sub-layer reads a normalised copy
    of the residual stream and adds its output back to the stream itself:

        x = x + self_attn(norm1(x), mask, cache)
        x = x + ffn(norm2(x))

    Build it from your ``RMSNorm``, ``GroupedQueryAttention`` and ``SwiGLU``.

    Args:
        d_model: width D.
        n_heads: query heads H.
        n_kv_heads: key/value heads Hkv.
        d_ff: hidden width F of the SwiGLU.
        eps: the RMSNorms' eps.
        rope_theta: ``theta`` of the rotary frequencies.
        rope_pairs: ``pairs`` of the rotation.

    Submodules (the check copies the reference weights into them by these names):
    ``norm1`` and ``norm2`` (RMSNorm), ``self_attn`` (GroupedQueryAttention), ``ffn`` (SwiGLU).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_ff: int,
        eps: float = 1e-5,
        rope_theta: float = 10000.0,
        rope_pairs: str = "halves",
    ) -> None:
        super().__init__()
        raise NotImplementedError

    def forward(
        self, x: Tensor, mask: Tensor | None = None, cache: dict[str, Tensor] | None = None
    ) -> Tensor:
        """One block: attention, then the feed-forward, each on the normalised stream.

        Args:
            x: the residual stream.
            mask: as in :class:`GroupedQueryAttention`.
            cache: passed on to ``self_attn``.

        Shape:
            x (B, L, D) -> (B, L, D).

        Returns:
            The stream with both sub-layers' outputs added.
        """
        raise NotImplementedError
