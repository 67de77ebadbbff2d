"""The command line of the instructor's term: ``coursepkg extension``, ``coursepkg export``,
``coursepkg regrade`` and ``coursepkg similarity``.

Each command is a pair, ``_add_<verb>(sub)`` that declares its arguments and ``_<verb>(args)``
that runs it (its exit status), as in every home of ``coursepkg``'s commands
(:mod:`coursepkg.cli.model`). What a command runs (:mod:`coursepkg.grading`, which imports torch,
nbgrader and Dask) is imported when it runs, so an argument's error comes at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .grading import add_gradebook_option

__all__ = ["ARGUMENTS", "COMMANDS", "open_course"]

#: The commands of this home and their line in ``coursepkg --help``.
COMMANDS = {
    "extension": "grant a student an extension, kept out of git (instructors)",
    "export": "write the grades as the CSV Canvas or Gradescope imports (instructors)",
    "regrade": "regrade requests: ask (students), record, list and answer (instructors)",
    "similarity": "rank pairs of submissions by how much code they share (instructors)",
    "leaderboard": "grade the capstone's recipes and write its leaderboard pages and CSV",
}


def _say(line: str) -> None:
    # a command's result, one line on standard output (what the user asked the command for)
    sys.stdout.write(line + "\n")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=".", help="the nbgrader course directory (default: .)")
    add_gradebook_option(p)


def open_course(args: argparse.Namespace) -> Any:
    """The course (:class:`~coursepkg.grading.classroom.gradebook.Course`) that ``--root`` and
    ``--db`` name, its gradebook checked to be reachable."""
    from ..grading.classroom.gradebook import Course, reachable_url

    root = Path(args.root).resolve()
    return Course(root, reachable_url(root, args.db))


def _export(args: argparse.Namespace) -> int:
    from ..grading.term.export import export, read_mapping

    if bool(args.assignment) == args.all:
        raise ValueError("give ASSIGNMENT ... or --all (got both or neither)")
    if args.include_empty and not args.all:
        raise ValueError("--include-empty goes with --all (named assignments are always written)")
    course = open_course(args)
    mapping = read_mapping(args.mapping, args.id_column) if args.mapping else None
    _grades_now(course, args.assignment or None)
    out = args.output or course.root / "reports" / f"export-{args.format}.csv"
    written = export(
        course.url,
        course.course_id,
        None if args.all else args.assignment,
        args.format,
        out,
        mapping=mapping,
        parts=args.parts,
        include_empty=args.include_empty,
        skip_unmapped=args.skip_unmapped,
        config=course.config,
    )
    _say("\n".join(written.lines()))
    return 0


def _grades_now(course: Any, assignments: list[str] | None) -> None:
    """Before an export: every late penalty computed from the points now, and the reports
    ``coursepkg grade`` wrote brought up to date with hand scores saved since (one line on
    each assignment whose reports changed)."""
    from ..grading.term.regrade import refresh_pages

    with course.gradebook() as gb:
        known = [a.name for a in gb.assignments]
    for name in [a for a in assignments or known if a in known]:
        stale = refresh_pages(course, name)
        if stale:
            _say(
                f"{name}: the reports of {', '.join(stale)} now show the grades given since "
                "`coursepkg grade` (hand scores, late penalty); run `nbgrader "
                f"generate_feedback {name}` so that their feedback does too"
            )


def _extension(args: argparse.Namespace) -> int:
    from ..grading.classroom.gradebook import Course, database_url
    from ..grading.policy.extensions import (
        EXTENSIONS_FILE,
        extensions_path,
        grant_extension,
        read_extensions,
    )

    root = Path(args.root).resolve()
    if not (root / "nbgrader_config.py").is_file():
        raise ValueError(f"{root} is not an nbgrader course directory (no nbgrader_config.py)")
    db = args.db or (
        f"sqlite:///{root / 'gradebook.db'}" if (root / "gradebook.db").is_file() else None
    )
    course = Course(root, database_url(db) if db else "")
    name = course.config.get("LatePolicy", {}).get("extensions_file", EXTENSIONS_FILE)
    path = extensions_path(course.config, name)
    if args.action == "list":
        found = read_extensions(path)
        for key, value in sorted(found.items()):
            for student, hours in sorted(value.items()) if isinstance(value, dict) else []:
                _say(f"{student:<16} {hours:>6g} h  {key}")
            if not isinstance(value, dict):
                _say(f"{key:<16} {value:>6g} h  every assignment")
        _say(f"{path}: {'no extension' if not found else 'ignored by git, never in the kit'}")
        return 0
    hours = 0.0 if args.action == "revoke" else args.hours
    grant_extension(path, args.student, hours, args.assignment, args.note or "")
    what = f"{args.assignment or 'every assignment'}"
    _say(f"{args.student}: {f'{hours:g} hours' if hours else 'no extension'} for {what}, in {path}")
    if db:  # penalties already recorded follow at once
        _penalties_now(course, args.student, args.assignment)
    return 0


def _penalties_now(course: Any, student: str, assignment: str | None) -> None:
    """After an extension changed: the student's late penalties computed again, and the pages
    ``coursepkg grade`` wrote made again where the grade changed."""
    from ..grading.policy.late import reassess_penalties
    from ..grading.term.regrade import refresh_pages

    with course.gradebook() as gb:
        names = [a.name for a in gb.assignments if assignment in (None, a.name)]
        changed = [n for n in names if reassess_penalties(course.config, gb, n, [student])]
    for name in changed:
        refresh_pages(course, name, [student])
        _say(
            f"{name}: {student}'s late penalty changed; run `nbgrader generate_feedback {name}` "
            "so that their feedback shows it"
        )


def _add_extension(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Extensions are often accommodations, which are private: they live in "
        "extensions.csv in the course folder (student, assignment, hours, note), which the "
        "course's .gitignore ignores and the student kit never holds, not in the tracked "
        "nbgrader_config.py. The late policy (LatePolicy) reads it; a penalty already in the "
        "gradebook is computed again at once."
    )
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("grant", help="grant (or change) a student's extension")
    q.add_argument("student", help="nbgrader's student id")
    q.add_argument("hours", type=float, help="the extension in hours (0 removes it)")
    q.add_argument("--assignment", help="one assignment (default: every assignment)")
    q.add_argument("--note", help="your own note (e.g. an accommodation); never shown to anyone")
    _common(q)
    q.set_defaults(func=_extension)
    q = actions.add_parser("revoke", help="remove a student's extension")
    q.add_argument("student", help="nbgrader's student id")
    q.add_argument("--assignment", help="one assignment (default: the one for every assignment)")
    _common(q)
    q.set_defaults(func=_extension, note="")
    q = actions.add_parser("list", help="the course's extensions")
    _common(q)
    q.set_defaults(func=_extension)


def _add_export(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Read nbgrader's gradebook (SQLite or PostgreSQL) and write one CSV file: "
        "Canvas's gradebook layout (for its Import), the layout of Gradescope's grade download "
        "(Gradescope imports no grades; for what reads its downloads), or a plain CSV. One "
        "column per assignment (nbgrader's score: points less the late penalty), optionally "
        "one per graded part. Students are matched to the platform's ids by --mapping. It prints "
        "what it wrote and what it skipped."
    )
    p.add_argument("assignment", nargs="*", help="assignment ids, in the file's order (or --all)")
    p.add_argument(
        "--all",
        action="store_true",
        help="every assignment someone has handed in, by name (the others are listed as skipped)",
    )
    p.add_argument(
        "--include-empty",
        action="store_true",
        help="with --all, also the assignments nobody has handed in (columns of zeros)",
    )
    p.add_argument(
        "--skip-unmapped",
        action="store_true",
        help="leave out the students missing from --mapping (e.g. who dropped), listing them",
    )
    p.add_argument("--format", choices=("canvas", "gradescope", "csv"), required=True)
    p.add_argument(
        "--mapping",
        help="CSV with a student_id column (nbgrader's id) and the platform's columns "
        "(Canvas: Student, ID, SIS User ID, SIS Login ID, Section; Gradescope: First Name, "
        "Last Name, SID, Email); needed for canvas and gradescope",
    )
    p.add_argument("--id-column", default="student_id", help="the mapping's column of nbgrader ids")
    p.add_argument("--parts", action="store_true", help="also one column per graded part")
    p.add_argument("--output", help="the file to write (default: reports/export-FORMAT.csv)")
    _common(p)
    p.set_defaults(func=_export)


def _regrade(args: argparse.Namespace) -> int:
    import getpass
    import json
    import os

    from ..grading.policy.pages import change
    from ..grading.policy.regrade import request_file, requests
    from ..grading.term.regrade import add_requests, answer

    if args.action == "request":  # the student's side: no gradebook
        student = args.student or os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
        data = request_file(args.assignment, student, args.part, args.reason)
        out = Path(args.output or f"regrade-{student}-{args.assignment}-{args.part}.json")
        out.write_text(json.dumps(data, indent=1), encoding="utf-8")
        _say(f"wrote {out}: send this file to your instructor")
        return 0
    course = open_course(args)
    if args.action == "add":
        ids = add_requests(course, [Path(f) for f in args.files])
        known = {r.id: r for r in requests(course.url)}
        for i in ids:
            r = known[i]
            _say(f"request {i}: {r.student}, {r.assignment} {r.part} ({r.status})")
        _say(f"dashboard: {course.root / 'reports' / 'dashboard.html'}")
    elif args.action == "answer":
        signed = course.config.get("RegradeNote", {}).get("answered_by") or ""
        who = args.by or signed.strip() or os.environ.get("USER") or getpass.getuser()
        answer(course, args.id, why=args.why, who=who, score=args.score)
        _say(f"answered request {args.id} as {who!r}; the feedback of its student was made again")
        if not (args.by or signed.strip()):
            _say(
                '(signed with your login; c.RegradeNote.answered_by = "..." in '
                "nbgrader_config.py, or --by, signs with the name students read)"
            )
    else:
        found = requests(course.url, args.assignment)
        if not args.all and not any(r.status == "open" for r in found):
            _say(f"no open requests ({len(found)} answered; --all lists them with their trail)")
        for r in found:
            if r.status == "open" or args.all:
                _say(
                    f"{r.id:>4}  {r.status:<8} {r.student:<16} {r.assignment} {r.part}: {r.reason}"
                )
                for e in r.log:
                    _say(f"      {e['at']} {e['who']}: {change(e)}. {e['why']}")
    return 0


def _add_regrade(p: argparse.ArgumentParser) -> None:
    p.description = (
        "A student asks for a regrade of one graded part with a reason (`request` "
        "writes a file to send to the instructor). The instructor records the files (`add`), "
        "lists the open requests (`list`, also in the dashboard) and answers each with a new "
        "score or a comment (`answer`). Every change is kept in the gradebook with who, when, "
        "the old and new scores and why; a new score stays through reruns of coursepkg grade, "
        "and the student's feedback shows the answer."
    )
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("request", help="write a regrade request file (students)")
    q.add_argument("assignment", help="the assignment id, e.g. ex01_attention")
    q.add_argument("part", help="the graded part (the test cell's name in your feedback)")
    q.add_argument("--reason", required=True, help="why the part deserves another look")
    q.add_argument("--student", help="your student id (default: $JUPYTERHUB_USER, else login)")
    q.add_argument(
        "--output", help="the file to write (default: regrade-STUDENT-ASSIGNMENT-PART.json)"
    )
    q.set_defaults(func=_regrade)
    q = actions.add_parser("add", help="record request files in the gradebook")
    q.add_argument("files", nargs="+", help="the request files the students sent")
    _common(q)
    q.set_defaults(func=_regrade)
    q = actions.add_parser("list", help="the open requests (--all: answered too, with trail)")
    q.add_argument("--assignment", help="only this assignment")
    q.add_argument("--all", action="store_true", help="answered requests too, with their trail")
    _common(q)
    q.set_defaults(func=_regrade)
    q = actions.add_parser("answer", help="answer a request: a new score and/or a comment")
    q.add_argument("id", type=int, help="the request's id (see `coursepkg regrade list`)")
    q.add_argument("--why", required=True, help="the answer's reason, shown to the student")
    q.add_argument("--score", type=float, help="the part's new score (default: unchanged)")
    q.add_argument(
        "--by",
        help="who answers, as the student reads it (default: the config's "
        "c.RegradeNote.answered_by, else your login)",
    )
    _common(q)
    q.set_defaults(func=_regrade)


def _similarity(args: argparse.Namespace) -> int:
    from ..grading.term.similarity import DEFAULT_THRESHOLD, DEFAULT_TOP, similarity_report

    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    top = DEFAULT_TOP if args.top is None else args.top
    found = similarity_report(args.root, args.assignment, threshold, top)
    above = [p for p in found.pairs if p.similarity >= threshold]
    for p in above[:10]:
        same = "  (identical answers)" if (p.left, p.right) in found.identical else ""
        _say(f"{p.similarity:.3f}  {p.left}  {p.right}{same}")
    for sid, why in found.unreadable.items():
        _say(f"not compared: {sid}: {why}")
    for group in found.clusters[:10]:
        _say(f"similar group of {len(group)}: {' ~ '.join(group)}")
    _say(
        f"{len(above)} pair(s) at or above {threshold:g} of {len(found.pairs)} sharing "
        f"code; {found.table}  {found.page}"
    )
    return 0


def _add_similarity(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare what each student wrote in submitted/*/ASSIGNMENT (answer cells "
        "and added cells; the release's stubs and given code never count) with Dolos, and "
        "write reports/ASSIGNMENT/similarity.csv and similarity.html (pairs ranked, those at "
        "or above the threshold side by side with the shared code marked), linked from the "
        "dashboard. It is a list for a person to read, not a verdict. Needs Node.js."
    )
    p.add_argument("assignment", help="the assignment id, e.g. ex04_encoder")
    # The defaults are similarity.DEFAULT_THRESHOLD and DEFAULT_TOP (importing that module here
    # would import the grader's torch and nbgrader; tests/cli/test_cli.py keeps these equal).
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="similarity (0-1) from which a pair is shown side by side (0.7)",
    )
    p.add_argument("--top", type=int, default=None, help="the most pairs shown side by side (50)")
    p.add_argument("--root", default=".", help="the nbgrader course directory (default: .)")
    p.set_defaults(func=_similarity)


def _add_leaderboard(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The capstone (ex19_capstone): with --grade, re-run every student's recipe "
        "confined under the budget, for each seed, and score it in held-out bits per byte "
        "(the results go to OUT/results.json); then rank RESULTS (or those) and write "
        "OUT/instructor.html, OUT/students.html and OUT/leaderboard.csv. A new record must beat "
        "the standing best by --margin-nats with Welch's one-sided t-test at p < 0.01."
    )
    p.add_argument("results", nargs="?", help="a results.json written by --grade")
    p.add_argument("--grade", help="a folder of submissions: STUDENT/*.ipynb (or *.py)")
    p.add_argument("--out", required=True, help="the folder for the pages, CSV and results")
    p.add_argument("--root", default=".", help="the course folder (its secret salts pseudonyms)")
    p.add_argument(
        "--corpus", help="the folder of `coursepkg data prepare` (default: Tiny Shakespeare)"
    )
    p.add_argument("--budget-s", type=float, default=600.0, help="training seconds per run")
    p.add_argument("--memory-mb", type=int, default=4096, help="memory per run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per recipe (0, 1, ...)")
    p.add_argument("--names", choices=("names", "pseudonyms"), default="pseudonyms")
    p.add_argument("--margin-nats", type=float, default=0.005, help="a record's margin")
    p.add_argument("--baseline", help="the student id whose entry is the first standing best")
    p.add_argument("--scheduler", help="a Dask scheduler's address (default: a LocalCluster)")
    p.add_argument("--workers", type=int, help="the LocalCluster's workers (default: CPUs)")
    p.set_defaults(func=_leaderboard)


def _submissions(folder: Path) -> dict[str, Path]:
    found = {}
    for student in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = sorted([*student.glob("*.ipynb"), *student.glob("*.py")])
        if files:
            found[student.name] = files[0]
    if not found:
        raise SystemExit(f"--grade {folder}: no STUDENT/*.ipynb or STUDENT/*.py in it")
    return found


def _leaderboard(args: argparse.Namespace) -> int:
    import json

    from ..grading.policy.leaderboard import leaderboard_rows, write_pages
    from ..grading.release import course_secret

    out = Path(args.out)
    if args.grade:
        from ..grading.classroom.capstone import CapstoneRules, grade_class
        from ..grading.classroom.orchestrate import connect

        rules = CapstoneRules(
            budget_s=args.budget_s, memory_mb=args.memory_mb, seeds=tuple(range(args.seeds))
        )
        with connect(args.scheduler, args.workers) as client:
            entries = grade_class(
                _submissions(Path(args.grade)), rules, args.corpus, args.root, client=client
            )
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(entries, indent=1))
    elif args.results:
        entries = json.loads(Path(args.results).read_text())
    else:
        raise SystemExit("leaderboard: give RESULTS (a results.json) or --grade FOLDER")
    base = [e["scores"] for e in entries if e["student"] == args.baseline]
    rows = leaderboard_rows(entries, base[0] if base else None, args.margin_nats)
    secret = course_secret(args.root, create=args.names == "pseudonyms")  # else guessable
    paths = write_pages(rows, out, args.names, secret)
    records = sum(r["record"] for r in rows)
    _say(
        f"{len(rows)} entries, {records} new record(s): wrote "
        + ", ".join(map(str, paths.values()))
    )
    return 0


#: How each command of this home declares its arguments, on the subparser ``coursepkg``
#: makes for it (its :data:`COMMANDS` line as help).
ARGUMENTS = {
    "extension": _add_extension,
    "export": _add_export,
    "regrade": _add_regrade,
    "similarity": _add_similarity,
    "leaderboard": _add_leaderboard,
}
