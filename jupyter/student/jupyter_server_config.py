"""JupyterLab for students: the course's notebooks with the student's tools only.

`make lab` starts JupyterLab with this folder on JUPYTER_CONFIG_PATH (your own Jupyter settings
still apply). It keeps nbgrader's student tools (Validate; the Assignment List when the course
has an exchange, COURSE_EXCHANGE) and leaves out the instructors' (Formgrader, Create
Assignment, Courses). It also serves the built book under /static/book/, which the notebooks
link to, and makes the course's commands (`coursepkg check ...`) work in JupyterLab's terminal.
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

here = Path(__file__).resolve().parent
repo = here.parent.parent
exchange = os.environ.get("COURSE_EXCHANGE", "")

# Server side: nbgrader's handlers for the instructors' tools are not loaded at all.
c.ServerApp.jpserver_extensions = {
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.course_list": False,
    "nbgrader.server_extensions.assignment_list": bool(exchange),
    "nbgrader.server_extensions.validate_assignment": True,
}
# Browser side: the matching JupyterLab plugins are switched off.
hidden = [
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
]
if not exchange:
    hidden.append("@jupyter/nbgrader:assignment-list")


def _hide_instructor_tools(handler, page_config):
    page_config["disabledExtensions"] = [*page_config.get("disabledExtensions", []), *hidden]
    return page_config


c.ServerApp.tornado_settings = {"page_config_hook": _hide_instructor_tools}

# The terminal: a login shell would rebuild PATH from /etc/profile and lose the course's
# virtual environment, so `coursepkg` would be "command not found". An interactive shell reads
# ~/.bashrc (through bashrc here), then puts the environment's bin/ first.
os.environ["COURSE_VENV_BIN"] = str(Path(sys.executable).parent)
c.ServerApp.terminado_settings = {"shell_command": ["bash", "--rcfile", str(here / "bashrc"), "-i"]}

# The built book (`make book`): its chapters, in _build/html/book/, are then served at
# /static/book/ (the server's static handler refuses symbolic links out of its folders).
c.ServerApp.extra_static_paths = [str(repo / "_build" / "html")]
