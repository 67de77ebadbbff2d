"""Assignment ex07_parameters: count the Transformer's parameters from its hyper-parameters
(chapter 10)."""

from __future__ import annotations


def transformer_parameter_count(
    vocab_size: int,
    d_model: int,
    n_heads: int,
    d_ff: int,
    n_layers: int,
    *,
    n_decoder_layers: int | None = None,
    d_k: int | None = None,
    d_v: int | None = None,
    src_vocab_size: int | None = None,
    share_embeddings: bool = True,
    tie_embeddings: bool = True,
    bias: bool = True,
    final_norm: bool = False,
) -> int:
    """Number of trainable parameters of the encoder-decoder Transformer (Vaswani et al.),
    from the formulas alone: build nothing, count with arithmetic.

    The model: a token embedding (V x D) for the source and one for the target; sinusoidal
    positions (no parameters); ``n_layers`` encoder layers (self-attention, feed-forward, two
    LayerNorms); ``n_decoder_layers`` decoder layers (self-attention, cross-attention,
    feed-forward, three LayerNorms); a final LayerNorm after each stack only if ``final_norm``;
    an output projection D -> V without bias. Each attention block has W^Q, W^K (D x H*Dk),
    W^V (D x H*Dv) and W^O (H*Dv x D); each feed-forward network has W1 (D x F) and W2 (F x D);
    each LayerNorm has a gain and a shift of size D. With ``bias=True`` every linear layer has
    a bias vector (of its output size); with ``bias=False`` no linear has one and LayerNorms
    keep only their gain. A matrix that is shared or tied is counted once.

    The paper's base model (V=37000, D=512, H=8, F=2048, N=6) has 63,082,496 parameters here.

    Args:
        vocab_size: target vocabulary V (also the source one unless ``src_vocab_size`` is set).
        d_model: width D.
        n_heads: heads H.
        d_ff: feed-forward inner width F.
        n_layers: encoder layers N (and decoder layers unless ``n_decoder_layers`` is set).
        n_decoder_layers: decoder layers; None means ``n_layers``.
        d_k: per-head query/key size; None means ``d_model // n_heads``.
        d_v: per-head value size; None means ``d_model // n_heads``.
        src_vocab_size: source vocabulary when it differs; None means ``vocab_size``.
        share_embeddings: source and target use one embedding matrix (needs one vocabulary).
        tie_embeddings: the output projection reuses the target embedding matrix.
        bias: biases in the linear layers and the LayerNorms' shift.
        final_norm: a LayerNorm after the encoder stack and one after the decoder stack.

    Returns:
        The number of distinct parameters, an ``int``.
    """
    raise NotImplementedError
