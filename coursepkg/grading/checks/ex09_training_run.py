"""Checks of ex09_training_run: a Transformer the student assembles from their own pieces, trains
in the notebook within a CPU budget, and decodes greedily; graded on a held-out set of dates.

The notebook's locked setup cell calls
:func:`~coursepkg.grading.framework.watch.watch_training`, which installs (once per kernel,
for good: audit hooks cannot be removed) an audit hook and a global optimiser-step hook. From
then on they record what grading needs to know about how the model came to be:

* every optimiser step (``torch.optim``), its learning rate, and a copy of the parameters it
  updated, so the graded model's weights must be exactly the ones the last step left;
* every file opened for reading outside Python's and the installed packages' own files (a
  checkpoint, the course's recipe cache, the instructors' notebook), every new process and
  every network connection;
* while the grader runs the student's decoder on the held-out set: any look at call frames
  (``sys._getframe``, ``inspect``, a traceback's frames) or at the garbage collector's objects.

:func:`check_training_run` then grades the trained model: provenance (all of the above), the
CPU budget (the kernel's own CPU time, ``resource.getrusage``), and exact-match accuracy of the
student's ``greedy_decode`` on dates generated from a seed that only the hidden test holds. When
the model falls short it diagnoses the classic training mistakes from the model's behaviour
and the training record (``BUGS``, in :mod:`.ex09_training_run_mistakes`).
:func:`check_accuracy_band` awards the higher bands from the same run; :func:`check_own_pieces`
finds reference stand-ins.

What this cannot catch (all need deliberate work against the grader, not an everyday shortcut):
weights smuggled in as text inside the notebook itself; files read by C code that bypasses
Python's ``open`` (``torch.from_file``, a C extension); a student who reads the hidden cell's
text from IPython's in-memory history during grading, or who rewrites this module's objects
in the kernel before the hidden tests run (every in-kernel test shares that weakness).
"""

from __future__ import annotations

import copy
import hashlib
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ...data.batching import make_seq2seq_batch
from ...data.dates import date_vocabs, encode_batch, make_date_pairs
from ...data.vocab import BOS_ID, EOS_ID
from ..framework import (
    CheckFailure,
    CheckReport,
    CheckResult,
    NotImplementedYet,
    call_student,
    checking,
    run_check,
)
from ..framework.watch import (
    CPU_BUDGET_SECONDS,
    TrainingWatch,
    current_watch,
    kernel_cpu_seconds,
    watch_training,
)
from .ex09_training_run_mistakes import named

__all__ = [
    "BANDS",
    "TrainingRun",
    "check_accuracy_band",
    "check_own_pieces",
    "check_training_run",
    # Kept importable from here: the locked setup cell of ex09 as released before they moved to
    # framework.watch imports them from this module, and a student's notebook (or a gradebook
    # holding that cell) must still run (tests/test_layout.py, KEPT_FOR_OLD_RELEASES).
    "CPU_BUDGET_SECONDS",
    "kernel_cpu_seconds",
    "watch_training",
]

#: Exact-match accuracies the hidden tests award points for.
BANDS = (0.90, 0.97, 0.99)
#: Fewest optimiser steps that count as training the model in the notebook.
MIN_STEPS = 50
VISIBLE_SEED = 20260901  # the visible check's dates (the hidden test passes its own seed)
ISO_LENGTH = 10


def _texts(ids: Tensor, tgt_itos: list[str]) -> list[str]:
    """Decoded ISO strings: the tokens after BOS up to the first special token."""
    out = []
    for row in ids.tolist():
        chars = []
        for token in row[1:]:
            if token < 4:  # PAD, BOS, EOS, UNK end the answer
                break
            chars.append(tgt_itos[token] if token < len(tgt_itos) else "?")
        out.append("".join(chars))
    return out


# ---------------------------------------------------------------------------------------------
# Diagnosing the known mistakes from the trained model and the training record
# ---------------------------------------------------------------------------------------------


def _probe_batch(n: int = 48):
    src_vocab, tgt_vocab = date_vocabs()
    return encode_batch(make_date_pairs(n, seed=VISIBLE_SEED + 1), src_vocab, tgt_vocab)


def _logits(model: nn.Module, batch: Any, tgt_in: Tensor) -> Tensor:
    with torch.no_grad():
        args = (batch.src, tgt_in, batch.src_mask, batch.tgt_mask)
        logits = call_student(model, *args, item="DateTransformer.forward")  # (B, T, V)
    if not isinstance(logits, Tensor) or logits.shape[:2] != tgt_in.shape:
        raise CheckFailure(
            "DateTransformer.forward(src, tgt_in, src_mask, tgt_mask) must return logits of "
            f"shape (B, T, V) = ({tgt_in.shape[0]}, {tgt_in.shape[1]}, V), got "
            f"{getattr(logits, 'shape', type(logits).__name__)}"
        )
    return logits


def _diagnose_model(model: nn.Module) -> list[str]:
    """Mistakes visible in the trained model's teacher-forced behaviour (in eval mode)."""
    found = []
    batch = _probe_batch()
    was_training = model.training
    model.eval()
    try:
        logits = _logits(model, batch, batch.tgt_in)
        cut = 5
        changed = batch.tgt_in.clone()
        changed[:, cut:] = torch.randint(4, 15, changed[:, cut:].shape)
        shift = (_logits(model, batch, changed)[:, :cut] - logits[:, :cut]).abs().max().item()
        if shift > 1e-4:
            found.append(
                named(
                    "ex09.no_causal_mask",
                    f"changing the target tokens from position {cut} on moved the logits at "
                    f"positions 0-{cut - 1} by up to {shift:.3g}",
                )
            )
        predicted = logits.argmax(-1)  # (B, T)
        real = batch.tgt_mask[:, 1:]
        copies = (predicted[:, 1:] == batch.tgt_in[:, 1:])[real].float().mean().item()
        if copies > 0.6:
            found.append(
                named(
                    "ex09.target_not_shifted",
                    f"given the target, the model predicts its own input token at {copies:.0%} "
                    "of the positions",
                )
            )
    finally:
        model.train(was_training)
    return found


def _diagnose_loss(loss_fn: Callable[..., Any], model: nn.Module) -> list[str]:
    """Mistakes in the student's ``sequence_loss``, found by calling it on a copy of the model
    with a batch whose targets have padding."""
    found = []
    pairs = make_date_pairs(16, seed=VISIBLE_SEED + 2)
    src_vocab, tgt_vocab = date_vocabs()
    # Targets of different lengths, so tgt_out has padding.
    targets = [tgt_vocab.encode(iso)[: 4 + i % 7] for i, (_, iso) in enumerate(pairs)]
    batch = make_seq2seq_batch([src_vocab.encode(h) for h, _ in pairs], targets)
    probe = copy.deepcopy(model).eval()
    seen: list[tuple] = []
    noise = [None]

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(tuple(args) + tuple(kwargs.values()))

    def post(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if noise[0] is None or not isinstance(output, Tensor) or output.dim() != 3:
            return output
        pad = ~batch.tgt_mask[:, : output.size(1)]  # (B, T)
        return output + noise[0][:, : output.size(1)] * pad[..., None]

    probe.register_forward_pre_hook(pre, with_kwargs=True)
    probe.register_forward_hook(post, with_kwargs=True)
    loss = call_student(loss_fn, probe, batch, item="sequence_loss")
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise CheckFailure(f"sequence_loss must return a scalar tensor, got {type(loss).__name__}")
    fed = [a for call in seen for a in call if isinstance(a, Tensor)]
    gets_tgt_in = any(a.shape == batch.tgt_in.shape and torch.equal(a, batch.tgt_in) for a in fed)
    gets_tgt_out = any(
        a.shape == batch.tgt_out.shape and torch.equal(a, batch.tgt_out) for a in fed
    )
    if gets_tgt_out and not gets_tgt_in:
        found.append(named("ex09.target_not_shifted", "sequence_loss gave the model batch.tgt_out"))
    noise[0] = 50 * torch.randn(batch.tgt_in.shape[0], batch.tgt_in.shape[1], len(tgt_vocab))
    noisy = call_student(loss_fn, probe, batch, item="sequence_loss")
    before, after = float(loss.detach()), float(torch.as_tensor(noisy).detach())
    if abs(after - before) > 1e-4 * max(1.0, before):
        found.append(
            named("ex09.padding_in_loss", f"the loss went from {before:.4f} to {after:.4f}")
        )
    return found


def _diagnose_schedule(watch: TrainingWatch) -> list[str]:
    if watch.steps >= 2 and len(set(watch.lrs)) == 1:
        return [
            named(
                "ex09.schedule_not_stepped",
                f"it was {watch.lrs[0]:g} at all {watch.steps} optimiser steps",
            )
        ]
    return []


# ---------------------------------------------------------------------------------------------
# Grading the run
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)  # compared (and hashed) by identity: _GRADED holds the real ones
class TrainingRun:
    """What :func:`check_training_run` measured; :func:`check_accuracy_band` reads it.

    Attributes:
        accuracy: exact-match accuracy of greedy decoding on the held-out dates.
        n: how many held-out dates.
        cpu_seconds: the kernel's CPU time when grading started.
        steps: optimiser steps the model was trained with.
        diagnoses: the known mistakes recognised, as sentences.
        wrong: a few ``(human date, decoded)`` pairs the model got wrong.
    """

    accuracy: float
    n: int
    cpu_seconds: float
    steps: int
    diagnoses: list[str] = field(default_factory=list)
    wrong: list[tuple[str, str]] = field(default_factory=list)
    result: CheckResult | None = field(default=None, repr=False)

    def _ipython_display_(self) -> None:
        # A test cell's value is shown as the check's green box, not returned as a value
        # (nbgrader would read a returned value as partial credit).
        if self.result is not None:
            self.result._ipython_display_()


_GRADED: weakref.WeakSet = weakref.WeakSet()  # the runs this module made (not look-alikes)


def _provenance(model: nn.Module, watch: TrainingWatch) -> None:
    """Fail unless the model's weights are exactly what the notebook's own training made."""
    if watch.violations:
        raise CheckFailure(
            "The model must be trained in this notebook, from scratch, within the budget; "
            "after the setup cell this kernel " + "; ".join(watch.violations[:5]) + ". A run "
            "that does so earns no points (train here, and read no files)."
        )
    if watch.steps < MIN_STEPS:
        raise CheckFailure(
            f"Only {watch.steps} optimiser steps were taken after the setup cell (at least "
            f"{MIN_STEPS} needed): train the model in this notebook with a torch.optim optimiser."
        )
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise CheckFailure("The model has no trainable parameters.")
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        after = watch.weights_after_last_step(p)
        if after is None:
            raise CheckFailure(
                f"The parameter {name} was never updated by an optimiser step in this notebook: "
                "every weight must come from training here."
            )
        if after.shape != p.shape or not torch.equal(after, p.detach()):
            raise CheckFailure(
                f"The parameter {name} changed after the last optimiser step that updated it "
                "(weights loaded or edited after training earn nothing): train, then grade."
            )


def _budget(cpu: float, budget: float) -> None:
    if cpu > budget:
        raise CheckFailure(
            f"The kernel had used {cpu:.0f} CPU seconds when grading started; the budget is "
            f"{budget:.0f} (all of the notebook: imports, training, checks). Train for fewer "
            "steps or a smaller model."
        )


def _evaluate(
    model: nn.Module, decode: Callable[..., Any], seed: int, n: int, watch: TrainingWatch
) -> tuple[list[str], list[bool], list[str], bool]:
    """Decode the held-out dates with the student's ``greedy_decode``; keep only hashes of the
    answers while student code runs."""
    src_vocab, tgt_vocab = date_vocabs()
    pairs = make_date_pairs(n, seed=seed)
    humans = [h for h, _ in pairs]
    expected = [hashlib.sha256(iso.encode()).digest() for _, iso in pairs]
    del pairs
    training_seen: list[bool] = []
    # encode/decode are not forward: watch every submodule the decoding calls.
    handles = [
        m.register_forward_pre_hook(lambda m, a: training_seen.append(m.training))
        for m in model.modules()
    ]
    decoded: list[str] = []
    first_twice: tuple[str, ...] = ()
    try:
        for start in range(0, n, 250):
            chunk = humans[start : start + 250]
            batch = encode_batch([(h, "0000-00-00") for h in chunk], src_vocab, tgt_vocab)
            args = (model, batch.src, batch.src_mask, ISO_LENGTH + 1, BOS_ID, EOS_ID)
            watch._grading[0] = True
            try:
                out = call_student(decode, *args, item="greedy_decode")
                if start == 0:
                    again = call_student(decode, *args, item="greedy_decode")
            finally:
                watch._grading[0] = False
            if not isinstance(out, Tensor) or out.dim() != 2 or out.size(0) != len(chunk):
                raise CheckFailure(
                    f"greedy_decode must return a (B, 1 + T) tensor of ids with B = "
                    f"{len(chunk)}, got {getattr(out, 'shape', type(out).__name__)}"
                )
            decoded += _texts(out, tgt_vocab.itos)
            if start == 0 and isinstance(again, Tensor):
                first_twice = tuple(_texts(again, tgt_vocab.itos))
    finally:
        for handle in handles:
            handle.remove()
    hashed = (hashlib.sha256(d.encode()).digest() for d in decoded)
    right = [h == e for h, e in zip(hashed, expected, strict=True)]
    dropout_on = any(isinstance(m, nn.Dropout) and m.p > 0 and m.training for m in model.modules())
    noisy = any(training_seen) and (dropout_on or first_twice != tuple(decoded[: len(first_twice)]))
    return decoded, right, humans, noisy


def _diagnoses(
    watch: TrainingWatch, model: nn.Module, sequence_loss: Callable[..., Any] | None, noisy: bool
) -> list[str]:
    """The known mistakes the training record, the model and the loss show."""
    diagnoses = _diagnose_schedule(watch) + _diagnose_model(model)
    if sequence_loss is not None:
        diagnoses += _diagnose_loss(sequence_loss, model)
    if noisy:
        diagnoses.append(
            named(
                "ex09.dropout_at_evaluation",
                "decoding the same dates twice gave different answers, in training mode",
            )
        )
    return diagnoses


def check_training_run(
    model: nn.Module,
    greedy_decode: Callable[..., Any],
    sequence_loss: Callable[..., Any] | None = None,
    *,
    seed: int | None = None,
    n: int = 1000,
    min_accuracy: float = BANDS[0],
    budget: float = CPU_BUDGET_SECONDS,
    points: float | None = None,
) -> TrainingRun:
    """Grade the notebook's trained model on held-out dates.

    Fails (with what the model got wrong and the known mistakes it shows) unless the model was
    trained in this notebook after the setup cell, the kernel's CPU time is within ``budget``,
    and greedy decoding gets at least ``min_accuracy`` of the dates exactly right.

    Args:
        model: the trained ``DateTransformer``, as training left it (None: not built yet).
        greedy_decode: the student's ``greedy_decode(model, src, src_mask, max_len, bos_id,
            eos_id) -> (B, 1 + T)``.
        sequence_loss: the student's ``sequence_loss(model, batch)``, examined for the known
            mistakes when given.
        seed: the held-out dates' seed (the hidden test's own; default the visible one).
        n: how many held-out dates.
        min_accuracy: the exact-match accuracy needed to pass.
        budget: CPU seconds the kernel may have used when grading starts.
        points: shown in the result.

    Returns:
        A :class:`TrainingRun` (it displays as a passed check).
    """
    name = "check_training_run"
    cpu = kernel_cpu_seconds()  # before the grader's own work

    def body() -> CheckResult:
        watch = current_watch()
        if watch is None:
            raise CheckFailure(
                "The setup cell did not run (it starts watching the training): run the notebook "
                "from the top."
            )
        if model is None:
            raise NotImplementedYet("model", "the training cell did not build and train it")
        if not isinstance(model, nn.Module):
            raise CheckFailure(f"model must be your trained nn.Module, got {type(model).__name__}")
        _provenance(model, watch)
        _budget(cpu, budget)
        decoded, right, humans, noisy = _evaluate(
            model, greedy_decode, VISIBLE_SEED if seed is None else seed, n, watch
        )
        _provenance(model, watch)  # decoding must not have changed (or swapped) the weights
        accuracy = sum(right) / n
        diagnoses = _diagnoses(watch, model, sequence_loss, noisy)
        wrong = [(h, d) for h, d, ok in zip(humans, decoded, right, strict=True) if not ok][:3]
        run = TrainingRun(accuracy, n, cpu, watch.steps, diagnoses, wrong)
        _GRADED.add(run)
        if accuracy < min_accuracy:
            lines = [
                f"Greedy decoding got {accuracy:.1%} of {n} held-out dates exactly right; "
                f"{min_accuracy:.0%} needed."
            ]
            lines += [f"  {h!r} -> {d!r}" for h, d in wrong]
            lines += diagnoses or ["No known mistake recognised: train longer, or tune the run."]
            raise CheckFailure("\n".join(lines))
        messages = [
            f"trained here ({watch.steps} optimiser steps, {cpu:.0f} of {budget:.0f} CPU s)",
            f"{accuracy:.1%} of {n} held-out dates exactly right",
        ] + diagnoses
        run.result = CheckResult(name=name, passed=True, points=points, messages=messages)
        return run

    with checking(name):
        return body()


def check_accuracy_band(
    run: Any, min_accuracy: float, *, points: float | None = None
) -> CheckResult:
    """Pass when the run graded by :func:`check_training_run` reached ``min_accuracy``.

    Args:
        run: what :func:`check_training_run` returned in this kernel (anything else fails).
        min_accuracy: the band's exact-match accuracy.
        points: shown in the result.
    """
    name = "check_accuracy_band"

    def body() -> CheckResult:
        if not isinstance(run, TrainingRun) or run not in _GRADED:
            raise CheckFailure(
                "The training run was not graded (see the first hidden test's message): no "
                "accuracy band can be awarded."
            )
        if run.accuracy < min_accuracy:
            raise CheckFailure(
                f"{run.accuracy:.1%} of the held-out dates exactly right; this band needs "
                f"{min_accuracy:.0%}.\n" + "\n".join(run.diagnoses)
            )
        return CheckResult(
            name=name,
            passed=True,
            points=points,
            messages=[f"{run.accuracy:.1%} >= {min_accuracy:.0%} of {run.n} held-out dates"],
        )

    with checking(name):
        return body()


# ---------------------------------------------------------------------------------------------
# check_own_pieces: the model and the notebook's code use the student's own pieces, not the
# course's reference or PyTorch's ready-made layers (allowed, but they cost this check's points;
# the accuracy points stay the student's).
# ---------------------------------------------------------------------------------------------

# What the earlier assignments wrote by hand; using one of these instead costs the points.
_TORCH_STAND_INS = (
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.MultiheadAttention,
    nn.LayerNorm,
)
_TORCH_FUNCTIONS = ("scaled_dot_product_attention", "multi_head_attention_forward", "layer_norm")
_ALLOWED_PACKAGES = ("coursepkg.data", "coursepkg.grading")


def _reference_name(obj: Any) -> str | None:
    """``module.name`` when ``obj`` is a piece of the course's reference implementation."""
    module = obj.__name__ if isinstance(obj, type(os)) else getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return None
    if module == "coursepkg" or module.startswith("coursepkg."):
        if not module.startswith(_ALLOWED_PACKAGES):
            return module if isinstance(obj, type(os)) else f"{module}.{obj.__qualname__}"
    return None


def _code_names(obj: Any) -> set[str]:
    """Global names the functions of ``obj`` (a function or a class's methods) refer to."""
    functions = [obj] if callable(obj) and not isinstance(obj, type) else []
    if isinstance(obj, type):
        functions = [v for v in vars(obj).values() if callable(v)]
    names: set[str] = set()
    for fn in functions:
        code = getattr(fn, "__code__", None)
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return names


def check_own_pieces(
    model: nn.Module, namespace: Mapping[str, Any], *, points: float | None = None
) -> CheckResult:
    """Pass when the model and the notebook's code use the student's own pieces only.

    A piece of ``coursepkg`` (other than its data and grading) or PyTorch's ready-made
    Transformer layers, attention or layer norm, whether in the model or bound to a name in
    the notebook, is a stand-in: allowed, but it costs this check's points.

    Args:
        model: the trained model.
        namespace: the notebook's globals (``globals()``).
        points: shown in the result.
    """
    return run_check("check_own_pieces", points, _own_pieces, model, namespace)


def _own_pieces(report: CheckReport, model: nn.Module, namespace: Mapping[str, Any]) -> None:
    if model is None:
        raise NotImplementedYet("model", "the training cell did not build and train it")
    stand_ins: set[str] = set()
    for module in model.modules():
        cls = type(module)
        ref = _reference_name(cls)
        if ref:
            stand_ins.add(ref)
        elif issubclass(cls, _TORCH_STAND_INS):
            stand_ins.add(f"torch.nn.{cls.__name__}")
    for key, value in namespace.items():
        if key.startswith("_"):
            continue
        ref = _reference_name(value)
        if ref:
            stand_ins.add(ref)
        elif callable(value) and getattr(value, "__module__", None) in ("__main__", None):
            used = _code_names(value) & set(_TORCH_FUNCTIONS)
            stand_ins.update(f"torch.nn.functional.{u} (in {key})" for u in sorted(used))
    if stand_ins:
        raise CheckFailure(
            "Reference stand-ins in use (they cost this test's points; the accuracy points "
            "stay yours): " + ", ".join(sorted(stand_ins)) + "."
        )
    report.ok("the model is built from your pieces")
