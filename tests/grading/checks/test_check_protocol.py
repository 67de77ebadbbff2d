"""The protocol every check keeps, written once over the registry's checks (each assignment's
own test file holds what is particular to it): each catalogued mistake, handed in as a
student's answer, fails the check that lists it, which names the mistake by its id, says the
mistake's sentence (its description and advice; a mistake named by a forbidden call: its id)
and signs the failure with its own name; and the untouched stub of what each check grades
says, in one line, that it is not implemented yet."""

from __future__ import annotations

import inspect
from importlib import import_module

import grading_impls_decoder
import pytest
import torch
from student_code import named_text, student_impl

from coursepkg.grading import CheckFailure, NotImplementedYet
from coursepkg.grading.framework import diagnosis_message
from coursepkg.grading.framework.registry import CheckEntry, registered_checks
from coursepkg.stubs import ASSIGNMENTS

MISTAKES = [(entry, bug) for entry in registered_checks() for bug in entry.bugs]

# A layer's wiring mistake is a wrong ``forward`` function (ex05's catalogue): it is handed in
# as a correct layer of another style whose forward is the wrong one.
WIRED_INTO = {"DecoderLayer": grading_impls_decoder.DecoderLayerEinsum}


def _answer(entry: CheckEntry, bug) -> object:
    # What a student with this mistake hands in.
    if inspect.isfunction(bug.impl) and entry.implements in WIRED_INTO and not bug.calls:
        return type(
            f"Wired_{bug.impl.__name__}", (WIRED_INTO[entry.implements],), {"forward": bug.impl}
        )
    return student_impl(bug)


@pytest.fixture(autouse=True)
def _one_thread():
    # The checks run hundreds of tiny ops; on a busy machine a second thread only adds
    # synchronisation (measured: ~0.15 s per check with one thread, ~1 s with two).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_assignment_s_mistakes_are_here():
    # ex09's mistakes cannot be rerun (a training run): its check gathers its own evidence.
    # ex19 (the capstone) has no pieces to diagnose: its grader names a verdict per recipe.
    assignments = {entry.assignment for entry, _ in MISTAKES}
    assert assignments == set(ASSIGNMENTS) - {"ex09_training_run", "ex19_capstone"}


@pytest.mark.parametrize(("entry", "bug"), MISTAKES, ids=[bug.id for _, bug in MISTAKES])
def test_every_catalogued_mistake_is_caught_and_named(entry, bug):
    with pytest.raises(CheckFailure) as info:
        entry.check(_answer(entry, bug))
    assert info.value.diagnosis == bug.id, str(info.value)
    assert info.value.check == entry.name
    assert named_text(bug, diagnosis_message(bug)) in str(info.value)  # its advice included


STUBS = [
    (entry, getattr(import_module(f"coursepkg.stubs.{entry.assignment}"), entry.implements))
    for entry in registered_checks()
]


@pytest.mark.parametrize(("entry", "stub"), STUBS, ids=[entry.name for entry, _ in STUBS])
def test_the_untouched_stub_is_not_implemented_yet(entry, stub):
    with pytest.raises(NotImplementedYet) as info:
        entry.check(stub)
    said = str(info.value)
    assert f"{entry.implements} is not implemented yet" in said, said
    assert "\n" not in said and "Traceback" not in said
