"""The ex09 watch's file rule, in a fresh interpreter each (its audit hook is permanent): a
coursepkg module imported after the setup cell is not a file the student read, and a file
planted beside coursepkg's modules still is."""

from __future__ import annotations

import importlib.util
import json
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _violations(code: str) -> list[str]:
    program = textwrap.dedent(
        """
        import json
        from coursepkg.grading.framework.watch import watch_training
        watch = watch_training(interrupt_after=1e9)
        {code}
        print(json.dumps(watch.violations))
        """
    ).format(code=code)
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_coursepkg_module_imported_after_the_setup_cell_from_its_bytecode_is_not_a_read():
    source = ROOT / "coursepkg" / "data" / "text.py"
    cached = Path(py_compile.compile(str(source), importlib.util.cache_from_source(str(source))))
    assert cached.is_file() and cached.parent.name == "__pycache__"
    assert _violations("import coursepkg.data.text") == []


def test_a_file_planted_in_coursepkgs_bytecode_folder_is_a_read():
    planted = ROOT / "coursepkg" / "data" / "__pycache__" / "weights.cpython-311.pyc"
    planted.parent.mkdir(exist_ok=True)
    planted.write_bytes(b"not a module")
    try:
        found = _violations(f"open({str(planted)!r}, 'rb').read()")
    finally:
        planted.unlink()
    assert found == [f"read the file {planted.resolve()}"]
