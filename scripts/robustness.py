"""Do the book's results hold on any x86-64 CPU? Run its trainings under four CPU settings.

The pages glue every measured figure into their prose (``myst_nb.glue``). This script executes
the pages that train something, as the book build does, once under each of

* the kernels PyTorch picks for this CPU (``default``; AVX-512 where the CPU has it) and the
  AVX2 kernels every x86-64 CPU of the last decade has (``ATEN_CPU_CAPABILITY=avx2``),
* with 1 and with 2 threads (the pages ask for 1; a first cell pins the run's count instead),

collects the glued figures of each run, and prints one row per figure: its value under each
setting and the spread (largest minus smallest). Rounding differs between kernels and thread
counts, so trainings end with other weights; a headline that holds only under one setting is a
result of this machine, not of the recipe. Each setting gets its own empty translator cache, so
chapter 9 reuses the translator chapter 8 trained under the same setting.

It exits with status 1 if the date translator's held-out exact match falls below 99%, the
character GPT's held-out loss rises above 1.95 nats, a ratio of chapter 8's race between the
attention RNN and the Transformer changes direction, the fine-tuned GPT's lead over training
from scratch falls short of what chapter 12 says, a post-training claim of chapter 20 (SFT
and LoRA teach the chat format, DPO raises the preference and drifts less at a larger beta,
GRPO drifts further without the KL term and lifts the reward and the accuracy in every seed)
turns round, or a timing order the pages glue as a verdict
(chapters 3, 8, 9 and 15) turns round, under any setting (the claims the book makes for them). The
pages themselves assert no timing order: each glues what it measured with a word for it.

Usage::

    python scripts/robustness.py                   # every page that trains (long: ~30 min)
    python scripts/robustness.py 08_training 09_decoding --json figures.json
    python scripts/robustness.py 12_decoder_only --settings default/2t,avx2/2t
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (ATEN_CPU_CAPABILITY or None for PyTorch's own choice, threads)
SETTINGS = [(None, 1), ("avx2", 1), (None, 2), ("avx2", 2)]
#: The pages with a training run or a timing order the text relies on, in build order (chapter 9
#: reuses chapter 8's translator).
TRAINING_PAGES = [
    "01_rnn_bottleneck",
    "02_bahdanau_attention",
    "03_self_attention",
    "04_multi_head_attention",
    "05_positional_encoding",
    "07_decoder",
    "08_training",
    "09_decoding",
    "12_decoder_only",
    "13_inside_the_model",
    "14_tokens",
    "15_attention_at_length",
    "16_modern_decoder",
    "17_training_for_real",
    "19_experts",
    "20_post_training",
    "21_training_across_machines",
    "22_text_to_chat",
]
#: glued figure -> the least value the book claims for it under every setting
REQUIRED = {
    "08_training/translator_accuracy": 0.99,
    # chapter 8's race: the Transformer trains more tokens per second, the RNN needs fewer steps
    # and less time to equal quality, and the RNN's pass grows dearer with the length
    "08_training/race_speed_ratio": 1.0,
    "08_training/race_steps_ratio": 1.0,
    "08_training/race_time_ratio": 1.0,
    "08_training/sweep_ratio_long": 2.0,
    "08_training/sweep_gap_growth": 2.0,
    "08_training/sweep_slope_gap": 0.0,
    # timing orders the pages glue as a verdict: at L = 1024 attention is the dearer part of a
    # layer (chapter 3); 16 times the pairs cost more than twice the time, and linear attention
    # is more than 3 times faster than softmax attention at L = 4096 (chapter 15)
    "03_self_attention/cross_ratio_long": 1.0,
    # chapter 9: the KV cache makes 200 new tokens faster, and more so than 25
    "09_decoding/speedup_long": 1.5,
    "09_decoding/speedup_gap": 1.0,
    "15_attention_at_length/time_ratio": 2.0,
    "15_attention_at_length/linear_speedup": 3.0,
    # chapter 12's fine-tuning: pre-training's gain at 16 labels (percentage points), how much
    # it shrinks by 1,024 labels, and the frozen body ahead of full fine-tuning at 16 labels
    "12_decoder_only/ft_gain_smallest": 15.0,
    "12_decoder_only/ft_gain_shrink": 10.0,
    "12_decoder_only/ft_frozen_minus_tuned_16": 2.0,
    # chapter 20's post-training: the base model knows the task in plain text; SFT and LoRA
    # teach the chat format (points gained, mean of the seeds); DPO raises the preference for
    # the chosen answers at every beta (points) and drifts less at the largest beta than at the
    # smallest (KL ratio); GRPO without the KL term drifts further than with it (KL ratio);
    # GRPO from a start right about a third of the time raises the held-out accuracy in every
    # seed (the smallest gain, points) and the mean reward (last ten steps minus first ten, points)
    "20_post_training/base_plain": 80.0,
    "20_post_training/sft_gain": 50.0,
    "20_post_training/lora_gain": 30.0,
    "20_post_training/dpo_pref_gain": 20.0,
    "20_post_training/dpo_kl_fall": 1.0,
    "20_post_training/nokl_kl_ratio": 1.0,
    "20_post_training/grpo_min_gain": 5.0,
    "20_post_training/grpo_reward_rise": 10.0,
}
#: glued figure -> the largest value the book claims for it under every setting
REQUIRED_AT_MOST = {
    "12_decoder_only/gpt_heldout": 1.95,
    # chapter 3: at L = 32 attention is the cheaper part of a layer; chapter 15: linear
    # attention's time grows more slowly than quadratically
    "03_self_attention/cross_ratio_short": 1.0,
    "15_attention_at_length/linear_exponent": 1.5,
    # chapter 20: the base model rarely answers in the chat format
    "20_post_training/base_chat": 5.0,
}
_PIN_THREADS = """\
import torch

torch.set_num_threads({threads})
# The page asks for one thread; this run keeps {threads}.
torch.set_num_threads = lambda n: None
print("threads", torch.get_num_threads(), "kernels", torch.backends.cpu.get_cpu_capability())
"""


def label(capability: str | None, threads: int) -> str:
    return f"{capability or 'default'}/{threads}t"


def parse_settings(text: str) -> list[tuple[str | None, int]]:
    """``"default/1t,avx2/2t"`` -> ``[(None, 1), ("avx2", 2)]``: a subset of SETTINGS, in order."""
    by_label = {label(*s): s for s in SETTINGS}
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in by_label]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown setting {', '.join(unknown) or repr(text)}; choose from {', '.join(by_label)}"
        )
    return [s for s in SETTINGS if label(*s) in wanted]


def glued(notebook) -> dict[str, float]:
    """The numbers a notebook glued (``myst_nb.glue``), by name."""
    found = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            text = next((v for k, v in output["data"].items() if k.endswith("text/plain")), None)
            try:
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                found[name] = float(value)
    return found


def run_page(page: str, capability: str | None, threads: int, cache: str) -> dict[str, float]:
    """Execute one page under one setting; its glued numbers."""
    import jupytext
    import nbformat

    # The book build's client: its waits on the kernel's replies survive an explore() cell's
    # widget (jupyter/nbclient#312, where plain nbclient waits until the cell's timeout), and a
    # stalled cell fails named instead of hanging.
    if str(ROOT / "book" / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from execution_watchdog import KERNEL_CONFIG, WatchedClient

    notebook = jupytext.read(ROOT / "book" / f"{page}.md")
    notebook.cells.insert(0, nbformat.v4.new_code_cell(_PIN_THREADS.format(threads=threads)))
    env = dict(os.environ, COURSEPKG_CACHE_DIR=cache, MPLBACKEND="Agg")
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = WatchedClient(
            notebook,
            kernel_name="python3",
            timeout=1800,
            resources={"metadata": {"path": str(ROOT / "book")}},
            config=KERNEL_CONFIG,
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return glued(notebook)


def table(results: dict[str, dict[str, float]], columns: list[str]) -> str:
    """One row per glued figure: its value under each setting, then the spread."""
    names = sorted({name for by_name in results.values() for name in by_name})
    width = max(len(n) for n in names) if names else 10

    def show(value: float | None) -> str:
        if value is None:
            return f"{'-':>10}"
        return f"{value:>10.4g}"

    lines = [f"{'figure':<{width}} " + " ".join(f"{c:>10}" for c in columns) + "     spread"]
    for name in names:
        values = [results[c].get(name) for c in columns]
        present = [v for v in values if v is not None]
        spread = max(present) - min(present) if present else 0.0
        lines.append(f"{name:<{width}} " + " ".join(show(v) for v in values) + show(spread))
    return "\n".join(lines)


def failures(results: dict[str, dict[str, float]], columns: list[str]) -> list[str]:
    """The claims of REQUIRED and REQUIRED_AT_MOST that some setting breaks, one line each."""
    low = [
        f"{name} = {results[c][name]:.4f} < {least} under {c}"
        for name, least in REQUIRED.items()
        for c in columns
        if name in results[c] and results[c][name] < least
    ]
    high = [
        f"{name} = {results[c][name]:.4f} > {most} under {c}"
        for name, most in REQUIRED_AT_MOST.items()
        for c in columns
        if name in results[c] and results[c][name] > most
    ]
    return low + high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", default=TRAINING_PAGES, help="pages to run")
    parser.add_argument(
        "--json", type=Path, help="also write the figures here, after every page (partial runs)"
    )
    parser.add_argument(
        "--settings",
        type=parse_settings,
        default=SETTINGS,
        help="a comma-separated subset of "
        + ",".join(label(*s) for s in SETTINGS)
        + " (default: all four)",
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.pages if not (ROOT / "book" / f"{p}.md").exists()]
    if unknown:
        parser.error(f"no such page in book/: {', '.join(unknown)}")
    columns = [label(*s) for s in args.settings]
    results: dict[str, dict[str, float]] = {c: {} for c in columns}
    for (capability, threads), column in zip(args.settings, columns, strict=True):
        with tempfile.TemporaryDirectory(prefix="coursepkg-robustness-") as cache:
            for page in args.pages:
                start = time.perf_counter()
                numbers = run_page(page, capability, threads, cache)
                results[column].update({f"{page}/{k}": v for k, v in numbers.items()})
                took = time.perf_counter() - start
                print(f"[{column}] {page}: {len(numbers)} figures, {took:.0f} s", flush=True)
                if args.json is not None:
                    args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    print()
    print(table(results, columns))
    failed = failures(results, columns)
    for line in failed:
        print("FAILED:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
