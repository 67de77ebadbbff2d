"""The checks' framework (``coursepkg/grading/framework/``) and the layout of the checks: the
registry is the one list of public checks (the table in ``coursepkg.grading``'s docstring and
:func:`catalogue` follow it), the tensor guard and the locator's comparison say what they
promise, forbidden calls have their own failure type, and the grading modules stay small, import
no private name of another module and form no import cycle."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import coursepkg.grading as grading
from coursepkg import stubs
from coursepkg.grading.framework import (
    CheckFailure,
    ForbiddenCall,
    expect_tensor,
    forbidden_calls,
    is_close,
    registered_checks,
)
from coursepkg.grading.framework.layout import LAYOUT_MISTAKES

ROOT = Path(__file__).resolve().parents[3]
GRADING = ROOT / "coursepkg" / "grading"
#: The part of grading/ this layout covers (classroom, sandbox, fork server and notebook
#: runner are the class grader's, with their own tests).
CHECK_FILES = sorted([GRADING / "__init__.py", *(GRADING / "framework").glob("*.py")]) + sorted(
    (GRADING / "checks").rglob("*.py")  # a catalogue's concept modules too (checks/ex13_mistakes)
)


def test_every_public_check_is_registered_once_with_an_existing_assignment():
    entries = registered_checks()
    names = [e.name for e in entries]
    assert len(names) == len(set(names)) == 56
    exported = {n for n in grading.__all__ if n.startswith("check_")}
    # ex09 grades a whole training run (model, decoder, loss), not one implementation, so its
    # check has its own signature and is exported without joining the registry.
    assert exported == set(names) | {"check_training_run"}
    assignments = {p.stem for p in Path(stubs.__file__).parent.glob("ex*.py")}
    for entry in entries:
        assert getattr(grading, entry.name) is entry.check
        assert entry.assignment in assignments
        assert entry.check.__module__ == f"coursepkg.grading.checks.{entry.assignment}"
        assert list(inspect.signature(entry.check).parameters) == [
            "impl",
            "thorough",
            "seed",
            "points",
        ]
        assert "Args:" in entry.check.__doc__ and "Raises:" in entry.check.__doc__


def test_the_docstring_table_lists_the_registry():
    rows = re.findall(r"^(check_\S+)\s+(.+?)\s{2,}(ex\d\d_\w+)\s*$", grading.__doc__, re.M)
    entries = registered_checks()
    assert len(rows) == len(entries)
    for (name, _, assignment), entry in zip(rows, entries, strict=True):
        assert entry.name.startswith(name.rstrip("."))  # long names are cut with "..."
        assert assignment == entry.assignment


def test_catalogue_is_every_registered_mistake_with_unique_ids():
    bugs = grading.catalogue()
    registered = [bug for entry in registered_checks() for bug in entry.bugs]
    assert bugs == registered + list(LAYOUT_MISTAKES)
    ids = [bug.id for bug in bugs]
    assert len(ids) == len(set(ids)) and len(ids) > 80


def test_the_tensor_guard_names_what_came_back_and_the_shapes():
    t = torch.zeros(2, 3)
    assert expect_tensor(t, "x") is t and expect_tensor(t, "x", (2, 3)) is t
    with pytest.raises(CheckFailure, match="your code returned a tuple"):
        expect_tensor((t, t), "the output")
    with pytest.raises(CheckFailure, match=r"has shape \(2, 3\), expected \(3, 2\)"):
        expect_tensor(t, "the output", (3, 2))


def test_is_close_is_false_for_anything_but_a_near_tensor_of_the_same_shape():
    t = torch.randn(2, 3)
    assert is_close(t + 1e-7, t)
    assert not is_close(t + 1e-2, t)
    assert not is_close(t[:1], t)
    assert not is_close([0.0], t)
    assert is_close(t.double(), t)


def test_a_forbidden_call_has_its_own_failure_type():
    q = torch.randn(1, 2, 4)
    with pytest.raises(ForbiddenCall, match="scaled_dot_product_attention"):
        with forbidden_calls("x"):
            exec("F.scaled_dot_product_attention(q, q, q)", {"F": F, "q": q})  # noqa: S102
    assert issubclass(ForbiddenCall, CheckFailure)


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


@pytest.mark.parametrize("path", CHECK_FILES, ids=lambda p: p.name)
def test_grading_files_are_small_and_their_functions_short(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    for fn in _functions(ast.parse(text)):
        assert fn.end_lineno - fn.lineno + 1 <= 80, fn.name


@pytest.mark.parametrize("path", CHECK_FILES, ids=lambda p: p.name)
def test_no_private_name_is_imported_from_another_module(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.level or "coursepkg" in (node.module or "")):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} imports {private} from {node.module}"


def test_every_assignment_has_its_checks_and_its_catalogue():
    """checks/exNN_x.py holds the configurations and public checks, checks/exNN_x_mistakes.py
    the catalogue (which may gather it from a folder of concept modules, checks/ex13_mistakes/),
    and checks/ nothing else; ``BUGS`` in the catalogue is every mistake the assignment's checks
    name."""
    registered: dict[str, set[str]] = {}
    for entry in registered_checks():
        registered.setdefault(entry.assignment, set()).update(b.id for b in entry.bugs)
    assignments = sorted(p.stem for p in Path(stubs.__file__).parent.glob("ex*.py"))
    assert len(assignments) >= 10
    # the capstone is graded by re-running the recipe (grading/classroom/capstone.py), not by checks
    assert "ex19_capstone" in assignments
    assignments.remove("ex19_capstone")
    files = {p.name for p in (GRADING / "checks").glob("*.py")}
    expected = {f"{aid}{tail}.py" for aid in assignments for tail in ("", "_mistakes")}
    assert files == expected | {"__init__.py"}, sorted(files ^ (expected | {"__init__.py"}))
    for aid in assignments:
        assert (GRADING / "checks" / f"{aid}.py").is_file(), aid
        mistakes = importlib.import_module(f"coursepkg.grading.checks.{aid}_mistakes")
        ids = [bug.id for bug in mistakes.BUGS]
        assert ids and len(ids) == len(set(ids)), aid
        assert all(i.split(".")[0] and "." in i for i in ids), aid
        if aid in registered:
            assert set(ids) == registered[aid], aid


def test_constants_and_bug_ids_share_their_prefix():
    """In every catalogue, ``X_ITEM`` names what the student writes and ``X_BUGS`` its mistakes,
    whose ids all start with ``x.`` (``LN_BUGS``: ``ln.eps_ignored``), and ``BUGS`` is every
    ``X_BUGS``; every mistake is a :class:`BugVariant`. ex09 grades a training run: its
    ``BUGS`` (ids ``ex09.*``) span several items and have no ``impl`` to rerun."""
    for path in sorted((GRADING / "checks").glob("ex*_mistakes.py")):
        mistakes = importlib.import_module(f"coursepkg.grading.checks.{path.stem}")
        assert all(isinstance(bug, grading.BugVariant) for bug in mistakes.BUGS), path.name
        lists = {
            n[: -len("_BUGS")]: getattr(mistakes, n) for n in dir(mistakes) if n.endswith("_BUGS")
        }
        items = {
            n[: -len("_ITEM")]: getattr(mistakes, n) for n in dir(mistakes) if n.endswith("_ITEM")
        }
        assert set(lists) == set(items), path.name
        for prefix, bugs in lists.items():
            assert bugs, (path.name, prefix)
            for bug in bugs:
                assert bug.id.startswith(f"{prefix.lower()}."), (path.name, prefix, bug.id)
                assert bug.item == items[prefix], (path.name, bug.id, bug.item)
        if lists:
            assert sorted(b.id for b in mistakes.BUGS) == sorted(
                b.id for bugs in lists.values() for b in bugs
            ), path.name
        else:
            assert path.stem == "ex09_training_run_mistakes", path.name
            assert all(m.id.startswith("ex09.") and m.impl is None for m in mistakes.BUGS)


def test_the_ids_students_see_are_kept():
    """Every id in ``tests/fixtures/catalogue_ids.txt`` (what students have read in messages and
    the gradebook) is still a catalogued mistake, and every catalogued mistake is listed."""
    listed = ROOT / "tests" / "fixtures" / "catalogue_ids.txt"
    kept = {
        line.strip()
        for line in listed.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    ids = {bug.id for bug in grading.catalogue()}
    run = importlib.import_module("coursepkg.grading.checks.ex09_training_run_mistakes")
    ids |= {mistake.id for mistake in run.BUGS}
    assert len(kept) >= 100
    assert not kept - ids, f"catalogue ids gone (keep them as aliases): {sorted(kept - ids)}"
    assert not ids - kept, f"new ids: add them to {listed.name}: {sorted(ids - kept)}"


def _checks_imported(path: Path) -> set[str]:
    """The modules of ``coursepkg.grading.checks`` that the module at ``path`` imports, however
    the import is written (relative or absolute, a module or a name from the package)."""
    package = "coursepkg.grading.checks"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(f"{package}.ex"):
                found.add(name[len(package) + 1 :].split(".")[0])
    return found


CHECK_MODULES = sorted(
    [*(GRADING / "checks").glob("ex*.py"), *(GRADING / "checks").glob("ex*/*.py")]
)


@pytest.mark.parametrize("path", CHECK_MODULES, ids=lambda p: p.relative_to(GRADING).as_posix())
def test_a_check_module_imports_no_other_check_module(path):
    """Shared pieces live in framework/; a check module imports the framework, the reference
    and its own catalogue, never another check module (a catalogue imports none but the
    folder of concept modules it gathers, checks/exNN_mistakes/; a check split by concept
    imports its own pieces, checks/exNN_parts/)."""
    folder = path.parent.name if path.parent.name.startswith("ex") else None
    own = {f"{(folder or path.stem)[:4]}_mistakes"}  # exNN_mistakes/: the concept modules
    if folder is None and not path.stem.endswith("_mistakes"):
        own |= {f"{path.stem}_mistakes", f"{path.stem[:4]}_parts"}
    others = _checks_imported(path) - own
    assert not others, f"{path.name} imports {sorted(others)}"


def test_the_import_finder_sees_every_spelling(tmp_path):
    source = tmp_path / "ex05_decoder.py"
    source.write_text(
        "from .ex04_encoder import a\nfrom . import ex02_multihead\n"
        "import coursepkg.grading.checks.ex01_attention\n"
        "from ..checks.ex03_positions_mistakes import b\n"
        "from coursepkg.grading.checks import ex07_parameters\n"
        "from ..framework import c\nfrom .ex05_decoder_mistakes import d\n",
        encoding="utf-8",
    )
    assert _checks_imported(source) == {
        "ex04_encoder",
        "ex02_multihead",
        "ex01_attention",
        "ex03_positions_mistakes",
        "ex07_parameters",
        "ex05_decoder_mistakes",
    }


def test_coursepkg_grading_has_no_import_cycle():
    """Every import counts, inside functions too (``tests/test_layout.py`` checks the whole
    package and the direction of the grading folders)."""
    path = ROOT / "scripts" / "import_cycles.py"
    spec = importlib.util.spec_from_file_location("import_cycles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = module.graph(ROOT / "coursepkg")
    grading_graph = {
        name: {m for m in imported if m.startswith("coursepkg.grading")}
        for name, imported in graph.items()
        if name.startswith("coursepkg.grading")
    }
    assert module.cycles(grading_graph) == []
    assert "coursepkg.grading.framework" in grading_graph["coursepkg.grading.checks.ex01_attention"]
