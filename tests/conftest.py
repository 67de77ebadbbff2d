"""Shared fixtures: tiny seeded CPU configurations, models and token batches.

Every test starts from ``torch.manual_seed(0)`` (autouse fixture below), so a failure reproduces
exactly; tests that need several independent draws take an explicit ``torch.Generator``.
The helpers are factory fixtures (``tiny_config``, ``make_model``, ``make_tokens``) so that a test
can ask for several variants of a tiny model in one go.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import budgets
import pytest
import torch
from processes import die_with_parent, end_leftovers, machine_factor
from real_parts import postgres_server  # noqa: F401 - one PostgreSQL server per test process

from coursepkg import DecoderOnlyLM, Transformer, TransformerConfig

# One thread: the tests' models are tiny, so a second thread only adds synchronisation (measured:
# the grading tests take 4x longer with two threads on a busy 2-core machine), and the kernels the
# notebook tests start get the other core.
torch.set_num_threads(1)

#: The tiny configuration every test starts from (override any field per test).
TINY = dict(vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=32)


#: Seconds the longest test files took in a quiet fresh-clone `.ci/run` (run L of 2026-11-27, two
#: workers: its `--durations=30`, summed by file; each file's shorter tests left out). Only their
#: order matters: `make test` hands these out first, longest first, so that the last file a worker
#: starts is a short one and the two workers end close together.
LONGEST_FILES = {
    "tests/e2e/test_autograde.py": 542,
    "tests/e2e/test_cluster.py": 476,
    "tests/grading/classroom/test_classroom.py": 406,
    "tests/grading/term/test_course.py": 402,
    "tests/e2e/test_training_ddp.py": 275,
    "tests/e2e/test_student_journey.py": 210,
    "tests/e2e/test_browser.py": 147,
    "tests/grading/term/test_course_folder.py": 100,
    "tests/grading/classroom/test_capstone.py": 150,
    "tests/grading/checks/test_check_protocol.py": 120,
    "tests/grading/checks/test_ex09_hostile.py": 56,
    "tests/grading/term/test_similarity.py": 56,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the longest files first (:data:`LONGEST_FILES`), then the other files holding a slow
    test, then the rest, each file's tests in their written order.

    ``make test`` runs two files at a time (pytest-xdist, ``--dist loadfile
    --no-loadscope-reorder``: without that flag xdist hands out the files with the most tests
    first, whatever this order says), handing out the files in this order: a long file handed out
    last would keep one worker busy while the other has nothing left to do. The sort is stable:
    a file's tests keep their order.
    """
    if not hasattr(config, "workerinput"):
        return  # one process (the default): the files keep pytest's own order
    root = config.rootpath
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item: pytest.Item) -> tuple[int, bool]:
        seconds = LONGEST_FILES.get(item.path.relative_to(root).as_posix(), 0)
        return -seconds, item.path not in slow_files

    items.sort(key=key)


_SCALED = pytest.StashKey[int]()  # the test's pytest-timeout, once scaled
_TIMED = pytest.StashKey[tuple[float, float]]()  # the test's start and the machine factor then
_CALL_PASSED = pytest.StashKey[bool]()
_BUDGETS = pytest.StashKey[dict]()
_LEFT = pytest.StashKey[list]()  # commands the tests left running (the workers', on xdist)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Scale the test's pytest-timeout (its ``timeout`` mark, else ``timeout`` in
    pyproject.toml) by the machine's measured pace (:func:`processes.machine_factor`), so that a
    machine busy with something else does not fail a test; the bound stays a guard against a hang.

    This wrapper runs before pytest-timeout's, which reads the closest ``timeout`` mark.
    """
    from pytest_timeout import _get_item_settings

    settings = _get_item_settings(item)
    if settings.timeout and _SCALED not in item.stash:
        scaled = round(settings.timeout * machine_factor())
        mark = pytest.mark.timeout(scaled, method=settings.method, func_only=settings.func_only)
        item.add_marker(mark, append=False)  # the closest mark: pytest-timeout reads it
        item.stash[_SCALED] = scaled
    item.stash[_TIMED] = (time.monotonic(), machine_factor())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Hold each test to its budget (``tests/budget.toml``, :mod:`budgets`): one that took more
    than twice its budget, scaled by the machine factor while it ran, gets an error at its
    teardown saying so. Every test's time and factor go into its teardown report (for the
    summary, from every xdist worker)."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        item.stash[_CALL_PASSED] = report.passed
        return
    if call.when != "teardown" or _TIMED not in item.stash:
        return
    start, factor = item.stash[_TIMED]
    seconds, factor = time.monotonic() - start, max(factor, machine_factor())
    budget = _budgets(item.config)["tests"].get(item.nodeid)
    report.user_properties.append(("timing", [seconds, factor, budget]))
    verdict = budgets.Verdict(item.nodeid, seconds, factor, budget)
    if verdict.over and report.passed and item.stash.get(_CALL_PASSED, False):
        report.outcome = "failed"
        report.longrepr = (
            f"{verdict.message()}: a regression, or a budget to raise in tests/budget.toml "
            "(say why in the commit)"
        )


def _budgets(config: pytest.Config) -> dict[str, dict[str, float]]:
    if _BUDGETS not in config.stash:
        config.stash[_BUDGETS] = budgets.load()
    return config.stash[_BUDGETS]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The budgeted tests against their budgets, then the slowest tests without one, as lines
    to paste into ``tests/budget.toml`` (seconds brought back to the reference machine)."""
    timed = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            props = dict(getattr(report, "user_properties", []) or [])
            if getattr(report, "when", "") == "teardown" and "timing" in props:
                seconds, factor, budget = props["timing"]
                timed.append(budgets.Verdict(report.nodeid, seconds, factor, budget))
    if not timed:
        return
    listed = sorted((v for v in timed if v.budget is not None), key=lambda v: v.name)
    if listed:
        terminalreporter.section("time budget (tests/budget.toml)")
        for verdict in listed:
            terminalreporter.write_line(verdict.message(), red=verdict.over)
    others = sorted((v for v in timed if v.budget is None), key=lambda v: -v.reference_seconds)
    others = [v for v in others[:15] if v.reference_seconds >= 20]
    if others:
        terminalreporter.section("slowest tests without a budget (lines for tests/budget.toml)")
        for verdict in others:
            terminalreporter.write_line(f"{budgets.toml_line(verdict)}  # {verdict.message()}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """End whatever command a test started and left running (a test that failed before its own
    cleanup), with its whole process tree, and fail the run that left one (an xdist worker
    hands its list to the controller, :func:`pytest_testnodedown`)."""
    left = session.config.stash.get(_LEFT, []) + end_leftovers()
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["coursepkg_left_running"] = left
        return
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(
            f"commands left running by the tests (now ended): {', '.join(left)}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job's timeout, ``kill``) stops pytest as Ctrl-C does, so that its
    session ends what the tests started (:func:`pytest_sessionfinish`) instead of leaving it.
    An xdist worker gets SIGTERM when its controller ends, even by SIGKILL
    (:func:`processes.die_with_parent`), so no worker outlives the run."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
    if hasattr(config, "workerinput"):  # an xdist worker: it ends when its pytest is killed
        die_with_parent(signal.SIGTERM)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: collect what a worker's tests left running."""
    left = getattr(node, "workeroutput", {}).get("coursepkg_left_running", [])
    node.config.stash[_LEFT] = node.config.stash.get(_LEFT, []) + list(left)


@pytest.fixture(autouse=True)
def _seed_torch() -> None:
    """Seed torch's global generator before every test."""
    torch.manual_seed(0)


def _tiny_config(**overrides) -> TransformerConfig:
    return TransformerConfig(**{**TINY, **overrides})


@pytest.fixture
def tiny_config() -> Callable[..., TransformerConfig]:
    """``tiny_config(**overrides)`` -> a tiny :class:`TransformerConfig` (dropout 0)."""
    return _tiny_config


def _make_model(
    config: TransformerConfig | None = None,
    kind: str = "encoder-decoder",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Transformer | DecoderOnlyLM:
    config = _tiny_config(**overrides) if config is None else config.replace(**overrides)
    torch.manual_seed(seed)
    cls = Transformer if kind == "encoder-decoder" else DecoderOnlyLM
    return cls(config).to(dtype).eval()


@pytest.fixture
def make_model() -> Callable[..., Transformer | DecoderOnlyLM]:
    """``make_model(config=None, kind="encoder-decoder"|"decoder-only", seed=0, **overrides)``.

    Builds the model from a seeded generator, in eval mode.
    """
    return _make_model


def _make_tokens(batch: int, length: int, vocab: int, low: int = 0, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (batch, length), generator=g)  # (B, L)


@pytest.fixture
def make_tokens() -> Callable[..., torch.Tensor]:
    """``make_tokens(batch, length, vocab, low=0, seed=1)`` -> long ids in [low, vocab)."""
    return _make_tokens


@pytest.fixture
def per_parameter_adam(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``per_parameter_adam()`` makes every ``torch.optim.Adam``/``AdamW`` built afterwards in
    the test run PyTorch's per-parameter loop (``foreach=False``), the peer against which the
    chapters' ``foreach=True`` optimisers are held to the same numbers."""

    def looped(cls: type[torch.optim.Optimizer]) -> Callable[..., torch.optim.Optimizer]:
        def build(*args, **kwargs) -> torch.optim.Optimizer:
            return cls(*args, **{**kwargs, "foreach": False})

        return build

    def apply() -> None:
        monkeypatch.setattr(torch.optim, "Adam", looped(torch.optim.Adam))
        monkeypatch.setattr(torch.optim, "AdamW", looped(torch.optim.AdamW))

    return apply
