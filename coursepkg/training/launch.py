"""``coursepkg`` under ``torchrun``: N processes on this machine, found through 127.0.0.1.

What a chapter needs to show data parallelism for real, in one call: PyTorch's own launcher
starts the ranks, they meet at a rendezvous on a free local port, and gloo all-reduces over the
loopback interface. A run on several machines is started by hand with ``torchrun``
(``docs`` and chapter 17 give the command); this is for one machine and a page's small runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["run_torchrun"]


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the system picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(
    args: Sequence[str], nproc: int = 2, timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Run ``coursepkg ARGS`` as ``nproc`` ranks under ``torchrun`` on this machine.

    Each rank gets one thread (``OMP_NUM_THREADS=1``), so N ranks share the cores fairly; on
    Linux gloo is told to use the loopback interface, which every machine has.

    Args:
        args: the ``coursepkg`` command line, e.g. ``["train", "data.txt", "--out", "runs/a"]``.
        nproc: how many ranks (processes) to start.
        timeout: seconds after which the whole run is stopped (a guard against a hang).

    Returns:
        The finished run: ``stdout`` (rank 0's summary) and ``stderr`` (each rank's log lines).

    Raises:
        RuntimeError: when the run fails, with the end of its standard error.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "torchrun"), "--nproc-per-node", str(nproc)]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"]
    command += ["--no-python", str(bin_dir / "coursepkg"), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if sys.platform == "linux":
        env["GLOO_SOCKET_IFNAME"] = "lo"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise RuntimeError(
            f"coursepkg {' '.join(map(str, args))} under torchrun ({nproc} ranks) exited with "
            f"status {done.returncode}; the end of its stderr:\n{tail}"
        )
    return done
