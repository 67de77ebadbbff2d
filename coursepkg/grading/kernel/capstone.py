"""The confined process that runs one capstone recipe for one seed (``python -m
coursepkg.grading.kernel.capstone``), started by :mod:`coursepkg.grading.classroom.capstone`.

A recipe is a Python file (the code cells of the student's notebook) that defines
``config(seed) -> TransformerConfig`` (a byte-level :class:`~coursepkg.DecoderOnlyLM`:
``vocab_size=256``) and ``train(model, data, budget_s, seed)``, which trains the model this
process built, in place, on ``data`` (the training split's bytes). This process:

1. confines itself before any of the recipe's code runs: the address space (a memory bomb is a
   ``MemoryError``), core dumps, the size of each file written (``SIGXFSZ`` ignored, so a
   write past it is an ``OSError``), a process ceiling, a network namespace, a system-call
   filter, and Landlock: it may read the Python installation, the package (less the files
   named ``--protect``: the corpus's held-out split and its source) and its inputs folder
   (the training split only), and write its output folder;
2. records every attempt to open a file outside what it may read (an audit hook, so the
   attempt is named even when the recipe catches Landlock's ``PermissionError``);
3. builds the model with the course's code (the recipe chooses the configuration, never the
   class), checks its parameter count, and calls ``train`` with a watch that, at the budget,
   saves the weights as they stand and ends the process (``over_budget``);
4. saves ``{"config", "state"}`` to ``weights.pt`` and what happened to ``status.json``.

The grader scores the weights after this process has ended, with the course's own model code,
on bytes this process never saw.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import resource
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from .confine import (
    deny_network,
    die_with_parent,
    limit_processes,
    loopback_up,
    readable_roots,
    restrict_files,
)
from .syscalls import filter_syscalls

__all__ = [
    "EXIT_OVER_BUDGET",
    "MODULE",
    "VOCAB_SIZE",
    "granted_reads",
    "outcome_of",
    "student_frames",
]

#: This module, as ``python -m`` runs it.
MODULE = "coursepkg.grading.kernel.capstone"

#: Every recipe models bytes: its held-out score is then bits per byte without a tokenizer.
VOCAB_SIZE = 256
#: The exit status of a run the watch stopped at its budget (its weights saved as they stood).
EXIT_OVER_BUDGET = 3
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def granted_reads(roots: list[str], protected: list[Path]) -> list[str]:
    """``roots`` less every file in ``protected``: a root holding one is replaced by its
    entries, recursively, leaving the protected files out (Landlock grants whole trees).

    Args:
        roots: directories (or files) that may be read.
        protected: files that must stay unreadable.

    Returns:
        Paths to grant, none of which is or contains a protected file.
    """
    hidden = [p.resolve() for p in protected]
    granted: list[str] = []
    for root in roots:
        real = Path(os.path.realpath(root))
        if not any(h == real or h.is_relative_to(real) for h in hidden):
            granted.append(str(real))
        elif real.is_dir() and real.name not in (".git", "__pycache__"):
            granted += granted_reads([str(e) for e in real.iterdir()], hidden)
    return granted


def student_frames(error: BaseException, recipe: str) -> str:
    """The traceback of ``error`` with the recipe's frames only (and the error itself)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == recipe]
    lines = traceback.format_list(frames)
    return "".join(["Traceback (the recipe's own lines):\n", *lines]) + "".join(
        traceback.format_exception_only(type(error), error)
    )


def outcome_of(error: BaseException) -> str:
    """The verdict a recipe's exception stands for: a limit it ran into, or a crash."""
    text = str(error)
    if isinstance(error, MemoryError) or "can't allocate memory" in text:
        return "too_much_memory"
    if isinstance(error, OSError) and error.errno == errno.EFBIG:
        return "wrote_too_much"
    if isinstance(error, OSError) and error.errno == errno.EAGAIN:
        return "too_many_processes"
    return "crashed"


def _confine(options: dict[str, Any], problems: list[str]) -> None:
    """Everything but Landlock (which comes once the package is imported)."""
    die_with_parent()
    memory = int(options["memory_mb"]) * 2**20
    for limit, value in (
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, int(options["disk_mb"]) * 2**20),
    ):
        resource.setrlimit(limit, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit raises EFBIG
    problems.append(limit_processes(int(options["max_processes"])))
    why = deny_network()
    problems.append(why or loopback_up())  # 127.0.0.1 of its own, nothing beyond
    problems[:] = [p for p in problems if p]


def _watch_opens(allowed: list[str], log: Any) -> None:
    """Record each open of a path outside ``allowed`` (before Landlock refuses it)."""
    roots = tuple(os.path.join(a, "") for a in allowed)

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes)):
            return
        path = os.path.realpath(os.fsdecode(args[0]))
        if path not in allowed and not path.startswith(roots):
            log.write(path + "\n")
            log.flush()

    sys.addaudithook(hook)


def _save(out: Path, model: Any, config: Any, name: str = "weights.pt") -> None:
    import torch

    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"config": dataclasses.asdict(config), "state": state}, out / name)


def _build(namespace: dict, seed: int, max_params: int) -> tuple[Any, Any]:
    """The recipe's configuration, checked, and the course's model built from it."""
    import torch

    from coursepkg import DecoderOnlyLM, TransformerConfig

    config = namespace["config"](seed)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config(seed) must return a TransformerConfig, not {type(config)}")
    if config.vocab_size != VOCAB_SIZE:
        raise ValueError(
            f"the capstone models bytes: vocab_size must be 256, not {config.vocab_size}"
        )
    torch.manual_seed(seed)
    model = DecoderOnlyLM(config)
    count = sum(p.numel() for p in model.parameters())
    if count > max_params:
        raise _TooLarge(f"{count:,} parameters, the limit is {max_params:,}")
    return config, model


class _TooLarge(Exception):
    """The recipe's model has more parameters than the rules allow."""


def _run(options: dict[str, Any], out: Path) -> dict[str, Any]:
    recipe = os.path.realpath(options["recipe"])
    seed, budget = int(options["seed"]), float(options["budget_s"])
    data = (Path(options["inputs"]) / "train.bin").read_bytes()
    namespace: dict[str, Any] = {"__name__": "recipe", "__file__": recipe}
    source = Path(recipe).read_text(encoding="utf-8")
    try:
        exec(compile(source, recipe, "exec"), namespace)
        for name in ("config", "train"):
            if not callable(namespace.get(name)):
                raise NameError(f"the recipe must define a function {name}()")
        config, model = _build(namespace, seed, int(options["max_params"]))
    except _TooLarge as err:
        return {"outcome": "artifact_too_large", "detail": str(err)}
    except BaseException as err:  # noqa: BLE001 - the recipe's, reported
        return {"outcome": outcome_of(err), "detail": student_frames(err, recipe)}
    started = time.monotonic()

    def stop_at_budget() -> None:
        _save(out, model, config)
        (out / "status.json").write_text(
            json.dumps({"outcome": "over_budget", "train_s": time.monotonic() - started})
        )
        os._exit(EXIT_OVER_BUDGET)

    watch = threading.Timer(budget, stop_at_budget)
    watch.daemon = True
    watch.start()
    try:
        model.train()
        namespace["train"](model, data, budget, seed)
    except BaseException as err:  # noqa: BLE001 - the recipe's, reported
        watch.cancel()
        return {"outcome": outcome_of(err), "detail": student_frames(err, recipe)}
    watch.cancel()
    elapsed = time.monotonic() - started
    _save(out, model, config)
    return {"outcome": "trained", "train_s": elapsed}


def main(argv: list[str]) -> None:
    """Confine, run the recipe, report (argv: ``--name=value`` options, see the module)."""
    options = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    options["protect"] = [p for p in options.get("protect", "").split(os.pathsep) if p]
    out, inputs = Path(options["out"]).resolve(), Path(options["inputs"]).resolve()
    problems: list[str] = []
    _confine(options, problems)
    import torch

    import coursepkg  # noqa: F401 - imported before Landlock applies

    torch.set_num_threads(int(options.get("threads", 1)))
    log = open(out / "opened_outside.log", "w", encoding="utf-8")  # noqa: SIM115
    status_file = open(out / "status.json", "w", encoding="utf-8")  # noqa: SIM115
    protected = [Path(p) for p in options["protect"]]
    reads = granted_reads(readable_roots(Path(os.path.realpath(options["course"]))), protected)
    reads += [str(inputs), options["recipe"], *_DEVICES]
    scratch = out / "scratch"
    scratch.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # found again, under TMPDIR: the only place the recipe may write
    for path in ("/proc", "/sys"):  # the recipe may read these without being logged
        reads.append(path)
    _watch_opens([*reads, str(out)], log)
    abi = restrict_files(reads, [str(out), *_DEVICES])
    seccomp, why = filter_syscalls()
    if why:
        problems.append(why)
    status = _run(options, out)
    status.update(landlock=abi, seccomp=seccomp, problems=problems)
    status_file.write(json.dumps(status))
    status_file.close()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
