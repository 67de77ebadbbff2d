"""Independent correct implementations of the ex05-ex08 exercise items, used by the grading tests
to show that the checks accept solutions other than the reference.

Each item has two versions written differently from each other and from ``coursepkg``. They
live here, in ``tests/``, never in the package (students can import the package).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# --------------------------------------------------------------------------------------------
# ex05: causal mask
# --------------------------------------------------------------------------------------------


def causal_mask_tril(length: int) -> Tensor:
    """Lower triangle of ones."""
    return torch.ones(length, length).tril().bool()  # (L, L)


def causal_mask_compare(length: int) -> Tensor:
    """Compare row and column indices."""
    idx = torch.arange(length)
    return idx[:, None] >= idx[None, :]  # (L, L)


# --------------------------------------------------------------------------------------------
# ex05: decoder layer, from two different sets of building blocks
# --------------------------------------------------------------------------------------------


class ManualLayerNorm(nn.Module):
    """LayerNorm from mean and variance."""

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)  # (..., 1)
        var = x.var(-1, unbiased=False, keepdim=True)  # (..., 1)
        return self.weight * (x - mu) * torch.rsqrt(var + self.eps) + self.bias


class ReluFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(torch.relu(self.linear1(x)))  # (B, L, D)


class EinsumMHA(nn.Module):
    """Multi-head attention with einsum over explicit head axes."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None):
        b, n_q, d = query.shape
        dk = d // self.h
        q = self.q_proj(query).reshape(b, n_q, self.h, dk)  # (B, L, H, Dk)
        k = self.k_proj(key).reshape(b, key.size(1), self.h, dk)  # (B, S, H, Dk)
        v = self.v_proj(value).reshape(b, value.size(1), self.h, dk)  # (B, S, H, Dv)
        scores = torch.einsum("blhd,bshd->bhls", q, k) / math.sqrt(dk)  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (B, H, L, S)
        out = torch.einsum("bhls,bshd->blhd", w, v).reshape(b, n_q, d)  # (B, L, D)
        return self.out_proj(out)


class LoopMHA(nn.Module):
    """Multi-head attention computed one head at a time, with a large negative fill."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None):
        d = query.size(-1)
        dk = d // self.h
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        heads = []
        b, n_q, n_k = q.size(0), q.size(1), k.size(1)
        if mask is not None:
            mask = mask.expand(b, self.h, n_q, n_k)  # (B, H, L, S)
        for i in range(self.h):
            sl = slice(i * dk, (i + 1) * dk)
            s = q[..., sl] @ k[..., sl].transpose(-1, -2) * dk**-0.5  # (B, L, S)
            if mask is not None:
                m = mask[:, i]  # (B, L, S)
                s = s.masked_fill(~m, -1e9 if s.dtype == torch.float32 else -1e300)
                w = torch.softmax(s, dim=-1) * m.any(-1, keepdim=True)  # (B, L, S)
            else:
                w = torch.softmax(s, dim=-1)  # (B, L, S)
            heads.append(w @ v[..., sl])  # (B, L, Dk)
        return self.out_proj(torch.cat(heads, dim=-1))  # (B, L, D)


class DecoderLayerEinsum(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = EinsumMHA(d_model, n_heads)
        self.cross_attn = EinsumMHA(d_model, n_heads)
        self.ffn = ReluFFN(d_model, d_ff)
        self.norm1 = ManualLayerNorm(d_model)
        self.norm2 = ManualLayerNorm(d_model)
        self.norm3 = ManualLayerNorm(d_model)

    def forward(self, x, memory, self_mask=None, cross_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, self_mask))  # (B, L, D)
        x = self.norm2(x + self.cross_attn(x, memory, memory, cross_mask))  # (B, L, D)
        return self.norm3(x + self.ffn(x))  # (B, L, D)


class DecoderLayerLoop(nn.Module):
    """Same layer, written with a loop over sub-layers and per-head attention."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.self_attn = LoopMHA(d_model, n_heads)
        self.cross_attn = LoopMHA(d_model, n_heads)
        self.ffn = ReluFFN(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, x, memory, self_mask=None, cross_mask=None):
        steps = [
            (lambda h: self.self_attn(h, h, h, self_mask), self.norm1),
            (lambda h: self.cross_attn(h, memory, memory, cross_mask), self.norm2),
            (self.ffn, self.norm3),
        ]
        for sublayer, norm in steps:
            x = norm(x + sublayer(x))  # (B, L, D)
        return x


# --------------------------------------------------------------------------------------------
# ex06: schedule and loss
# --------------------------------------------------------------------------------------------


def noam_lr_min(step: int, d_model: int, warmup_steps: int) -> float:
    if step == 0:
        return 0.0
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def noam_lr_piecewise(step: int, d_model: int, warmup_steps: int) -> float:
    scale = 1.0 / math.sqrt(d_model)
    if step <= warmup_steps:
        return scale * step / warmup_steps**1.5
    return scale / math.sqrt(step)


def smoothed_ce_gather(logits, targets, smoothing=0.1, ignore_index=-100):
    logp = logits.log_softmax(-1)  # (..., V)
    keep = targets != ignore_index  # (...)
    safe = torch.where(keep, targets, torch.zeros_like(targets))
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (...)
    smooth = -logp.mean(-1)  # (...)
    per_pos = ((1 - smoothing) * nll + smoothing * smooth)[keep]  # (N,)
    if per_pos.numel() == 0:
        return logits.sum() * 0.0
    return per_pos.mean()


def smoothed_ce_distribution(logits, targets, smoothing=0.1, ignore_index=-100):
    v = logits.size(-1)
    flat_logits = logits.reshape(-1, v)  # (N, V)
    flat_t = targets.reshape(-1)  # (N,)
    keep = flat_t != ignore_index  # (N,)
    q = torch.full_like(flat_logits, smoothing / v)  # (N, V)
    rows = torch.arange(flat_t.numel())[keep]
    q[rows, flat_t[keep]] += 1 - smoothing
    loss = -(q * F.log_softmax(flat_logits, dim=-1)).sum(-1)  # (N,)
    return (loss * keep).sum() / max(int(keep.sum()), 1)


# --------------------------------------------------------------------------------------------
# ex07: parameter count
# --------------------------------------------------------------------------------------------


def param_count_formula(
    vocab_size,
    d_model,
    n_heads,
    d_ff,
    n_layers,
    *,
    n_decoder_layers=None,
    d_k=None,
    d_v=None,
    src_vocab_size=None,
    share_embeddings=True,
    tie_embeddings=True,
    bias=True,
    final_norm=False,
):
    d = d_model
    dk = d_k or d // n_heads
    dv = d_v or d // n_heads
    h = n_heads
    b = 1 if bias else 0
    attn = d * h * dk * 2 + d * h * dv + h * dv * d + b * (2 * h * dk + h * dv + d)
    ffn = 2 * d * d_ff + b * (d_ff + d)
    ln = d + b * d
    n_dec = n_layers if n_decoder_layers is None else n_decoder_layers
    total = n_layers * (attn + ffn + 2 * ln) + n_dec * (2 * attn + ffn + 3 * ln)
    if final_norm:
        total += 2 * ln
    v_src = vocab_size if src_vocab_size is None else src_vocab_size
    total += v_src * d
    if not share_embeddings:
        total += vocab_size * d
    if not tie_embeddings:
        total += vocab_size * d
    return total


def param_count_modules(vocab_size, d_model, n_heads, d_ff, n_layers, **kw) -> int:
    """Walk a list of (rows, cols, has_bias) matrices, as if building the model."""
    d = d_model
    dk = kw.get("d_k") or d // n_heads
    dv = kw.get("d_v") or d // n_heads
    bias = kw.get("bias", True)
    n_dec = kw.get("n_decoder_layers") or n_layers
    src_v = kw.get("src_vocab_size") or vocab_size

    def linear(i, o):
        return i * o + (o if bias else 0)

    def norm():
        return d * (2 if bias else 1)

    def attention():
        return linear(d, n_heads * dk) * 2 + linear(d, n_heads * dv) + linear(n_heads * dv, d)

    def ffn():
        return linear(d, d_ff) + linear(d_ff, d)

    params = {"src_embed": src_v * d}
    params["tgt_embed"] = 0 if kw.get("share_embeddings", True) else vocab_size * d
    for i in range(n_layers):
        params[f"enc{i}"] = attention() + ffn() + 2 * norm()
    for i in range(n_dec):
        params[f"dec{i}"] = 2 * attention() + ffn() + 3 * norm()
    if kw.get("final_norm", False):
        params["enc_norm"] = norm()
        params["dec_norm"] = norm()
    params["head"] = 0 if kw.get("tie_embeddings", True) else d * vocab_size
    return sum(params.values())


# --------------------------------------------------------------------------------------------
# ex08: decoding
# --------------------------------------------------------------------------------------------


def _pad_id(model, eos_id):
    return model.config.pad_id if model.config.pad_id is not None else eos_id


@torch.no_grad()
def greedy_batched(model, src, max_len, bos_id, eos_id):
    memory = model.encode(src)  # (B, S, D)
    pad = _pad_id(model, eos_id)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)  # (B, 1)
    alive = torch.ones(src.size(0), dtype=torch.bool)  # (B,)
    for _ in range(max_len):
        nxt = model.decode(out, memory)[:, -1].argmax(-1)  # (B,)
        nxt[~alive] = pad
        out = torch.cat([out, nxt[:, None]], 1)  # (B, t + 1)
        alive &= nxt != eos_id
        if not alive.any():
            break
    return out


@torch.no_grad()
def greedy_per_row(model, src, max_len, bos_id, eos_id):
    """One source at a time, always running max_len steps, then padding after EOS; the
    trailing all-pad columns are kept (the check allows them)."""
    pad = _pad_id(model, eos_id)
    rows = []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])  # (1, S, D)
        seq = [bos_id]
        while len(seq) <= max_len and seq[-1] != eos_id:
            logits = model.decode(torch.tensor([seq]), memory)  # (1, t, V)
            seq.append(int(logits[0, -1].argmax()))
        rows.append(seq + [pad] * (1 + max_len - len(seq)))
    return torch.tensor(rows)


@torch.no_grad()
def beam_per_source(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """Python lists of (logp, tokens), one source at a time, no cache."""
    pad = _pad_id(model, eos_id)
    best_rows, best_scores = [], []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])  # (1, S, D)
        open_hyps = [(0.0, [bos_id])]
        finished = []
        done = False
        for t in range(1, max_len + 1):
            cands = []
            for logp, seq in open_hyps:
                lp = model.decode(torch.tensor([seq]), memory)[0, -1].float().log_softmax(-1)
                for tok, val in enumerate(lp.tolist()):
                    cands.append((logp + val, seq + [tok]))
            cands.sort(key=lambda c: -c[0])
            new_open = []
            for logp, seq in cands:
                if seq[-1] == eos_id:
                    finished.append((logp / t**length_penalty, seq))
                    if len(finished) >= beam_size and t < max_len:
                        done = True
                        break
                else:
                    new_open.append((logp, seq))
                    if len(new_open) == beam_size:
                        break
            open_hyps = new_open
            if done or not open_hyps:
                done = True
                break
        if not done:
            finished += [(lp / max_len**length_penalty, s) for lp, s in open_hyps]
        score, seq = max(finished, key=lambda f: f[0])
        best_rows.append(seq)
        best_scores.append(score)
    width = max(map(len, best_rows))
    tokens = torch.tensor([r + [pad] * (width - len(r)) for r in best_rows])
    return tokens, torch.tensor(best_scores)


@torch.no_grad()
def beam_tensor(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """Each source's beams as one batch; candidates ranked with a full sort of (K*V) scores."""
    pad = _pad_id(model, eos_id)
    results = []
    for i in range(src.size(0)):
        mem = model.encode(src[i : i + 1])  # (1, S, D)
        seqs = torch.tensor([[bos_id]])  # (K, t)
        totals = torch.zeros(1)  # (K,)
        fin_scores: list[float] = []
        fin_seqs: list[Tensor] = []
        stopped = False
        for t in range(1, max_len + 1):
            memory = mem.expand(seqs.size(0), -1, -1)  # (K, S, D)
            lp = model.decode(seqs, memory)[:, -1].float().log_softmax(-1)  # (K, V)
            v = lp.size(-1)
            cand = (totals[:, None] + lp).flatten()  # (K*V,)
            order = cand.argsort(descending=True)
            keep_rows, keep_toks, keep_vals = [], [], []
            for idx in order.tolist():
                row, tok = divmod(idx, v)
                if tok == eos_id:
                    fin_scores.append(float(cand[idx]) / t**length_penalty)
                    fin_seqs.append(torch.cat([seqs[row], torch.tensor([eos_id])]))
                    if len(fin_scores) >= beam_size and t < max_len:
                        stopped = True
                        break
                else:
                    keep_rows.append(row)
                    keep_toks.append(tok)
                    keep_vals.append(float(cand[idx]))
                    if len(keep_rows) == beam_size:
                        break
            if stopped or not keep_rows:
                stopped = True
                break
            seqs = torch.cat([seqs[keep_rows], torch.tensor(keep_toks)[:, None]], 1)  # (K, t+1)
            totals = torch.tensor(keep_vals)  # (K,)
        if not stopped:
            fin_scores += (totals / max_len**length_penalty).tolist()
            fin_seqs += list(seqs)
        j = max(range(len(fin_scores)), key=fin_scores.__getitem__)
        results.append((fin_seqs[j], fin_scores[j]))
    width = max(len(s) for s, _ in results)
    tokens = torch.full((len(results), width), pad, dtype=torch.long)  # (B, 1 + T)
    for i, (s, _) in enumerate(results):
        tokens[i, : len(s)] = s
    return tokens, torch.tensor([sc for _, sc in results])
