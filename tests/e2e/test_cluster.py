"""``coursepkg grade`` on real distributed parts, started here on 127.0.0.1: a ``dask scheduler``
with two ``dask worker`` processes, a PostgreSQL server (Debian's ``initdb``/``pg_ctl``, as the
``postgres`` user when the tests run as root), and the default ``LocalCluster``.

* A class graded on the cluster into PostgreSQL: every student exactly once with the expected
  score; a worker SIGKILLed while it grades a (slow) notebook, and that student graded by the
  other worker, exactly once; a notebook's kernel cannot connect to the PostgreSQL port (no
  network) and does not see the workers' database credentials; a rerun replaces, never adds.
* On the default LocalCluster: a notebook that kills its worker every time gets 0 with the
  reason after a bounded number of tries while the batch finishes, and the pids cgroups of its
  kernels do not stay behind; a fork bomb is contained.
* A rerun keeps a hand grade and the feedback it writes shows it, as nbgrader's does.
* An unreachable scheduler or database is a clear error before any work.
* Ctrl-C (SIGINT to the command's process group, as a terminal sends it) or SIGTERM while a
  class is graded: a clean exit, every recorded student complete and the others untouched, no
  process left behind, and a rerun finishes the class with each student once.

Without PostgreSQL or Dask's command line the tests that need them are skipped with the reason;
``COURSE_REQUIRE_CLUSTER=1`` (set by ``.ci/run``) makes them mandatory.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import nbformat
import pytest
import real_parts
from grading_hostile import points
from processes import Command, budget, files_under, run, running, wait_until
from real_parts import free_port, missing

from coursepkg.grading.kernel import confine

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AID = "ex01_attention"
SECRET = "pg-secret-9f3a"  # in the workers' environment; no kernel may see it

# The guard against a hang (scaled by the machine factor, tests/conftest.py); the waits below end
# a stuck step long before it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
postgres = real_parts.postgres  # the PostgreSQL server fixture


#: Seconds (reference machine, scaled by the machine factor) that ``coursepkg grade`` may go
#: without a progress sign (output, a file written in the test's folder) before the test gives
#: up on it: above the kernels' --notebook-timeout (240 s), for a worker restarted after a kill.
GRADE_IDLE = 360.0


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


# ---------------------------------------------------------------------------------------------
# Real parts
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``dask scheduler`` and two ``dask worker`` processes (with nannies) on 127.0.0.1."""
    if shutil.which("dask", path=str(BIN)) is None:
        missing("Dask's command line is not installed (pip install distributed)")
    from distributed import Client

    folder = tmp_path_factory.mktemp("dask")
    info = folder / "scheduler.json"
    env = _env(PGPASSWORD=SECRET, DATABASE_URL=f"postgresql://u:{SECRET}@127.0.0.1/x")
    common = ["--no-dashboard", "--host", "127.0.0.1"]
    procs = [
        Command(
            [str(BIN / "dask"), "scheduler", "--port", "0", "--scheduler-file", str(info), *common],
            what="dask scheduler",
            env=env,
        )
    ]

    def started() -> tuple:
        for proc in procs:  # one that stopped: say why
            assert proc.poll() is None, f"{proc.what} stopped:\n{proc.tail()}"
        return tuple(proc.sizes() for proc in procs)

    try:
        wait_until(info.exists, "the scheduler's file", idle=120, progress=started)
        for name in ("w1", "w2"):
            procs.append(
                Command(
                    [
                        str(BIN / "dask"),
                        "worker",
                        "--scheduler-file",
                        str(info),
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--name",
                        name,
                        "--memory-limit",
                        "0",
                        *common,
                    ],
                    what=f"dask worker {name}",
                    env=env,
                )
            )
        client = Client(scheduler_file=str(info), timeout=f"{budget(60):.0f}s")
        wait_until(
            lambda: len(client.scheduler_info()["workers"]) >= 2,
            "two Dask workers",
            idle=300,
            progress=started,
        )
        yield {"client": client, "address": client.scheduler.address}
        client.close()
    finally:
        for proc in reversed(procs):
            proc.end()


def _nbgrader(course: Path, command: str) -> None:
    run([str(BIN / "nbgrader"), command, AID, "--force"], cwd=course, env=_env(), check=True)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A course folder with ex01's source and release (``nbgrader generate_assignment``)."""
    course = tmp_path_factory.mktemp("release")
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / AID, course / "solutions" / AID)
    _nbgrader(course, "generate_assignment")
    return course


def _course(release: Path, where: Path, students: dict[str, nbformat.NotebookNode]) -> Path:
    course = where / "course"
    shutil.copytree(release, course)
    for sid, nb in students.items():
        target = course / "submitted" / sid / AID / f"{AID}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, str(target))
    return course


def _with_first_answer(nb: nbformat.NotebookNode, code: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose first answer cell starts with ``code``."""
    nb = nbformat.from_dict(nb)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    cell.source = code + "\n\n" + cell.source
    return nb


def _grade(course: Path, *args: str, options: tuple[str, ...] | None = None, **env: str) -> Command:
    """``coursepkg grade`` on ``course`` (in a session of its own, as a shell starts it); its
    progress signs are its output and the files written under the test's folder."""
    if options is None:
        options = (
            "--no-progress",
            "--cell-timeout",
            "60",
            "--notebook-timeout",
            "240",
            "--memory-mb",
            "2048",
        )
    return Command(
        [str(BIN / "coursepkg"), "grade", AID, "--root", str(course), *options, *args],
        what=f"coursepkg grade {' '.join(args)} on {course}",
        env=_env(**env),
        progress=lambda: files_under(course.parent),
    )


def _finish(proc: Command, ok: bool = True) -> str:
    out, err = proc.wait(idle=GRADE_IDLE)
    if ok:
        assert proc.returncode == 0, f"coursepkg grade failed:\n{out}\n{err}"
    return out + err


def _rows(url: str) -> dict[str, list[float]]:
    """Each student's submissions of ex01 in the gradebook, with their scores."""
    from nbgrader.api import Gradebook

    from coursepkg.grading.classroom.gradebook import database_url

    with Gradebook(database_url(url), "transformers") as gb:
        rows: dict[str, list[float]] = {}
        for sub in gb.assignment_submissions(AID):
            rows.setdefault(sub.student.id, []).append(sub.score)
        return rows


def _outputs(course: Path, student: str) -> str:
    nb = nbformat.read(str(course / "autograded" / student / AID / f"{AID}.ipynb"), as_version=4)
    return "\n".join(
        o.get("text", "") + o.get("evalue", "") for c in nb.cells for o in c.get("outputs", [])
    )


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

PROBE = f"""import os as _os, socket as _socket
try:
    _socket.create_connection(("127.0.0.1", {{port}}), timeout=5).close()
    print("PROBE network: connected")
except OSError as _err:
    print("PROBE network: refused", _err)
_seen = [k for k, v in _os.environ.items() if "{SECRET}" in v or k.startswith("PG")]
print("PROBE env:", sorted(_seen))
"""


def test_a_class_on_a_cluster_into_postgresql(cluster, postgres, release, tmp_path):
    source = nbformat.read(str(release / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    stubs = nbformat.read(str(release / "exercises" / AID / f"{AID}.ipynb"), as_version=4)
    full = points(source)
    students = {f"s{i:02d}": source for i in range(6)}
    students["untouched"] = stubs
    students["prober"] = _with_first_answer(source, PROBE.format(port=postgres["port"]))
    students["slowpoke"] = _with_first_answer(source, "import time\ntime.sleep(25)")
    course = _course(release, tmp_path, students)
    proc = _grade(course, "--scheduler", cluster["address"], "--db", postgres["url"])

    # Kill the worker grading the slow notebook, while it grades it.
    client = cluster["client"]

    def grading_slowpoke():
        assert proc.poll() is None, _finish(proc)  # the grader stopped before: say why
        return next(
            (w for w, keys in client.processing().items() if any("slowpoke" in k for k in keys)),
            None,
        )

    worker = wait_until(
        grading_slowpoke,
        "the slow notebook to be graded",
        idle=GRADE_IDLE,
        progress=lambda: (proc.sizes(), files_under(course)),
    )
    pid = client.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGKILL)
    out = _finish(proc)

    expected = {**{s: full for s in students}, "untouched": 0.0}
    assert _rows(postgres["url"]) == {s: [expected[s]] for s in students}, out
    assert "graded 9 student(s)" in out
    probe = _outputs(course, "prober")
    assert "PROBE network: refused" in probe and "connected" not in probe, probe
    assert "PROBE env: []" in probe, probe
    assert "no network" in out, out
    assert not (course / "gradebook.db").read_bytes().count(b"slowpoke")  # PostgreSQL only

    # A rerun replaces the grades: still one submission per student.
    _finish(
        _grade(
            course,
            "--scheduler",
            cluster["address"],
            "--db",
            postgres["url"],
            "--student=untouched",
            "--student=s00",
        )
    )
    assert _rows(postgres["url"]) == {s: [expected[s]] for s in students}


# The worker grading this kernel: the kernel's parent is a fork server, which on a LocalCluster
# is the grader's own (a sibling of the workers: the worker is the one whose working folder, its
# private course, holds the kernel's), or a worker's own (then the worker is its parent).
KILL_WORKER = """import os as _os, signal as _signal
def _parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
_server = _os.getppid()
_worker = _parent(_server)
if b"--siblings" in open(f"/proc/{_server}/cmdline", "rb").read():
    _here = _os.getcwd()
    for _p in filter(str.isdigit, _os.listdir("/proc")):
        try:
            if _parent(int(_p)) == _worker and _p != str(_server):
                _cwd = _os.readlink(f"/proc/{_p}/cwd")
                if _here.startswith(_cwd.rstrip("/") + "/"):
                    _worker = int(_p)
                    break
        except OSError:
            pass
    else:
        raise RuntimeError("no worker found")
_os.kill(_worker, _signal.SIGKILL)
"""

# In a child, as a kernel does it; the parent removes the child's cgroup afterwards.
CEILING = """import os
from coursepkg.grading.kernel.confine import kill_process_group_cgroup, limit_processes
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, (limit_processes(64) or "ok").encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
kill_process_group_cgroup(pid)
"""

FORK_BOMB = """import os as _os, time as _time
while True:
    if _os.fork() == 0:
        _time.sleep(600)
        _os._exit(0)
"""


def test_local_cluster_survives_a_worker_killer_and_a_fork_bomb(release, tmp_path):
    """On the default LocalCluster, with Landlock off so that a notebook can reach its worker
    (with Landlock ABI 6 it cannot signal it at all)."""
    source = nbformat.read(str(release / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    pids = tmp_path / "killer-kernels"  # each killer kernel's pid, to find its cgroup after
    note = f"import os as _o\nopen({str(pids)!r}, 'a').write(str(_o.getpid()) + '\\n')\n"
    students = {"good": source, "killer": _with_first_answer(source, note + KILL_WORKER)}
    probe = run(  # can this machine put a ceiling on a kernel's processes?
        [sys.executable, "-c", CEILING], what="the process ceiling's probe", idle=60, check=True
    )
    bomb = probe.stdout.strip() == "ok"
    if bomb:
        students["bomber"] = _with_first_answer(source, FORK_BOMB)
    course = _course(release, tmp_path, students)
    out = _finish(_grade(course, "--workers", "2", COURSEPKG_LANDLOCK="0"))
    rows = _rows(f"sqlite:///{course / 'gradebook.db'}")
    assert rows["good"] == [points(source)]
    assert rows["killer"] == [0.0]
    assert "killer: the process grading your notebook was killed every time" in out, out
    # The pids cgroups of the kernels that died with their worker did not stay behind.
    killers = pids.read_text().split()
    assert len(killers) >= 2, killers  # it was tried again
    cgroups = confine._cgroup_parent("pids")[0]  # the grader's own pids cgroup, or the root
    if os.geteuid() == 0 and cgroups is not None:
        left = [k for k in killers if (cgroups / f"coursepkg-kernel-{k}").exists()]
        assert not left, f"pids cgroups left behind: {left}"
    if bomb:
        assert rows["bomber"] == [points(source) - points(source, _first_item(source))]
        assert "Resource temporarily unavailable" in _outputs(course, "bomber")
    else:
        pytest.skip(f"no process ceiling here ({probe.stdout.strip()}): fork bomb not run")


def _first_item(nb: nbformat.NotebookNode) -> str:
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    return cell.metadata["nbgrader"]["grade_id"].removeprefix("answer_")


def test_unreachable_scheduler_or_database_is_a_clear_error_before_any_work(release, tmp_path):
    source = nbformat.read(str(release / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    course = _course(release, tmp_path, {"s1": source})
    before = sorted(p.name for p in course.iterdir())
    nowhere = free_port()
    proc = _grade(course, "--scheduler", f"tcp://127.0.0.1:{nowhere}")
    text = _finish(proc, ok=False)
    assert proc.returncode == 2 and "cannot reach the Dask scheduler" in text, text
    proc = _grade(course, "--db", f"postgresql://someone:{SECRET}@127.0.0.1:{nowhere}/gradebook")
    text = _finish(proc, ok=False)
    assert proc.returncode == 2 and "cannot reach the gradebook" in text, text
    assert SECRET not in text  # the password is not echoed
    assert sorted(p.name for p in course.iterdir()) == before  # nothing was done


# ---------------------------------------------------------------------------------------------
# Stopped by a signal
# ---------------------------------------------------------------------------------------------


def _recorded_whole(course: Path, student: str, cells: int) -> bool | None:
    """True when ``student`` is recorded whole (gradebook rows, graded notebook, feedback, log),
    False when nothing of theirs is, None when they are half-written."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "transformers") as gb:
        try:
            graded = [g for nb in gb.find_submission(AID, student).notebooks for g in nb.grades]
        except MissingEntry:
            graded = []
    parts = [
        len(graded) == cells,  # one grade per graded cell (the written answers' wait for a hand)
        (course / "autograded" / student / AID / f"{AID}.ipynb").is_file(),
        (course / "feedback" / student / AID / f"{AID}.html").is_file(),
        (course / "reports" / AID / "logs" / f"{student}.log").is_file(),
    ]
    if all(parts):
        return True
    return False if not any(parts) and not graded else None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_grading_between_students(release, tmp_path, signum):
    source = nbformat.read(str(release / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    cells = sum(1 for c in source.cells if c.metadata.get("nbgrader", {}).get("grade"))
    slow = _with_first_answer(source, "import time\ntime.sleep(3)")
    # Six students on two workers (eight before: the rerun paid a fourth round): when two are
    # recorded, two more are in flight, and recording all six before the signal lands would take
    # a worker a whole further notebook (3 s of sleep at least) after its notebook in flight.
    students = [f"s{i}" for i in range(6)]
    course = _course(release, tmp_path, dict.fromkeys(students, slow))
    logs = course / "reports" / AID / "logs"
    options = ("--no-progress", "--cell-timeout", "60", "--memory-mb", "2048")
    proc = _grade(course, "--workers", "2", options=options)

    def some_recorded():
        assert proc.poll() is None, _finish(proc)  # it stopped before: say why
        proc.descendants()  # remember every process of the tree, whenever it started
        return logs.is_dir() and len(list(logs.glob("*.log"))) >= 2

    wait_until(
        some_recorded,
        "two students to be recorded",
        idle=GRADE_IDLE,
        poll=0.5,
        progress=lambda: (proc.sizes(), files_under(course)),
    )
    tree = {p.pid: " ".join(p.cmdline()) for p in proc.seen() if p.pid != proc.pid and running(p)}
    assert any("resource_tracker" in c for c in tree.values()), tree
    assert sum("spawn_main" in c for c in tree.values()) >= 2, tree  # the two Dask workers
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole process group
    else:
        os.kill(proc.pid, signum)  # `kill`, a batch system: the command alone
    out, err = proc.wait(idle=GRADE_IDLE)

    assert proc.returncode == 128 + signum, f"{proc.returncode}\n{out}\n{err}"
    assert f"interrupted ({signal.Signals(signum).name})" in err, err
    assert "run it again" in err, err
    states = {s: _recorded_whole(course, s, cells) for s in students}
    assert None not in states.values(), states  # nobody half-written
    assert 2 <= sum(states.values()) < len(students), states  # stopped in the middle
    assert not list(course.glob("*/*/*.coursepkg-new")), "a half-swapped folder was left"

    # No descendant survives: workers, fork servers, kernels (sessions of their own) and the
    # resource tracker, every one seen while it graded.
    def left() -> list[str]:
        return [f"{p.pid} {tree.get(p.pid, '')}" for p in proc.seen() if running(p)]

    wait_until(lambda: not left(), "the grader's processes to end", idle=60, progress=left)

    # A rerun finishes the class: everyone once, with the full score. Both signals leave the
    # same state (asserted above: each student whole or not started, no half-swapped folder, no
    # process left), so the rerun, a cluster start and four notebooks, is paid once.
    if signum != signal.SIGINT:
        return
    _finish(_grade(course, "--workers", "2"))
    assert _rows(f"sqlite:///{course / 'gradebook.db'}") == {s: [points(source)] for s in students}
    assert all(_recorded_whole(course, s, cells) for s in students)


# ---------------------------------------------------------------------------------------------
# Hand grades
# ---------------------------------------------------------------------------------------------


def _feedback_score(course: Path, student: str) -> float:
    """The notebook's total in ``student``'s feedback page (nbgrader's feedback template)."""
    import re

    text = (course / "feedback" / student / AID / f"{AID}.html").read_text(encoding="utf-8")
    found = re.search(rf"{AID} \(Score: ([\d.]+) / ([\d.]+)\)", text)
    assert found, text[:2000]
    return float(found.group(1))


def test_a_rerun_keeps_a_hand_grade_and_its_feedback_shows_it(release, tmp_path):
    from nbgrader.api import Gradebook

    source = nbformat.read(str(release / "solutions" / AID / f"{AID}.ipynb"), as_version=4)
    course = _course(release, tmp_path, {"alice": source})
    url = f"sqlite:///{course / 'gradebook.db'}"
    _finish(_grade(course, "--workers", "1"))
    before = _feedback_score(course, "alice")
    with Gradebook(url, "transformers") as gb:  # as the formgrader records a hand grade
        written = [
            g
            for nb in gb.find_submission(AID, "alice").notebooks
            for g in nb.grades
            if g.cell_type == "markdown"
        ]
        assert written, "ex01 has no written answer to grade by hand"
        for grade in written:
            grade.manual_score = grade.max_score
            grade.needs_manual_grade = False
        hand = sum(g.max_score for g in written)
        gb.db.commit()

    _finish(_grade(course, "--workers", "1"))
    with Gradebook(url, "transformers") as gb:
        grades = [g for nb in gb.find_submission(AID, "alice").notebooks for g in nb.grades]
        kept = [g for g in grades if g.cell_type == "markdown"]
        assert all(g.manual_score == g.max_score and not g.needs_manual_grade for g in kept)
    ours = _feedback_score(course, "alice")
    assert ours == before + hand, (before, hand, ours)
    # The same page as nbgrader's own generate_feedback makes from the gradebook.
    _nbgrader(course, "generate_feedback")
    assert _feedback_score(course, "alice") == ours
    assert not (course / "feedback.coursepkg").exists()
