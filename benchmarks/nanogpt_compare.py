"""Pretraining against nanoGPT's own ``train.py``, side by side on this CPU.

nanoGPT's README CPU quick-start (character-level Tiny Shakespeare, n_layer 4, n_head 4,
n_embd 128, block 64, batch 12, dropout 0, lr 1e-3 -> 1e-4, warm-up 100, ``--iters`` steps,
eval every 250 steps on 20 batches) against ``coursepkg train`` with the same data, split,
shape, batch, schedule, AdamW (betas 0.9/0.99, decay 0.1 on matrices), clipping and evaluation,
in one run: the runs alternate (nanoGPT, then each of ours, ``--rounds`` times), each a fresh
process with the same thread count. Reported per run: wall time of the process, the held-out
loss of the final model on every 64-character window of the held-out tenth (the same windows
for both, computed here), and the steps and time to reach a target held-out loss (each run's
own periodic estimate; time = wall x steps / iters, the steps being equally long).

nanoGPT is never vendored: ``--nanogpt PATH`` names a checkout (``train.py``, ``model.py``,
``configurator.py``), or its files are read from the mirror the ``fetch`` tool makes
(``/work/.mirror/karpathy+nanoGPT/repo``, a bare git repository).

Run: ``.venv/bin/python benchmarks/nanogpt_compare.py [--iters 2000] [--ours defaults gpt2]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from coursepkg.chapters.shipped import write_results

ROOT = Path(__file__).resolve().parent.parent
MIRROR = Path("/work/.mirror/karpathy+nanoGPT/repo")
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py")
SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12)
EVAL = dict(eval_interval=250, eval_iters=20)  # --eval-interval changes the first

#: Our runs: ``--model`` options on top of the shape (``defaults``: the course's GPT as it is).
OURS = {
    "defaults": [],
    "no-scale-no-bias": ["scale_embeddings=false", "bias=false"],
}


def warmup(iters: int) -> int:
    """The README's 100 warm-up steps (fewer for a short development run)."""
    return min(100, iters // 5)


def timed(args: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run a process to its end: it, its wall seconds and its CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return done, wall, cpu


def nanogpt_folder(given: str | None, work: Path) -> Path:
    """A folder holding nanoGPT's files: ``given``, or a copy read from the fetched mirror."""
    if given:
        folder = Path(given)
        missing = [f for f in NANOGPT_FILES if not (folder / f).is_file()]
        if missing:
            raise SystemExit(f"--nanogpt {given!r} lacks {', '.join(missing)}")
        return folder
    if not MIRROR.is_dir():
        raise SystemExit(
            f"no nanoGPT: pass --nanogpt PATH, or fetch github:karpathy/nanoGPT to {MIRROR}"
        )
    folder = work / "nanogpt"
    for name in NANOGPT_FILES:
        text = subprocess.run(
            ["git", f"--git-dir={MIRROR}", "show", f"HEAD:{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def prepare_data(text: str, folder: Path) -> None:
    """nanoGPT's ``data/shakespeare_char/prepare.py`` output (its split: the first 90%)."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    cut = int(len(text) * 0.9)
    data = folder / "data" / "shakespeare_char"
    data.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", text[:cut]), ("val", text[cut:])):
        np.array([stoi[c] for c in part], dtype=np.uint16).tofile(data / f"{name}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))


def run_nanogpt(folder: Path, iters: int, out: Path, env: dict) -> dict:
    """nanoGPT's README CPU command; its wall time and its (step, val loss) estimates."""
    flags = {
        **SHAPE,
        **EVAL,
        "device": "cpu",
        "compile": False,
        "dtype": "float32",
        "log_interval": 50,
        "max_iters": iters,
        "lr_decay_iters": iters,
        "dropout": 0.0,
        "warmup_iters": warmup(iters),
        "always_save_checkpoint": True,
        "out_dir": str(out),
    }
    args = ["config/train_shakespeare_char.py", *(f"--{k}={v}" for k, v in flags.items())]
    done, wall, cpu = timed([sys.executable, "train.py", *args], cwd=folder, env=env)
    if done.returncode:
        raise SystemExit(f"nanoGPT failed:\n{done.stderr[-3000:]}")
    curve = [
        (int(s), float(v)) for s, v in re.findall(r"step (\d+): .*val loss ([\d.]+)", done.stdout)
    ]
    return {"wall": wall, "cpu": cpu, "curve": curve}


def run_ours(corpus: Path, iters: int, out: Path, options: list[str], env: dict) -> dict:
    """``coursepkg train`` with the same settings; its wall time and its held-out estimates."""
    model = ["d_model=128", "n_heads=4", "n_layers=4", "d_ff=512", "dropout=0", *options]
    args = [
        "train",
        str(corpus),
        "--out",
        str(out),
        "--tokenizer",
        "char",
        "--steps",
        str(iters),
        "--batch-size",
        "12",
        "--block-size",
        "64",
        "--lr",
        "1e-3",
        "--min-lr",
        "1e-4",
        "--warmup-steps",
        str(warmup(iters)),
        "--beta2",
        "0.99",
        "--weight-decay",
        "0.1",
        "--eval-every",
        str(EVAL["eval_interval"]),
        "--eval-batches",
        str(EVAL["eval_iters"]),
        "--checkpoint-every",
        str(iters),
        "--samples",
        "1",
        "--sample-tokens",
        "1",
        "--device",
        "cpu",
        "--no-progress",
        *(f"--model={m}" for m in model),
    ]
    done, wall, cpu = timed([sys.executable, "-m", "coursepkg.cli", *args], env=env)
    if done.returncode:
        raise SystemExit(f"coursepkg train failed:\n{done.stderr[-3000:]}")
    rows = (out / "log.csv").read_text().splitlines()[1:]
    curve = [(int(r.split(",")[0]), float(r.split(",")[3])) for r in rows if r.split(",")[3]]
    return {"wall": wall, "cpu": cpu, "curve": curve}


@torch.no_grad()
def heldout_loss(logits_of, ids: list[int], block: int) -> float:
    """Mean next-character loss over every non-overlapping window of ``block`` + 1 ids."""
    data = torch.tensor(ids)
    n = (len(data) - 1) // block
    x = data[: n * block].view(n, block)  # (N, T)
    y = data[1 : n * block + 1].view(n, block)  # (N, T)
    losses = [
        F.cross_entropy(logits_of(xb).flatten(0, 1), yb.flatten(), reduction="sum")
        for xb, yb in zip(x.split(256), y.split(256), strict=True)
    ]
    return float(sum(losses)) / y.numel()


def nanogpt_heldout(folder: Path, out: Path, text: str) -> float:
    sys.path.insert(0, str(folder))
    from model import GPT, GPTConfig  # nanoGPT's own model.py

    saved = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**saved["model_args"]))
    model.load_state_dict(saved["model"])
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}
    val = text[int(len(text) * 0.9) :]
    dummy = torch.zeros(1, 1, dtype=torch.long)
    return heldout_loss(
        lambda x: model.eval()(x, dummy.expand_as(x))[0], [stoi[c] for c in val], 64
    )


def ours_heldout(out: Path, text: str) -> float:
    from coursepkg import DecoderOnlyLM, TransformerConfig
    from coursepkg.training.checkpoint import load_checkpoint
    from coursepkg.training.data import make_tokenizer

    saved = load_checkpoint(out / "checkpoint.pt")
    model = DecoderOnlyLM(TransformerConfig.from_dict(saved["identity"]["config"])).eval()
    model.load_state_dict(saved["model"])
    vocab = make_tokenizer("char", text)
    return heldout_loss(model, vocab.encode(text[int(len(text) * 0.9) :]), 64)


def init_report(folder: Path, text: str) -> dict[str, dict[str, float]]:
    """Both models as initialised, before any step: parameters, the scale of what the token
    embedding hands the first block, of the residual projections, and the held-out loss
    (printed, and returned by model)."""
    sys.path.insert(0, str(folder))
    from model import GPT, GPTConfig  # nanoGPT's own model.py

    from coursepkg import DecoderOnlyLM, TransformerConfig
    from coursepkg.training.data import make_tokenizer
    from coursepkg.training.settings import GPT_DEFAULTS

    torch.manual_seed(0)
    chars = sorted(set(text))
    val = text[int(len(text) * 0.9) :][: 200 * 64 + 1]
    theirs = GPT(
        GPTConfig(
            block_size=64,
            vocab_size=len(chars),
            n_layer=4,
            n_head=4,
            n_embd=128,
            dropout=0.0,
            bias=False,
        )
    ).eval()
    shape = dict(d_model=128, n_heads=4, n_layers=4, d_ff=512, max_len=64)
    vocab = make_tokenizer("char", text)
    ours = DecoderOnlyLM(
        TransformerConfig.from_dict({**GPT_DEFAULTS, **shape, "vocab_size": len(vocab)})
    ).eval()
    dummy = torch.zeros(1, 1, dtype=torch.long)
    stoi = {c: i for i, c in enumerate(chars)}
    with torch.no_grad():
        rows = {
            "nanoGPT": (
                sum(p.numel() for p in theirs.parameters()),
                theirs.transformer.wte.weight.std(),
                theirs.transformer.h[0].attn.c_proj.weight.std(),
                heldout_loss(
                    lambda x: theirs(x, dummy.expand_as(x))[0], [stoi[c] for c in val], 64
                ),
            ),
            "ours": (
                sum(p.numel() for p in ours.parameters()),
                ours.embed.weight.std() * (ours.embed.scale or 1.0),
                ours.layers[0].self_attn.out_proj.weight.std(),
                heldout_loss(ours, vocab.encode(val), 64),
            ),
        }
    for name, (params, embed, proj, loss) in rows.items():
        print(
            f"init {name:8s} {params:,} parameters; token embedding std {float(embed):.3f}, "
            f"attention output projection std {float(proj):.4f}; held-out loss {loss:.3f} "
            f"(uniform: {np.log(len(chars)):.3f})"
        )
    uniform = float(np.log(len(chars)))
    return {
        name: {
            "parameters": params,
            "embedding_std": float(embed),
            "out_proj_std": float(proj),
            "heldout": float(loss),
            "uniform": uniform,
        }
        for name, (params, embed, proj, loss) in rows.items()
    }


def first_reaching(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((step for step, loss in curve if loss <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--nanogpt", help="a nanoGPT checkout (default: the fetched mirror)")
    parser.add_argument("--ours", nargs="+", default=list(OURS), choices=list(OURS))
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or the CPU time of the processes",
    )
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument(
        "--write",
        help="write them with their provenance as the book's shipped result (chapter 22): "
        "coursepkg/chapters/results/nanogpt.json",
    )
    parser.add_argument("--init-only", action="store_true", help="compare the initial models")
    args = parser.parse_args()
    EVAL["eval_interval"] = min(args.eval_interval, args.iters)
    text = (ROOT / "coursepkg" / "data" / "tinyshakespeare.txt").read_text()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = nanogpt_folder(args.nanogpt, work)
        init = init_report(folder, text)
        if args.init_only:
            return
        prepare_data(text, folder)
        (work / "input.txt").write_text(text)
        runs: dict[str, list[dict]] = {"nanoGPT": [], **{f"ours:{v}": [] for v in args.ours}}
        for r in range(args.rounds):
            out = work / f"nano{r}"
            result = run_nanogpt(folder, args.iters, out, env)
            runs["nanoGPT"].append({**result, "heldout": nanogpt_heldout(folder, out, text)})
            for variant in args.ours:
                out = work / f"{variant}{r}"
                result = run_ours(work / "input.txt", args.iters, out, OURS[variant], env)
                runs[f"ours:{variant}"].append({**result, "heldout": ours_heldout(out, text)})
    summary = report(runs, args)
    if args.write:
        settings = {
            **SHAPE,
            **EVAL,
            "iters": args.iters,
            "rounds": args.rounds,
            "threads": args.threads,
            "clock": args.clock,
            "ours": args.ours,
        }
        write_results(
            args.write,
            {**summary, "init": init, "settings": settings},
            command="benchmarks/nanogpt_compare.py " + " ".join(sys.argv[1:]),
            settings=settings,
            cpu_seconds=sum(sum(x["cpu"]) for x in runs.values()),
            wall_seconds=sum(sum(x["wall"]) for x in runs.values()),
        )


def report(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    """Print (and write with ``--json``) each run's time, held-out loss and time to target.

    Returns:
        ``{"iters", "target", "runs": {name: figures}}``.
    """
    target = max(statistics.median(x["heldout"] for x in rs) for rs in runs.values())
    base = statistics.median(x[args.clock] for x in runs["nanoGPT"])
    print(
        f"{args.iters} steps, {args.rounds} round(s), {args.threads} thread(s), clock "
        f"{args.clock}; target: the worst final held-out loss, {target:.3f}"
    )
    summary = {}
    for name, rs in runs.items():
        spent = statistics.median(x[args.clock] for x in rs)
        heldout = statistics.median(x["heldout"] for x in rs)
        steps = [first_reaching(x["curve"], target) for x in rs]
        reach = [x[args.clock] * n / args.iters for x, n in zip(rs, steps, strict=True) if n]
        to_target = statistics.median(reach) if reach else None
        summary[name] = {
            **{k: [x[k] for x in rs] for k in ("wall", "cpu", "heldout", "curve")},
            "steps_to_target": steps,
            "time_to_target_s": to_target,
        }
        shown = f"{to_target:.1f} s" if to_target is not None else "not reached"
        print(
            f"{name:22s} {args.clock} {spent:6.1f} s ({spent / base:.2f}x nanoGPT)  held-out "
            f"loss {heldout:.3f} ({heldout / np.log(2):.3f} bits/byte)  to {target:.3f}: "
            f"{shown} (steps {steps})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"iters": args.iters, "target": target, **summary}))
    return {"iters": args.iters, "target": target, "runs": summary}


if __name__ == "__main__":
    main()
