"""Training step of the reference Transformer vs ``torch.nn.Transformer``.

Both models share the same token embedding (scaled by sqrt(D)), sinusoidal positions and tied
output projection; only the encoder-decoder stack differs. Each step is forward, backward and
an Adam update on the same batch (B=32, S=T=64, V=8000), with 2 threads; the two models are
timed alternately in one run. Prints the time ratio (reference / torch; <= 1.00 means the
reference is at least as fast) and the model FLOP utilisation against a measured fp32 matmul
peak.

Run: ``.venv/bin/python benchmarks/train_step.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, median, setup_threads  # noqa: E402

from coursepkg import Transformer, TransformerConfig  # noqa: E402
from coursepkg.chapters.roofline import matmul_peak_flops  # noqa: E402
from coursepkg.model_parts import TokenEmbedding  # noqa: E402
from coursepkg.positional import SinusoidalPositionalEncoding  # noqa: E402


class TorchPeer(nn.Module):
    """``nn.Transformer`` wrapped in the same embeddings and tied head as the reference."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.embed = TokenEmbedding(config.vocab_size, d)
        self.positions = SinusoidalPositionalEncoding(d, config.max_len)
        self.dropout = nn.Dropout(config.dropout)
        self.stack = nn.Transformer(
            d_model=d,
            nhead=config.n_heads,
            num_encoder_layers=config.n_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.d_ff,
            dropout=config.dropout,
            batch_first=True,
            norm_first=config.norm_first,
        )
        # The paper's post-LN stack has no final LayerNorm; nn.Transformer always adds one.
        # Keep it (it is the peer as users build it); its cost is negligible.
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, src, tgt):
        t = tgt.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=tgt.device)
        s = self.dropout(self.positions(self.embed(src)))
        y = self.dropout(self.positions(self.embed(tgt)))
        h = self.stack(s, y, tgt_mask=causal, tgt_is_causal=True)
        return self.lm_head(h)


def step_fn(model, opt, src, tgt_in, tgt_out):
    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
        loss.backward()
        opt.step()

    return step


def model_flops(config: TransformerConfig, b: int, s: int, t: int) -> float:
    """Matmul FLOPs of one training step (forward x 3: backward costs twice the forward)."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    n_enc, n_dec = config.n_layers, config.decoder_layers
    enc = n_enc * (2 * b * s * (4 * d * d + 2 * d * f) + 2 * 2 * b * s * s * d)
    dec_self = 2 * b * t * 4 * d * d + 2 * 2 * b * t * t * d
    dec_cross = 2 * b * t * 2 * d * d + 2 * b * s * 2 * d * d + 2 * 2 * b * t * s * d
    dec = n_dec * (dec_self + dec_cross + 2 * b * t * 2 * d * f)
    head = 2 * b * t * d * v
    return 3.0 * (enc + dec + head)


def run(d_model, n_layers, n_heads, d_ff, rounds, b=32, s=64, t=64, vocab=8000):
    config = TransformerConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=n_heads,
        d_ff=d_ff,
        n_layers=n_layers,
        dropout=0.1,
        attention_dropout=0.1,  # nn.Transformer drops attention weights too: same computation
        max_len=max(s, t),
    )
    torch.manual_seed(0)
    ours = Transformer(config).train()
    peer = TorchPeer(config).train()
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (b, s), generator=g)
    tgt = torch.randint(4, vocab, (b, t + 1), generator=g)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    fns = {
        "reference": step_fn(ours, torch.optim.Adam(ours.parameters(), 1e-4), src, tgt_in, tgt_out),
        "torch": step_fn(peer, torch.optim.Adam(peer.parameters(), 1e-4), src, tgt_in, tgt_out),
    }
    times = alternate(fns, rounds)
    return config, {k: median(v) for k, v in times.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    setup_threads(args.threads)
    peak = matmul_peak_flops()
    print(f"threads={torch.get_num_threads()}  measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
    header = ("config", "reference s", "torch s", "ratio", "MFU ref", "MFU torch")
    print("".join(f"{h:<14}" if i == 0 else f"{h:>12}" for i, h in enumerate(header)))
    results = {}
    for d, n, h, f in [(128, 2, 4, 512), (512, 6, 8, 2048)]:
        rounds = args.rounds if d <= 128 else max(3, args.rounds // 3)
        config, med = run(d, n, h, f, rounds)
        flops = model_flops(config, 32, 64, 64)
        ratio = med["reference"] / med["torch"]
        mfu_ref = flops / med["reference"] / peak
        mfu_torch = flops / med["torch"] / peak
        name = f"d={d}/L={n}"
        print(
            f"{name:<14}{med['reference']:>12.4f}{med['torch']:>12.4f}{ratio:>12.3f}"
            f"{mfu_ref:>12.1%}{mfu_torch:>12.1%}"
        )
        results[name] = dict(ratio=ratio, reference_s=med["reference"], torch_s=med["torch"])
    return results


if __name__ == "__main__":
    main()
