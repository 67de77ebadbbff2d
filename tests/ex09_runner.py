"""Run the ex09_training_run solution, with edits, in a fresh Python process, and grade it.

The checks of ex09 install an audit hook and an optimiser-step hook that cannot be removed, so
every scenario runs in its own process (never in pytest's). The scenario's code is the solution
notebook's own cells (setup, pasted pieces, answers) with the scenario's text edits, then a
short training run of a small model and ``check_training_run``; the process prints one JSON
line: ``{"passed": ..., "message": ..., "accuracy": ...}``.

Usage (what :func:`run_scenario` does): ``python tests/ex09_runner.py '<json>'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "solutions" / "ex09_training_run" / "ex09_training_run.ipynb"
CELLS = (
    "setup",
    "paste_ex02",
    "paste_ex03",
    "paste_ex04",
    "paste_ex05",
    "paste_ex06",
    "answer_DateTransformer",
    "answer_sequence_loss",
    "answer_train_model",
    "answer_greedy_decode",
)
# A small model trained briefly: enough to be graded, not to pass (the tests look at what the
# check says, not at the accuracy).
TRAIN = """
torch.manual_seed(0)
src_vocab, tgt_vocab = date_vocabs()
model = DateTransformer(len(src_vocab), len(tgt_vocab), d_model=32, n_heads=2, d_ff=64)
losses = train_model(model, steps={steps}, batch_size=32, warmup_steps=20, lr_factor=1.0)
"""
GRADE = """
run = check_training_run(model, greedy_decode, sequence_loss, n={n}, min_accuracy={min_accuracy},
                         budget={budget})
"""


def scenario_code(edits: list[tuple[str, str, str]]) -> str:
    """The solution's cells in order, with ``(grade_id, old, new)`` edits applied (each ``old``
    must occur exactly once in its cell)."""
    import nbformat

    nb = nbformat.read(str(SOURCE), as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells}
    sources = {gid: by_id[gid] for gid in CELLS}
    for gid, old, new in edits:
        assert sources[gid].count(old) == 1, f"{old!r} not found once in {gid}"
        sources[gid] = sources[gid].replace(old, new)
    return "\n\n".join(sources[gid] for gid in CELLS)


def start_scenario(
    edits: list[tuple[str, str, str]] = (),
    *,
    before: str = "",
    train: str | None = None,
    after: str = "",
    steps: int = 60,
    n: int = 100,
    min_accuracy: float = 0.9,
    budget: float = 300,
    interrupt_after: float | None = None,
) -> subprocess.Popen:
    """Start one scenario in a new process; :func:`verdict` waits for its answer."""
    spec = {
        "code": scenario_code(list(edits)),
        "before": before,
        "train": TRAIN.format(steps=steps) if train is None else train,
        "after": after,
        "grade": GRADE.format(n=n, min_accuracy=min_accuracy, budget=budget),
        "interrupt_after": interrupt_after,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, __file__, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def verdict(proc: subprocess.Popen, timeout: float = 900) -> dict:
    """Wait for a scenario started by :func:`start_scenario`; its JSON verdict."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"scenario printed no verdict:\n{out}\n{err}"
    return json.loads(lines[-1])


def run_scenario(*args, **kwargs) -> dict:
    """Run one scenario (the arguments of :func:`start_scenario`) and return its verdict."""
    return verdict(start_scenario(*args, **kwargs))


def _main(spec: dict) -> None:
    from coursepkg.grading import CheckerError, CheckFailure
    from coursepkg.grading.checks.ex09_training_run import watch_training

    if spec["interrupt_after"] is not None:
        watch_training(interrupt_after=spec["interrupt_after"])
    namespace: dict = {"__name__": "__main__"}
    verdict: dict = {}
    try:
        exec(compile(spec["before"], "<before>", "exec"), namespace)
        exec(compile(spec["code"], "<notebook>", "exec"), namespace)
        try:
            exec(compile(spec["train"], "<train>", "exec"), namespace)
        except KeyboardInterrupt:
            verdict["interrupted"] = True
        exec(compile(spec["after"], "<after>", "exec"), namespace)
        exec(compile(spec["grade"], "<grade>", "exec"), namespace)
        run = namespace["run"]
        verdict.update(passed=True, accuracy=run.accuracy, message="\n".join(run.result.messages))
    except CheckFailure as failure:
        verdict.update(
            passed=False, message=str(failure), checker_error=isinstance(failure, CheckerError)
        )
    print(json.dumps(verdict))


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
