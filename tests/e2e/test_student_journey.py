"""A student's whole journey in JupyterLab and an instructor's whole term, in a real browser.

One test drives headless Chromium (Debian's ``chromium``, through tests/fixtures/browser.py) on
127.0.0.1:

1. the instructor releases ex01 to a local exchange in a temporary folder (``coursepkg
   release``, ``nbgrader release_assignment``);
2. the student's JupyterLab (``make lab``'s configuration, jupyter/student/, with a token) lists
   it in the Assignment List; the student fetches it and opens it; the tab is not marked unsaved;
3. a classic mistake typed through the editor (softmax over the queries) fails its check with
   the message that names it; the correct answers pass; the written answer is typed; the
   notebook is saved, validated, checked whole from its last cell, and submitted;
4. the instructor runs ``nbgrader collect`` and ``coursepkg grade``; the written answer is graded
   in the formgrader (a second server, the instructor's); ``coursepkg grade`` again keeps that
   grade settled; ``nbgrader generate_feedback`` and ``release_feedback``;
5. the student fetches the feedback and opens it: it shows the hand-graded score and the total.

Each step is screenshotted in the light and the dark theme (JupyterLab follows the browser's
colour scheme here) into ``_build/student-journey/``, with ``timings.json``. Every wait is for
a condition (a server answering, a cell's output, a file), never a fixed sleep; both servers
and the browser are stopped at the end. Skips without Chromium unless COURSE_REQUIRE_BROWSER is
set.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import processes
import pytest
from browser import Browser, find_chromium
from processes import Command, Stuck, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SHOTS = ROOT / "_build" / "student-journey"
AID = "ex01_attention"
TOKEN = "journey-token"

# What the student types. The mistake: the softmax over the queries (dim=-2) instead of the keys.
WRONG = """def scaled_dot_product_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ value, weights
"""
RIGHT = """def scaled_dot_product_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ value, weights
"""
ADDITIVE = """def additive_score(query, keys, W_q, W_k, v):
    return torch.tanh((query @ W_q.T)[:, None, :] + keys @ W_k.T) @ v
"""
WRITTEN = (
    "A dot product of two D_k-dimensional vectors with unit-variance entries has variance D_k; "
    "unscaled, the softmax saturates and its gradients vanish. Dividing by sqrt(D_k) restores "
    "unit variance."
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], cwd: Path, env: dict, timeout: float = 600) -> str:
    done = processes.run(args, cwd=cwd, env=env, idle=timeout, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{output[-3000:]}"
    return output


@contextmanager
def _server(args: list[str], env: dict, log: Path, port: int, cwd: Path):
    """A Jupyter server on 127.0.0.1:port started in ``cwd``, stopped (its process group) on
    exit. nbgrader's server extensions read ``nbgrader_config.py`` from the folder the server
    was started in, as when a user types ``jupyter lab`` there."""
    proc = Command(
        [
            str(BIN / "jupyter"),
            *args,
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--ServerApp.token={TOKEN}",
            "--ServerApp.port_retries=0",
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        what=f"jupyter {args[0]} on port {port}",
        env=env,
        cwd=cwd,
    )
    url = f"http://127.0.0.1:{port}/api/status?token={TOKEN}"

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the Jupyter server exited:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        # The server's log grows while it starts: a bound on silence, not on its start.
        wait_until(
            answers,
            f"the Jupyter server on port {port} to answer",
            idle=180,
            progress=proc.sizes,
            poll=0.3,
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.end(grace=30)
        out, err = proc.output()
        log.write_text(out + err, encoding="utf-8")


def _assert_loopback(urls: list[str]) -> None:
    """Fail on any request to another host than 127.0.0.1 (a CDN would not answer offline)."""
    local = ("http://127.0.0.1:", "ws://127.0.0.1:", "data:", "blob:", "about:")
    away = [u for u in urls if not u.startswith(local)]
    assert urls and not away, f"requests that left loopback: {away}"


class Journey:
    """The browser, the screenshots (light and dark) and the time each step took."""

    def __init__(self, browser: Browser) -> None:
        self.b = browser
        self.timings: dict[str, float] = {}
        self._step = 0
        self._start = time.monotonic()

    # -- bookkeeping -----------------------------------------------------------------------
    def step(self, name: str, lab: bool = True) -> None:
        """End a step: record its time, screenshot it in the light and the dark theme."""
        self.timings[name] = round(time.monotonic() - self._start, 1)
        self._step += 1
        for theme in ("light", "dark"):
            if lab:
                self._theme(theme)
            self.b.screenshot(SHOTS / f"{self._step:02d}-{name}-{theme}.png", full_page=False)
        if lab:
            self._theme("light")
        self._start = time.monotonic()

    def _theme(self, theme: str) -> None:
        # JupyterLab's adaptive theme follows the browser's colour scheme.
        self.b.send(
            "Emulation.setEmulatedMedia",
            features=[{"name": "prefers-color-scheme", "value": theme}],
        )
        light = "true" if theme == "light" else "false"
        assert self.wait(f"document.body.dataset.jpThemeLight === '{light}'", 60), theme
        # The theme's stylesheet is applied once the body's background colour has changed.
        want = "dark" if theme == "dark" else "light"
        assert self.wait(
            "(() => { const c = getComputedStyle(document.body).backgroundColor"
            ".match(/\\d+/g).map(Number); const l = c[0] + c[1] + c[2];"
            f" return '{want}' === 'dark' ? l < 300 : l > 450; }})()",
            60,
        ), f"the {theme} theme was not applied"
        # JupyterLab covers the page with its splash screen while it changes the theme.
        assert self.wait("!document.querySelector('#jupyterlab-splash')", 60), "splash stays"

    # -- JupyterLab ------------------------------------------------------------------------
    def wait(self, expression: str, timeout: float = 120) -> bool:
        return self.b.wait_for(expression, timeout)

    def js(self, expression: str, timeout: float = 60):
        return self.b.evaluate(expression, timeout)

    def command(self, name: str, args: dict | None = None) -> None:
        self.js(
            f"window.jupyterapp.commands.execute({json.dumps(name)}, "
            f"{json.dumps(args or {})}).then(() => true)",
            120,
        )

    def click(self, selector: str, text: str | None = None) -> None:
        """Click the first visible element matching ``selector`` (and containing ``text``)."""
        find = (
            f"[...document.querySelectorAll({json.dumps(selector)})].find(e => e.offsetParent"
            f" && ({json.dumps(text)} === null || e.textContent.includes({json.dumps(text)})))"
        )
        assert self.wait(f"!!{find}", 120), f"nothing to click: {selector} {text}"
        box = self.js(
            f"(() => {{ const e = {find}; e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.b.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def key(self, key: str, code: str, keycode: int, modifiers: int = 0) -> None:
        for kind in ("rawKeyDown", "keyUp"):
            self.b.send(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=code,
                windowsVirtualKeyCode=keycode,
                modifiers=modifiers,
            )

    NB = "window._nb.content"  # the notebook panel, kept when it was opened

    def cell_source(self, index: int) -> str:
        return self.js(f"{self.NB}.widgets[{index}].model.sharedModel.getSource()")

    def cell_index(self, grade_id: str) -> int:
        index = self.js(
            f"{self.NB}.widgets.findIndex(c => (c.model.getMetadata('nbgrader') || {{}})"
            f".grade_id === {json.dumps(grade_id)})"
        )
        assert index >= 0, grade_id
        return index

    def type_into(self, index: int, text: str) -> None:
        """Type ``text`` over the content of cell ``index``, through its editor."""
        self.js(f"{self.NB}.activeCellIndex = {index}; {self.NB}.mode = 'edit'; true")
        self.click(f".jp-Notebook .jp-Cell:nth-child({index + 1}) .cm-content")
        assert self.wait(f"{self.NB}.widgets[{index}].editor.hasFocus()", 30), (
            "the cell's editor did not get the focus"
        )
        self.key("a", "KeyA", 65, modifiers=2)  # Ctrl+A: select the cell's text
        self.b.send("Input.insertText", text=text)
        assert self.cell_source(index).strip() == text.strip(), "the editor did not take the text"

    def run_cell(self, index: int) -> None:
        """Run one cell (Ctrl+Enter) and wait until it has finished."""
        self.js(
            f"{self.NB}.activeCellIndex = {index}; {self.NB}.mode = 'command';"
            f" {self.NB}.node.focus(); true"
        )
        before = self.js(f"{self.NB}.widgets[{index}].model.executionCount ?? -1")
        self.key("Enter", "Enter", 13, modifiers=2)  # Ctrl+Enter: run, stay on the cell
        cell = f"{self.NB}.widgets[{index}]"
        if self.js(f"{cell}.model.type") == "code":
            assert self.wait(
                f"{cell}.model.executionCount !== null && {cell}.model.executionCount !== {before}"
                f" && window._nb.sessionContext.session.kernel.status"
                " === 'idle'",
                300,
            ), f"cell {index} did not finish"

    def output_text(self, index: int) -> str:
        return self.js(f"{self.NB}.widgets[{index}].outputArea.node.innerText")

    def show(self, index: int) -> None:
        self.js(f"{self.NB}.widgets[{index}].node.scrollIntoView({{block: 'start'}}); true")


def _submission(course: Path, student: str) -> tuple[str, float, dict[str, tuple]]:
    """From nbgrader's gradebook: the submitted notebook's id, its score, and per graded cell
    (auto score, manual score, needs manual grade)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_submission_notebook(AID, AID, student)
        grades = {g.name: (g.auto_score, g.manual_score, g.needs_manual_grade) for g in nb.grades}
        return nb.id, nb.score, grades


# What a dialog says (Validate's verdict), for a failure message.
_DIALOG = "document.querySelector('.jp-Dialog')?.innerText ?? 'no dialog is open'"

# The submitted assignment's row in the Assignment List, and its feedback link.
_ROW = "document.querySelector('#submitted_assignments_list')?.innerText ?? ''"
_LINK = (
    "[...document.querySelectorAll('#submitted_assignments_list a')]"
    ".find(a => a.textContent.toLowerCase().includes('feedback'))"
)


def _fetch_feedback(j: Journey, folder: Path) -> list[Path]:
    """Click Fetch Feedback and wait for what it does, event by event: the list offers the
    released feedback (its last render, whose button a click reaches), the button reports the
    request, nbgrader's fetch writes the HTML, the list shows the link. A click that reached
    no button (the list re-rendered under it) leaves the button as it was and is repeated."""
    assert j.wait(f"{_ROW}.includes('feedback available to fetch')", 180), (
        "the Assignment List does not offer the released feedback"
    )
    fetching = (
        "[...document.querySelectorAll('#submitted_assignments_list button')]"
        ".some(b => b.disabled || b.innerText.includes('Fetching'))"
    )
    written = lambda: sorted(folder.glob(f"*/{AID}.html"))  # noqa: E731
    for _ in range(3):
        j.click("#submitted_assignments_list button", "Fetch Feedback")
        if j.wait(f"{fetching} || !!{_LINK}", 30) or written():
            break
    # nbgrader's fetch_feedback finishing is the event: its HTML is on disk.
    try:
        wait_until(written, "Fetch Feedback's HTML", idle=600, poll=0.2)
    except Stuck as err:
        raise AssertionError(f"{err}; the list says: {j.js(_ROW)!r}") from None
    if not j.wait(f"!!{_LINK}", 60):  # the list was drawn before the fetch ended: redraw it
        j.click("#refresh_assignments_list")
        assert j.wait(f"!!{_LINK}", 120), f"no feedback link; the list says: {j.js(_ROW)!r}"
    return written()


@pytest.mark.slow  # about 3 minutes: make test hands its file out first
@pytest.mark.timeout(1200)
def test_student_and_instructor_journey(tmp_path):
    timings: dict[str, float] = {}
    try:
        _journey(tmp_path, timings)
    except (Exception, pytest.fail.Exception) as err:
        # Which step the journey stopped in, and what the servers said: a failure seen only in
        # CI's log must be diagnosable from it.
        done = ", ".join(f"{name} ({s} s)" for name, s in timings.items()) or "none"
        logs = "".join(
            f"\n--- the end of {log.name} ---\n{log.read_text(errors='replace')[-1500:]}"
            for log in (tmp_path / "student-lab.log", tmp_path / "formgrader.log")
            if log.is_file()
        )
        raise AssertionError(
            f"the journey stopped after the steps {done}: {type(err).__name__}: "
            f"{str(err)[:1500]}{logs}"
        ) from err


def _journey(tmp_path: Path, timings: dict[str, float]) -> None:
    """The steps of the module's docstring; ``timings`` gets each finished step's seconds."""
    chromium = find_chromium()
    if chromium is None:
        if os.environ.get("COURSE_REQUIRE_BROWSER"):
            pytest.fail("COURSE_REQUIRE_BROWSER is set but chromium is not installed")
        pytest.skip("chromium is not installed")
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)

    # The course (a copy of the repository's configuration and ex01), the exchange, the student.
    course, exchange, home = tmp_path / "course", tmp_path / "exchange", tmp_path / "alice"
    for sub in ("solutions", "exercises"):
        shutil.copytree(ROOT / sub / AID, course / sub / AID)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    exchange.mkdir(mode=0o777)
    exchange.chmod(0o777)
    work = home / "coursework"
    work.mkdir(parents=True)
    settings = home / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab/apputils-extension/themes.jupyterlab-settings").write_text(
        json.dumps({"adaptive-theme": True})
    )
    (settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    base = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "COURSE_EXCHANGE": str(exchange),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
    }
    base.pop("JUPYTER_CONFIG_PATH", None)
    instructor = {**base, "JUPYTER_CONFIG_DIR": str(tmp_path / "instructor-config")}
    student = {
        **base,
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
        "JUPYTER_CONFIG_PATH": str(ROOT / "jupyter" / "student"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    # The instructor releases ex01 to the exchange.
    t = time.monotonic()
    _run([str(BIN / "coursepkg"), "release", AID, "--root", str(course)], course, instructor)
    _run([str(BIN / "nbgrader"), "release_assignment", AID], course, instructor)
    assert (exchange / "transformers" / "outbound" / AID / f"{AID}.ipynb").is_file()
    timings["instructor: release to the exchange"] = round(time.monotonic() - t, 1)

    lab_args = ["lab", f"--notebook-dir={work}", "--LabApp.expose_app_in_browser=True"]
    port = _free_port()
    with (
        _server(lab_args, student, tmp_path / "student-lab.log", port, ROOT) as lab,  # as make lab
        Browser(chromium, width=1400, height=900) as browser,
    ):
        j = Journey(browser)
        j.timings = timings
        j.b.goto(f"{lab}/lab?token={TOKEN}", timeout=180)
        assert j.wait("!!(window.jupyterapp && document.querySelector('#jp-main-dock-panel'))")
        j.js("window.jupyterapp.restored.then(() => true)", 180)
        commands = j.js("window.jupyterapp.commands.listCommands()")
        assert "nbgrader:open-assignment-list" in commands
        for tool in (
            "nbgrader:open-formgrader",
            "nbgrader:open-create-assignment",
            "nbgrader:open-course-list",
        ):
            assert tool not in commands, f"students see an instructor's tool: {tool}"

        # The Assignment List lists ex01 from the exchange; Fetch.
        j.command("nbgrader:open-assignment-list")
        assert j.wait(
            f"document.querySelector('#released_assignments_list')?.innerText.includes('{AID}')",
            180,
        ), "ex01 is not in the Assignment List"
        j.step("assignment-list")
        j.click("#released_assignments_list button", "Fetch")
        assert j.wait(
            f"document.querySelector('#fetched_assignments_list')?.innerText.includes('{AID}')", 180
        ), "Fetch did not download ex01"
        assert (work / AID / f"{AID}.ipynb").is_file()
        # The file browser shows the fetched folder without a manual refresh.
        assert j.wait(
            "[...document.querySelectorAll('.jp-DirListing-itemText')]"
            f".some(e => e.textContent.includes('{AID}'))",
            60,
        ), "the file browser does not show the fetched assignment"
        j.step("fetched")

        # Open the notebook: it starts clean (not marked unsaved).
        j.js(
            "window.jupyterapp.commands.execute('docmanager:open', "
            f"{{path: '{AID}/{AID}.ipynb'}}).then(w => {{ window._nb = w; return true; }})",
            120,
        )
        assert j.wait("!!window._nb?.context?.isReady", 120), "the notebook did not open"
        assert j.wait(
            "window._nb?.sessionContext?.session?.kernel?.status === 'idle'",
            240,
        ), "the notebook's kernel did not start"
        assert j.wait(f"{j.NB}.widgets.length > 10")
        dirty = j.js("window._nb.context.model.dirty")
        assert not dirty, "the notebook is marked unsaved as soon as it opens"
        j.step("opened")

        setup = j.cell_index("setup")
        j.run_cell(setup)
        assert "Error" not in j.output_text(setup)

        # A classic mistake, typed through the editor: the check names it.
        answer = j.cell_index("answer_scaled_dot_product_attention")
        test = j.cell_index("test_scaled_dot_product_attention_visible")
        j.type_into(answer, WRONG)
        j.run_cell(answer)
        j.run_cell(test)
        message = j.output_text(test)
        assert "softmax" in message and "dim=-1" in message.replace(" ", ""), message
        j.show(answer)
        j.step("mistake")

        # The right answers pass: a green box, readable in both themes.
        j.type_into(answer, RIGHT)
        j.run_cell(answer)
        j.run_cell(test)
        assert "✓ check_scaled_dot_product_attention passed" in j.output_text(test)
        colour = j.js(
            f"getComputedStyle({j.NB}.widgets[{test}].outputArea.node"
            ".querySelector('.jp-RenderedHTMLCommon div')).color"
        )
        assert colour == "rgb(26, 26, 26)", colour
        additive = j.cell_index("answer_additive_score")
        j.type_into(additive, ADDITIVE)
        j.run_cell(additive)
        additive_test = j.cell_index("test_additive_score_visible")
        j.run_cell(additive_test)
        assert "✓ check_additive_score passed" in j.output_text(additive_test)
        j.show(test)
        j.step("passing")

        # The written answer, then save.
        written = j.cell_index("written_sqrt_dk")
        j.js(f"{j.NB}.widgets[{written}].rendered = false; true")
        j.type_into(written, WRITTEN)
        j.run_cell(written)
        j.command("docmanager:save")
        assert j.wait("!window._nb.context.model.dirty", 60)
        saved = json.loads((work / AID / f"{AID}.ipynb").read_text())
        assert any(WRITTEN in "".join(c["source"]) for c in saved["cells"])

        # Check the whole notebook from its last cell (what `coursepkg check` prints).
        last = j.js(f"{j.NB}.widgets.length") - 1
        j.run_cell(last)
        report = j.output_text(last)
        assert "Total: 3/3 points on the visible tests" in report, report
        j.show(last)
        j.step("check-whole-notebook")

        # Validate (nbgrader's button in the notebook's toolbar).
        j.click(".jp-Toolbar-item button, .jp-Toolbar-item jp-button", "Validate")
        assert j.wait(
            "document.querySelector('.jp-Dialog')?.innerText.includes('Success')"
            " || document.querySelector('.jp-Dialog')?.innerText.includes('passed')",
            300,
        ), f"Validate did not succeed: {j.js(_DIALOG)[:1500]}"
        j.step("validate")
        j.click(".jp-Dialog button", "Ok")
        assert j.wait("!document.querySelector('.jp-Dialog')", 30)

        # Submit from the Assignment List.
        j.command("nbgrader:open-assignment-list")
        j.click("#fetched_assignments_list button", "Submit")
        assert j.wait(
            f"document.querySelector('#submitted_assignments_list')?.innerText.includes('{AID}')",
            180,
        ), "Submit did not reach the exchange"
        j.step("submitted")

        # The instructor: collect, grade by machine, grade the written answer by hand.
        t = time.monotonic()
        _run([str(BIN / "nbgrader"), "collect", AID], course, instructor)
        # nbgrader names the student after the account that submitted (one machine here).
        student_id = pwd.getpwuid(os.getuid()).pw_name
        assert (course / "submitted" / student_id / AID / f"{AID}.ipynb").is_file()
        j.timings["instructor: nbgrader collect"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        grade = [
            str(BIN / "coursepkg"),
            "grade",
            AID,
            "--root",
            str(course),
            "--workers",
            "1",
            "--no-progress",
        ]
        _run(grade, course, instructor, timeout=900)
        _, score, rows = _submission(course, student_id)
        assert rows["test_scaled_dot_product_attention_hidden"][0] == 6, rows
        assert rows["test_additive_score_hidden"][0] == 2, rows
        assert rows["written_sqrt_dk"][1:] == (None, True), rows
        assert score == 11, rows
        j.timings["instructor: coursepkg grade"] = round(time.monotonic() - t, 1)

        fport = _free_port()
        with _server(
            ["lab", f"--notebook-dir={course}"],
            {**instructor, "HOME": str(tmp_path)},
            tmp_path / "formgrader.log",
            fport,
            course,
        ) as formgrader:
            t = j._start = time.monotonic()
            submission = _submission(course, student_id)[0]
            # Log in with the token on the login page (the formgrader's own requests need the
            # login cookie, which a token in the URL does not set).
            page = f"/formgrader/submissions/{submission}/"
            j.b.goto(f"{formgrader}/login?next={page}", 180)
            j.js(
                f"document.querySelector('input[name=password]').value = '{TOKEN}'; "
                "document.querySelector('form').submit(); true"
            )
            assert j.wait(f"location.pathname === '{page}'", 180), "could not log in"
            # Ready once its script has put the focus on the first box to fill and has loaded the
            # grades and comments: it fetches them after the page loads, and only then listens
            # to the score boxes (a score typed before that is overwritten and never saved).
            assert j.wait(
                "!!document.querySelector('input.score')"
                " && !!document.activeElement?.classList.contains('tabbable')"
                " && window.formgrader?.grades?.loaded === true"
                " && window.formgrader?.comments?.loaded === true",
                180,
            ), "the formgrader page did not get ready"
            # nbgrader's script needs MathJax 2 (MathJax.Hub); the course's server extension
            # has it served by this server instead of a CDN. Nothing may leave loopback.
            assert j.wait("!!window.MathJax?.Hub", 60), "no MathJax 2 on the formgrader page"
            mathjax = j.js("document.querySelector('script[src*=\"MathJax.js\"]')?.src || ''")
            assert mathjax.startswith(f"{formgrader}/static/jupyter_server_mathjax/"), mathjax
            _assert_loopback(j.b.requested_urls())
            box = "document.getElementById('written_sqrt_dk')"
            assert j.wait(f"!!{box}", 60), "the written answer has no score box"
            shown = j.js(f"{box}.closest('.nbgrader_cell')?.innerText || ''")
            assert "D_k-dimensional" in shown, shown
            # When MathJax has typeset the page, nbgrader's script moves the focus back to the
            # first box and scrolls to it (formgrade.js, ``MathJax.loaded``): a score typed before
            # that lands in another box (failed once in a fresh-clone run).
            assert j.wait("window.MathJax?.loaded === true", 120), "MathJax did not typeset"
            # The script then scrolls with an animation, so a click at the box's position may
            # miss it: the box is focused directly, then typed into and left with real keys.
            j.js(f"{box}.scrollIntoView({{block: 'center'}}); {box}.focus(); true")
            assert j.wait("document.activeElement?.id === 'written_sqrt_dk'", 30), "no focus"
            j.b.send("Input.insertText", text="2")
            j.key("Tab", "Tab", 9)
            saved = lambda: _submission(course, student_id)[2]["written_sqrt_dk"][1] == 2  # noqa: E731
            # j.wait: the browser's events are read while the formgrader saves
            wait_until(
                lambda: saved() or j.wait("false", 0.5),
                "the formgrader to save the score",
                idle=60,
                poll=0,
            )
            j.step("formgrader", lab=False)
            j.timings["instructor: formgrader"] = j.timings.pop("formgrader")
            _assert_loopback(j.b.requested_urls())
            # The formgrader's other pages load nothing from another host either.
            for other in ("/formgrader/manage_assignments", "/formgrader/gradebook"):
                j.b.goto(f"{formgrader}{other}", 120)
                shown = f"document.getElementById('main-table')?.innerText.includes('{AID}')"
                assert j.wait(shown, 60), f"{other} did not list {AID}"
                _assert_loopback(j.b.requested_urls())

        # Our grader again: the hand grade of the same submission stays settled.
        t = time.monotonic()
        _run(grade, course, instructor, timeout=900)
        _, score, rows = _submission(course, student_id)
        assert rows["written_sqrt_dk"][1:] == (2, False), rows
        assert score == 13, rows
        j.timings["instructor: coursepkg grade again"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        _run([str(BIN / "nbgrader"), "generate_feedback", AID], course, instructor)
        _run([str(BIN / "nbgrader"), "release_feedback", AID], course, instructor)
        html_files = list((exchange / "transformers" / "feedback").glob("*.html"))
        assert len(html_files) == 1, html_files
        assert "13" in html_files[0].read_text()
        j.timings["instructor: generate and release feedback"] = round(time.monotonic() - t, 1)

        # The student fetches the feedback and opens it.
        j._start = time.monotonic()
        j.b.goto(f"{lab}/lab?token={TOKEN}", timeout=180)
        j.js("window.jupyterapp.restored.then(() => true)", 180)
        j.command("nbgrader:open-assignment-list")
        feedback = _fetch_feedback(j, work / AID / "feedback")
        j.step("feedback-fetched")
        stamp = feedback[-1].parent.name
        j.b.goto(f"{lab}/files/{AID}/feedback/{stamp}/{AID}.html?token={TOKEN}", timeout=120)
        text = j.js("document.body.innerText")
        assert "13 / 13" in text.replace("13.0", "13"), text[:2000]
        assert "2 / 2" in text.replace("2.0", "2")
        assert j.wait(
            "!document.body.innerText.includes('\\\\sqrt')"
            " && !!document.querySelector('mjx-container')",
            60,
        ), "the feedback's math is not typeset"
        j.step("feedback", lab=False)

    (SHOTS / "timings.json").write_text(json.dumps(j.timings, indent=1))


def test_lab_terminal_finds_the_course_commands(tmp_path):
    """JupyterLab's terminal under `make lab` (jupyter/student/bashrc) has the environment's
    bin/ first on PATH, even where the shell's start-up files rebuild PATH."""
    (tmp_path / ".bashrc").write_text("export PATH=/usr/bin:/bin\n")  # as /etc/profile does
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "COURSE_VENV_BIN": str(BIN)}
    rcfile = ROOT / "jupyter" / "student" / "bashrc"
    done = processes.run(
        ["bash", "--rcfile", str(rcfile), "-i", "-c", "command -v coursepkg"],
        env=env,
        idle=60,
        check=False,
    )
    assert done.stdout.strip() == str(BIN / "coursepkg"), done.stdout + done.stderr


def test_name_error_after_a_restart_says_what_to_run(tmp_path):
    """Under `make lab`, a NameError says to run the setup cell (a check) or the cells above."""
    hints = ROOT / "jupyter" / "student" / "course_hints.py"
    code = (
        "import runpy\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        f"runpy.run_path({str(hints)!r})\n"
        "first = shell.run_cell('check_additive_score(additive_score)')\n"
        "second = shell.run_cell('my_helper(1)')\n"
        "assert isinstance(first.error_in_exec, NameError)\n"
    )
    done = processes.run([sys.executable, "-c", code], idle=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "comes from the notebook's setup cell" in out, out
    assert "if `my_helper` is defined in a cell above, run that cell first" in out, out
