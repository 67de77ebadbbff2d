"""Shared fixtures: tiny seeded CPU configurations, models and token batches.

Every test starts from ``torch.manual_seed(0)`` (autouse fixture below), so a failure reproduces
exactly; tests that need several independent draws take an explicit ``torch.Generator``.
The helpers are factory fixtures (``tiny_config``, ``make_model``, ``make_tokens``) so that a test
can ask for several variants of a tiny model in one go.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

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
