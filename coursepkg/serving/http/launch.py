"""``coursepkg serve`` started as a child process, for scripts, benchmarks and tests: it returns
once the server says it is ready (its ``ready on`` line), never after a guessed sleep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

__all__ = ["ServerProcess"]


class ServerProcess:
    """``coursepkg serve CHECKPOINT --port 0 OPTIONS`` in a child process; a context manager.

    Args:
        checkpoint: what ``coursepkg serve`` takes (a run folder or its file).
        options: more command-line options (``"--max-batch", "4"``).
        python: the interpreter (default: this one).

    Attributes:
        url: ``http://127.0.0.1:PORT``, once started.
        name: the served model's id (``/v1/models``), once started.
        log: the server's stderr lines so far.
    """

    def __init__(self, checkpoint: str | Path, *options: str, python: str | None = None) -> None:
        self.command = [python or sys.executable, "-m", "coursepkg.cli", "serve"]
        self.command += [str(checkpoint), "--port", "0", *options]
        self.url = self.name = ""
        self.log: list[str] = []
        self.process: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        """Start the server and wait for its ready line.

        Raises:
            RuntimeError: the server exited first (its stderr is in the message).
        """
        # the child imports the same coursepkg as this process (a checkout on PYTHONPATH too)
        root = str(Path(__file__).resolve().parents[3])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            self.command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path}
        )
        for line in self.process.stderr:  # blocks until a line comes, or the process ends
            self.log.append(line)
            if "ready on " in line:
                self.url = line.split("ready on ")[1].split()[0]
                break
        else:
            self.process.wait()
            raise RuntimeError("coursepkg serve exited before it was ready:\n" + "".join(self.log))
        # keep reading its stderr so that the pipe never fills and blocks the server
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()
        with urllib.request.urlopen(self.url + "/v1/models", timeout=60) as reply:
            self.name = json.load(reply)["data"][0]["id"]
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM: uvicorn shuts down, the engine's thread ends)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
