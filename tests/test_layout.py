"""The package's size rules (DEVELOPING.md, "Conventions"), anywhere in ``coursepkg``: no module
over 600 lines, no function over 80 lines (counted from ``def`` to the end of its body, as
``scripts/code_size.py`` does)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "coursepkg"
FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_small_and_their_functions_short(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 600
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long, long


ROOT = PACKAGE.parent
GUIDE = ROOT / "DEVELOPING.md"


def test_the_guide_states_these_limits():
    text = GUIDE.read_text(encoding="utf-8")
    assert "over 600 lines" in text and "over 80 lines" in text


def _map_rows() -> list[list[str]]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # without the header


def test_every_path_in_the_guides_map_exists():
    """The map's modules and checks are under coursepkg/ (or the repository root: book/,
    scripts/), its tests under tests/; a renamed or moved file shows here."""
    rows = _map_rows()
    assert len(rows) >= 20
    missing = []
    for concept, module, test, _chapter, check, check_test in rows:
        for cell, base in ((module, PACKAGE), (check, PACKAGE), (test, ROOT / "tests")):
            for name in re.findall(r"`([\w./]+(?:\.py|/))`", cell):
                if not ((base / name).exists() or (ROOT / name).exists()):
                    missing.append((concept, name))
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", check_test):
            if not (ROOT / "tests" / name).exists():
                missing.append((concept, name))
    assert not missing, missing


def _map_names() -> set[str]:
    """Every path the map names (``attention.py``, ``grading/term/``, ``reference/test_rnn.py``)."""
    return {
        name
        for row in _map_rows()
        for cell in row
        for name in re.findall(r"`([\w./]+(?:\.py|/))`", cell)
    }


def _listed(path: str, names: set[str]) -> bool:
    return path in names or any(n.endswith("/") and path.startswith(n) for n in names)


def test_the_map_lists_every_module_and_every_test_file():
    """Each module of coursepkg (a check's catalogue goes with its check, the stubs with their
    checks) and each test file is in the map, itself or through its folder."""
    names = _map_names()
    modules = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and "stubs" not in p.parts
    ]
    unlisted = [m for m in modules if not _listed(m.replace("_mistakes.py", ".py"), names)]
    tests = [
        p.relative_to(ROOT / "tests").as_posix()
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.name != "test_layout.py"
    ]
    unlisted += [t for t in tests if not _listed(t, names)]
    assert modules and tests
    assert not unlisted, f"not in DEVELOPING.md's map: {sorted(unlisted)}"


@functools.cache  # built once per session: four tests read it, none changes it
def _import_graph() -> tuple[dict[str, set[str]], Any]:
    """``scripts/import_cycles.py``'s graph of ``coursepkg``: every import, wherever written."""
    path = ROOT / "scripts" / "import_cycles.py"
    spec = importlib.util.spec_from_file_location("import_cycles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.graph(PACKAGE), module.cycles


def test_no_import_cycle_even_through_imports_inside_functions():
    graph, cycles = _import_graph()
    # an import inside a function counts (Course.notebooks imports the release when it runs)
    assert "coursepkg.grading.release" in graph["coursepkg.grading.classroom.gradebook"]
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The libraries: what a user imports to train, serve, fine-tune or load models; the book's
# runs and measurements (coursepkg.chapters) are built on them, never the reverse.
LIBRARIES = ("data", "interop", "parallel", "posttrain", "serving", "training")


def test_libraries_never_import_the_chapters_runs():
    graph, _ = _import_graph()
    libraries = [name for name in graph if name.split(".")[1:2] and name.split(".")[1] in LIBRARIES]
    assert {name.split(".")[1] for name in libraries} == set(LIBRARIES)
    upward = sorted(
        (name, target)
        for name in libraries
        for target in graph[name]
        if target.startswith("coursepkg.chapters")
    )
    assert not upward, upward


# The grading folders from the bottom up; a module imports its own floor or those below.
_FLOORS = {
    "framework": 0,
    "checks": 1,
    "": 2,  # coursepkg.grading itself: the public checks and the catalogue
    "notebook": 3,
    "kernel": 3,
    "formgrader_offline": 3,
    "release": 3,  # nbgrader release and feedback: imports nothing of coursepkg
    "policy": 4,
    "classroom": 5,
    "term": 6,
}


def _floor(module: str) -> int:
    return _FLOORS[module.removeprefix("coursepkg.grading").lstrip(".").split(".")[0]]


def test_the_grading_folders_import_one_way():
    """framework < checks < the package < kernel, notebook < policy < classroom < term (the
    commands that run them are in coursepkg/cli): the class grader never reaches up into the
    instructor's commands, the policies into neither."""
    graph, _ = _import_graph()
    upward = sorted(
        (name, target)
        for name, targets in graph.items()
        if name.startswith("coursepkg.grading")
        for target in targets
        if target.startswith("coursepkg.grading") and _floor(target) > _floor(name)
    )
    assert not upward, upward
    assert _floor("coursepkg.grading.term.regrade") > _floor("coursepkg.grading.classroom.record")


# The package root holds the reference model only: the book's helpers are in chapters/, the
# command line in cli/ (DEVELOPING.md, "Where things live"). A new root module is added here on
# purpose, or goes to the folder it belongs to.
ROOT_MODULES = {
    "__init__.py",
    "_lazy.py",  # the packages' names imported on first use (coursepkg/__init__.py uses it)
    "_validation.py",
    "alibi.py",
    "attention.py",
    "config.py",
    "config_groups.py",
    "decoder_only.py",
    "decoding.py",
    "efficient_attention.py",
    "encoder_only.py",
    "fast_attention.py",
    "fast_optim.py",
    "functional.py",
    "kv_cache.py",
    "layers.py",
    "masks.py",
    "mla.py",
    "model.py",
    "model_parts.py",
    "moe.py",
    "optim.py",
    "params.py",
    "positional.py",
    "rnn.py",
    "schedule.py",
    "tokenizer.py",
    "tokenizer_long.py",
}
ROOT_FOLDERS = {
    "chapters",
    "cli",
    "curation",
    "data",
    "grading",
    "interop",
    "parallel",
    "posttrain",
    "serving",
    "stubs",
    "training",
}


# Package folders whose tests live elsewhere, and why; every other folder of coursepkg has
# tests/<its path> holding tests.
TESTED_ELSEWHERE = {
    "stubs": "exercises",  # the stubs are the notebooks' answer cells
    "chapters/diagrams": "chapters",  # test_diagrams.py, beside the chapters' runs
    "serving/http": "serving",  # the server's tests beside the engine's
    "grading/checks/ex13_mistakes": "grading/checks",  # ex13's catalogue, tested with its check
    "grading/checks/ex14_mistakes": "grading/checks",  # ex14's catalogue, tested with its check
    "grading/checks/ex15_parts": "grading/checks",  # ex15's ranks and training, with its check
}
# Folders still without tests of their own (none now). Remove a folder from here once its
# tests folder exists.
NO_TESTS_FOLDER_YET: set[str] = set()


def test_every_package_folder_has_its_tests_folder():
    folders = sorted(
        p.parent.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE
    )
    assert set(TESTED_ELSEWHERE) <= set(folders), "TESTED_ELSEWHERE names a folder that is gone"
    missing, stale = [], []
    for folder in folders:
        tests = ROOT / "tests" / TESTED_ELSEWHERE.get(folder, folder)
        has_tests = any(tests.glob("test_*.py"))
        if folder in NO_TESTS_FOLDER_YET:
            stale += [folder] if has_tests else []
        elif not has_tests:
            missing.append(f"coursepkg/{folder} -> {tests.relative_to(ROOT)}")
    assert not missing, f"package folders without a tests folder of test files: {missing}"
    assert not stale, f"{stale} have their tests folder now: remove them from NO_TESTS_FOLDER_YET"


def test_the_package_root_holds_the_model_only():
    modules = {p.name for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert modules == ROOT_MODULES, (sorted(modules - ROOT_MODULES), sorted(ROOT_MODULES - modules))
    assert folders == ROOT_FOLDERS, (sorted(folders - ROOT_FOLDERS), sorted(ROOT_FOLDERS - folders))
    # and the model never reaches up into the book's helpers or the command line
    graph, _ = _import_graph()
    root = {f"coursepkg.{name.removesuffix('.py')}" for name in ROOT_MODULES} - {
        "coursepkg.__init__"
    }
    upward = sorted(
        (name, target)
        for name in root | {"coursepkg"}
        for target in graph.get(name, ())
        if target.startswith(("coursepkg.chapters", "coursepkg.cli"))
    )
    assert not upward, upward


def private_imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for each ``from <a coursepkg module> import _name`` in ``path``,
    relative or absolute, where ``_name`` is not a module itself (a private module such as
    ``_validation`` is the package's own and may be imported; a private function may not)."""
    folder = list(path.relative_to(package.parent).parts[:-1])  # the package it is in
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = folder[: len(folder) - node.level + 1] + (node.module or "").split(".")
        else:
            base = (node.module or "").split(".")
        base = [part for part in base if part]
        if not base or base[0] != package.name:
            continue
        where = package.parent.joinpath(*base)
        for alias in node.names:
            name = alias.name
            is_module = (where / f"{name}.py").is_file() or (where / name).is_dir()
            if name.startswith("_") and not name.startswith("__") and not is_module:
                found.append((node.lineno, ".".join(base), name))
    return found


def test_no_private_name_is_imported_across_modules(tmp_path):
    found = {p.relative_to(PACKAGE).as_posix(): hits for p in FILES if (hits := private_imports(p))}
    assert not found, found
    # The scan sees both spellings and lets a private module through.
    fake = tmp_path / "coursepkg"
    (fake / "chapters").mkdir(parents=True)
    (fake / "_validation.py").write_text("", encoding="utf-8")
    probe = fake / "chapters" / "probe.py"
    probe.write_text(
        "from .char_gpt import _hidden, shown\n"
        "from coursepkg.model import _x\n"
        "from .. import _validation\n",
        encoding="utf-8",
    )
    assert private_imports(probe, fake) == [
        (1, "coursepkg.chapters.char_gpt", "_hidden"),
        (2, "coursepkg.model", "_x"),
    ]


def test_no_two_test_files_share_a_basename():
    """The test folders have no ``__init__.py`` (pytest's default import mode), so two test files
    with one basename cannot both be collected in one run: the second is an import-file mismatch."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


#: Modules kept so that a course's ``nbgrader_config.py`` written before a move, which names a
#: class by its dotted path, still loads (tests/grading/policy/test_old_config.py): the names
#: each may list in ``__all__`` without defining them.
OLD_CONFIG_ALIASES = {
    "grading/term/late.py": {
        "LateNote",
        "LatePolicy",
        "apply_due_date",
        "check_due_dates",
        "describe_lateness",
        "parse_due_date",
    },
    "grading/term/regrade.py": {"RegradeNote"},
}

#: Names a released notebook's locked cell imported from a module before they moved home: kept
#: there so that a student's notebook (and a gradebook holding that cell) still runs.
KEPT_FOR_OLD_RELEASES = {
    "grading/checks/ex09_training_run.py": {
        "CPU_BUDGET_SECONDS",
        "kernel_cpu_seconds",
        "watch_training",
    },
}


def reexports(path: Path) -> list[str]:
    """The names the module at ``path`` lists in ``__all__`` without defining them at its top
    level (a ``def``, a ``class`` or an assignment): names it re-exports from another module."""
    defined: set[str] = set()
    listed: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            defined |= names
            if "__all__" in names and isinstance(node.value, ast.List | ast.Tuple):
                listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return [name for name in listed if name not in defined]


def test_no_module_re_exports_another_modules_names(tmp_path):
    """DEVELOPING.md, "The root is the model": a name is imported from its home; only a
    package's ``__init__.py`` gathers names defined elsewhere."""
    found = {}
    for path in FILES:
        key = path.relative_to(PACKAGE).as_posix()
        kept = OLD_CONFIG_ALIASES.get(key, set()) | KEPT_FOR_OLD_RELEASES.get(key, set())
        extra = set(reexports(path)) - kept
        if path.name != "__init__.py" and extra:
            found[key] = sorted(extra)
    assert not found, f"import these from their own modules instead: {found}"
    # The scan tells a re-export from a name defined by def, class or assignment.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from .model_parts import TokenEmbedding\nfrom .x import y\n"
        "A = 1\ndef f(): ...\nclass C: ...\n"
        "__all__ = ['A', 'C', 'TokenEmbedding', 'f', 'y']\n",
        encoding="utf-8",
    )
    assert reexports(probe) == ["TokenEmbedding", "y"]


def test_an_old_release_setup_cell_still_imports():
    """ex09 as released before its watch moved to grading.framework.watch: the locked setup
    cell's import (copied from exercises/ex09_training_run at 0e03efe) still runs, and gives
    the framework's own objects."""
    from coursepkg.grading.framework import watch

    namespace: dict = {}
    exec(
        "from coursepkg.grading.checks.ex09_training_run import (\n"
        "    CPU_BUDGET_SECONDS,\n    check_own_pieces,\n    check_training_run,\n"
        "    kernel_cpu_seconds,\n    watch_training,\n)\n",
        namespace,
    )
    assert namespace["watch_training"] is watch.watch_training
    assert namespace["kernel_cpu_seconds"] is watch.kernel_cpu_seconds
    assert namespace["CPU_BUDGET_SECONDS"] == watch.CPU_BUDGET_SECONDS
