"""The capstone's grader: each recipe re-run confined under the instructor's budget, for each
seed, and scored in held-out bits per byte on a split the recipe never sees.

One run (:func:`run_recipe`) starts :mod:`coursepkg.grading.kernel.capstone` in a session of
its own with only the training split in its inputs folder; the held-out split stays in the
grader's memory and its files are left out of what the run may read. After the run has ended,
:func:`held_out_bpb` loads its weights into the course's own
:class:`~coursepkg.DecoderOnlyLM` (the recipe chose a configuration, never code that scores)
and measures bits per byte: nothing the recipe does can change how it is scored.

:func:`grade_recipe` runs every seed (and the first seed twice, to see nondeterminism) and
names one verdict (:data:`VERDICTS`) with the points the instructor's policy gives it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from statistics import mean, stdev
from typing import Any

from ..kernel.capstone import EXIT_OVER_BUDGET, MODULE
from ..kernel.confine import kill_process_group_cgroup

__all__ = [
    "CapstoneResult",
    "CapstoneRules",
    "RunRecord",
    "VERDICTS",
    "corpus_splits",
    "grade_class",
    "grade_entry",
    "grade_recipe",
    "held_out_bpb",
    "recipe_from_notebook",
    "run_recipe",
]

#: Each verdict a capstone submission can get (the id students and the gradebook see) and what
#: it means. Ids are never renamed.
VERDICTS: dict[str, str] = {
    "capstone.ok": "trained within every limit and scored",
    "capstone.over_budget": "training was stopped at the budget and scored as it stood",
    "capstone.artifact_too_large": "the model has more parameters or bytes than the rules allow",
    "capstone.nondeterministic": "two runs of one seed scored differently beyond the tolerance",
    "capstone.read_outside_inputs": "the recipe tried to open a file outside its inputs",
    "capstone.crashed": "the recipe raised an error (its own lines are shown)",
    "capstone.too_much_memory": "the recipe ran out of the memory the rules allow",
    "capstone.too_many_processes": "the recipe started more processes than the rules allow",
    "capstone.wrote_too_much": "the recipe wrote a file larger than the rules allow",
}
#: Points per verdict, as a fraction of the assignment's (the instructor's policy overrides).
DEFAULT_POINTS: dict[str, float] = {"capstone.ok": 1.0, "capstone.over_budget": 0.5}
_FAILURES = ("crashed", "too_much_memory", "too_many_processes", "wrote_too_much")


@dataclasses.dataclass(frozen=True)
class CapstoneRules:
    """What the instructor sets (each field's unit in its name).

    ``startup_s`` bounds the interpreter's start and the recipe's import, which the budget does
    not count; ``grace_s`` how long past the budget the watch may take to save the weights.
    """

    budget_s: float = 600.0
    memory_mb: int = 4096
    max_params: int = 2_000_000
    max_artifact_mb: float = 8.0
    seeds: tuple[int, ...] = (0, 1, 2)
    repeat_first_seed: bool = True
    tolerance_bpb: float = 1e-3
    threads: int = 2
    disk_mb: int = 256
    max_processes: int = 64
    output_limit: int = 100_000
    startup_s: float = 120.0
    grace_s: float = 30.0
    points: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_POINTS))

    def __post_init__(self) -> None:
        for name in ("budget_s", "max_artifact_mb", "startup_s", "grace_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CapstoneRules.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"CapstoneRules.seeds must be distinct and not empty: {self.seeds}")
        unknown = sorted(set(self.points) - set(VERDICTS))
        if unknown:
            raise ValueError(f"CapstoneRules.points names unknown verdicts {unknown}")


@dataclasses.dataclass
class RunRecord:
    """One run of a recipe for one seed."""

    seed: int
    outcome: str
    detail: str = ""
    train_s: float = 0.0
    wall_s: float = 0.0
    weights: Path | None = None
    opened_outside: list[str] = dataclasses.field(default_factory=list)
    output: str = ""
    bpb: float | None = None


@dataclasses.dataclass
class CapstoneResult:
    """A submission's verdict, its scores over seeds and the points it earned."""

    verdict: str
    scores: list[float]
    detail: str
    points: float
    runs: list[RunRecord]

    @property
    def mean(self) -> float | None:
        """The mean held-out bits per byte over seeds (None when unscored)."""
        return mean(self.scores) if self.scores else None

    @property
    def spread(self) -> float | None:
        """The sample standard deviation over seeds (0 for one seed, None when unscored)."""
        if not self.scores:
            return None
        return stdev(self.scores) if len(self.scores) > 1 else 0.0


def corpus_splits(prepared: str | Path | None = None) -> tuple[bytes, bytes, list[Path]]:
    """The capstone's training and held-out bytes, and the files a recipe must not read.

    Args:
        prepared: the folder ``coursepkg data prepare`` wrote (``train.txt``, ``val.txt``);
            None for Tiny Shakespeare, its first 90% trained on and the rest held out.

    Returns:
        ``(train, held_out, protected)``.
    """
    if prepared is not None:
        folder = Path(prepared)
        if not (folder / "train.txt").is_file() or not (folder / "val.txt").is_file():
            raise FileNotFoundError(
                f"{folder} holds no train.txt and val.txt (coursepkg data prepare)"
            )
        protected = [folder / "val.txt"]
        return (folder / "train.txt").read_bytes(), protected[0].read_bytes(), protected
    from importlib import resources

    source = Path(str(resources.files("coursepkg.data").joinpath("tinyshakespeare.txt")))
    text = source.read_bytes()
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:], [source]


def _read_capped(stream: Any, limit: int, into: list[bytes]) -> None:
    """Keep the first ``limit`` bytes of ``stream``, drain the rest (a print loop costs none)."""
    kept = 0
    while chunk := stream.read(65536):
        if kept < limit:
            into.append(chunk[: limit - kept])
            kept += len(into[-1])


def _command(recipe: Path, seed: int, rules: CapstoneRules, folder: Path, protect, course):
    options = {
        "recipe": recipe.resolve(),
        "inputs": folder / "inputs",
        "out": folder / "out",
        "seed": seed,
        "budget_s": rules.budget_s,
        "memory_mb": rules.memory_mb,
        "disk_mb": rules.disk_mb,
        "max_processes": rules.max_processes,
        "max_params": rules.max_params,
        "threads": rules.threads,
        "course": Path(course).resolve(),
        "protect": os.pathsep.join(str(Path(p).resolve()) for p in protect),
    }
    return [sys.executable, "-m", MODULE, *(f"--{k}={v}" for k, v in options.items())]


def run_recipe(
    recipe, train: bytes, seed: int, rules: CapstoneRules, folder, protect=(), course="."
):
    """Run ``recipe`` confined for one seed and say how it ended (not yet scored).

    Args:
        recipe: the recipe's Python file.
        train: the training split's bytes (all the run may read of the corpus).
        seed: the seed handed to ``config`` and ``train``.
        rules: the instructor's limits.
        folder: a fresh folder for this run's inputs and outputs.
        protect: files the run must not read (the held-out split, the corpus it was cut from).
        course: the course folder (kept out of what the run may read, as for every kernel).

    Returns:
        The run's :class:`RunRecord`.
    """
    folder = Path(folder)
    for sub in ("inputs", "out"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "inputs" / "train.bin").write_bytes(train)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "DATABASE"))}
    env["OMP_NUM_THREADS"] = str(rules.threads)
    started = time.monotonic()
    cmd = _command(Path(recipe), seed, rules, folder, protect, course)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    kept: list[bytes] = []
    reader = threading.Thread(target=_read_capped, args=(proc.stdout, rules.output_limit, kept))
    reader.start()
    killed = False
    try:
        proc.wait(rules.startup_s + rules.budget_s + rules.grace_s)
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kill_process_group_cgroup(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what it left in its session (a forked child)
    except ProcessLookupError:
        pass
    reader.join()
    record = _record(folder / "out", seed, proc.returncode, killed, rules)
    record.wall_s = time.monotonic() - started
    record.output = b"".join(kept).decode("utf-8", "replace")
    return record


def _record(out: Path, seed: int, code: int, killed: bool, rules: CapstoneRules) -> RunRecord:
    """Read what a run left: its status, weights and the files it tried to open."""
    try:
        status = json.loads((out / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    outside = out / "opened_outside.log"
    opened = sorted(set(outside.read_text().split("\n")) - {""}) if outside.is_file() else []
    weights = out / "weights.pt" if (out / "weights.pt").is_file() else None
    record = RunRecord(seed, status.get("outcome", ""), status.get("detail", ""))
    record.train_s, record.weights, record.opened_outside = (
        status.get("train_s", 0.0),
        weights,
        opened,
    )
    if killed or code == EXIT_OVER_BUDGET:
        record.outcome = "over_budget"
        if killed:
            record.train_s = rules.budget_s
            record.detail = "the run did not stop at its budget and was killed"
    elif not record.outcome:
        record.outcome = "crashed"
        record.detail = f"the process ended (exit status {code}) before it reported"
    return record


def held_out_bpb(weights: Path, held_out: bytes, max_bytes: int | None = None) -> float:
    """Bits per byte of the saved model on ``held_out``, with the course's own model code.

    The held-out bytes are cut into windows of the model's ``max_len``; each window's bytes
    after its first are predicted from those before them.

    Args:
        weights: the run's ``weights.pt`` (``{"config": dict, "state": state_dict}``).
        held_out: the bytes scored.
        max_bytes: score only the first ``max_bytes`` (None: all).

    Returns:
        Mean negative log-likelihood per predicted byte, in bits.
    """
    import torch
    import torch.nn.functional as F

    from coursepkg import DecoderOnlyLM, TransformerConfig

    saved = torch.load(weights, map_location="cpu", weights_only=True)
    config = TransformerConfig.from_dict(saved["config"])
    model = DecoderOnlyLM(config)
    model.load_state_dict(saved["state"], strict=True)
    model.eval()
    data = torch.frombuffer(bytearray(held_out[:max_bytes]), dtype=torch.uint8).long()
    width = min(config.max_len, 256)
    windows = data[: len(data) // width * width].view(-1, width)  # (N, W)
    if len(windows) == 0:
        raise ValueError(f"held_out has {len(data)} bytes, fewer than one window of {width}")
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in windows.split(64):
            logits = model(batch[:, :-1])  # (b, W-1, 256)
            loss = F.cross_entropy(
                logits.reshape(-1, 256), batch[:, 1:].reshape(-1), reduction="sum"
            )
            total, count = total + loss.item(), count + batch[:, 1:].numel()
    return total / count / math.log(2)


def _verdict(runs: list[RunRecord], rules: CapstoneRules) -> tuple[str, str]:
    """The one verdict of a submission's runs, the gravest first, and its detail."""
    for run in runs:
        if run.opened_outside:
            return "read_outside_inputs", "it tried to open " + ", ".join(run.opened_outside[:5])
    for run in runs:
        if run.outcome in (*_FAILURES, "artifact_too_large"):
            return run.outcome, run.detail
    cap = rules.max_artifact_mb * 2**20
    for run in runs:
        if run.weights is None:
            return "crashed", "the run saved no weights"
        if run.weights.stat().st_size > cap:
            size = run.weights.stat().st_size / 2**20
            return (
                "artifact_too_large",
                f"{size:.2f} MiB of weights, the limit is {rules.max_artifact_mb} MiB",
            )
    late = [r.seed for r in runs if r.outcome == "over_budget"]
    if late:
        return (
            "over_budget",
            f"stopped at the {rules.budget_s:g} s budget (seeds {sorted(set(late))})",
        )
    return "ok", ""


def grade_recipe(
    recipe,
    train: bytes,
    held_out: bytes,
    rules: CapstoneRules,
    folder,
    protect=(),
    course=".",
    score_bytes: int | None = None,
) -> CapstoneResult:
    """Grade one submission: every seed run confined and scored, one named verdict.

    Args:
        recipe: the recipe's Python file.
        train: the training split's bytes.
        held_out: the held-out bytes (never handed to a run).
        rules: the instructor's limits and points.
        folder: a fresh folder for the runs.
        protect: files the runs must not read.
        course: the course folder.
        score_bytes: score only this many held-out bytes (None: all).

    Returns:
        The :class:`CapstoneResult`; its ``scores`` are one per seed when the verdict allows a
        score (``ok``, ``over_budget``, ``nondeterministic``), else empty.
    """
    folder = Path(folder)
    seeds = list(rules.seeds) + ([rules.seeds[0]] if rules.repeat_first_seed else [])
    runs: list[RunRecord] = []
    for i, seed in enumerate(seeds):
        runs.append(run_recipe(recipe, train, seed, rules, folder / f"run{i}", protect, course))
        if runs[-1].opened_outside or runs[-1].outcome in (*_FAILURES, "artifact_too_large"):
            break  # the verdict is known: the rest of the class waits for no more seeds
    verdict, detail = _verdict(runs, rules)
    scores: list[float] = []
    if verdict in ("ok", "over_budget"):
        for run in runs:
            run.bpb = held_out_bpb(run.weights, held_out, score_bytes)
        scores = [r.bpb for r in runs[: len(rules.seeds)]]
        timely = verdict == "ok"  # a run stopped at the budget stops at no fixed step
        if (
            timely
            and rules.repeat_first_seed
            and abs(runs[-1].bpb - runs[0].bpb) > rules.tolerance_bpb
        ):
            gap = abs(runs[-1].bpb - runs[0].bpb)
            verdict = "nondeterministic"
            detail = (
                f"seed {seeds[0]} scored {runs[0].bpb:.4f} and {runs[-1].bpb:.4f} bits per "
                f"byte (differ by {gap:.2g} > {rules.tolerance_bpb:g})"
            )
    full = f"capstone.{verdict}"
    return CapstoneResult(full, scores, detail, float(rules.points.get(full, 0.0)), runs)


#: The released notebook's cells that check the recipe rather than define it (nbgrader's
#: grade ids): the grader never runs them in a recipe's process.
_CHECK_CELLS = ("check_notebook",)


def _is_check_cell(cell: Any) -> bool:
    """An nbgrader test cell (graded, not an answer) or the notebook's self-check cell."""
    grading = cell.get("metadata", {}).get("nbgrader", {})
    test = grading.get("grade", False) and not grading.get("solution", False)
    return bool(test) or grading.get("grade_id") in _CHECK_CELLS


def recipe_from_notebook(notebook: str | Path) -> str:
    """A submitted notebook's recipe: its code cells, in order, without the cells that only
    check it (nbgrader's test cells, the self-check) and without IPython's magics and shell
    lines (``%``, ``!``), which a recipe file cannot run."""
    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code" and not _is_check_cell(cell):
            lines = cell.source.splitlines()
            cells.append("\n".join(x for x in lines if not x.lstrip().startswith(("%", "!"))))
    return "\n\n".join(cells) + "\n"


def grade_entry(
    student: str,
    source: str,
    train: bytes,
    held_out: bytes,
    rules: CapstoneRules,
    protected: list[Path] | None = None,
    course: str | Path = ".",
    score_bytes: int | None = None,
) -> dict:
    """Grade one student's recipe (its source text) in a temporary folder of this machine (a
    Dask worker needs no shared file system): the leaderboard's entry for it.

    Returns:
        ``student``, ``verdict``, ``scores``, ``detail``, ``points``.
    """
    import tempfile

    if protected is None:  # on a worker: its own copy of the corpus files stays unreadable
        protected = corpus_splits()[2]
    with tempfile.TemporaryDirectory(prefix="coursepkg-capstone-") as folder:
        recipe = Path(folder) / "recipe.py"
        recipe.write_text(source, encoding="utf-8")
        result = grade_recipe(
            recipe, train, held_out, rules, Path(folder) / "runs", protected, course, score_bytes
        )
    return {
        "student": student,
        "verdict": result.verdict,
        "scores": result.scores,
        "detail": result.detail,
        "points": result.points,
    }


def grade_class(
    submissions: Mapping[str, str | Path],
    rules: CapstoneRules,
    prepared: str | Path | None = None,
    course: str | Path = ".",
    score_bytes: int | None = None,
    client: Any = None,
) -> list[dict]:
    """Grade every student's notebook and give the leaderboard's entries, in submission order.

    Args:
        submissions: the notebook (or recipe ``.py``) of each student, in submission order.
        rules: the instructor's limits.
        prepared: the prepared corpus's folder (None: Tiny Shakespeare).
        course: the course folder.
        score_bytes: score only this many held-out bytes (None: all).
        client: a Dask ``distributed.Client``: one task per student on its workers (each
            worker protects its own copy of the corpus); None: one after another here.

    Returns:
        One :func:`grade_entry` per student.
    """
    train, held_out, protected = corpus_splits(prepared)
    sources = {}
    for student, path in submissions.items():
        path = Path(path)
        sources[student] = (
            recipe_from_notebook(path) if path.suffix == ".ipynb" else path.read_text()
        )
    args = (train, held_out, rules)
    if client is None:
        return [
            grade_entry(s, src, *args, protected, course, score_bytes) for s, src in sources.items()
        ]
    shared = client.scatter(list(args), broadcast=True)
    futures = [
        client.submit(grade_entry, s, src, *shared, None, course, score_bytes, pure=False)
        for s, src in sources.items()
    ]
    return client.gather(futures)
