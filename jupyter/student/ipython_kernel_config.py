"""The notebooks' Python kernel under `make lab`: a hint on top of a NameError (course_hints.py)."""

from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets when it loads this file)

hints = Path(__file__).resolve().parent / "course_hints.py"
c.InteractiveShellApp.exec_lines = [f"__import__('runpy').run_path({str(hints)!r})"]
