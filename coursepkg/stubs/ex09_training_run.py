"""Assignment ex09_training_run: assemble an encoder-decoder from your pieces, train it on the
date task within a CPU budget, and decode it greedily (chapters 6-9).

The pieces (``MultiHeadAttention``, ``sinusoidal_positional_encoding``, ``LayerNorm``,
``PositionwiseFeedForward``, ``EncoderLayer``, ``causal_mask``, ``DecoderLayer``, ``noam_lr``,
``label_smoothed_cross_entropy``) are the student's own from ex02-ex06, pasted into the notebook.
Masks follow the course's convention: bool, True = may attend (attention masks) or True = real
token (the token masks ``src_mask``/``tgt_mask``).
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor, nn


class DateTransformer(nn.Module):
    """An encoder-decoder Transformer (Vaswani et al., Sec. 3) built from your own pieces.

    Token embeddings plus sinusoidal positions (and dropout) feed ``n_layers`` of your
    ``EncoderLayer`` and ``n_layers`` of your ``DecoderLayer``; a final ``nn.Linear`` turns the
    decoder's states into scores over the target vocabulary.

    Args:
        src_vocab_size: size of the source (human date) vocabulary.
        tgt_vocab_size: size V of the target (ISO date) vocabulary.
        d_model: width D.
        n_heads: heads H.
        d_ff: inner width F of the feed-forward networks.
        n_layers: encoder layers, and decoder layers.
        dropout: dropout on the embeddings (plus positions).
        max_len: longest sequence the positional table covers.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        d_ff: int = 128,
        n_layers: int = 1,
        dropout: float = 0.1,
        max_len: int = 64,
    ) -> None:
        super().__init__()
        raise NotImplementedError

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """Encode the source.

        Args:
            src: source token ids.
            src_mask: bool, True = real token (False = padding).

        Shape:
            src (B, S), src_mask (B, S) -> memory (B, S, D).
        """
        raise NotImplementedError

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """Scores of the next token at every target position, under the causal mask.

        Args:
            tgt_in: decoder input ids, BOS first (the target shifted right).
            memory: the encoder's output.
            src_mask: bool, True = real source token.
            tgt_mask: None or bool, True = real target token.

        Shape:
            tgt_in (B, T), memory (B, S, D), src_mask (B, S), tgt_mask (B, T) -> (B, T, V).

        Returns:
            Logits; position t scores the token that follows ``tgt_in[:, : t + 1]``.
        """
        raise NotImplementedError

    def forward(
        self, src: Tensor, tgt_in: Tensor, src_mask: Tensor, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """Teacher forcing: encode ``src`` and decode ``tgt_in`` in one pass.

        Shape:
            src (B, S), tgt_in (B, T), src_mask (B, S), tgt_mask (B, T) -> logits (B, T, V).
        """
        raise NotImplementedError


def sequence_loss(model: nn.Module, batch, smoothing: float = 0.1) -> Tensor:
    """The label-smoothed, teacher-forced loss of one batch (Sec. 5.4).

    ``batch`` is a ``coursepkg.data.batching.Seq2SeqBatch`` (``src, tgt_in, tgt_out, src_mask,
    tgt_mask``): feed ``tgt_in`` (BOS + target) to the decoder and score its logits against
    ``tgt_out`` (target + EOS) with your ``label_smoothed_cross_entropy``, padding ignored.

    Args:
        model: your ``DateTransformer``.
        batch: one padded batch.
        smoothing: label-smoothing epsilon.

    Returns:
        The mean loss over the real target tokens, a scalar tensor.
    """
    raise NotImplementedError


def train_model(
    model: nn.Module,
    steps: int,
    batch_size: int = 64,
    warmup_steps: int = 100,
    lr_factor: float = 1.0,
    smoothing: float = 0.1,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` on fresh date pairs with Adam and the warm-up schedule (Sec. 5.3).

    Draw ``steps * batch_size`` training pairs with ``coursepkg.data.dates.make_date_pairs``
    (seeded by ``seed``), batch them with ``encode_batch``, and take one optimiser step per
    batch: Adam (betas (0.9, 0.98), eps 1e-9) at the rate ``lr_factor * noam_lr(step, D,
    warmup_steps)`` (a ``torch.optim.lr_scheduler.LambdaLR`` stepped after every optimiser
    step), loss :func:`sequence_loss`. Leave the model in eval mode at the end.

    Args:
        model: the model to train (in place).
        steps: optimiser steps.
        batch_size: pairs per step.
        warmup_steps: steps of linear warm-up.
        lr_factor: multiplies the schedule.
        smoothing: label-smoothing epsilon.
        seed: seeds the training pairs.

    Returns:
        The loss of every step.
    """
    raise NotImplementedError


def greedy_decode(
    model: nn.Module, src: Tensor, src_mask: Tensor, max_len: int, bos_id: int, eos_id: int
) -> Tensor:
    """Greedy decoding with your model: append the most probable token, one step at a time.

    Every row starts with ``bos_id``; a row that has produced ``eos_id`` is finished and gets
    the pad id (0) after it. Stop when every row is finished or after ``max_len`` new tokens.
    The grader calls this on the model as training left it: make sure dropout is off.

    Args:
        model: your trained ``DateTransformer``.
        src: source ids.
        src_mask: bool, True = real source token.
        max_len: the most tokens to generate after BOS.
        bos_id: start-of-sequence id.
        eos_id: end-of-sequence id.

    Shape:
        src (B, S), src_mask (B, S) -> (B, 1 + T) with T <= max_len.

    Returns:
        Long tensor of ids, BOS first.
    """
    raise NotImplementedError
