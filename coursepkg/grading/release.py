"""Make the students' notebooks from the instructors' ones, and prove nothing secret leaks.

``solutions/<id>/<id>.ipynb`` is nbgrader's *source* (solutions between ``### BEGIN SOLUTION`` and
``### END SOLUTION``, hidden tests between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN
TESTS``, model answers in manually graded cells); ``exercises/<id>/<id>.ipynb`` is its *release*,
made by nbgrader's own ``generate_assignment`` converter. ``coursepkg release`` (or ``make
release``) regenerates it; the test suite regenerates it in a temporary directory to show the
committed release is current, and scans it for leaks with :func:`find_leaks`. Every released
notebook states the assignment's AI-use policy under its title (:func:`ai_policy`: the course's
``ai_policy.md``, else :data:`DEFAULT_AI_POLICY`).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import logging
import re
import secrets
import shutil
import zipfile
from pathlib import Path

import nbformat
from jinja2 import BytecodeCache
from nbconvert.exporters import HTMLExporter
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback

__all__ = [
    "AI_POLICY_FILE",
    "DEFAULT_AI_POLICY",
    "FeedbackExporter",
    "ReleaseFeedback",
    "ai_policy",
    "build_student_kit",
    "course_secret",
    "find_leaks",
    "generate_release",
    "hide_hidden_test_outputs",
    "insert_ai_policy",
    "salt_hidden_seeds",
    "salted_seed",
    "secret_lines",
]

#: The course's secret, in the course folder (never committed, never in the student kit).
SECRET_FILE = "course_secret.txt"
#: The course's AI-use policy, in the course folder; ``ai_policy/<assignment>.md`` for one
#: assignment's own.
AI_POLICY_FILE = "ai_policy.md"
#: The AI-use policy of a course that sets none (its release says it is the default).
DEFAULT_AI_POLICY = (
    "You may use AI assistants (chat models, code completion) as you would ask a tutor: to "
    "explain an idea of the notes, an error message or a library function. The code and the "
    "written answers you hand in must be your own work: do not give an AI tool this exercise, "
    "its stubs or its checks to write the answer for you, and do not paste code or text that an "
    "AI tool wrote into an answer cell. If an AI tool helped you, say which one and how in a "
    "comment at the top of your answer (it costs no points). The checks grade what your code "
    "does, and a person reads your written answers."
)
_AI_HEADING = "## AI-use policy for this assignment"

_BLOCK = re.compile(
    r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", flags=re.DOTALL
)  # a region nbgrader removes from the release
# Lines this short or this generic occur in stubs too; they prove nothing when found.
_MIN_LEN = 12


def generate_release(
    root: str | Path,
    assignment: str = "*",
    *,
    source: str = "solutions",
    release: str = "exercises",
    db_url: str | None = None,
) -> list[Path]:
    """Run nbgrader's ``generate_assignment`` on ``root/source`` into ``root/release``.

    Runs in-process, replacing the assignments' previous release (like ``nbgrader
    generate_assignment --force``). With ``db_url`` it also records each assignment, its
    notebooks and their graded cells in that gradebook, as nbgrader's command does, which
    ``nbgrader release_assignment``, ``autograde`` and ``coursepkg grade`` need; without it no
    gradebook is touched (``--no-db``).

    Args:
        root: the course directory (the repository root).
        assignment: an assignment id, or ``"*"`` for every assignment in ``source``.
        source: nbgrader's source directory, relative to ``root``.
        release: nbgrader's release directory, relative to ``root`` (or absolute).
        db_url: the gradebook's SQLAlchemy URL, or None for no gradebook.

    Returns:
        The released notebooks, sorted.
    """
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    root = Path(root).resolve()
    if not (root / source).is_dir():
        raise ValueError(f"source directory {root / source} does not exist")
    ids = sorted(p.name for p in (root / source).iterdir() if p.is_dir())
    if assignment != "*" and assignment not in ids:
        raise ValueError(f"assignment {assignment!r} not in {root / source} (have: {ids})")
    for aid in ids if assignment == "*" else [assignment]:
        # Stale files from an earlier release (a renamed notebook) must not survive.
        shutil.rmtree(root / release / aid, ignore_errors=True)
    config = Config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.source_directory = source
    config.CourseDirectory.release_directory = release
    if db_url is None:
        config.GenerateAssignment.no_database = True
        config.SaveCells.enabled = False
    else:
        config.CourseDirectory.db_url = db_url
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = assignment
    converter = GenerateAssignment(coursedir=coursedir, config=config)
    converter.force = True
    converter.start()
    pattern = f"{assignment}/*.ipynb"
    released = sorted((root / release).glob(pattern))
    for notebook in released:
        insert_ai_policy(notebook, *ai_policy(root, notebook.parent.name))
    return released


def ai_policy(root: str | Path, assignment: str | None = None) -> tuple[str, bool]:
    """The AI-use policy students read in ``assignment``'s release (None: the course's).

    ``ai_policy/<assignment>.md`` in the course folder is that assignment's own; else
    ``ai_policy.md`` is the course's; else :data:`DEFAULT_AI_POLICY`.

    Args:
        root: the course folder.
        assignment: the assignment id, or None for the course's policy.

    Returns:
        The text (Markdown) and whether it is the default.
    """
    root = Path(root)
    own = [root / "ai_policy" / f"{assignment}.md"] if assignment else []
    for path in [*own, root / AI_POLICY_FILE]:
        if path.is_file() and path.read_text(encoding="utf-8").strip():
            return path.read_text(encoding="utf-8").strip(), False
    return DEFAULT_AI_POLICY, True


def insert_ai_policy(notebook: str | Path, text: str, default: bool) -> None:
    """Put the AI-use policy in a released notebook, in place: a locked Markdown cell after
    the title (the first cell, when it is a heading), replacing one put there before.

    Args:
        notebook: the released notebook.
        text: the policy (Markdown).
        default: whether it is :data:`DEFAULT_AI_POLICY` (the cell then says so).
    """
    nb = nbformat.read(str(notebook), as_version=4)
    nb.cells = [
        c for c in nb.cells if "ai_policy" not in c.get("metadata", {}).get("coursepkg", {})
    ]
    note = (
        "\n\n*This is the course's default policy (coursepkg's): your instructor has not set one "
        "of their own.*"
        if default
        else ""
    )
    cell = nbformat.v4.new_markdown_cell(f"{_AI_HEADING}\n\n{text}{note}")
    cell.metadata.update(
        deletable=False, editable=False, coursepkg={"ai_policy": "default" if default else "course"}
    )
    if nb.get("nbformat_minor", 0) >= 5:
        cell["id"] = "ai-use-policy"  # the same in every release (nbformat's would be random)
    else:
        cell.pop("id", None)
    titled = bool(nb.cells) and nb.cells[0].cell_type == "markdown"
    nb.cells.insert(1 if titled and nb.cells[0].source.startswith("#") else 0, cell)
    nbformat.write(nb, str(notebook))


def secret_lines(source_notebook: str | Path) -> list[str]:
    """The lines of a source notebook that students must never see.

    Solution code, hidden tests and the model answers of manually graded cells, minus lines
    that also occur in the notebook's public text (stub signatures, docstrings) and lines
    shorter than 12 characters (``return x``), which would prove nothing when found.
    """
    nb = nbformat.read(str(source_notebook), as_version=4)
    secret: list[str] = []
    public: set[str] = set()
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        blocks = [m.group(2) for m in _BLOCK.finditer(cell.source)]
        if cell.cell_type == "markdown" and meta.get("solution") and not blocks:
            blocks = [cell.source]  # a model answer: nbgrader replaces the whole cell
        secret.extend(line.strip() for block in blocks for line in block.splitlines())
        outside = _BLOCK.sub("", cell.source) if blocks != [cell.source] else ""
        public.update(line.strip() for line in outside.splitlines())
    return sorted({line for line in secret if len(line) >= _MIN_LEN and line not in public})


def find_leaks(source_notebook: str | Path, released_notebook: str | Path) -> list[str]:
    """Secret lines of ``source_notebook`` that appear in ``released_notebook``.

    Args:
        source_notebook: the instructors' notebook (solutions, hidden tests).
        released_notebook: the students' notebook made from it.

    Returns:
        The leaked lines (empty when nothing leaks).
    """
    nb = nbformat.read(str(released_notebook), as_version=4)
    released = {line.strip() for cell in nb.cells for line in cell.source.splitlines()}
    return [line for line in secret_lines(source_notebook) if line in released]


#: What nbgrader's ``ClearHiddenTests`` looks for (its default delimiter).
HIDDEN_MARK = "BEGIN HIDDEN TESTS"
_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n?(.*?)(?:### END HIDDEN TESTS|\Z)", flags=re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def hide_hidden_test_outputs(nb: nbformat.NotebookNode) -> int:
    """Make the outputs of every cell holding hidden tests safe to show the student, in place.

    nbgrader's ``ClearHiddenTests`` removes the hidden tests from a cell's source, not from its
    outputs: when the student's function is missing (their cell raised, did not parse, or
    defines another name), the hidden cell's traceback quotes the hidden call, arguments and
    seed included. Here an error keeps only ``ename: evalue`` (a check's message is its
    ``evalue``), and any other output loses the lines that are lines of the hidden tests (a
    warning quotes its source line). Run before ``ClearHiddenTests``, while the source still
    shows which lines are hidden.

    Args:
        nb: a graded notebook (the feedback's copy).

    Returns:
        The number of outputs changed.
    """
    changed = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code" or HIDDEN_MARK not in cell.get("source", ""):
            continue
        hidden = {
            line.strip()
            for block in _HIDDEN.findall(cell.source)
            for line in block.splitlines()
            if len(line.strip()) >= 4
        }
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                short = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
                if output.get("traceback") != short:
                    output["traceback"], changed = short, changed + 1
                continue
            texts = [("text", output)] if "text" in output else []
            texts += [(k, output["data"]) for k in output.get("data", {}) if k.startswith("text/")]
            for key, holder in texts:
                text = holder[key] if isinstance(holder[key], str) else "".join(holder[key])
                kept = [ln for ln in text.split("\n") if _ANSI.sub("", ln).strip() not in hidden]
                if len(kept) < len(text.split("\n")):
                    holder[key], changed = "\n".join(kept), changed + 1
    return changed


def course_secret(root: str | Path, create: bool = False) -> str:
    """The course's secret (``course_secret.txt`` in the course folder), or ``""`` without one.

    Args:
        root: the course folder.
        create: write a new random secret first if there is none (``coursepkg release`` does).
    """
    path = Path(root) / SECRET_FILE
    if create and not path.is_file():
        path.write_text(secrets.token_hex(16) + "\n", encoding="utf-8")
        path.chmod(0o600)
    return path.read_text(encoding="utf-8").strip() if path.is_file() else ""


def salted_seed(secret: str, grade_id: str, seed: int) -> int:
    """The seed a hidden test runs with: its source's ``seed`` mixed with the course's secret
    and the test cell's id (SHA-256), so knowing the public seed does not give the inputs."""
    digest = hashlib.sha256(f"{secret}:{grade_id}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 2**31


def salt_hidden_seeds(source: str, secret: str, grade_id: str) -> str:
    """``source`` with every ``seed=<int>`` inside its hidden-test regions replaced by its
    :func:`salted_seed` (outside those regions nothing changes)."""

    def salt(region: re.Match) -> str:
        def one(seed: re.Match) -> str:
            return f"seed={salted_seed(secret, grade_id, int(seed[1]))}"

        return re.sub(r"\bseed=(\d+)", one, region[0])

    return _HIDDEN.sub(salt, source)


#: What a student reads first in the kit.
_KIT_README = """# {name}: what students get

This kit holds what a student of the course needs, and nothing that grades them:

- `coursepkg/` and `pyproject.toml`: the course's package (the reference model, the exercise
  stubs and the checks with their public tests).
- `exercises/`: the released assignments ({count} notebooks), as nbgrader released them.
- `jupyter/student/`: the settings of the students' JupyterLab (nbgrader's Validate button and
  Assignment List, the course's hints).

Install it once, in a virtual environment of Python 3.10 or later, from the folder this file is
in:

    python -m venv .venv && .venv/bin/pip install '.[course]'

Then start JupyterLab with the course's settings (COURSE_EXCHANGE: the exchange folder your
instructor names, for the Assignment List):

    JUPYTER_CONFIG_PATH=$PWD/jupyter/student COURSE_EXCHANGE=/srv/nbgrader/exchange \\
      .venv/bin/jupyter lab --notebook-dir=exercises

Fill in the cells marked `# YOUR CODE HERE`; `.venv/bin/coursepkg check
exercises/<id>/<id>.ipynb` runs a notebook as the grader will and lists the visible tests. The
hidden tests, the solutions and the model answers are not here: they stay with the instructor.

## AI-use policy

{policy}

Each notebook states the policy of its assignment again, under its title.
"""


def build_student_kit(root: str | Path, out: str | Path, *, release: str = "exercises") -> dict:
    """Write the student kit, a zip of what a student installs for a graded course: the
    package (``coursepkg/``, ``pyproject.toml``, ``README.md``), the released notebooks
    (``exercises/``), the students' Jupyter settings (``jupyter/student/``) and a README.

    Never ``solutions/``, the course's secret, a gradebook or students' work: the kit is built
    from named folders only, every released notebook is checked against its source for leaked
    lines (:func:`find_leaks`) and hidden-test or solution markers, and the written zip is
    checked again for any path outside those folders.

    Args:
        root: the course folder (with ``exercises/``; ``solutions/`` for the leak check).
        out: the zip file to write.
        release: the release folder, relative to ``root``.

    Returns:
        ``{"path", "notebooks", "files"}``: the zip, the released notebooks, all files.

    Raises:
        ValueError: no release, a leaked line or marker, or no package source to ship.
    """
    root = Path(root).resolve()
    package = Path(__file__).resolve().parents[1]  # this installation's coursepkg/
    project = package.parent
    notebooks = sorted((root / release).glob("*/*.ipynb"))
    if not notebooks:
        raise ValueError(f"{root / release} holds no released notebook: run `coursepkg release`")
    for notebook in notebooks:
        source = root / "solutions" / notebook.parent.name / notebook.name
        text = notebook.read_text(encoding="utf-8")
        leaked = find_leaks(source, notebook) if source.is_file() else []
        markers = [m for m in ("BEGIN SOLUTION", HIDDEN_MARK, "END HIDDEN TESTS") if m in text]
        if leaked or markers:
            raise ValueError(
                f"{notebook} leaks {len(leaked)} secret line(s) and {markers}: "
                "run `coursepkg release` again; no kit was written"
            )
    if not (project / "pyproject.toml").is_file():
        raise ValueError(
            f"no pyproject.toml beside {package}: build the kit from the course's "
            "repository (a clone, or the installed editable checkout)"
        )
    files: dict[str, Path] = {"pyproject.toml": project / "pyproject.toml"}
    if (project / "README.md").is_file():
        files["README.md"] = project / "README.md"
    trees = [(package, "coursepkg"), (root / release, "exercises")]
    trees.append((project / "jupyter" / "student", "jupyter/student"))
    for folder, name in trees:
        for path in sorted(folder.rglob("*")):
            parts = path.relative_to(folder).parts
            if (
                path.is_file()
                and not {"__pycache__", ".ipynb_checkpoints"} & set(parts)
                and (path.suffix != ".pyc")
            ):
                files["/".join((name, *parts))] = path
    top = Path(out).stem
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as kit:
        for name, path in files.items():
            kit.write(path, f"{top}/{name}")
        policy, default = ai_policy(root)
        policy += "\n\n*This is the course's default policy (coursepkg's).*" if default else ""
        readme = _KIT_README.format(name=top, count=len(notebooks), policy=policy)
        kit.writestr(f"{top}/STUDENTS.md", readme)
    with zipfile.ZipFile(out) as kit:
        names = [n.split("/", 1)[1] for n in kit.namelist()]
    allowed = ("coursepkg/", "exercises/", "jupyter/student/")
    stray = [
        n
        for n in names
        if not n.startswith(allowed) and n not in ("pyproject.toml", "README.md", "STUDENTS.md")
    ]
    if stray or any(Path(n).name == SECRET_FILE for n in names):
        Path(out).unlink()
        raise ValueError(f"the kit would hold {stray}: nothing was written")
    return {"path": Path(out), "notebooks": len(notebooks), "files": len(names)}


class ReleaseFeedback(ExchangeReleaseFeedback):
    """nbgrader's ``release_feedback``, which skips (with a warning) instead of crashing on a
    student who did not hand in through the exchange.

    nbgrader files released feedback under a hash of the secret the exchange gave the
    submission; one collected the ``zip_collect`` way has no secret, so nbgrader cannot deliver
    its feedback (and its own command stops at the first such student). Their feedback stays in
    ``feedback/<student>/<assignment>/`` to hand back another way. Selected in
    ``nbgrader_config.py`` with ``c.ExchangeFactory.release_feedback``.
    """

    def copy_files(self) -> None:
        """Release every student's feedback that the exchange can deliver."""
        pattern = self.coursedir.format_path(
            self.coursedir.feedback_directory, "*", self.coursedir.assignment_id
        )
        skipped = sorted(
            folder.parent.name
            for folder in map(Path, glob.glob(pattern))
            if any(folder.glob("*.html")) and not (folder / "submission_secret.txt").is_file()
        )
        if skipped:
            self.log.warning(
                "Not releasing the feedback of %s on %s through the exchange: they did not "
                "submit through it (no submission_secret.txt); hand back the HTML files in "
                "%s/<student>/%s another way",
                ", ".join(skipped),
                self.coursedir.assignment_id,
                self.coursedir.feedback_directory,
                self.coursedir.assignment_id,
            )
            excluded = set(filter(None, (self.coursedir.student_id_exclude or "").split(",")))
            self.coursedir.student_id_exclude = ",".join(sorted(excluded | set(skipped)))
        super().copy_files()


log = logging.getLogger(__name__)

# The script tag nbconvert's classic template writes: MathJax 2 from a CDN.
_CDN_MATHJAX = re.compile(
    r'<script src="https://cdnjs\.cloudflare\.com/ajax/libs/mathjax/[^"]*">\s*</script>'
)
# MathJax 3 typesets the same delimiters; the SVG output needs no font files.
_MATHJAX_CONFIG = (
    "window.MathJax = {tex: {inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], "
    "displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']], processEscapes: true, "
    "processEnvironments: true}, svg: {fontCache: 'global'}};"
)


def _offline_mathjax() -> str | None:
    """The script tags that typeset math with the MathJax copy installed with the course's
    environment (sphinx-mathjax-offline, which the book uses too), or None without it."""
    try:
        dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    except importlib.metadata.PackageNotFoundError:
        return None
    script = Path(str(dist.locate_file("sphinx-mathjax-offline/static/mathjax/tex-svg.js")))
    if not script.is_file():
        return None
    code = script.read_text(encoding="utf-8")
    if "</script" in code:  # cannot be inlined safely
        return None
    return f"<script>{_MATHJAX_CONFIG}</script>\n<script>{code}</script>"


class _CompiledTemplates(BytecodeCache):
    """Jinja's compiled templates, kept for the life of the process.

    Why it exists: nbgrader makes a new exporter, hence a new Jinja environment, for each
    student's feedback, and each compiled nbconvert's nine templates again (about 0.2 s of CPU a
    student). Jinja checks each template's source against the checksum kept with its code, so
    an edited template is compiled anew; the key holds the environment's async flag, the one
    setting of ours that changes the compiled code.
    """

    def __init__(self) -> None:
        self._code: dict[tuple[str, bool], bytes] = {}

    def load_bytecode(self, bucket) -> None:  # noqa: ANN001 - jinja2's Bucket
        code = self._code.get((bucket.key, bucket.environment.is_async))
        if code is not None:
            bucket.bytecode_from_string(code)  # dropped by Jinja if the checksum differs

    def dump_bytecode(self, bucket) -> None:  # noqa: ANN001 - jinja2's Bucket
        self._code[(bucket.key, bucket.environment.is_async)] = bucket.bytecode_to_string()


_COMPILED_TEMPLATES = _CompiledTemplates()


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback page with its math typeset offline.

    nbconvert's template loads MathJax from a CDN, so a student reading feedback without a
    network sees raw LaTeX. This exporter swaps that script for MathJax 3 inlined into the page
    (about 2 MB, the price of a page that works anywhere). Selected in ``nbgrader_config.py``
    with ``c.GenerateFeedback.exporter_class``; nbgrader's template is otherwise unchanged.
    """

    def _create_environment(self):  # noqa: ANN202 - nbconvert's API
        """nbconvert's Jinja environment, its compiled templates shared by every exporter of
        this process (:class:`_CompiledTemplates`)."""
        environment = super()._create_environment()
        environment.bytecode_cache = _COMPILED_TEMPLATES
        return environment

    def from_notebook_node(self, nb, resources=None, **kw):  # noqa: ANN001, ANN201 - nbconvert's API
        """Export as nbgrader does, with no output of a hidden-test cell that shows its code
        (:func:`hide_hidden_test_outputs`, before any preprocessor), then replace the CDN's
        MathJax with the inlined copy."""
        hide_hidden_test_outputs(nb)
        output, resources = super().from_notebook_node(nb, resources, **kw)
        mathjax = _offline_mathjax()
        if mathjax is None:
            log.warning("MathJax for offline feedback not found; the feedback loads it from a CDN")
            return output, resources
        return _CDN_MATHJAX.sub(lambda _: mathjax, output, count=1), resources
