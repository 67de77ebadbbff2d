"""The fork server of ``coursepkg grade``: a forked kernel is a fresh, confined, separate kernel.

Each test talks to real kernels through :class:`~coursepkg.grading.forked.ForkKernelManager`
(what nbgrader's ``Execute`` uses when grading) with the sandbox kernelspec. A forked kernel
must behave like a freshly started one: a process of its own whose parent is the server, its
own random state, the sandbox's limits, interrupts that work, its exit code reported; and the
server must refuse anyone but its parent and anything but the sandbox kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import processes
import pytest
from processes import budget, wait_until

from coursepkg.grading.kernel import forked, forkserver
from coursepkg.grading.kernel.confine import landlock_abi
from coursepkg.grading.kernel.sandbox import KERNEL_NAME, _parse, write_kernelspec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A sandbox kernelspec, a protected 'course' with a secret, and a running fork server."""
    root = tmp_path_factory.mktemp("fork")
    course = root / "a-course"  # dashes in the path, as in most real ones
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "secret.txt").write_text("the answer")
    work = course / "autograded" / "s1"
    work.mkdir(parents=True)
    write_kernelspec(root / "jupyter", course_root=course, memory_mb=2048, cpu_seconds=120)
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(root / "jupyter")
    server = forkserver.ForkServer(root / "fork.sock").start()
    assert server.connect(timeout=budget(120)) is not None, "the fork server did not start"
    yield {"root": root, "course": course, "work": work, "server": server}
    server.stop()
    if old is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = old


@contextlib.asynccontextmanager
async def _ready_kernel(work: Path, now: bool = False):
    """A forked sandbox kernel started in ``work`` and ready: yields its manager and client,
    then shuts it down (``now``: killed)."""
    km = forked.ForkKernelManager(kernel_name=KERNEL_NAME)
    await km.start_kernel(cwd=str(work))
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=budget(60))
        yield km, kc
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=now)


async def _session(work: Path, code: list[str], interrupt_when: str | None = None):
    """Start a kernel, run ``code`` cell by cell; return (manager info, outputs).

    With ``interrupt_when``, each cell is interrupted once its output shows that text (waiting
    for it rather than for a fixed time, which a busy machine can outlast)."""
    km = forked.ForkKernelManager(kernel_name=KERNEL_NAME)
    await km.start_kernel(cwd=str(work))
    kc = km.client()
    kc.start_channels()
    outputs: list[str] = []
    try:
        await kc.wait_for_ready(timeout=budget(60))
        for source in code:
            texts: list[str] = []

            def hook(msg, texts=texts):
                content = msg["content"]
                if msg["msg_type"] == "stream":
                    texts.append(content["text"])
                elif msg["msg_type"] == "error":
                    texts.append(f"{content['ename']}: {content['evalue']}")

            run = asyncio.ensure_future(
                kc.execute_interactive(source, output_hook=hook, timeout=budget(60))
            )
            if interrupt_when is not None:
                while interrupt_when not in "".join(texts) and not run.done():
                    await asyncio.sleep(0.05)
                await km.interrupt_kernel()
            await run
            outputs.append("".join(texts).strip())
        info = {
            "pid": km.provisioner.pid,
            "forked": isinstance(km.provisioner.process, forked._ForkedKernel),
        }
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=False)
    return info, outputs


def test_a_forked_kernel_is_a_fresh_process_of_its_own(setup):
    code = [
        "import os, random, sys; print(os.getpid(), os.getppid())",
        "import torch; print(random.random(), torch.initial_seed())",
        "print('torch' in sys.modules, os.getcwd(), sys.path[0] == os.getcwd())",
    ]
    first, out1 = asyncio.run(_session(setup["work"], code))
    second, out2 = asyncio.run(_session(setup["work"], code))
    server = setup["server"].proc.pid
    for info, out in ((first, out1), (second, out2)):
        assert info["forked"], "the kernel was started anew, not forked"
        pid, ppid = map(int, out[0].split())
        assert pid == info["pid"] and ppid == server and pid not in (server, os.getpid())
        # torch was imported by the server, so the notebook's `import torch` costs nothing
        # (and, as a fresh `python -m` kernel would, it finds modules in its own folder first)
        assert out[2] == f"True {setup['work']} True"
    assert first["pid"] != second["pid"]
    # each child seeds `random` and torch anew, as fresh processes do (a state copied from the
    # server would give both children the same numbers)
    assert out1[1].split()[0] != out2[1].split()[0]
    assert out1[1].split()[1] != out2[1].split()[1]


def test_the_checks_are_imported_by_the_server_not_by_each_kernel(setup):
    # What the server imported before forking, it froze (gc.freeze), so the kernel's collector
    # holds none of those modules' namespaces; a module the kernel imports itself is held.
    # Every check module (the guard reads every check before the first cell) and what the
    # server preloads (torch, ipykernel's pieces) must be the server's: importing them is the
    # cost the server spares each kernel.
    code = [
        "import gc, sys, coursepkg.grading as g, json.tool\n"
        f"PRELOAD = {forkserver.PRELOAD}\n"
        "held = {id(o) for o in gc.get_objects()}\n"
        "homes = sorted({'coursepkg.grading' + h for h in g._HOMES.values()})\n"
        "print(sorted(n for n in homes + list(PRELOAD) if id(sys.modules[n].__dict__) in held))\n"
        "print(len(homes), id(sys.modules['json.tool'].__dict__) in held)",
    ]
    _, out = asyncio.run(_session(setup["work"], code))
    imported_by_kernel, counts = out[0].splitlines()
    assert imported_by_kernel == "[]"
    n_homes, control = counts.split()
    assert int(n_homes) > 15 and control == "True"  # the test sees a kernel's own import


@pytest.mark.skipif(landlock_abi() < 1, reason="Landlock is not available on this kernel")
def test_a_forked_kernel_is_confined_like_a_fresh_one(setup):
    secret = setup["course"] / "solutions" / "secret.txt"
    code = [
        f"try:\n    print(open({str(secret)!r}).read())\n"
        "except OSError as e:\n    print(type(e).__name__)",
        "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)",
        "import torch; print(float(torch.ones(300, 300).matmul(torch.ones(300, 300))[0, 0]))",
    ]
    info, out = asyncio.run(_session(setup["work"], code))
    assert info["forked"]
    assert out == ["PermissionError", "2048", "300.0"]


def test_a_forked_kernel_talks_to_itself_on_127_0_0_1_and_to_nothing_else(setup):
    """Its network namespace has a loopback of its own, up: ranks of a data-parallel exercise
    meet there (Landlock then allows TCP), while the grader's 127.0.0.1 stays out of reach."""
    with socket.socket() as host:
        host.bind(("127.0.0.1", 0))  # the grader's side, as its PostgreSQL would listen
        host.listen(1)
        code = [
            "import socket\nwith socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n"
            "    s.listen(1)\n    socket.create_connection(s.getsockname(), timeout=10).close()\n"
            "print('own loopback: reached')",
            f"try:\n    socket.create_connection(('127.0.0.1', {host.getsockname()[1]}), 10)\n"
            "    print('host reached')\nexcept OSError as e:\n    print(type(e).__name__)",
        ]
        info, out = asyncio.run(_session(setup["work"], code))
    assert info["forked"]
    assert out == ["own loopback: reached", "ConnectionRefusedError"]


def test_an_optimizers_first_step_is_not_taken_for_a_change_to_the_checks(setup):
    """The step imports torch._dynamo, which wraps torch.manual_seed: the guard's snapshot must
    already hold the wrapper (ex15's checks take such a step before forking their ranks), while
    a notebook that replaces the function itself is still caught."""
    step = (
        "import torch\nfrom coursepkg.grading import check_causal_mask\n"
        "p = torch.nn.Parameter(torch.zeros(1))\np.grad = torch.ones(1)\n"
        "torch.optim.AdamW([p]).step()\nprint('stepped')"
    )
    check = (
        "try:\n    check_causal_mask(lambda length: torch.ones(length, length, dtype=torch.bool))\n"
        "except Exception as e:\n    print('changed' if 'was changed' in str(e) else 'judged')"
    )
    _, out = asyncio.run(_session(setup["work"], [step, check]))
    assert out == ["stepped", "judged"]
    _, out = asyncio.run(_session(setup["work"], [f"{step}\ntorch.manual_seed = print", check]))
    assert out == ["stepped", "changed"]


def test_a_forked_kernel_guards_with_the_snapshot_its_server_took(setup):
    """The guard's snapshot is the server's (frozen there: the kernel's collector does not hold
    it), so no kernel takes its own, and the checks still judge an answer."""
    code = [
        "import gc\n"
        "hook = next(f for f in get_ipython().events.callbacks['pre_run_cell']\n"
        "            if f.__name__ == 'before_cell')\n"
        "snapshot = hook.__closure__[hook.__code__.co_freevars.index('snapshot')].cell_contents\n"
        "print(type(snapshot).__name__, id(snapshot) in {id(o) for o in gc.get_objects()})",
        "from coursepkg.grading import check_causal_mask\n"
        "check_causal_mask(lambda n: __import__('torch').ones(n, n).tril().bool())\n"
        "print('judged')",
    ]
    info, out = asyncio.run(_session(setup["work"], code))
    assert info["forked"]
    assert out[0] == "_Snapshot False"
    assert out[1].endswith("judged")


def test_the_launcher_keeps_paths_as_they_are():
    """Option names read ``-`` as ``_``; values (course paths with dashes) stay untouched."""
    options, kernel = _parse(["--protect=/srv/my-course", "--memory-mb=512", "--", "-f", "c.json"])
    assert options == {"protect": "/srv/my-course", "memory_mb": "512"}
    assert kernel == ["-f", "c.json"]
    with pytest.raises(ValueError, match="--name=value"):
        _parse(["--protect", "/srv/my-course"])


def test_an_endless_cell_is_interrupted(setup):
    cell = "print('looping', flush=True)\nwhile True:\n    pass"
    info, out = asyncio.run(_session(setup["work"], [cell], interrupt_when="looping"))
    assert info["forked"]
    assert out == ["looping\nKeyboardInterrupt:"]


def test_the_exit_code_of_a_kernel_reaches_its_manager(setup):
    async def run() -> tuple[bool, int | None]:
        async with _ready_kernel(setup["work"], now=True) as (km, kc):
            kc.execute("import os; os._exit(3)")
            deadline = time.monotonic() + budget(60)  # a bound for a very busy machine, not a wait
            while await km.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return await km.is_alive(), km.provisioner.process.poll()

    alive, code = asyncio.run(run())
    assert not alive and code == 3


def test_a_ready_kernel_leaves_the_first_cell_only_its_own_messages(setup):
    """ReadyKernelClient stops draining iopub at the kernel's idle status for kernel_info,
    not after 0.2 s of silence: nothing of the start may reach the first cell's messages."""

    async def run() -> tuple[type, str, list[dict]]:
        async with _ready_kernel(setup["work"]) as (_, kc):
            msg_id = kc.execute("print('first')")
            seen: list[dict] = []
            while not seen or not (
                seen[-1]["msg_type"] == "status"
                and seen[-1]["content"]["execution_state"] == "idle"
                and seen[-1]["parent_header"].get("msg_id") == msg_id
            ):
                seen.append(await kc.iopub_channel.get_msg(timeout=budget(60)))
            return type(kc), msg_id, seen

    kind, msg_id, seen = asyncio.run(run())
    assert kind is forked.ReadyKernelClient
    assert [m["parent_header"].get("msg_id") for m in seen] == [msg_id] * len(seen)
    assert [m["msg_type"] for m in seen][0] == "status"  # busy: the cell's first message
    assert "first\n" in [m["content"].get("text") for m in seen]


def _ask(path: Path, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall((json.dumps(request) + "\n").encode())
        return json.loads(forkserver.read_line(conn))


def test_the_server_refuses_other_processes(setup):
    """A process that is not the server's parent (a student's kernel, say) gets no kernel."""
    path = setup["server"].path
    # The server may refuse (answer and close) before the probe has written its request, so the
    # probe's write can meet a closed socket (EPIPE); the refusal is still waiting to be read.
    # (A probe slowed down by a busy machine once failed here with an empty reply.)
    probe = (
        "import json, socket, sys\n"
        "c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1])\n"
        "try:\n"
        "    c.sendall((json.dumps({'argv': ['x'], 'env': {}, 'cwd': '/'}) + '\\n').encode())\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    pass\n"
        "data = b''\n"
        "while not data.endswith(b'\\n'):\n"
        "    chunk = c.recv(4096)\n"
        "    if not chunk:\n"
        "        break\n"
        "    data += chunk\n"
        "print(data.decode())"
    )
    out = processes.run([sys.executable, "-c", probe, str(path)], idle=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"error": "only the grading worker may ask for kernels"}


def test_a_server_of_siblings_answers_its_parents_children_and_no_one_else():
    """``--siblings`` (one server for a LocalCluster's workers, the grader's children) admits
    the parent and its children; a grandchild (a kernel, or what a kernel starts) and any other
    process are refused, as without it."""
    here = os.getpid()
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    spawner = [sys.executable, "-c", f"import subprocess; subprocess.run({sleeper!r})"]
    with (
        processes.Command(sleeper, what="a child of the test") as child,
        processes.Command(spawner, what="a child that starts a grandchild") as middle,
    ):
        started = wait_until(lambda: middle.descendants()[1:], "the grandchild to start")
        grandchild = started[0].pid
        assert forkserver.may_ask(here, here, siblings=True)
        assert forkserver.may_ask(here, here, siblings=False)
        assert forkserver.may_ask(child.pid, here, siblings=True)
        assert not forkserver.may_ask(child.pid, here, siblings=False)
        assert not forkserver.may_ask(grandchild, here, siblings=True)
        assert not forkserver.may_ask(os.getppid(), here, siblings=True)


def test_a_kernel_whose_client_is_gone_is_killed(setup):
    """A kernel lives as long as the connection of the process that asked for it: the server
    kills one whose client closed it (a worker that died, taking its kernel manager along)."""

    async def run():
        km = forked.ForkKernelManager(kernel_name=KERNEL_NAME)
        await km.start_kernel(cwd=str(setup["work"]))
        try:
            kernel = km.provisioner.process
            assert isinstance(kernel, forked._ForkedKernel)
            pid = kernel.pid
            assert _alive(pid)
            kernel._conn.close()  # as the client's death closes it
            deadline = time.monotonic() + budget(60)
            while _alive(pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return pid, _alive(pid)  # before the manager's own shutdown below
        finally:
            with contextlib.suppress(Exception):
                await km.shutdown_kernel(now=True)

    pid, alive = asyncio.run(run())
    assert not alive, f"kernel {pid} outlived its client's connection"
    assert setup["server"].proc.poll() is None  # the server goes on serving
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), "the server to reap the kernel")
    # ... and the kernels it forks next are judged as before: cleaning up after the killed one
    # changed nothing the guard watches (its snapshot is the server's, taken before any kernel).
    code = [
        "from coursepkg.grading import check_causal_mask\n"
        "check_causal_mask(lambda n: __import__('torch').ones(n, n).tril().bool())\n"
        "print('judged')"
    ]
    info, out = asyncio.run(_session(setup["work"], code))
    assert info["forked"]
    assert out[0].endswith("judged"), out


def test_stopping_a_server_ends_its_kernels_first(setup, tmp_path):
    """``ForkServer.stop`` returns once the server has killed and reaped every kernel it
    forked (and removed their cgroups): none is left running, orphaned, after the grader."""
    own = forkserver.ForkServer(tmp_path / "fork.sock").start()
    try:

        async def start() -> tuple[forked.ForkKernelManager, int]:
            km = forked.ForkKernelManager(kernel_name=KERNEL_NAME)
            await km.start_kernel(cwd=str(setup["work"]))
            assert isinstance(km.provisioner.process, forked._ForkedKernel)
            return km, km.provisioner.process.pid

        km, pid = asyncio.run(start())
        assert _alive(pid)
        own.stop()
        assert not _alive(pid), f"kernel {pid} outlived its server's stop"
        assert not Path(f"/proc/{pid}").exists(), "the kernel was not reaped"
    finally:
        own.stop()
        setup["server"].start()  # the module's server serves the other tests again


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZXx"


def test_the_server_refuses_anything_but_the_sandbox_kernel(setup):
    answer = _ask(setup["server"].path, {"argv": ["/bin/sh", "-c", "id"], "env": {}, "cwd": "/"})
    assert "not the sandbox kernel" in answer["error"]


def test_without_a_server_kernels_start_anew(setup, monkeypatch):
    monkeypatch.setattr(forkserver, "_current", None)
    info, out = asyncio.run(_session(setup["work"], ["import os; print(os.getppid())"]))
    assert not info["forked"]
    assert int(out[0]) == os.getpid()
