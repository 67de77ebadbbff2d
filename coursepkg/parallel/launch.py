"""Start N ranks on this machine, joined by gloo over 127.0.0.1, and collect what each returns.

The parent opens the rendezvous store itself on a port the system picks (port 0), so no other
process can take the port between choosing and using it. Every wait is bounded: a collective
gives up after ``timeout`` seconds, and the parent ends every rank still running when the
``timeout`` is over, or as soon as one rank raises (its error is re-raised here).

This is for the tests' and the book's small runs on one machine; a real run starts its ranks
with ``torchrun`` (``coursepkg train``), never with a launcher of the course's own.
"""

from __future__ import annotations

import datetime
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

__all__ = ["run_ranks"]


def _rank_main(rank, fn, world_size, port, out, timeout, args) -> None:
    torch.set_num_threads(1)  # N ranks share the machine's cores
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    limit = datetime.timedelta(seconds=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=limit)
    try:
        torch.save(fn(rank, world_size, *args), Path(out) / f"rank{rank}.pt")
    except BaseException as error:  # noted for the parent before the others are ended
        (Path(out) / f"rank{rank}.error").write_text(f"{type(error).__name__}: {error}")
        raise
    finally:
        dist.destroy_process_group()


def _failures(out: Path) -> str:
    """Each failed rank's error, the first to fail first (the others usually failed only
    because it left: their peer closed the connection)."""
    files = sorted(out.glob("rank*.error"), key=lambda f: f.stat().st_mtime_ns)
    return "; ".join(f"{f.stem}: {f.read_text().strip()}" for f in files)


def run_ranks(fn: Callable, world_size: int, *args, timeout: float = 60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes, one per rank.

    Args:
        fn: a module-level function (the ranks import it by name); its process group is
            already joined when it starts. What it returns must be ``torch.save``-able.
        world_size: the number of ranks, >= 1.
        *args: passed on to ``fn``.
        timeout: seconds for the whole run and for any one collective.

    Returns:
        What each rank's ``fn`` returned, in rank order.

    Raises:
        TimeoutError: some rank was still running after ``timeout`` seconds (all are ended).
        RuntimeError: a rank raised (the others are ended); the message gives each failed
            rank's error, the first one first.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="ranks-") as out:
        params = (fn, world_size, store.port, out, timeout, args)
        ranks = mp.start_processes(_rank_main, params, world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ranks.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{world_size} ranks of {fn.__name__} still running after {timeout} s"
                    )
        except ProcessException as error:
            failed = _failures(Path(out)) or str(error)
            raise RuntimeError(f"{fn.__name__} failed on {world_size} ranks: {failed}") from error
        finally:
            for process in ranks.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(world_size)]
