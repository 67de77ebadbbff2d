"""The assignments: instructors' notebooks in solutions/, their release in exercises/.

The release must be exactly what nbgrader makes from the sources today, hold no solution or hidden
test, and keep the exercise contract (the stubs' signatures). ``coursepkg check`` must give a
student a useful report on untouched, solved, crashing and looping notebooks.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import processes
import psutil
import pytest
from flaky_kernel import dying_kernelspec

from coursepkg.grading.notebook import (
    DEFAULT_CELL_TIMEOUT,
    NotebookError,
    cell_timeout,
    find_test_cells,
    load_notebook,
    run_notebook,
)
from coursepkg.grading.release import find_leaks, generate_release, secret_lines
from coursepkg.stubs import ASSIGNMENTS

ROOT = Path(__file__).resolve().parents[2]


def _source(aid: str) -> Path:
    return ROOT / "solutions" / aid / f"{aid}.ipynb"


def _release(aid: str) -> Path:
    return ROOT / "exercises" / aid / f"{aid}.ipynb"


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def test_every_assignment_has_a_source_and_a_release():
    assert sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir()) == sorted(
        ASSIGNMENTS
    )
    for aid in ASSIGNMENTS:
        assert _source(aid).is_file(), aid
        assert _release(aid).is_file(), f"{aid}: run `make release`"


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory) -> Path:
    """nbgrader's release made now from solutions/, in a temporary course directory."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "solutions", root / "solutions")
    generate_release(root)
    return root / "exercises"


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_committed_release_is_current(aid, fresh_release):
    made = json.loads((fresh_release / aid / f"{aid}.ipynb").read_text())
    committed = json.loads(_release(aid).read_text())
    assert made == committed, (
        f"exercises/{aid} is stale: solutions/{aid} changed after the release was made; "
        "run `make release`"
    )


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_release_leaks_no_solution_and_no_hidden_test(aid):
    secrets = secret_lines(_source(aid))
    assert len(secrets) >= 5, f"{aid}: the source should hold solutions and hidden tests"
    assert find_leaks(_source(aid), _release(aid)) == []
    text = _release(aid).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "thorough=True"):
        assert marker not in text, f"{aid}: {marker!r} in the release"
    nb = nbformat.read(str(_release(aid)), as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs released"


def test_leak_scan_finds_a_planted_leak(tmp_path):
    aid = ASSIGNMENTS[-1]
    nb = nbformat.read(str(_release(aid)), as_version=4)
    secret = secret_lines(_source(aid))[0]
    nb.cells[-1].source += "\n" + secret
    planted = tmp_path / "leaky.ipynb"
    nbformat.write(nb, str(planted))
    assert find_leaks(_source(aid), planted) == [secret]


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_points_and_locks(aid):
    nb = nbformat.read(str(_source(aid)), as_version=4)
    tests = find_test_cells(nb)
    assert tests, aid
    visible = sum(_meta(c)["points"] for _, c in tests if "HIDDEN" not in c.source)
    hidden = sum(_meta(c)["points"] for _, c in tests if "HIDDEN" in c.source)
    manual = [c for c in nb.cells if c.cell_type == "markdown" and _meta(c).get("grade")]
    assert 0 < visible < hidden, f"{aid}: hidden tests should carry most of the points"
    assert 1 <= len(manual) <= 2, f"{aid}: one or two written questions"
    for _, cell in tests:
        assert _meta(cell)["locked"], f"{aid}: test cell {_meta(cell)['grade_id']} is not locked"
    ids = [_meta(c)["grade_id"] for c in nb.cells if _meta(c)]
    assert len(ids) == len(set(ids)), f"{aid}: duplicated grade ids"


@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_answer_cells_are_the_stubs(aid):
    """Every stub item appears in the release with its exact signature and docstring."""
    stub_path = ROOT / "coursepkg" / "stubs" / f"{aid}.py"
    stub = stub_path.read_text()
    released = "\n".join(c.source for c in nbformat.read(str(_release(aid)), as_version=4).cells)
    for node in ast.parse(stub).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            first = stub.splitlines()[node.lineno - 1]
            assert first in released, f"{aid}: {node.name}'s signature differs from the stub"
            doc = ast.get_docstring(node, clean=False).splitlines()[0]
            assert doc in released, f"{aid}: {node.name}'s docstring differs from the stub"
            assert "raise NotImplementedError" in released


# ---------------------------------------------------------------- coursepkg check


def _notebook(tmp_path: Path, *sources: str, test: str = "assert True") -> Path:
    """A tiny assignment-like notebook: some code cells, then one 2-point test cell."""
    cells = [nbformat.v4.new_code_cell(s) for s in sources]
    cell = nbformat.v4.new_code_cell(test)
    cell.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "points": 2,
        "grade_id": "test_it",
        "schema_version": 3,
    }
    cells.append(cell)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
    return path


def test_check_untouched_release_says_not_implemented_yet():
    report = run_notebook(_release("ex07_parameters"))
    visible = report.visible
    assert visible and all(c.status == "failed" for c in visible)
    assert all("not implemented yet" in c.message for c in visible), report.format()
    assert any(c.status == "hidden" for c in report.cells)
    assert report.score == 0 and not report.passed


def test_check_untouched_training_run_says_not_implemented_yet():
    """ex09's tests grade a model the untouched notebook never builds: they say so, fast."""
    report = run_notebook(_release("ex09_training_run"))
    visible = report.visible
    assert visible and all(c.status == "failed" for c in visible)
    assert all("model is not implemented yet" in c.message for c in visible), report.format()
    assert report.score == 0 and not report.passed


def test_check_solution_passes_every_test():
    report = run_notebook(_source("ex07_parameters"))
    assert report.passed, report.format()
    assert report.score == report.max_score > 0


def test_check_says_when_the_kernel_never_started(tmp_path):
    # a "python3" kernel that never answers: nbclient's own cleanup then fails a second time
    # (an empty AssertionError), which must not be all the student reads, nor be printed when
    # the process ends (nbclient's clean-up at exit fails the same way). In a process of its
    # own, so that its exit is seen.
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-c", "import time; time.sleep(600)", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "mute", "language": "python"})
    )
    path = _notebook(tmp_path, "x = 1")
    code = (
        "from coursepkg.grading.notebook import run_notebook\n"
        f"report = run_notebook({str(path)!r}, timeout=60, startup_timeout=2)\n"
        "print(report.problem)\n"
        "print([c.status for c in report.cells])\n"
    )
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter")}
    done = processes.run([sys.executable, "-c", code], env=env, idle=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the Python kernel did not start within 2 s" in done.stdout, done.stdout
    assert "['not run']" in done.stdout, done.stdout
    assert "AssertionError" not in done.stderr, done.stderr


def test_check_starts_a_kernel_again_when_the_first_dies_before_answering(tmp_path, monkeypatch):
    # The first start of the "python3" kernel exits at once (as one whose port another process
    # took does); the next starts are the real kernel. No cell ran in the first, so the check
    # starts it again and the notebook is checked as usual.
    starts = dying_kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    path = _notebook(tmp_path, "x = 1", test="assert x == 1")
    report = run_notebook(path, timeout=60)
    assert starts.read_text() == "2"  # the first start did exit
    assert report.problem == "", report.problem
    assert [c.status for c in report.cells] == ["passed"], report.format()


@pytest.mark.parametrize("own", [None, "3"])
def test_the_checks_kernel_runs_as_a_graded_one_and_skips_its_last_collection(
    own, tmp_path, monkeypatch
):
    """The check's kernel gets the threads a graded kernel gets by default (one), unless the
    student's environment sets them; it loads ``load_ipython_extension`` (so it ends without
    walking torch's objects once more), and the notebook's namespace gets nothing from it."""
    if own is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", own)
    path = _notebook(
        tmp_path,
        "import os\nthreads = os.environ.get('OMP_NUM_THREADS')\n"
        "loaded = set(get_ipython().extension_manager.loaded)",
        test=f"assert threads == {own or '1'!r}, threads\n"
        "assert 'coursepkg.grading.notebook' in loaded, loaded\n"
        "assert not {'gc', 'atexit', 'load_ipython_extension'} & set(dir())",
    )
    report = run_notebook(path, timeout=60)
    assert [c.status for c in report.cells] == ["passed"], report.format()


def test_check_runs_from_inside_a_kernel_as_in_jupyterlab(tmp_path):
    """``check_notebook()`` in JupyterLab runs the check inside a kernel, whose event loop is
    running: the check's own kernel starts and runs the saved notebook all the same."""
    inner = _notebook(tmp_path, "x = 1", test="assert x == 1")
    outer_dir = tmp_path / "outer"
    outer_dir.mkdir()
    code = (
        "from coursepkg.grading.notebook import run_notebook\n"
        f"inner = run_notebook({str(inner)!r}, timeout=60)"
    )
    outer = _notebook(
        outer_dir, code, test="assert [c.status for c in inner.cells] == ['passed'], inner.format()"
    )
    report = run_notebook(outer, timeout=120)
    assert [c.status for c in report.cells] == ["passed"], report.format()


def test_the_extension_freezes_the_kernels_objects_at_exit():
    """At exit, after the extension's handler (handlers run last registered, first run), the
    objects are frozen: the interpreter's last collection skips them."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: sys.stdout.write(f'frozen {gc.get_freeze_count()}'))\n"
        "from coursepkg.grading.notebook import load_ipython_extension\n"
        "print('before', gc.get_freeze_count())\n"
        "load_ipython_extension(None)\n"
        "print('after', gc.get_freeze_count())\n"
    )
    out = processes.run([sys.executable, "-c", code], idle=60)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[:4] == ["before", "0", "after", "0"], out.stdout  # nothing frozen until exit
    assert words[4] == "frozen" and int(words[5]) > 1000, out.stdout


def test_check_reports_a_dead_kernel(tmp_path):
    path = _notebook(tmp_path, "import os\nos._exit(3)")
    report = run_notebook(path, timeout=60)
    assert "kernel died" in report.problem
    assert [c.status for c in report.cells] == ["not run"]
    assert "Stopped early" in report.format()


def test_check_reports_an_endless_loop(tmp_path):
    path = _notebook(tmp_path, "x = 1", test="while True:\n    pass")
    report = run_notebook(path, timeout=3)
    assert "longer than the 3 s limit" in report.problem
    assert report.cells[0].status == "failed"
    assert report.score == 0


def test_check_reports_a_failing_assertion(tmp_path):
    path = _notebook(tmp_path, "x = 1", test="assert x == 2, 'x should be 2'")
    report = run_notebook(path)
    assert report.cells[0].status == "failed"
    assert "x should be 2" in report.cells[0].message


@pytest.mark.parametrize(
    ("content", "expected"),
    [("", "empty"), ("{not json", "not valid JSON"), ('{"a": 1}', "not a Jupyter notebook")],
)
def test_check_rejects_files_that_are_not_notebooks(tmp_path, content, expected):
    path = tmp_path / "broken.ipynb"
    path.write_text(content)
    with pytest.raises(NotebookError, match=expected):
        load_notebook(path)
    cli = subprocess.run(
        [sys.executable, "-m", "coursepkg.cli", "check", str(path)],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2
    assert expected in cli.stderr
    assert "Traceback" not in cli.stderr


def test_check_cli_prints_each_test_and_a_total():
    cli = processes.run(
        [sys.executable, "-m", "coursepkg.cli", "check", str(_release("ex07_parameters"))],
        idle=300,
    )
    assert cli.returncode == 1
    assert "[FAIL] test_transformer_parameter_count_visible: 0/2" in cli.stdout
    assert "not implemented yet" in cli.stdout
    assert "Total: 0/2 points on the visible tests" in cli.stdout
    assert "in written answers graded by hand" in cli.stdout  # the whole notebook's points
    assert "IPKernelApp" not in cli.stderr  # the kernel's startup warnings are not the student's


def test_check_reads_a_notebook_and_loads_the_kernel_client_without_torch():
    """``coursepkg check``'s own process reads the notebook and imports nbclient, and only the
    kernel imports torch and the notebook's checks (torch, the other assignments' checks and
    the IRI grammar jsonschema would build cost about 10 s of CPU before). A fresh process,
    since this one has imported them all."""
    code = (
        "import sys\n"
        "from coursepkg.grading.notebook import load_notebook\n"
        f"nb = load_notebook({str(_source('ex01_attention'))!r})\n"
        "import nbclient\n"
        "heavy = {'torch', 'coursepkg.grading.checks.ex01_attention', 'rfc3987_syntax', 'lark'}\n"
        "print(sorted(heavy & set(sys.modules)), len(nb.cells))\n"
    )
    out = processes.run([sys.executable, "-c", code], idle=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", str(len(load_notebook(_source("ex01_attention")).cells))]


def test_a_notebook_rejected_after_its_kernel_started_leaves_no_kernel(tmp_path):
    """The check starts the kernel before nbformat reads the notebook (to overlap the two): a
    notebook that nbformat's reading then rejects (a bad cell time limit) ends that kernel."""
    path = _notebook(tmp_path, "x = 1")
    nb = json.loads(path.read_text())
    nb["metadata"]["coursepkg"] = {"cell_timeout": "900"}
    path.write_text(json.dumps(nb))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(NotebookError, match="cell_timeout"):
        run_notebook(path)
    after = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not [p for p in after if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], after


def test_a_notebook_asks_for_its_cell_time_limit_in_its_metadata():
    assert cell_timeout({"metadata": {}}) == DEFAULT_CELL_TIMEOUT
    assert cell_timeout({"metadata": {"coursepkg": {"cell_timeout": 900}}}) == 900
    for bad in (0, -5, "900", True, None):
        with pytest.raises(NotebookError, match="cell_timeout"):
            cell_timeout({"metadata": {"coursepkg": {"cell_timeout": bad}}})


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_only_the_training_run_asks_for_longer_cells_and_its_release_keeps_it(assignment):
    """ex09 trains a model in one cell, longer than the 120 s every other notebook gets; the
    release (what ``coursepkg grade`` reads) carries the source's request."""
    source = load_notebook(ROOT / "solutions" / assignment / f"{assignment}.ipynb")
    release = load_notebook(ROOT / "exercises" / assignment / f"{assignment}.ipynb")
    expected = 900 if assignment == "ex09_training_run" else DEFAULT_CELL_TIMEOUT
    assert cell_timeout(source) == cell_timeout(release) == expected
