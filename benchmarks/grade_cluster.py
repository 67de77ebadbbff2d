"""A large synthetic class on a real cluster: ``dask scheduler`` + two ``dask worker`` processes on
127.0.0.1 and a PostgreSQL gradebook, one worker SIGKILLed when half the class is recorded.

Everything is started here and removed at the end: PostgreSQL from Debian's ``initdb`` and
``pg_ctl`` in a temporary folder (as the ``postgres`` user when run as root) on a free port, the
scheduler and two workers (``dask worker --nthreads 1``, each under its nanny), and then
``coursepkg grade ex01_attention --scheduler ... --db postgresql://...`` on N submissions made as
in :mod:`grade_class` (a mix of full, partial and zero scores). When half the class is recorded,
one worker process is SIGKILLed; its nanny starts a new one, so two workers keep grading (the
student it was grading is graded again, by either).

Prints, in one summary: the wall time and notebooks per minute, when the worker was killed, the
peak resident memory (RSS, sampled every 0.2 s) of the client (``coursepkg grade``) and of the
scheduler, and whether every student is in the gradebook exactly once with nbgrader's score
for their kind of submission. Exits 1 if not.

Run: ``PATH=$PWD/.venv/bin:$PATH .venv/bin/python benchmarks/grade_cluster.py --students 500``
(needs Debian's ``postgresql`` package; about 25 minutes on a quiet 2-core machine; validate
with ``--students 20`` first, about 2 minutes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grade_class import AID, BIN, make_course, uptime  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(condition: Callable[[], object], what: str, seconds: float = 300.0) -> object:
    """Poll ``condition()`` until it is truthy; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


class _Peak(threading.Thread):
    """The peak resident memory of one process, sampled every 0.2 s until it exits."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.halt = psutil.Process(pid), 0, threading.Event()
        self.start()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            self.halt.wait(0.2)


def _postgres(folder: Path) -> tuple[str, Callable[[], None]]:
    """A PostgreSQL server in ``folder`` on 127.0.0.1; its URL and how to stop it."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise SystemExit("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    pg = found[-1].parent
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:  # PostgreSQL refuses to run as root
        shutil.chown(folder, "postgres", "postgres")
    port = _free_port()

    def run(*cmd: str) -> None:
        done = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")

    run(str(pg / "initdb"), "-D", str(folder / "db"), "-U", "postgres", "--auth=trust")
    # -w: pg_ctl returns once the server accepts connections.
    run(
        str(pg / "pg_ctl"),
        "-D",
        str(folder / "db"),
        "-o",
        f"-h 127.0.0.1 -p {port} -k {folder}",
        "-l",
        str(folder / "log"),
        "-w",
        "-t",
        "120",
        "start",
    )

    def stop() -> None:
        run(str(pg / "pg_ctl"), "-D", str(folder / "db"), "-m", "immediate", "stop")

    try:
        run(str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "gradebook")
    except BaseException:
        stop()
        raise
    return f"postgresql://postgres@127.0.0.1:{port}/gradebook", stop


def _gradebook(url: str) -> dict[str, list[float]]:
    """Each student's submissions of the assignment in the gradebook, with their scores."""
    from nbgrader.api import Gradebook

    from coursepkg.grading.classroom.gradebook import database_url

    rows: dict[str, list[float]] = {}
    with Gradebook(database_url(url), "transformers") as gb:
        for sub in gb.assignment_submissions(AID):
            rows.setdefault(sub.student.id, []).append(sub.score)
    return rows


def _expected(course: Path) -> dict[int, float]:
    """The score of each kind of submission (student ``i`` handed in kind ``i % 4``), from
    nbgrader's own ``autograde`` on one of each."""
    from grade_class import _run, _scores

    probe = make_course(course.parent / "probe", 4)
    nbgrader = str(BIN / "nbgrader")
    _run([nbgrader, "autograde", AID, "--create"], probe)
    _run([nbgrader, "export", "--to", "grades.csv"], probe)
    scores = _scores(probe / "grades.csv")
    shutil.rmtree(probe, ignore_errors=True)
    return {int(sid[1:]) % 4: score for sid, score in scores.items()}


def grade_on_cluster(n: int) -> dict:
    """Grade ``n`` synthetic submissions on a scheduler, two workers and PostgreSQL."""
    from distributed import Client

    before = uptime()
    print(f"uptime: {before}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-", dir="/tmp"))
    procs: list[subprocess.Popen] = []
    stop_pg: Callable[[], None] | None = None
    pg_folder: Path | None = None
    client = None
    try:
        course = make_course(tmp / "course", n)
        kinds = _expected(course)
        # A folder of its own: the postgres user cannot enter the private ``tmp``.
        pg_folder = Path(tempfile.mkdtemp(prefix="bench-pg-", dir="/tmp"))
        url, stop_pg = _postgres(pg_folder)
        info = tmp / "scheduler.json"
        common = ["--no-dashboard", "--host", "127.0.0.1"]
        procs.append(
            subprocess.Popen(
                [
                    str(BIN / "dask"),
                    "scheduler",
                    "--port",
                    "0",
                    "--scheduler-file",
                    str(info),
                    *common,
                ],
                stderr=subprocess.DEVNULL,
            )
        )
        _until(info.exists, "the scheduler's file")
        for name in ("w1", "w2"):
            procs.append(
                subprocess.Popen(
                    [
                        str(BIN / "dask"),
                        "worker",
                        "--scheduler-file",
                        str(info),
                        "--nthreads",
                        "1",
                        "--name",
                        name,
                        "--memory-limit",
                        "0",
                        *common,
                    ],
                    stderr=subprocess.DEVNULL,
                )
            )
        client = Client(scheduler_file=str(info), timeout="60s")
        client.wait_for_workers(2, timeout=300)
        students = sorted(p.name for p in (course / "submitted").iterdir())
        print(f"cluster and PostgreSQL ready; grading {n} submissions", flush=True)
        start = time.perf_counter()
        grader = subprocess.Popen(
            [
                str(BIN / "coursepkg"),
                "grade",
                AID,
                "--root",
                str(course),
                "--no-progress",
                "--scheduler",
                client.scheduler.address,
                "--db",
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peaks = {"client": _Peak(grader.pid), "scheduler": _Peak(procs[0].pid)}
        logs = course / "reports" / AID / "logs"  # one log per recorded student

        def half_recorded() -> bool:
            if grader.poll() is not None:
                raise SystemExit(f"coursepkg grade stopped early:\n{grader.communicate()}")
            return logs.is_dir() and len(list(logs.glob("*.log"))) >= n // 2

        _until(half_recorded, "half the class to be recorded", 24 * 3600)
        busy = {w: ks for w, ks in client.processing().items() if ks}
        victim = next(iter(busy or client.scheduler_info()["workers"]))
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.perf_counter() - start
        print(f"SIGKILLed worker {victim} (pid {pid}) at {killed_at:.0f} s", flush=True)
        out, err = grader.communicate()
        seconds = time.perf_counter() - start
        for peak in peaks.values():
            peak.halt.set()
        if grader.returncode != 0:
            raise SystemExit(f"coursepkg grade failed:\n{out}\n{err[-3000:]}")
        workers_after = len(client.scheduler_info()["workers"])
        rows = _gradebook(url)
    finally:
        if client is not None:
            client.close()
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if stop_pg is not None:
            stop_pg()
        shutil.rmtree(tmp, ignore_errors=True)
        if pg_folder is not None:
            shutil.rmtree(pg_folder, ignore_errors=True)
    once = sorted(rows) == students and all(len(v) == 1 for v in rows.values())
    right = once and all(rows[s] == [kinds[int(s[1:]) % 4]] for s in students)
    mib = {k: v.peak / 2**20 for k, v in peaks.items()}
    summary = out.strip().splitlines()[0] if out.strip() else "(no summary)"
    print(
        f"\n{n} submissions of {AID} on `dask scheduler` + 2 `dask worker --nthreads 1` "
        f"(127.0.0.1, {os.cpu_count()} cores), PostgreSQL gradebook"
    )
    print(
        f"one worker SIGKILLed at {killed_at:.0f} s (half the class recorded); its nanny "
        f"restarted it ({workers_after} workers at the end)"
    )
    print(f"wall time {seconds:.0f} s ({60 * n / seconds:.1f} notebooks/min)")
    print(f"peak RSS: client {mib['client']:.0f} MiB, scheduler {mib['scheduler']:.0f} MiB")
    print(
        f"every student exactly once in the gradebook: {once} "
        f"({sum(map(len, rows.values()))} submissions for {n} students); "
        f"each with nbgrader's score for their submission: {right}"
    )
    print(f"coursepkg grade: {summary}")
    print(f"uptime before: {before}\nuptime after:  {uptime()}")
    return {"seconds": seconds, "once": once, "right": right, **mib}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=500)
    args = parser.parse_args(argv)
    result = grade_on_cluster(args.students)
    if not (result["once"] and result["right"]):
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
