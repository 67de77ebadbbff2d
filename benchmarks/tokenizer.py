"""Byte-level BPE: coursepkg.tokenizer vs Hugging Face ``tokenizers`` (Rust) and ``tiktoken``.

On Tiny Shakespeare (1.1 MB), one thread each (``RAYON_NUM_THREADS=1`` for the Rust libraries),
timed alternately in one run:

* training to vocab 1,000 and 5,000 (``<|endoftext|>`` special): ours vs Hugging Face's
  ``BpeTrainer``. Target: ours at most 4x Hugging Face's time.
* encoding the whole text as one string with GPT-2's vocabulary (the shipped files), each
  tokenizer built fresh so no cache is warm: ours vs Hugging Face's BPE vs tiktoken, ids asserted
  identical. Target: ours at least as fast as Hugging Face's. Our warm-cache time is printed too.
* the worst case, one chunk of 1k/10k/100k random letters a-j (no space, so one pre-token):
  ours (the backtracker of ``coursepkg.tokenizer_long``) vs our heap (``long_route="heap"``, the
  encoding before it) vs our plain merge loop (``long_above=None``, the encoding before the heap)
  vs Hugging Face, one-thread CPU time, with the growth exponents from 1k to 100k; and the first
  call of fresh tokenizers on another 100k letters (ours builds the backtracker's tables then).
  Targets: exponent <= 1.1, ours at most Hugging Face's time on 100k.
* peak memory of ``encode_iterable`` over a 100 MB file made by repeating the corpus, in a child
  process. Target: under 100 MB above the memory at its start.

Run: ``.venv/bin/python benchmarks/tokenizer.py [--rounds N] [--stream-mb MB] [--only long ...]``
"""

from __future__ import annotations

import os

# Before the Rust libraries start their thread pools.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from functools import partial  # noqa: E402
from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, median  # noqa: E402

from coursepkg.data import load_tinyshakespeare  # noqa: E402
from coursepkg.tokenizer import GPT2_PATTERN, Tokenizer, train_bpe  # noqa: E402

EOT = "<|endoftext|>"
GPT2_DIR = resources.files("coursepkg") / "data" / "gpt2"

# Run in a child process so its peak memory is the streaming's alone. VmHWM is reset through
# /proc/self/clear_refs after the set-up, so the peak is measured from there.
_STREAM_CHILD = r"""
import sys
from coursepkg.tokenizer import Tokenizer

def status(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field)) // 1024

tok = Tokenizer.gpt2()
tok.encode("warm up the regular expression")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
start = status("VmRSS:")
n = 0
with open(sys.argv[1], encoding="utf-8", newline="") as f:
    for _ in tok.encode_iterable(f):
        n += 1
print(start, status("VmHWM:"), n)
"""


def hf_trainer(vocab_size: int):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def hf_gpt2():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    with resources.as_file(GPT2_DIR / "vocab.json") as vocab:
        with resources.as_file(GPT2_DIR / "merges.txt") as merges:
            tok = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens([EOT])
    return tok


def tiktoken_gpt2(ours: Tokenizer):
    import tiktoken

    ranks = {token: index for index, token in ours.vocab.items() if index != 50256}
    return tiktoken.Encoding(
        "gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256}
    )


def bench_training(text: str, vocab_size: int, rounds: int) -> dict:
    def hf():
        tok, trainer = hf_trainer(vocab_size)
        tok.train_from_iterator([text], trainer)

    times = alternate({"ours": lambda: train_bpe(text, vocab_size, [EOT]), "hf": hf}, rounds, 0)
    ours, theirs = median(times["ours"]), median(times["hf"])
    ratio = ours / theirs
    print(
        f"  train to {vocab_size:>5}: ours {ours:.2f} s, Hugging Face {theirs:.2f} s, "
        f"ratio {ratio:.2f}x (target <= 4x)"
    )
    return dict(ours_s=ours, hf_s=theirs, ratio=ratio)


def bench_encoding(text: str, rounds: int) -> dict:
    gpt2 = Tokenizer.gpt2()
    fresh = {"ours": [], "hf": []}
    for _ in range(rounds + 1):  # built outside the timing, one per call: caches start cold
        fresh["ours"].append(Tokenizer(gpt2.vocab, gpt2.merges, [EOT]))
        fresh["hf"].append(hf_gpt2())
    enc = tiktoken_gpt2(gpt2)
    ids = {}

    def run(name, call):
        def fn():
            ids[name] = call(fresh[name].pop() if name in fresh else None)

        return fn

    times = alternate(
        {
            "ours": run("ours", lambda tok: tok.encode(text)),
            "hf": run("hf", lambda tok: tok.encode(text).ids),
            "tiktoken": run("tiktoken", lambda _: enc.encode(text, allowed_special="all")),
        },
        rounds,
        warmup=1,
    )
    warm = median(alternate({"warm": lambda: gpt2.encode(text)}, rounds, warmup=1)["warm"])
    if not ids["ours"] == ids["hf"] == ids["tiktoken"]:
        raise SystemExit("the three tokenizers gave different ids for the same text")
    ours, hf, tt = (median(times[k]) for k in ("ours", "hf", "tiktoken"))
    mb = len(text.encode()) / 1e6
    print(f"  encode {mb:.2f} MB with GPT-2's vocab ({len(ids['ours'])} ids, identical in all 3):")
    print(f"    ours (cold cache) {ours:.3f} s ({mb / ours:.1f} MB/s); warm cache {warm:.3f} s")
    print(f"    Hugging Face      {hf:.3f} s ({mb / hf:.1f} MB/s)")
    print(f"    tiktoken          {tt:.3f} s ({mb / tt:.1f} MB/s)")
    print(
        f"    speed ours / Hugging Face: {hf / ours:.2f}x (target >= 1x); "
        f"ours / tiktoken: {tt / ours:.2f}x"
    )
    return dict(ours_s=ours, warm_s=warm, hf_s=hf, tiktoken_s=tt, speedup_vs_hf=hf / ours)


def bench_long_chunk(rounds: int, plain_up_to: int) -> dict:
    """One pre-token of n random letters a-j (the worst case: no space to cut at), encoded
    by ours (the backtracker above 64 characters), our heap (what encoding was before it), our
    plain merge loop (long_above=None, what it was before the heap), and Hugging Face's BPE;
    one-thread CPU time, caches off."""
    import random
    import time

    gpt2 = Tokenizer.gpt2()
    made = {
        name: Tokenizer(gpt2.vocab, gpt2.merges, [EOT], cache_size=0, **options)
        for name, options in {
            "ours": {},
            "heap": {"long_route": "heap"},
            "plain": {"long_above": None},
        }.items()
    }
    hf = hf_gpt2()
    rng, cold_rng = random.Random(0), random.Random(1)
    cold = "".join(cold_rng.choice("abcdefghij") for _ in range(100_000))
    first = {}
    for name, encode in (("ours", made["ours"].encode), ("hf", hf.encode)):
        start = time.thread_time()
        encode(cold)  # ours: builds the backtracker's tables, meets every pair for the first time
        first[name] = time.thread_time() - start
    out = {"first_call_s": first["ours"], "hf_first_call_s": first["hf"]}
    print(
        f"  first call of a fresh tokenizer on another 100000 letters (ours builds its tables):"
        f" ours {first['ours']:.2f} s, Hugging Face {first['hf']:.2f} s"
    )
    for n in (1_000, 10_000, 100_000):
        text = "".join(rng.choice("abcdefghij") for _ in range(n))
        if not made["ours"].encode(text) == made["heap"].encode(text) == hf.encode(text).ids:
            raise SystemExit(f"ours, our heap and Hugging Face's ids differ on {n} letters")
        calls = {name: partial(made[name].encode, text) for name in ("ours", "heap")}
        calls["hf"] = partial(hf.encode, text)
        if n <= plain_up_to:
            calls["plain"] = partial(made["plain"].encode, text)
        times = alternate(calls, rounds, 1, clock=time.thread_time)
        row = {name: median(t) for name, t in times.items()}
        row["ratio_vs_hf"] = row["ours"] / row["hf"]
        row["heap_ratio_vs_hf"] = row["heap"] / row["hf"]
        out[n] = row
        plain_s = f"plain loop {row['plain']:.3f} s, " if "plain" in row else ""
        print(
            f"  {n:>7} letters: ours {row['ours']:.4f} s, heap {row['heap']:.4f} s, {plain_s}"
            f"Hugging Face {row['hf']:.4f} s; time / HF's: ours {row['ratio_vs_hf']:.2f}x "
            f"(target <= 1x), heap {row['heap_ratio_vs_hf']:.2f}x"
        )
    sizes = [n for n in out if isinstance(n, int)]
    for name in ("ours", "heap", "hf", "plain"):
        have = [n for n in sizes if name in out[n]]
        if len(have) > 1:
            times = [out[n][name] for n in have]
            exponent = math.log(times[-1] / times[0]) / math.log(have[-1] / have[0])
            out[f"exponent_{name}"] = exponent
            print(
                f"  growth exponent {name} ({have[0]}-{have[-1]} letters): {exponent:.2f}"
                + (" (target <= 1.1)" if name == "ours" else "")
            )
    return out


def bench_streaming(text: str, megabytes: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.txt"
        copies = -(-megabytes * 1_000_000 // len(text.encode()))
        with open(path, "w", encoding="utf-8", newline="") as file:
            for _ in range(copies):
                file.write(text)
        size = path.stat().st_size / 1e6
        out = subprocess.run(
            [sys.executable, "-c", _STREAM_CHILD, str(path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
    start, peak, n = map(int, out)
    print(
        f"  encode_iterable over {size:.0f} MB: {n} ids, peak {peak} MiB, "
        f"{peak - start} MiB above start (target < 100 MB)"
    )
    return dict(file_mb=size, start_mib=start, peak_mib=peak, above_mib=peak - start, ids=n)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-mb", type=int, default=100)
    parts = ["train", "encode", "long", "stream"]
    parser.add_argument("--only", choices=parts, nargs="*", default=parts, help="parts to run")
    parser.add_argument(
        "--plain-up-to", type=int, default=10_000, help="longest chunk for the plain loop"
    )
    args = parser.parse_args(argv)
    text = load_tinyshakespeare()
    print(
        f"Tiny Shakespeare, {len(text.encode()) / 1e6:.2f} MB, one thread, medians of "
        f"{args.rounds} alternated rounds"
    )
    results = {}
    if "train" in args.only:
        results = {f"train_{v}": bench_training(text, v, args.rounds) for v in (1000, 5000)}
    if "encode" in args.only:
        results["encode"] = bench_encoding(text, args.rounds)
    if "long" in args.only:
        print("  one chunk of random letters a-j, CPU time of the calling thread:")
        results["long"] = bench_long_chunk(args.rounds, args.plain_up_to)
    if "stream" in args.only and args.stream_mb > 0:
        results["stream"] = bench_streaming(text, args.stream_mb)
    return results


if __name__ == "__main__":
    main()
