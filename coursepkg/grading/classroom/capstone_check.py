"""The capstone's self-check: a student's recipe run in seconds through the grader itself.

:func:`check_capstone_recipe` is what the capstone notebook's test cells call. It hands the
notebook's own ``config`` and ``train`` (pickled by value with ``cloudpickle``, the helpers and
constants they use with them) to :func:`~.capstone.grade_recipe`: the same confined process,
limits, budget watch, scoring and verdicts as the class's grading, on a small budget and a
slice of the corpus. A verdict other than ``capstone.ok`` fails the check with the verdict's id
and meaning, so a recipe that would be marked over budget, too large or nondeterministic is
told so before it is handed in.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..framework.results import CheckFailure, CheckResult, NotImplementedYet
from .capstone import VERDICTS, CapstoneRules, corpus_splits, grade_recipe

__all__ = ["SELF_CHECK_RULES", "check_capstone_recipe", "recipe_source"]

#: The self-check's limits: the class's defaults (memory, parameters, artifact, processes) on a
#: budget of seconds, one thread (a loaded laptop), one seed.
SELF_CHECK_RULES = CapstoneRules(budget_s=20.0, threads=1, seeds=(0,), repeat_first_seed=False)
#: What the self-check trains on and scores (bytes of each split).
TRAIN_BYTES = 200_000
SCORE_BYTES = 16_384
#: Bits per byte of guessing uniformly among 256 bytes: a trained model must do better.
UNIFORM_BPB = math.log2(256)


def recipe_source(config: Callable, train: Callable) -> str:
    """A recipe file's text that defines ``config`` and ``train`` as the caller's functions.

    The functions are pickled by value (``cloudpickle``), with the globals they use, so a
    notebook's functions and their helpers reach the confined run without the notebook.

    Args:
        config: the recipe's ``config(seed)``.
        train: the recipe's ``train(model, data, budget_s, seed)``.

    Returns:
        Python source for :func:`~.capstone.grade_recipe`.
    """
    import cloudpickle

    payload = cloudpickle.dumps((config, train))
    return f"import cloudpickle\n\nconfig, train = cloudpickle.loads({payload!r})\n"


def _call_config(config: Callable, seed: int) -> None:
    """Call ``config`` here first: an untouched stub is "not implemented yet", fast."""
    try:
        config(seed)
    except NotImplementedError as err:
        raise NotImplementedYet("config", check="check_capstone_recipe") from err


def check_capstone_recipe(
    config: Callable,
    train: Callable,
    *,
    seed: int = 0,
    thorough: bool = False,
    budget_s: float | None = None,
) -> CheckResult:
    """Run the recipe through the capstone's grader on a small budget and fail on any verdict
    but ``capstone.ok`` (naming it), or on a model no better than uniform guessing.

    Args:
        config: the recipe's ``config(seed)``.
        train: the recipe's ``train(model, data, budget_s, seed)``.
        seed: the seed handed to both.
        thorough: run the seed twice, as the grader does, to catch nondeterminism.
        budget_s: the training budget (default :data:`SELF_CHECK_RULES`'s).

    Returns:
        The passed :class:`~coursepkg.grading.framework.results.CheckResult`, saying the
        held-out bits per byte of the (first) run (a notebook shows it; nbgrader would read a
        returned number as partial credit).

    Raises:
        CheckFailure: the verdict's id, meaning and detail, or "not implemented yet".
    """
    _call_config(config, seed)
    rules = dataclasses.replace(
        SELF_CHECK_RULES,
        seeds=(seed,),
        repeat_first_seed=thorough,
        budget_s=budget_s or SELF_CHECK_RULES.budget_s,
    )
    train_bytes, held_out, protected = corpus_splits()
    with tempfile.TemporaryDirectory(prefix="capstone-check-") as folder:
        recipe = Path(folder) / "recipe.py"
        recipe.write_text(recipe_source(config, train), encoding="utf-8")
        result = grade_recipe(
            recipe,
            train_bytes[:TRAIN_BYTES],
            held_out,
            rules,
            Path(folder) / "runs",
            protected,
            Path.cwd(),
            SCORE_BYTES,
        )
    if result.verdict != "capstone.ok":
        if "NotImplementedError" in result.detail:
            raise NotImplementedYet("train", check="check_capstone_recipe")
        raise CheckFailure(
            f"{result.verdict}: {VERDICTS[result.verdict]} (a {rules.budget_s:g} s budget).\n"
            + result.detail,
            check="check_capstone_recipe",
        )
    bpb = result.scores[0]
    if not bpb < UNIFORM_BPB:
        raise CheckFailure(
            f"after training, the model scores {bpb:.3f} bits per byte on held-out text, no "
            f"better than guessing uniformly ({UNIFORM_BPB:g}): does train() update the model?",
            check="check_capstone_recipe",
        )
    runs = f"seed {seed}, run twice" if thorough else f"seed {seed}"
    return CheckResult(
        "check_capstone_recipe",
        True,
        messages=[
            f"capstone.ok on a {rules.budget_s:g} s budget ({runs})",
            f"{bpb:.3f} held-out bits per byte (uniform guessing: {UNIFORM_BPB:g})",
        ],
    )
