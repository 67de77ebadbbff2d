"""Make the students' notebooks from the instructors' ones, and prove nothing secret leaks.

``solutions/<id>/<id>.ipynb`` is nbgrader's *source* (solutions between ``### BEGIN SOLUTION`` and
``### END SOLUTION``, hidden tests between ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN
TESTS``, model answers in manually graded cells); ``exercises/<id>/<id>.ipynb`` is its *release*,
made by nbgrader's own ``generate_assignment`` converter. ``coursepkg release`` (or ``make
release``) regenerates it; the test suite regenerates it in a temporary directory to show the
committed release is current, and scans it for leaks with :func:`find_leaks`.
"""

from __future__ import annotations

import glob
import importlib.metadata
import logging
import re
import shutil
from pathlib import Path

import nbformat
from nbconvert.exporters import HTMLExporter
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback

__all__ = [
    "FeedbackExporter",
    "ReleaseFeedback",
    "find_leaks",
    "generate_release",
    "secret_lines",
]

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
    return sorted((root / release).glob(pattern))


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


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback page with its math typeset offline.

    nbconvert's template loads MathJax from a CDN, so a student reading feedback without a
    network sees raw LaTeX. This exporter swaps that script for MathJax 3 inlined into the page
    (about 2 MB, the price of a page that works anywhere). Selected in ``nbgrader_config.py``
    with ``c.GenerateFeedback.exporter_class``; nbgrader's template is otherwise unchanged.
    """

    def from_notebook_node(self, nb, resources=None, **kw):  # noqa: ANN001, ANN201 - nbconvert's API
        """Export as nbgrader does, then replace the CDN's MathJax with the inlined copy."""
        output, resources = super().from_notebook_node(nb, resources, **kw)
        mathjax = _offline_mathjax()
        if mathjax is None:
            log.warning("MathJax for offline feedback not found; the feedback loads it from a CDN")
            return output, resources
        return _CDN_MATHJAX.sub(lambda _: mathjax, output, count=1), resources
