"""nbgrader's gradebooks reuse one SQLAlchemy engine per URL while ``coursepkg grade`` runs
(:func:`coursepkg.grading.classroom.gradebook.reused_engines`), and a worker's private
gradebook commits without waiting for the disk (``scratch_gradebook``).

(The gradebook's engines serve the policies' tables too; the class grader's own tests are in
tests/grading/classroom.)
"""

from __future__ import annotations

import nbgrader.api
import pytest
import real_parts
import sqlalchemy
from nbgrader.api import Gradebook
from sqlalchemy import event, text

from coursepkg.grading.classroom import gradebook

COURSE = "transformers"


def _url(tmp_path, name: str = "gradebook.db") -> str:
    """A new, empty gradebook's URL."""
    return real_parts.new_sqlite_gradebook(tmp_path / name, COURSE)


def _statements(engine) -> list[str]:
    """Each statement the engine runs from now on, as SQLAlchemy's cache reports it: "cached
    since ..." when its compiled form was reused, "generated in ..." when compiled anew."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def note(conn, cursor, statement, parameters, context, executemany):
        if context is not None and context.compiled is not None:
            seen.append(context._get_cache_stats())

    return seen


def test_gradebooks_share_one_engine_and_its_compiled_statements(tmp_path):
    url = _url(tmp_path)
    with Gradebook(url, COURSE) as gb:
        gb.add_assignment("a1")
    with gradebook.reused_engines():
        with Gradebook(url, COURSE) as first:
            first.add_student("s1")
            first.find_student("s1")
            first.find_assignment("a1")
        with Gradebook(url, COURSE) as second:
            assert second.engine is first.engine
            seen = _statements(second.engine)
            # What the first wrote is read back; its queries are not compiled again.
            assert second.find_student("s1").id == "s1"
            assert second.find_assignment("a1").name == "a1"
        assert seen and all(s.startswith("cached since") for s in seen), seen
    with Gradebook(url, COURSE) as after:  # outside the block: nbgrader's own engine again
        assert after.engine is not first.engine
        assert after.find_student("s1").id == "s1"


def test_the_block_puts_nbgraders_create_engine_back(tmp_path):
    own = nbgrader.api.create_engine
    assert own is sqlalchemy.create_engine
    with pytest.raises(RuntimeError):
        with gradebook.reused_engines():
            with gradebook.reused_engines():
                assert nbgrader.api.create_engine is not own
            assert nbgrader.api.create_engine is not own  # the outer block still reuses
            raise RuntimeError("a failure inside the block")
    assert nbgrader.api.create_engine is own


def test_only_the_latest_engines_are_kept(tmp_path):
    urls = [_url(tmp_path, f"g{i}.db") for i in range(gradebook.KEPT_ENGINES + 1)]
    with gradebook.reused_engines():
        engines = []
        for url in urls:
            with Gradebook(url, COURSE) as gb:
                gb.add_student("s1")
                engines.append(gb.engine)
        with Gradebook(urls[-1], COURSE) as gb:
            assert gb.engine is engines[-1]
        with Gradebook(urls[0], COURSE) as gb:  # the oldest was let go: a new engine works
            assert gb.engine is not engines[0]
            assert gb.find_student("s1").id == "s1"


def _synchronous(url: str) -> int:
    with Gradebook(url, COURSE) as gb:
        return gb.db.execute(text("PRAGMA synchronous")).scalar()


def test_a_scratch_gradebook_commits_without_waiting_for_the_disk(tmp_path):
    scratch, course = _url(tmp_path, "scratch.db"), _url(tmp_path, "course.db")
    gradebook.scratch_gradebook(scratch)
    with gradebook.reused_engines():
        assert _synchronous(scratch) == 0  # OFF
        assert _synchronous(course) == 2  # FULL, SQLite's default: the course's stays durable
        with Gradebook(scratch, COURSE) as gb:
            gb.add_student("s1")
        with Gradebook(scratch, COURSE) as gb:
            assert gb.find_student("s1").id == "s1"
    assert _synchronous(scratch) == 2  # only the engines made in the block are scratch's
