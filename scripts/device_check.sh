#!/usr/bin/env bash
# The course's CUDA paths, checked on a GPU machine in one command, from the repository root:
#
#     OUT=/some/folder bash scripts/device_check.sh
#
# It runs the tests that need a device (tests/cuda/, the tiled-attention tests of the reference
# package and of exercise 12's check) on COURSE_TEST_DEVICE (default cuda) and writes
# $OUT/log.txt (everything printed) and $OUT/junit.xml. Dry run without a GPU:
# COURSE_TEST_DEVICE=cpu (tests/cuda then compares CPU with CPU; the CUDA-only tests skip).
#
# What the GPU machine needs: python3 with torch (CUDA build), numpy, matplotlib (the trainer
# plots its loss), regex (coursepkg's tokenizer; transformers depends on it, so it is there
# with transformers), hypothesis, pytest, pytest-timeout. Nothing else is imported by these
# tests (measured: the modules loaded by a dry run), so no course venv, nbgrader or Jupyter.
# Should a pure-Python one be missing, put its wheel in .whl/ (pip download --no-deps
# NAME==VERSION -d .whl, versions from requirements/lock.txt): this script installs what it
# finds there into a private folder on PYTHONPATH, without the network.
# Budget: about a minute on one GPU; pytest-timeout stops any test after 120 s.
set -euo pipefail

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export COURSE_TEST_DEVICE="${COURSE_TEST_DEVICE:-cuda}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export PYTHONDONTWRITEBYTECODE=1

extra=""
if compgen -G ".whl/*.whl" >/dev/null; then
    extra="$(mktemp -d)"
    "$PY" -m pip install --quiet --no-index --no-deps --target "$extra" .whl/*.whl
fi

tests=(tests/cuda)
for folder in tests/reference; do
    [ -f "$folder/test_efficient_attention.py" ] && tests+=("$folder/test_efficient_attention.py")
done
tests+=(tests/grading/checks/test_ex12_tiled_attention.py)

{
    echo "== $(date -u +%FT%TZ) device check, COURSE_TEST_DEVICE=$COURSE_TEST_DEVICE"
    command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi: not found"
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '| available', torch.cuda.is_available(), '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
    echo "== ${tests[*]}"
} 2>&1 | tee "$OUT/log.txt"

set +e
PYTHONPATH=".${extra:+:$extra}" timeout 280 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
    --timeout 120 -rA --junitxml "$OUT/junit.xml" "${tests[@]}" 2>&1 | tee -a "$OUT/log.txt"
status=${PIPESTATUS[0]}
set -e
echo "== pytest exit status $status" | tee -a "$OUT/log.txt"
exit "$status"
