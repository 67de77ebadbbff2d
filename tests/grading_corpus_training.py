"""Corpus, part 2: training, parameter counts and decoding (ex06-ex08), written the way widely
used public code writes them. Independent of ``coursepkg``; listed in :mod:`grading_corpus`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# ex06: schedule and label-smoothed loss
# --------------------------------------------------------------------------------------------


def noam_annotated(step, d_model, warmup_steps):
    """The Annotated Transformer's rate(), with step 0 mapped to 0."""
    if step == 0:
        return 0.0
    return d_model ** (-0.5) * min(step ** (-0.5), step * warmup_steps ** (-1.5))


def _mask_and_mean(per_position, keep):
    per_position = per_position.masked_fill(~keep, 0.0)
    return per_position.sum() / keep.sum().clamp(min=1)


def ls_scatter(logits, targets, smoothing=0.1, ignore_index=-100):
    """Builds the target distribution with scatter_, then cross-entropy."""
    v = logits.size(-1)
    keep = targets != ignore_index
    logp = logits.log_softmax(-1)
    dist = torch.full_like(logp, smoothing / v)
    dist.scatter_(-1, targets.masked_fill(~keep, 0).unsqueeze(-1), 1 - smoothing + smoothing / v)
    return _mask_and_mean(-(dist * logp).sum(-1), keep)


def ls_mix(logits, targets, smoothing=0.1, ignore_index=-100):
    """(1 - eps) * nll + eps * mean over the vocabulary of -log p."""
    keep = targets != ignore_index
    logp = F.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, torch.where(keep, targets, 0)[..., None]).squeeze(-1)
    smooth = -logp.mean(-1)
    return _mask_and_mean((1 - smoothing) * nll + smoothing * smooth, keep)


def ls_kl_div(logits, targets, smoothing=0.1, ignore_index=-100):
    """The KL-divergence habit (nn.KLDivLoss against the smoothed distribution)."""
    v = logits.size(-1)
    keep = targets != ignore_index
    logp = logits.log_softmax(-1)
    true_dist = torch.full_like(logp, smoothing / v)
    true_dist.scatter_(-1, targets.clamp(min=0).unsqueeze(-1), 1 - smoothing + smoothing / v)
    kl = F.kl_div(logp, true_dist, reduction="none").sum(-1)
    return _mask_and_mean(kl, keep)


def ls_wenet_kl(logits, targets, smoothing=0.1, ignore_index=-100):
    """WeNet's LabelSmoothingLoss: KLDivLoss against confidence on the target and
    smoothing / (V - 1) elsewhere, normalised by the kept positions."""
    v = logits.size(-1)
    x = logits.reshape(-1, v)
    target = targets.reshape(-1)
    ignore = target == ignore_index
    true_dist = torch.full_like(x, smoothing / (v - 1))
    true_dist.scatter_(1, target.masked_fill(ignore, 0).unsqueeze(1), 1 - smoothing)
    kl = F.kl_div(torch.log_softmax(x, dim=1), true_dist, reduction="none")
    total = (~ignore).sum().clamp(min=1)
    return kl.masked_fill(ignore.unsqueeze(1), 0).sum() / total


def ls_fairseq(logits, targets, smoothing=0.1, ignore_index=-100):
    """fairseq's label_smoothed_nll_loss: eps / (V - 1) on the wrong tokens."""
    lprobs = logits.log_softmax(-1)
    pad_mask = targets.eq(ignore_index)
    nll = -lprobs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.sum(-1)
    eps_i = smoothing / (lprobs.size(-1) - 1)
    loss = (1.0 - smoothing - eps_i) * nll + eps_i * smooth
    return _mask_and_mean(loss, ~pad_mask)


def ls_gather_first(logits, targets, smoothing=0.1, ignore_index=-100):
    """Gathers with the raw targets before masking (fails for ignore_index=-100)."""
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    loss = (1 - smoothing) * nll - smoothing * logp.mean(-1)
    keep = targets != ignore_index
    return _mask_and_mean(loss, keep)


# --------------------------------------------------------------------------------------------
# ex07: parameter count
# --------------------------------------------------------------------------------------------


def _count(
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
    habit="",
):
    d, h = d_model, n_heads
    dk = d_k if d_k is not None else d // h
    dv = d_v if d_v is not None else d // h
    b = int(bias)
    mha = 2 * (d * h * dk + b * h * dk) + d * h * dv + b * h * dv + h * dv * d + b * d
    ffn = d * d_ff + b * d_ff + d_ff * d + b * d
    norm = d * (1 + b)
    n_dec = n_layers if n_decoder_layers is None else n_decoder_layers
    total = n_layers * (mha + ffn + 2 * norm) + n_dec * (2 * mha + ffn + 3 * norm)
    if final_norm and habit != "no_final_norm":
        total += 2 * norm
    src_v = vocab_size if src_vocab_size is None else src_vocab_size
    tgt_emb = vocab_size * d
    src_emb = src_v * d
    if share_embeddings or habit == "untied_counted_once":
        total += tgt_emb if src_v == vocab_size else src_emb + tgt_emb
    else:
        total += src_emb + tgt_emb
    if not tie_embeddings:
        total += vocab_size * d
    if habit == "output_bias":
        total += vocab_size
    return total


def params_loops(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
    return _count(vocab_size, d_model, n_heads, d_ff, n_layers, **kw)


def params_output_bias(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
    """Counts a bias on the output projection (nn.Linear's default)."""
    return _count(vocab_size, d_model, n_heads, d_ff, n_layers, habit="output_bias", **kw)


def params_no_final_norm(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
    return _count(vocab_size, d_model, n_heads, d_ff, n_layers, habit="no_final_norm", **kw)


def params_untied_once(vocab_size, d_model, n_heads, d_ff, n_layers, **kw):
    """Counts one embedding matrix even when source and target are not shared."""
    return _count(vocab_size, d_model, n_heads, d_ff, n_layers, habit="untied_counted_once", **kw)


# --------------------------------------------------------------------------------------------
# ex08: decoding
# --------------------------------------------------------------------------------------------


def _pad(model, eos_id):
    pad = model.config.pad_id
    return eos_id if pad is None else pad


@torch.no_grad()
def greedy_cat(model, src, max_len, bos_id, eos_id):
    """The common batched loop: cat the argmax, stop when every row has EOS."""
    memory = model.encode(src)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        nxt = model.decode(ys, memory)[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, _pad(model, eos_id)), nxt)
        ys = torch.cat([ys, nxt.unsqueeze(1)], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return ys


@torch.no_grad()
def greedy_drops_eos(model, src, max_len, bos_id, eos_id):
    """Stops a row at EOS without writing the EOS itself."""
    pad = _pad(model, eos_id)
    rows = []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])
        seq = [bos_id]
        for _ in range(max_len):
            tok = int(model.decode(torch.tensor([seq]), memory)[0, -1].argmax())
            if tok == eos_id:
                break
            seq.append(tok)
        rows.append(seq)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


@torch.no_grad()
def _beam(model, src, beam_size, max_len, bos_id, eos_id, alpha, habit=""):
    pad = _pad(model, eos_id)
    rows, scores = [], []
    for i in range(src.size(0)):
        memory = model.encode(src[i : i + 1])
        if habit == "keep_finished":
            beams = [(0.0, [bos_id], False)]
            for _t in range(1, max_len + 1):
                cands = [b for b in beams if b[2]]
                for logp, seq, fin in beams:
                    if fin:
                        continue
                    lp = model.decode(torch.tensor([seq]), memory)[0, -1].log_softmax(-1)
                    for tok, val in enumerate(lp.tolist()):
                        cands.append((logp + val, seq + [tok], tok == eos_id))
                cands.sort(key=lambda c: -c[0])
                beams = cands[:beam_size]
                if all(b[2] for b in beams):
                    break
            finals = [(lp / (len(s) - 1) ** alpha, s) for lp, s, _ in beams]
        else:
            extra = 1 if habit == "bos_counted" else 0
            open_h, finals = [(0.0, [bos_id])], []
            stopped = False
            for t in range(1, max_len + 1):
                cands = []
                for logp, seq in open_h:
                    lp = model.decode(torch.tensor([seq]), memory)[0, -1].log_softmax(-1)
                    cands += [(logp + val, seq + [tok]) for tok, val in enumerate(lp.tolist())]
                cands.sort(key=lambda c: -c[0])
                open_h = []
                for logp, seq in cands:
                    if seq[-1] == eos_id:
                        finals.append((logp / (t + extra) ** alpha, seq))
                        if len(finals) >= beam_size and t < max_len:
                            stopped = True
                            break
                    else:
                        open_h.append((logp, seq))
                        if len(open_h) == beam_size:
                            break
                if stopped:
                    break
            if not stopped:
                finals += [(lp / (max_len + extra) ** alpha, s) for lp, s in open_h]
        score, seq = max(finals, key=lambda f: f[0])
        rows.append(seq)
        scores.append(score)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows]), torch.tensor(scores)


def beam_lists(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    return _beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty)


def beam_keeps_finished(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """Finished hypotheses stay in the beam and take its slots (a common simplification)."""
    return _beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty, "keep_finished")


def beam_bos_counted(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=1.0):
    """Normalises by the length of the whole sequence, BOS included."""
    return _beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty, "bos_counted")
