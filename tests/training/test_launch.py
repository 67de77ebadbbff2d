"""coursepkg.training.launch.run_torchrun: ``coursepkg`` as N ranks under the real ``torchrun``."""

import pytest
from processes import budget

from coursepkg.training.launch import run_torchrun


@pytest.mark.slow
def test_every_rank_runs_the_command():
    done = run_torchrun(["info"], nproc=2, timeout=budget(300))
    assert done.returncode == 0
    assert done.stdout.count("coursepkg ") == 2  # each rank printed its own banner


@pytest.mark.slow
def test_a_failed_run_raises_with_its_stderr(tmp_path):
    missing = tmp_path / "no-such-corpus.txt"
    with pytest.raises(RuntimeError, match="status") as caught:
        run_torchrun(["train", str(missing), "--out", str(tmp_path / "run")], timeout=budget(300))
    assert "no-such-corpus" in str(caught.value)


def test_nproc_must_be_a_positive_int():
    with pytest.raises(ValueError, match="nproc"):
        run_torchrun(["info"], nproc=0)
