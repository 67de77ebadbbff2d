"""GRU encoder-decoders for the bottleneck chapters, with and without Bahdanau attention.

Without attention the decoder starts from the encoder's final state and sees nothing else: the
whole source must squeeze through one vector h_S (the "bottleneck" of notes 1.1; Cho et al. 2014,
Sutskever et al. 2014). With attention the decoder looks back at every encoder state at every step
(Bahdanau et al. 2015), and :meth:`Seq2SeqRNN.greedy` returns the alignment weights for heatmaps.

:func:`encoder_state_gradient_norms` measures how much gradient reaches each encoder step, the
chapter's picture of why the bottleneck model struggles with long inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from coursepkg._validation import check_token_mask, check_tokens
from coursepkg.attention import AdditiveAttention

__all__ = ["Seq2SeqRNN", "encoder_state_gradient_norms"]


class Seq2SeqRNN(nn.Module):
    """RNN encoder-decoder, the bottleneck model and its attention fix (notes 1.1; Bahdanau 2015).

    * ``attention=False``: a unidirectional GRU encodes the source; its final state h_S is the
      decoder's initial state s_0 and the only thing the decoder ever sees of the source.
    * ``attention=True``: a bidirectional GRU encodes the source into states
      h_i = [h_i^fwd; h_i^bwd] (size 2 * hidden_dim). At target step t the decoder computes
      the context c_t = sum_i alpha_ti h_i from its previous state s_{t-1} (additive
      attention), feeds [embedding(y_{t-1}); c_t] to a GRU cell to get s_t, and predicts y_t
      from [s_t; c_t].
      s_0 = tanh(W_b [h_S^fwd; h_1^bwd]) (Bahdanau used the backward half only).
    * ``attention=True, bidirectional=False``: the ablation between the two, attention over the
      states of a unidirectional GRU (size hidden_dim), s_0 = tanh(W_b h_S).

    The source may be right-padded; padded positions are skipped by the encoder (packed sequences)
    and never attended, so outputs do not depend on how much padding follows a sentence.

    Args:
        src_vocab: Source vocabulary size.
        tgt_vocab: Target vocabulary size V.
        emb_dim: Embedding size E of both vocabularies.
        hidden_dim: GRU state size H (the encoder states are 2H wide with attention).
        attention: Whether the decoder attends over the encoder states.
        bidirectional: Whether the encoder reads both directions; None (the default) means
            the same as ``attention``. Only an attention model may be bidirectional.
        pad_id: Padding id in both vocabularies; its embedding is zero and receives no gradient.

    Shape:
        - src: (B, S) long, right-padded with ``pad_id``
        - tgt_in: (B, T) long, the target shifted right (starts with BOS)
        - src_mask: (B, S) bool, True = real token, or None to derive it as ``src != pad_id``
        - output: logits (B, T, V)
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        emb_dim: int,
        hidden_dim: int,
        attention: bool,
        pad_id: int = 0,
        bidirectional: bool | None = None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("src_vocab", src_vocab),
            ("tgt_vocab", tgt_vocab),
            ("emb_dim", emb_dim),
            ("hidden_dim", hidden_dim),
        ):
            _check_positive_int(name, value)
        if not isinstance(attention, bool):
            raise TypeError(f"attention must be a bool, got {type(attention).__name__}")
        if not isinstance(pad_id, int) or not 0 <= pad_id < min(src_vocab, tgt_vocab):
            raise ValueError(
                f"pad_id must be an int in [0, {min(src_vocab, tgt_vocab)}), got {pad_id!r}"
            )
        bidirectional = attention if bidirectional is None else bidirectional
        if bidirectional and not attention:
            raise ValueError(
                "bidirectional=True needs attention=True (the bottleneck decoder reads h_S only)"
            )
        self.src_vocab = src_vocab
        self.tgt_vocab = tgt_vocab
        self.emb_dim = emb_dim
        self.hidden_dim = hidden_dim
        self.use_attention = attention
        self.pad_id = pad_id
        self.bidirectional = bidirectional
        self.memory_dim = 2 * hidden_dim if bidirectional else hidden_dim  # an encoder state's size

        self.src_embed = nn.Embedding(src_vocab, emb_dim, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, emb_dim, padding_idx=pad_id)
        self.encoder = nn.GRU(emb_dim, hidden_dim, batch_first=True, bidirectional=bidirectional)
        self.bridge: nn.Linear | None
        self.attention: AdditiveAttention | None
        self.decoder: nn.GRUCell | nn.GRU
        if attention:
            dm = self.memory_dim
            self.bridge = nn.Linear(dm, hidden_dim)  # [h_S^fwd; h_1^bwd] (or h_S) -> s_0
            self.attention = AdditiveAttention(hidden_dim, dm, hidden_dim)
            # One step at a time: step t's context needs s_{t-1}, so no whole-sequence GRU call.
            self.decoder = nn.GRUCell(emb_dim + dm, hidden_dim)
            self.out_proj = nn.Linear(hidden_dim + dm, tgt_vocab)  # [s_t; c_t] -> V
        else:
            self.bridge = None
            self.attention = None
            # Teacher forcing needs no per-step Python loop here: one fused GRU call.
            self.decoder = nn.GRU(emb_dim, hidden_dim, batch_first=True)
            self.out_proj = nn.Linear(hidden_dim, tgt_vocab)

    # ------------------------------------------------------------------ encoder
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Run the encoder (notes 1.1: h_1..h_S) and derive the decoder's initial state s_0.

        Args:
            src: Source token ids, right-padded.
            src_mask: True = real token; None derives it as ``src != pad_id``.

        Shape:
            - src: (B, S)
            - src_mask: (B, S)

        Returns:
            ``(memory, state, src_mask)``: encoder states (B, S, Dm) with zeros at padded
            positions (Dm = ``memory_dim``), s_0 (B, H), and the checked mask (B, S).
        """
        src = check_tokens("src", src, self.src_vocab).long()  # (B, S)
        src_mask = self._resolve_src_mask(src, src_mask)
        emb = self.src_embed(src)  # (B, S, E)
        if bool(src_mask.all()):
            memory, h_n = self.encoder(emb)  # (B, S, Dm), (num_dir, B, H)
        else:
            # Packing makes the backward direction start at each row's last real token.
            lengths = src_mask.sum(dim=1).cpu()  # (B,)  pack_padded_sequence wants CPU lengths
            packed = pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)
            packed_out, h_n = self.encoder(packed)  # h_n: (num_dir, B, H), in input order
            memory, _ = pad_packed_sequence(
                packed_out, batch_first=True, total_length=src.shape[1]
            )  # (B, S, Dm)
        return memory, self._initial_state(h_n), src_mask

    def _initial_state(self, h_n: Tensor) -> Tensor:
        """s_0 from the encoder's final states h_n of shape (num_dir, B, H); returns (B, H)."""
        if self.bridge is None:
            return h_n[-1]  # (B, H)  the bottleneck: s_0 = h_S
        last = torch.cat([h_n[0], h_n[1]], dim=-1) if self.bidirectional else h_n[0]  # (B, Dm)
        return torch.tanh(self.bridge(last))  # (B, H)

    # ------------------------------------------------------------------ decoder
    def decode(
        self, tgt_in: Tensor, memory: Tensor, state: Tensor, src_mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding of a whole target (notes 1.1: s_t, c_t, alpha_ti).

        Args:
            tgt_in: Target ids shifted right (starting with BOS).
            memory: Encoder states from :meth:`encode`.
            state: Initial decoder state s_0 from :meth:`encode`.
            src_mask: True = real source token.

        Shape:
            - tgt_in: (B, T)
            - memory: (B, S, Dm)
            - state: (B, H)
            - src_mask: (B, S)

        Returns:
            ``(logits, attn)``: logits (B, T, V) and attention weights (B, T, S), or None
            without attention.
        """
        tgt_in = check_tokens("tgt_in", tgt_in, self.tgt_vocab).long()  # (B, T)
        if tgt_in.shape[1] == 0:
            raise ValueError(f"tgt_in must hold at least one position, got {tuple(tgt_in.shape)}")
        if tgt_in.shape[0] != memory.shape[0]:
            raise ValueError(
                f"tgt_in batch size {tgt_in.shape[0]} does not match src batch size "
                f"{memory.shape[0]}"
            )
        emb = self.tgt_embed(tgt_in)  # (B, T, E)
        if self.attention is None:
            assert isinstance(self.decoder, nn.GRU)
            out, _ = self.decoder(emb, state.unsqueeze(0).contiguous())  # (B, T, H)
            return self.out_proj(out), None  # (B, T, V)
        keys_proj = self.attention.key_proj(memory)  # (B, S, A)  same keys at every step
        features, weights = [], []
        for t in range(tgt_in.shape[1]):
            feat, state, w = self._attention_step(emb[:, t], state, memory, src_mask, keys_proj)
            features.append(feat)  # (B, H + Dm)
            weights.append(w)  # (B, S)
        logits = self.out_proj(torch.stack(features, dim=1))  # (B, T, V)
        return logits, torch.stack(weights, dim=1)  # (B, T, S)

    def _attention_step(
        self, y_emb: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor, keys_proj: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One Bahdanau step from s_{t-1}; returns features [s_t; c_t] (B, H+Dm), s_t, alpha_t."""
        assert self.attention is not None and isinstance(self.decoder, nn.GRUCell)
        context, weights = self.attention(state, memory, src_mask, keys_proj=keys_proj)  # (B, Dm)
        state = self.decoder(torch.cat([y_emb, context], dim=-1), state)  # (B, H)
        return torch.cat([state, context], dim=-1), state, weights  # (B, H + Dm), (B, H), (B, S)

    # ------------------------------------------------------------------ public API
    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits for every target position (notes 1.1; Bahdanau 2015, sec. 3).

        Args:
            src: Source token ids, right-padded with ``pad_id``.
            tgt_in: Target ids shifted right (starting with BOS).
            src_mask: True = real token; None derives it as ``src != pad_id``.

        Shape:
            - src: (B, S)
            - tgt_in: (B, T)
            - src_mask: (B, S)

        Returns:
            Logits of shape (B, T, V).
        """
        memory, state, src_mask = self.encode(src, src_mask)  # (B, S, Dm), (B, H), (B, S)
        logits, _ = self.decode(tgt_in, memory, state, src_mask)  # (B, T, V)
        return logits

    @torch.no_grad()
    def greedy(
        self,
        src: Tensor,
        max_len: int,
        bos_id: int,
        eos_id: int | None = None,
        src_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Greedy decoding, feeding back the argmax token (notes 1.1), with alignment weights.

        Decoding starts from ``bos_id`` (not included in the output). Once a row has produced
        ``eos_id`` its later positions hold ``pad_id`` and its later attention rows are zero.
        The model's train/eval mode is left unchanged (the model has no dropout).

        Args:
            src: Source token ids, right-padded with ``pad_id``.
            max_len: Number of target tokens to produce.
            bos_id: Start token fed at the first step.
            eos_id: End token, or None to always produce ``max_len`` tokens.
            src_mask: True = real token; None derives it as ``src != pad_id``.

        Shape:
            - src: (B, S)
            - src_mask: (B, S)

        Returns:
            ``(tokens, attn)``: tokens (B, max_len) long, and attention weights
            (B, max_len, S) for the attention model (None without attention).
        """
        _check_positive_int("max_len", max_len)
        _check_token_id("bos_id", bos_id, self.tgt_vocab)
        if eos_id is not None:
            _check_token_id("eos_id", eos_id, self.tgt_vocab)
        memory, state, src_mask = self.encode(src, src_mask)  # (B, S, Dm), (B, H), (B, S)
        batch, src_len = src.shape
        device = src.device
        y = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (B,)
        tokens = torch.full((batch, max_len), self.pad_id, dtype=torch.long, device=device)
        attn = None
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        if self.attention is not None:
            attn = memory.new_zeros(batch, max_len, src_len)  # (B, max_len, S)
            keys_proj = self.attention.key_proj(memory)  # (B, S, A)
        else:
            hidden = state.unsqueeze(0).contiguous()  # (1, B, H)
        for t in range(max_len):
            y_emb = self.tgt_embed(y)  # (B, E)
            if self.attention is not None:
                feat, state, w = self._attention_step(y_emb, state, memory, src_mask, keys_proj)
                logits = self.out_proj(feat)  # (B, V)
                attn[:, t] = w.masked_fill(finished.unsqueeze(1), 0.0)  # (B, S)
            else:
                out, hidden = self.decoder(y_emb.unsqueeze(1), hidden)  # (B, 1, H)
                logits = self.out_proj(out.squeeze(1))  # (B, V)
            y = logits.argmax(dim=-1).masked_fill(finished, self.pad_id)  # (B,)
            tokens[:, t] = y
            if eos_id is not None:
                finished |= y == eos_id
                if bool(finished.all()):
                    break
        return tokens, attn

    # ------------------------------------------------------------------ checks
    def _resolve_src_mask(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Check (or derive) a right-padded token mask with at least one real token per row."""
        if src_mask is None:
            src_mask = src != self.pad_id  # (B, S)
        else:
            check_token_mask("src_mask", src_mask, (src.shape[0], src.shape[1]))
        if src.shape[1] == 0:
            raise ValueError(
                f"src must contain at least one position, got shape {tuple(src.shape)}"
            )
        if not bool(src_mask[:, 0].all()):
            raise ValueError(
                "src_mask: every row needs a real first token (right padding only); "
                f"rows {_rows(~src_mask[:, 0])} start with padding or are empty"
            )
        gaps = src_mask[:, 1:] & ~src_mask[:, :-1]  # (B, S - 1)  a real token after padding
        if bool(gaps.any()):
            raise ValueError(
                "src_mask must be right-padded (True..True False..False) per row; "
                f"rows {_rows(gaps.any(dim=1))} have a real token after padding"
            )
        return src_mask


# ---------------------------------------------------------------------- gradient demo
def encoder_state_gradient_norms(
    model: Seq2SeqRNN, src: Tensor, tgt_in: Tensor, tgt_out: Tensor
) -> Tensor:
    """||dL/dh_t|| for every encoder step t: how much training signal reaches each source token.

    L is the mean token cross-entropy of the teacher-forced batch (ignoring ``pad_id`` targets)
    and h_t the full encoder state at step t (both directions for the attention model). The
    derivative is the *total* one, through the recurrence h_t -> h_{t+1} -> ... and, with
    attention, also straight from the attention weights (notes 1.1: bottleneck, vanishing
    gradients). Without attention every path to the loss goes through the final state, so the
    norm typically fades towards the start of the source; with attention it stays flat.

    To expose each h_t as a node of the graph the encoder is unrolled step by step with the
    model's own GRU weights (same numbers as :meth:`Seq2SeqRNN.encode`, just slower). Gradients are
    taken with :func:`torch.autograd.grad`, so the parameters' ``.grad`` are left untouched.

    Args:
        model: The encoder-decoder to probe.
        src: Source ids without padding (every row uses all S positions).
        tgt_in: Target ids shifted right (starting with BOS).
        tgt_out: Target ids to predict; ``pad_id`` positions are ignored.

    Shape:
        - src: (B, S)
        - tgt_in, tgt_out: (B, T)

    Returns:
        Tensor of shape (S,): the norm of dL/dh_t over the batch and feature dimensions.
    """
    if not isinstance(model, Seq2SeqRNN):
        raise TypeError(f"model must be a Seq2SeqRNN, got {type(model).__name__}")
    src = check_tokens("src", src, model.src_vocab).long()  # (B, S)
    tgt_in = check_tokens("tgt_in", tgt_in, model.tgt_vocab).long()  # (B, T)
    tgt_out = check_tokens("tgt_out", tgt_out, model.tgt_vocab).long()  # (B, T)
    if tuple(tgt_out.shape) != tuple(tgt_in.shape):
        raise ValueError(
            f"tgt_out must have the shape of tgt_in {tuple(tgt_in.shape)}, "
            f"got {tuple(tgt_out.shape)}"
        )
    if bool((src == model.pad_id).any()):
        raise ValueError(
            f"src must not contain pad_id={model.pad_id}: the gradient probe needs unpadded sources"
        )
    with torch.enable_grad():
        fwd, bwd = _unrolled_encoder_states(model, src)  # lists of S tensors (B, H)
        if bwd is None:
            memory = torch.stack(fwd, dim=1)  # (B, S, H)
            h_n = fwd[-1].unsqueeze(0)  # (1, B, H)
        else:
            memory = torch.cat([torch.stack(fwd, dim=1), torch.stack(bwd, dim=1)], dim=-1)
            # memory: (B, S, 2H)
            h_n = torch.stack([fwd[-1], bwd[0]], dim=0)  # (2, B, H)
        src_mask = torch.ones_like(src, dtype=torch.bool)  # (B, S)
        logits, _ = model.decode(tgt_in, memory, model._initial_state(h_n), src_mask)  # (B, T, V)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=model.pad_id
        )
        states = fwd + (bwd if bwd is not None else [])
        grads = torch.autograd.grad(loss, states)
    sq = torch.stack([g.pow(2).sum() for g in grads]).view(-1, src.shape[1])  # (num_dir, S)
    return sq.sum(dim=0).sqrt()  # (S,)


def _unrolled_encoder_states(
    model: Seq2SeqRNN, src: Tensor
) -> tuple[list[Tensor], list[Tensor] | None]:
    """The encoder's forward (and backward) states h_t as separate graph nodes, each (B, H)."""
    gru = model.encoder
    emb = model.src_embed(src)  # (B, S, E)
    fwd = _gru_direction(emb, gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)
    if not gru.bidirectional:
        return fwd, None
    bwd = _gru_direction(
        emb.flip(1),
        gru.weight_ih_l0_reverse,
        gru.weight_hh_l0_reverse,
        gru.bias_ih_l0_reverse,
        gru.bias_hh_l0_reverse,
    )
    return fwd, bwd[::-1]  # bwd[t] is the backward state at source position t


def _gru_direction(
    x: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor
) -> list[Tensor]:
    """Unroll one GRU direction from h_0 = 0 with the equations of ``torch.nn.GRU``'s docs.

    r = sigma(W_ir x + b_ir + W_hr h + b_hr), z = sigma(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h.
    """
    batch, steps, _ = x.shape
    h = x.new_zeros(batch, w_hh.shape[1])  # (B, H)
    gates_x = F.linear(x, w_ih, b_ih)  # (B, S, 3H)  input part of all steps at once
    states = []
    for t in range(steps):
        x_r, x_z, x_n = gates_x[:, t].chunk(3, dim=-1)  # 3 x (B, H)
        h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, dim=-1)  # 3 x (B, H)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        h = (1 - z) * n + z * h  # (B, H)
        states.append(h)
    return states


# ---------------------------------------------------------------------- input checks
def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_token_id(name: str, value: object, vocab_size: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be an int in [0, {vocab_size}), got {value!r}")


def _rows(flags: Tensor) -> list[int]:
    """Indices of the True rows, for error messages (at most 5)."""
    return flags.nonzero().flatten()[:5].tolist()
