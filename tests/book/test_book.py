"""The book: every page in the table of contents exists, has the parts a chapter needs, shows real
package code, and (once built) carries its figures.

Source checks always run. Checks of the built HTML run when ``_build/html`` exists (CI builds the
book first and sets ``COURSE_REQUIRE_BOOK=1`` so that they cannot be skipped there).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"

# chapter file -> the assignment it links to (None: no assignment goes with it)
CHAPTERS = {
    "01_rnn_bottleneck": None,
    "02_bahdanau_attention": "ex01",
    "03_self_attention": "ex01",
    "04_multi_head_attention": "ex02",
    "05_positional_encoding": "ex03",
    "06_encoder_layer": "ex04",
    "07_decoder": "ex05",
    "08_training": "ex06",
    "09_decoding": "ex08",
    "10_parameters": "ex07",
    "11_encoder_only": None,
    "12_decoder_only": None,
    "13_inside_the_model": None,
    "14_tokens": "ex10",
    "15_attention_at_length": "ex12",
    "16_modern_decoder": "ex11",
    "17_training_for_real": "ex13",
    "18_serving": "ex17",
    "19_experts": "ex16",
    "20_post_training": "ex14",
    "21_training_across_machines": "ex15",
    "22_text_to_chat": None,
    "23_data_and_scale": "ex18",
    "24_capstone": "ex19",
}
PART_ONE = [c for c in CHAPTERS if c < "07"]
PART_TWO = [c for c in CHAPTERS if c >= "07"]


def _toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", toc.get("chapters", [])))
    return files


def _source(chapter: str) -> str:
    return (ROOT / "book" / f"{chapter}.md").read_text()


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    files = _toc_files()
    for chapter in CHAPTERS:
        assert f"book/{chapter}" in files, f"{chapter} missing from _toc.yml"
    for entry in files:
        assert (ROOT / f"{entry}.md").exists() or (ROOT / f"{entry}.ipynb").exists(), entry


def test_a_page_reusing_a_run_is_read_after_it_in_the_same_parallel_chunk():
    """``make book`` reads the pages in BOOK_JOBS processes (default 2), each taking the next
    chunk of ``book/_ext/parallel_pages.py``'s ``book_chunks`` when it is free: a page that loads
    another page's saved run is read after it by the same process (else it trains the run
    itself), every page is read once, and the readers have more than one chunk to share."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from parallel_pages import REUSES, book_chunks
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    docnames = sorted(_toc_files())
    chunks = book_chunks(docnames, 2)
    assert sorted(name for chunk in chunks for name in chunk) == docnames
    where = {name: (i, j) for i, chunk in enumerate(chunks) for j, name in enumerate(chunk)}
    for page, makers in REUSES.items():
        reader = where[page]
        for maker in makers:
            chunk, place = where[maker]
            assert chunk == reader[0] and place < reader[1], f"{page} is not read after {maker}"
    the_book = set(docnames)
    loads = [page for page in REUSES if page not in the_book]
    assert not loads, f"REUSES names pages the book no longer has: {loads}"
    assert len(chunks) > len(docnames) // 2  # pages, not halves of the book


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_chapter_has_objectives_code_exercises_and_questions(chapter):
    text = _source(chapter)
    assert "This chapter is being written" not in text, f"{chapter} is still a placeholder"
    assert re.search(r"^#{2,3} .*learning objectives", text, re.I | re.M), chapter
    assert re.search(r"^#{2,3} .*check your understanding", text, re.I | re.M), chapter
    assert len(re.findall(r"^```\{code-cell\}", text, re.M)) >= 3, f"{chapter}: too little code"
    assert "import coursepkg" in text or "from coursepkg" in text, chapter
    if CHAPTERS[chapter] is not None:
        assert f"assignment-{CHAPTERS[chapter]}" in text, f"{chapter} does not link its assignment"


def _literalincludes(text: str) -> list[tuple[str, str | None]]:
    found = []
    pattern = r"^(`{3,}|:{3,})\{literalinclude\}\s+(\S+)\s*\n((?::[^\n]*\n)*)"
    for match in re.finditer(pattern, text, re.M):
        options = dict(re.findall(r"^:(\w+):\s*(.*)$", match.group(3), re.M))
        found.append((match.group(2), options.get("pyobject")))
    return found


def _defines(path: Path, dotted: str) -> bool:
    tree = ast.parse(path.read_text())
    nodes = tree.body
    for name in dotted.split("."):
        match = [
            n
            for n in nodes
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name == name
        ]
        if not match:
            return False
        nodes = match[0].body
    return True


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_chapter_shows_package_code_that_exists(chapter):
    """Package code is shown by literalinclude (not copied), and each include resolves."""
    includes = _literalincludes(_source(chapter))
    assert includes, f"{chapter} shows no package code with literalinclude"
    for target, pyobject in includes:
        path = (ROOT / "book" / target).resolve()
        assert path.exists(), f"{chapter}: literalinclude {target} does not exist"
        if pyobject:
            assert _defines(path, pyobject), f"{chapter}: {target} has no {pyobject}"


def test_interactive_explorations_in_both_parts():
    def count(chapters):
        return sum(len(re.findall(r"\bexplore\(", _source(c))) for c in chapters)

    assert count(PART_ONE) >= 2
    assert count(PART_TWO) >= 1


# ---------------------------------------------------------------- the built book


def _require_built() -> None:
    if not (HTML / "index.html").exists():
        if os.environ.get("COURSE_REQUIRE_BOOK"):
            pytest.fail(
                "COURSE_REQUIRE_BOOK is set but _build/html does not exist: run `make book`"
            )
        pytest.skip("the book is not built (run `make book`)")


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_built_chapter_carries_its_figures(chapter):
    _require_built()
    page = HTML / "book" / f"{chapter}.html"
    assert page.exists(), f"{chapter}.html was not built"
    source = ROOT / "book" / f"{chapter}.md"
    assert page.stat().st_mtime >= source.stat().st_mtime, (
        f"{page.name} is older than its source: rebuild the book with `make book`"
    )
    html = page.read_text()
    images = re.findall(r"<img [^>]*src=\"([^\"]+)\"", html)
    figures = [src for src in images if src.startswith("data:image") or "_images/" in src]
    assert figures, f"{chapter} has no figure"
    for src in figures:
        if not src.startswith("data:"):
            assert (page.parent / src).resolve().exists(), f"{chapter}: missing image {src}"
    assert "Traceback (most recent call last)" not in html, f"{chapter} shows an error"


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_built_chapter_offers_its_executed_notebook(chapter):
    """The page's download menu links its notebook, executed (book/_ext/offline_book.py)."""
    import nbformat

    _require_built()
    page = HTML / "book" / f"{chapter}.html"
    links = re.findall(r'<a href="([^"]+\.ipynb)"[^>]*download-notebook-button', page.read_text())
    assert links, f"{chapter}.html has no download button for its notebook"
    notebook = (page.parent / links[0]).resolve()
    assert notebook == (HTML / "_sources" / "book" / f"{chapter}.ipynb").resolve()
    cells = nbformat.read(notebook, as_version=4).cells
    code = [c for c in cells if c.cell_type == "code"]
    assert code and any(c.outputs for c in code), f"{notebook.name} was not executed"


def test_the_executed_notebook_is_found_beside_the_builders_folder():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from offline_book import executed_notebook
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    found = executed_notebook(Path("/x/_build/html"), "book/03_self_attention")
    assert found == Path("/x/_build/jupyter_execute/book/03_self_attention.ipynb")


# ---------------------------------------------------------------- code written to the column


def _book_line_length() -> int:
    import tomllib

    return tomllib.loads((ROOT / "book" / "ruff.toml").read_text())["line-length"]


def _format_book():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "format_book", ROOT / "scripts" / "format_book.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_book_code_cells_are_formatted_to_the_text_column(capsys):
    """Every code cell is as `ruff format` leaves it with book/ruff.toml, and no line is longer
    than its line length (the formatter does not break strings or comments)."""
    fmt = _format_book()
    width = _book_line_length()
    assert width <= 74, "a 1280-pixel window shows 75 characters of a hidden-input cell"
    too_long = [
        f"{cell.page.name}:{cell.start + i + 1} ({len(line)} characters)"
        for page in fmt.pages()
        for cell in fmt.code_cells(page)
        for i, line in enumerate(cell.code.splitlines())
        if len(line) > width
    ]
    assert not too_long, f"code lines longer than {width} characters: {too_long[:10]}"
    assert fmt.main(["--check"]) == 0, capsys.readouterr().out + (
        "\nrun `python scripts/format_book.py` to format the book's code cells"
    )


#: A code cell that trains: the package's loop, a recipe kept on disk, a scaling grid's run.
TRAINS = re.compile(r"\bfit\(|\bcache=\"|\bgrid_run\(")


def test_every_page_that_trains_pins_one_thread_before_it_does():
    """The book executes two pages at once on 2 cores, and its models are small: a page that
    trains on the kernel's default threads pays for the spinning of its second one (chapter
    24's baseline took 48.8 s of CPU on two threads and 8.6 s on one, beside a loaded build)."""
    fmt = _format_book()
    training, unpinned = [], []
    for page in sorted((ROOT / "book").glob("*.md")):
        cells = [cell.code for cell in fmt.code_cells(page)]
        trains = [i for i, code in enumerate(cells) if TRAINS.search(code)]
        pins = [i for i, code in enumerate(cells) if "torch.set_num_threads(1)" in code]
        if trains:
            training.append(page.stem)
            if not (pins and pins[0] <= trains[0]):
                unpinned.append(page.name)
    assert {"08_training", "12_decoder_only", "23_data_and_scale", "24_capstone"} <= set(training)
    assert not unpinned, f"pages that train before torch.set_num_threads(1): {unpinned}"


def test_the_cell_finder_sees_options_and_code():
    fmt = _format_book()
    cells = fmt.code_cells(ROOT / "book" / "08_training.md")
    assert len(cells) == len(re.findall(r"^```\{code-cell\}", _source("08_training"), re.M))
    assert all(not cell.code.startswith((":", "---")) for cell in cells)
    assert any("train_date_translator(" in cell.code for cell in cells)


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_built_chapter_keeps_one_line_per_progress_bar(chapter):
    """A training's progress bar ends as one line in the static page: its final state, not the
    intermediate redraws (which would start with the bar at 0%)."""
    _require_built()
    text = re.sub(r"<[^>]+>", "", (HTML / "book" / f"{chapter}.html").read_text())
    bars = re.findall(r"^.*\d+%\|.*\| *\d+/\d+ \[.*$", text, re.M)
    assert all(re.search(r"\b100%\|", bar) for bar in bars), f"{chapter}: {bars[:3]}"
    width = _book_line_length()
    assert all(len(bar) <= width for bar in bars), f"{chapter}: bars wider than the column"
    source = _source(chapter)
    # a page that trains (not one that reuses a saved run) shows its bar
    trains = re.search(r"(?<![\w.])fit\(", source) or (
        "train_date_translator(" in source and 'cache="reuse"' not in source
    )
    if trains and "progress=False" not in source:
        assert bars, f"{chapter} trains but shows no progress bar"


def test_in_a_notebook_the_progress_bar_is_one_display_updated_in_place(monkeypatch):
    """fit() in a notebook shows its bar as one text display that each redraw replaces, so the
    executed page keeps the final state only (and no line wider than the column)."""
    import IPython.display
    import torch

    import coursepkg.chapters.train as train

    shown: list[tuple[str, str]] = []

    class Handle:
        def update(self, data, raw=False):
            shown.append(("update", data["text/plain"]))

    def display(data, raw=False, display_id=False):
        shown.append(("display", data["text/plain"]))
        return Handle()

    monkeypatch.setattr(train, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    model = torch.nn.Linear(2, 1)
    evaluate = lambda m: {"held-out": 1.0, "a_long_metric_name": 2.0}  # noqa: E731
    train.fit(
        model,
        [torch.ones(4, 2)],
        lambda m, b: m(b).pow(2).mean(),
        steps=50,
        eval_fn=evaluate,
        eval_every=25,
        desc="a rather long description of the run",
    )
    assert [kind for kind, _ in shown].count("display") == 1  # one output...
    assert all(kind == "update" for kind, _ in shown[1:])  # ...redrawn in place
    final = shown[-1][1]
    assert "100%" in final and "50/50" in final and "loss=" in final
    assert len(final) <= train.NOTEBOOK_COLUMNS


def test_every_control_is_named_by_what_it_shows():
    """WCAG 2.5.3 (axe-core's label-content-name-mismatch): the markup the theme and MyST-NB write
    today is what the book's extension rewrites (a version that changes it fails here, not
    silently in the built pages), and each rewritten name contains the text shown."""
    import re

    import myst_nb
    import pydata_sphinx_theme

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from offline_book import LABEL_IN_NAME, label_in_name
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    theme = Path(pydata_sphinx_theme.__file__).parent / "theme" / "pydata_sphinx_theme"
    written = " ".join(
        (theme / "components" / name).read_text()
        for name in ("search-button-field.html", "theme-switcher.html")
    )
    written = re.sub(r"\{\{ _\('([^']*)'\) \}\}", r"\1", written)  # the English strings
    written = re.sub(r"\s+", " ", written)
    written += (Path(myst_nb.__file__).parent / "sphinx_.py").read_text()
    for before, _after in LABEL_IN_NAME:
        assert before in written, f"the theme or MyST-NB no longer writes {before!r}"
    page = " ".join(before for before, _after in LABEL_IN_NAME)
    fixed = label_in_name(page)
    assert 'aria-label="Search"' not in fixed  # named by its text, "Search Ctrl+K"
    assert "Toggle hidden content" not in fixed  # named by "Show code cell source"
    colour = re.search(r'theme-switch-button[^>]*aria-label="([^"]*)"', fixed).group(1)
    assert all(mode in colour for mode in ("Light", "Dark", "System Settings")), colour


def test_bibliography_entries_are_list_items():
    """docutils writes a bibliography as a role="list" holding role="doc-biblioentry" entries, which
    accessibility checkers do not count as list items (axe-core's aria-required-children); the
    book's extension gives each entry the listitem role."""
    from html.parser import HTMLParser

    from docutils.core import publish_parts

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from offline_book import citations_as_list_items
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    rst = ".. [one] A first reference.\n.. [two] A second reference.\n"
    body = publish_parts(rst, writer_name="html5")["body"]
    assert 'role="doc-biblioentry"' in body  # what docutils writes

    class Children(HTMLParser):
        """The roles of the direct children of each role="list" element."""

        def __init__(self):
            super().__init__()
            self.depth, self.list_depth, self.roles = 0, None, []

        def handle_starttag(self, tag, attrs):
            role = dict(attrs).get("role")
            if self.list_depth is not None and self.depth == self.list_depth + 1:
                self.roles.append(role)
            if role == "list":
                self.list_depth = self.depth
            self.depth += 1

        def handle_endtag(self, tag):
            self.depth -= 1
            if self.depth == self.list_depth:
                self.list_depth = None

    parser = Children()
    parser.feed(citations_as_list_items(body))
    assert parser.roles == ["listitem", "listitem"], parser.roles
