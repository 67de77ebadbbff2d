"""``nbgrader autograde``'s kernel start, as the course configures it: a kernel that dies before
it answers is started again (no cell has run), one that dies while running a cell is not."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from flaky_kernel import dying_kernelspec
from nbclient.exceptions import DeadKernelError
from nbgrader.preprocessors import Execute
from traitlets.config.loader import PyFileConfigLoader

from coursepkg.grading.classroom.worker import classify
from coursepkg.grading.kernel.execute import RestartingExecute, autograde_preprocessors
from coursepkg.grading.kernel.forked import ForkExecute

ROOT = Path(__file__).resolve().parents[3]


def _notebook(*sources: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def _run(pp: Execute, nb, folder: Path):
    return pp.preprocess(nb, {"metadata": {"path": str(folder)}})


def _logged(err: BaseException) -> str:
    """The error as nbgrader's log ends with it (``coursepkg grade`` classifies that log)."""
    head = "[AutogradeApp | ERROR] There was an error processing assignment"
    return f"{head}\n{type(err).__name__}: {err}"


@pytest.fixture
def flaky(tmp_path, monkeypatch) -> Path:
    """The "python3" kernel's first start exits before it answers; the file counts the starts."""
    starts = dying_kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return starts


def test_nbgraders_own_execute_gives_up_on_a_kernel_that_died_before_answering(flaky, tmp_path):
    # What the course's preprocessor is for: nbgrader's gives up on the whole notebook.
    with pytest.raises(RuntimeError, match="kernel"):
        _run(Execute(kernel_name="python3", timeout=60), _notebook("x = 1"), tmp_path)
    assert flaky.read_text() == "1"  # one start, which died


def test_a_kernel_that_died_before_answering_is_started_again(flaky, tmp_path):
    nb, _ = _run(
        RestartingExecute(kernel_name="python3", timeout=60),
        _notebook("x = 20", "print(x + 1)"),
        tmp_path,
    )
    assert flaky.read_text() == "2"  # the first start did die
    assert [o.get("text") for o in nb.cells[1].outputs] == ["21\n"]
    assert [c.execution_count for c in nb.cells] == [1, 2]  # each cell ran once, in one kernel


def test_a_kernel_that_dies_after_answering_is_not_started_again(tmp_path):
    # The notebook's own code ended its kernel: running it again would run the cells before it
    # twice, so the error is nbgrader's to report as before.
    log = tmp_path / "ran.txt"
    nb = _notebook(f"open({str(log)!r}, 'a').write('ran\\n')", "import os; os._exit(1)")
    with pytest.raises(DeadKernelError) as died:
        _run(RestartingExecute(kernel_name="python3", timeout=60), nb, tmp_path)
    assert log.read_text() == "ran\n"
    # `coursepkg grade` tells the student their code ended the kernel.
    assert classify(_logged(died.value), 120).startswith("the Python kernel died while running")


def test_a_kernel_that_never_answers_is_reported_after_the_last_start(tmp_path, monkeypatch):
    starts = dying_kernelspec(tmp_path / "jupyter", times=5)  # every start dies
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    pp = RestartingExecute(kernel_name="python3", timeout=60)
    with pytest.raises(RuntimeError, match="kernel") as never:
        _run(pp, _notebook("x = 1"), tmp_path)
    assert starts.read_text() == "3"
    # `coursepkg grade` says it is the machine's failure: none of the student's code ran.
    said = classify(_logged(never.value), 120)
    assert said.startswith("the grader could not start a Python kernel"), said
    assert "died while running" not in said


def test_the_course_config_gives_autograde_the_restarting_execute():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    chosen = config.Autograde.autograde_preprocessors
    assert chosen == autograde_preprocessors()
    assert RestartingExecute in chosen and Execute not in chosen
    # The rest is nbgrader's default list, in its order: only the one that runs cells changed.
    assert [pp for pp in autograde_preprocessors(Execute) if pp is not Execute] == [
        pp for pp in chosen if pp is not RestartingExecute
    ]
    assert issubclass(ForkExecute, RestartingExecute)  # `coursepkg grade`'s kernels too
