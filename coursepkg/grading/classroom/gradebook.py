"""The client's side of the gradebook (SQLite or PostgreSQL, any URL nbgrader's ``Gradebook``
takes): checking it can be reached, the assignment's definition shipped to the workers, and
recording each student's grades from the graded notebooks a worker sent back, with nbgrader's
own ``SaveAutoGrades`` and ``AssignLatePenalties`` (what ``nbgrader autograde`` runs), and the
CSV export (nbgrader's ``CsvExportPlugin``, what ``nbgrader export`` runs).

Only the client ever opens the gradebook: workers get an SQLite copy of the assignment's
definition, never the URL, so no credential reaches a worker or a student's kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat

from ..policy.late import reassess_penalties
from .standing import hand_grades, settle, submitted_at

__all__ = [
    "Course",
    "check_gradebook",
    "copy_assignment",
    "database_url",
    "definition",
    "export_csv",
    "reachable_url",
    "record",
    "reused_engines",
    "safe_url",
    "scratch_gradebook",
]

log = logging.getLogger(__name__)


def database_url(url: str, busy_seconds: int = 120) -> str:
    """The SQLAlchemy URL to use for a gradebook URL a user typed.

    ``postgresql://`` (or ``postgres://``) means psycopg 3, the driver this package installs
    (SQLAlchemy's default for it would be psycopg2); SQLite gets a busy timeout, so that it
    waits for a formgrader writing at the same moment.
    """
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    if url.startswith("sqlite") and "timeout=" not in url:
        return url + ("&" if "?" in url else "?") + f"timeout={busy_seconds}"
    return url


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse is shown as its scheme
        return url.split(":", 1)[0] + "://..."


def check_gradebook(url: str, timeout: int = 10) -> None:
    """Connect to the gradebook's database once, before any work.

    Raises:
        ValueError: it cannot be reached (the message names it, without its password).
    """
    from sqlalchemy import create_engine, text

    args = {"connect_timeout": timeout} if url.startswith("postgresql") else {}
    try:
        engine = create_engine(url, connect_args=args)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as err:  # noqa: BLE001 - any driver's error becomes one clear message
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"cannot reach the gradebook {safe_url(url)}: {first} (nothing was graded)"
        ) from err


#: How many gradebooks' engines :func:`reused_engines` keeps in a process (the least recently
#: used one beyond that is disposed of).
KEPT_ENGINES = 8

_engines: OrderedDict[tuple, Any] = OrderedDict()
_engines_lock = threading.Lock()
_reusing = {"depth": 0, "create_engine": None}
_scratch: set[str] = set()


def scratch_gradebook(url: str) -> None:
    """Say that the SQLite gradebook at ``url`` is scratch: the engine :func:`reused_engines`
    makes for it commits without waiting for the disk (``PRAGMA synchronous=OFF``; the
    rollback journal is kept, so a process killed mid-commit leaves it whole).

    For a grading worker's private gradebook, made again from the assignment by every worker
    process and thrown away with it: nbgrader commits to it ~55 times a student, and each
    durable commit waited for the disk (27 ms each on this machine at load 20).
    """
    with _engines_lock:
        _scratch.add(str(url))


def _no_fsync(connection: Any, _record: Any) -> None:
    connection.execute("PRAGMA synchronous=OFF")


def _reused_engine(url: Any, **options: Any) -> Any:
    """``sqlalchemy.create_engine``'s engine for ``url`` and ``options``, made once per process."""
    from sqlalchemy import create_engine, event

    key = (str(url), tuple(sorted(options.items())))
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = create_engine(url, **options)
            if str(url) in _scratch and engine.dialect.name == "sqlite":
                event.listen(engine, "connect", _no_fsync)
            if len(_engines) > KEPT_ENGINES:
                _engines.popitem(last=False)[1].dispose()
        _engines.move_to_end(key)
        return engine


@contextlib.contextmanager
def reused_engines() -> Iterator[None]:
    """While the block runs, nbgrader's ``Gradebook`` objects made in this process share one
    SQLAlchemy engine per database URL.

    nbgrader makes a new engine for every ``Gradebook``: grading one student opens about 20
    (each converter step and preprocessor of autograde and feedback on the worker, the record
    on the client). A new engine sets its dialect up again at its first connection and starts
    with an empty cache of compiled statements, so each of nbgrader's queries was compiled
    anew every time (~0.25 s of CPU a student, worker and client together). An engine holds no
    data: ``Gradebook.close`` still disposes of its connections, and every ``Gradebook`` checks
    the tables and reads the database as before. Blocks may nest (and run in several threads):
    nbgrader's own ``create_engine`` is put back when the outermost one ends.
    """
    import nbgrader.api

    with _engines_lock:
        if _reusing["depth"] == 0:
            _reusing["create_engine"] = nbgrader.api.create_engine
            nbgrader.api.create_engine = _reused_engine
        _reusing["depth"] += 1
    try:
        yield
    finally:
        with _engines_lock:
            _reusing["depth"] -= 1
            if _reusing["depth"] == 0:
                nbgrader.api.create_engine = _reusing["create_engine"]


def reachable_url(root: Path, db_url: str | None) -> str:
    """The gradebook URL of the course at ``root`` (``db_url``, else the course's SQLite file
    ``gradebook.db``), checked to be reachable before any work.

    Raises:
        ValueError: ``root`` is no nbgrader course (no ``nbgrader_config.py``), or its
            gradebook cannot be reached.
    """
    if not (root / "nbgrader_config.py").is_file():
        raise ValueError(f"{root} is not an nbgrader course directory (no nbgrader_config.py)")
    url = database_url(db_url or f"sqlite:///{root / 'gradebook.db'}")
    check_gradebook(url)
    return url


class Course:
    """The instructor's nbgrader course folder, as the client sees it.

    Args:
        root: the course folder (with ``nbgrader_config.py``).
        url: the gradebook's SQLAlchemy URL.
    """

    def __init__(self, root: Path, url: str) -> None:
        from traitlets.config.loader import PyFileConfigLoader

        self.root, self.url = root, url
        self.config_text = (root / "nbgrader_config.py").read_text(encoding="utf-8")
        here = os.getcwd()
        os.chdir(root)  # a config may read paths relative to its folder
        try:
            self.config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
        finally:
            os.chdir(here)
        self.course_id = self.config.get("CourseDirectory", {}).get("course_id") or (
            "default_course"
        )
        folders = self.config.get("CourseDirectory", {})  # the config's, else a guess
        self.source = folders.get("source_directory") or (
            "solutions" if (root / "solutions").is_dir() else "source"
        )
        self.release = folders.get("release_directory") or (
            "exercises" if (root / "exercises").is_dir() else "release"
        )

    def gradebook(self) -> Any:
        from nbgrader.api import Gradebook

        return Gradebook(self.url, self.course_id)

    def notebooks(self, assignment: str) -> list[str]:
        """The assignment's notebooks in the gradebook, recording the assignment from its
        source first if the gradebook lacks it (as ``nbgrader generate_assignment`` does)."""
        from nbgrader.api import MissingEntry

        try:
            with self.gradebook() as gb:
                return sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)
        except MissingEntry:
            pass
        from ..release import generate_release

        if not (self.root / self.source / assignment).is_dir():
            raise ValueError(
                f"the gradebook does not know assignment {assignment!r} and "
                f"{self.root / self.source} has no source for it: run `coursepkg release "
                f"{assignment}` (or `nbgrader generate_assignment {assignment} --force`) where "
                "the source is"
            )
        from nbgrader.api import Gradebook

        # Into a scratch gradebook, then copied under the course's id: nbgrader's
        # generate_assignment records it under a course whose row it does not create, which
        # PostgreSQL (unlike SQLite) refuses.
        with tempfile.TemporaryDirectory(prefix="coursepkg-release-") as scratch:
            url = f"sqlite:///{Path(scratch) / 'gradebook.db'}"
            generate_release(self.root, assignment, source=self.source, release=scratch, db_url=url)
            with Gradebook(url) as src, self.gradebook() as dst:
                copy_assignment(src, dst, assignment)
        log.warning(
            "the gradebook did not know %s: recorded it from %s/%s (the release students have "
            "is unchanged)",
            assignment,
            self.source,
            assignment,
        )
        with self.gradebook() as gb:
            return sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)

    def source_files(self, assignment: str) -> dict[str, bytes]:
        """The source's files nbgrader copies into every graded submission: all but the
        notebooks (which hold the solutions) and checkpoints."""
        folder = self.root / self.source / assignment
        return {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
            and p.suffix != ".ipynb"
            and not {".ipynb_checkpoints", "__pycache__"} & set(p.relative_to(folder).parts)
        }


def definition(course: Course, assignment: str) -> bytes:
    """An SQLite gradebook holding only ``assignment``'s definition (notebooks, graded cells
    and their points, locked cells' sources), read from the course's gradebook."""
    from nbgrader.api import Gradebook

    with tempfile.TemporaryDirectory(prefix="coursepkg-definition-") as scratch:
        path = Path(scratch) / "gradebook.db"
        with course.gradebook() as src:
            _stamped_tables(path, _alembic_version(src))
            with Gradebook(f"sqlite:///{path}", course.course_id) as dst:
                copy_assignment(src, dst, assignment)
        return path.read_bytes()


def _alembic_version(gb: Any) -> str | None:
    """The schema version nbgrader stamped on an open gradebook, or None."""
    from sqlalchemy import text

    try:
        return gb.db.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception:  # noqa: BLE001 - no stamp: nbgrader's Gradebook stamps the copy itself
        gb.db.rollback()
        return None


def _stamped_tables(path: Path, version: str | None) -> None:
    """nbgrader's empty tables in a new SQLite file at ``path``, stamped with ``version``.

    nbgrader's ``Gradebook`` stamps a new database by running ``alembic heads`` in a
    subprocess (seconds, on every run); the course's gradebook already says the version.
    """
    if version is None:
        return
    from nbgrader.api import Base
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{path}")
    try:
        Base.metadata.create_all(bind=engine)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": version})
    finally:
        engine.dispose()


def copy_assignment(src: Any, dst: Any, assignment: str) -> None:
    """Record ``assignment``'s definition from gradebook ``src`` in gradebook ``dst`` (open
    nbgrader ``Gradebook`` objects): its notebooks, graded, task and solution cells with their
    points, and the sources of its cells."""
    source = src.find_assignment(assignment)
    dst.update_or_create_assignment(assignment, duedate=source.duedate)
    for nb in source.notebooks:
        dst.update_or_create_notebook(nb.name, assignment)
        for c in nb.grade_cells:
            dst.update_or_create_grade_cell(
                c.name, nb.name, assignment, max_score=c.max_score, cell_type=c.cell_type
            )
        for c in nb.task_cells:
            dst.update_or_create_task_cell(
                c.name, nb.name, assignment, max_score=c.max_score, cell_type=c.cell_type
            )
        for c in nb.solution_cells:
            dst.update_or_create_solution_cell(c.name, nb.name, assignment)
        for c in nb.source_cells:
            dst.update_or_create_source_cell(
                c.name,
                nb.name,
                assignment,
                cell_type=c.cell_type,
                locked=c.locked,
                source=c.source,
                checksum=c.checksum,
            )


def _replace_folder(folder: Path, files: dict[str, bytes]) -> None:
    """Make ``folder`` hold exactly ``files``: written next to it, then swapped in."""
    fresh = folder.with_name(folder.name + ".coursepkg-new")
    shutil.rmtree(fresh, ignore_errors=True)
    for name, data in files.items():
        target = (fresh / name).resolve()
        if not target.is_relative_to(fresh.resolve()):
            raise ValueError(f"a graded file's name leaves its folder: {name!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    fresh.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    fresh.rename(folder)


def record(course: Course, assignment: str, answer: Any, notebooks: list[str]) -> None:
    """Write one student's graded notebooks and feedback into the course folder, and their
    grades into the gradebook, replacing what an earlier run recorded.

    The grades come from the graded notebooks through nbgrader's ``SaveAutoGrades`` and
    ``AssignLatePenalties``; a hand grade given to this same submission stays settled and the
    answered regrade requests' scores are put back (:func:`~.standing.settle`), and the late
    penalty is computed from the points then (:func:`~coursepkg.grading.policy.late.
    reassess_penalties`, as the worker's feedback did). The feedback is the worker's, made once
    from the same standing (:mod:`.standing`): it is not made again.
    """
    from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades

    sid = answer.student
    _replace_folder(course.root / "autograded" / sid / assignment, answer.autograded)
    if answer.feedback:
        _replace_folder(course.root / "feedback" / sid / assignment, answer.feedback)
    timestamp = submitted_at(course.root, assignment, sid)
    with course.gradebook() as gb:
        kept = hand_grades(gb, assignment, sid)
        gb.update_or_create_student(sid)
        if timestamp is not None:
            gb.update_or_create_submission(assignment, sid, timestamp=timestamp)
        else:
            gb.update_or_create_submission(assignment, sid)
    for name in notebooks:
        path = course.root / "autograded" / sid / assignment / f"{name}.ipynb"
        nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
        resources = {
            "nbgrader": {
                "notebook": name,
                "assignment": assignment,
                "student": sid,
                "db_url": course.url,
            }
        }
        SaveAutoGrades(config=course.config).preprocess(nb, resources)
        AssignLatePenalties(config=course.config).preprocess(nb, resources)
    settle(course, assignment, sid, kept)
    with course.gradebook() as gb:
        reassess_penalties(course.config, gb, assignment, [sid])


def export_csv(course: Course, assignment: str, to: Path) -> None:
    """nbgrader's CSV export of ``assignment`` (what ``nbgrader export`` runs)."""
    from nbgrader.plugins import CsvExportPlugin

    plugin = CsvExportPlugin(config=course.config, to=str(to), assignment=[assignment])
    with course.gradebook() as gb:
        plugin.export(gb)
