"""Assignment ex08_decoding: greedy decoding and beam search with a trained encoder-decoder
(chapter 9).

``model`` is a :class:`coursepkg.Transformer` in eval mode. Use only these two methods of it
(do not call ``coursepkg.greedy_decode`` or ``coursepkg.beam_search``: the check rejects that):

* ``memory = model.encode(src)``: src (B, S) token ids -> memory (B, S, D);
* ``logits = model.decode(tgt, memory)``: tgt (B, T) ids starting with BOS, memory (B, S, D)
  -> logits (B, T, V); ``logits[:, -1]`` scores the token that comes after ``tgt``.
  The causal mask is applied inside; ``memory`` must have the batch size of ``tgt`` (use
  ``memory.repeat_interleave(k, dim=0)`` or ``memory[i : i + 1]`` to match).

Positions after a finished sequence's EOS hold the pad id: ``model.config.pad_id`` if it is
set, otherwise ``eos_id``.
"""

from __future__ import annotations

import torch  # noqa: F401  (you will need it)
from torch import Tensor, nn


def greedy_decode(model: nn.Module, src: Tensor, max_len: int, bos_id: int, eos_id: int) -> Tensor:
    """Greedy decoding: at every step append the single most probable next token.

    Every row starts with ``bos_id``. A row is finished once it has produced ``eos_id``; its
    later positions hold the pad id (see the module docstring). Stop when every row is
    finished or after ``max_len`` new tokens, whichever comes first.

    Args:
        model: an encoder-decoder ``coursepkg.Transformer`` in eval mode.
        src: source token ids.
        max_len: the most tokens to generate after BOS (>= 1).
        bos_id: start-of-sequence id (the first decoder input).
        eos_id: end-of-sequence id.

    Shape:
        src (B, S) -> (B, 1 + T) with T <= max_len.

    Returns:
        Long tensor of generated ids, BOS first.
    """
    raise NotImplementedError


def beam_search(
    model: nn.Module,
    src: Tensor,
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Beam search with length normalisation, separately for each source sentence.

    The score of a hypothesis is its total log-probability (sum of ``log_softmax`` of the
    chosen tokens). For each source:

    1. Start from one open hypothesis ``[bos_id]`` with log-probability 0.
    2. At step ``t = 1, 2, ..., max_len``: extend every open hypothesis by every token, and
       sort these candidates by total log-probability, best first. Walk down the sorted list:

       * a candidate ending in ``eos_id`` is finished; it is ranked by the normalised score
         ``logp / t ** length_penalty`` (``t`` counts the generated tokens, EOS included, BOS
         not). As soon as ``beam_size`` hypotheses are finished (counting earlier steps) and
         ``t < max_len``, this source is done: stop searching it;
       * any other candidate becomes an open hypothesis of the next step; stop walking once
         ``beam_size`` open hypotheses are kept.
    3. If a source is not done after ``max_len`` steps, its open hypotheses are finished too,
       with the normalised score ``logp / max_len ** length_penalty``.
    4. The answer is the finished hypothesis with the highest normalised score.

    ``length_penalty=0`` ranks by raw log-probability (which favours short outputs);
    with ``beam_size=1`` beam search is exactly greedy decoding.

    Args:
        model: an encoder-decoder ``coursepkg.Transformer`` in eval mode.
        src: source token ids.
        beam_size: hypotheses kept per source, >= 1.
        max_len: the most tokens to generate after BOS (>= 1).
        bos_id: start-of-sequence id.
        eos_id: end-of-sequence id.
        length_penalty: the exponent alpha of the length normalisation, >= 0.

    Shape:
        src (B, S) -> tokens (B, 1 + T) with T <= max_len, scores (B,).

    Returns:
        ``(tokens, scores)``: per source, the best hypothesis (BOS first, shorter rows padded
        with the pad id) and its normalised score (a float tensor).
    """
    raise NotImplementedError
