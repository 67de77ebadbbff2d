"""``coursepkg finetune`` on one process: the commands of ``docs/training.md`` as written, on a
tiny base trained by ``coursepkg train --tokenizer bpe``; exact resume; each bad input refused
with its line named and the base's bytes unchanged; Llama and Qwen3 folders as bases."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from coursepkg.cli import main
from coursepkg.data.text import load_tinyshakespeare
from coursepkg.posttrain.chat import CHAT_TOKENS
from coursepkg.posttrain.trainer import FinetuneSettings, chat_tokenizer, finetune
from coursepkg.training import CheckpointError
from coursepkg.training.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
TINY = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32, bias=False)
FAST = dict(steps=6, batch_size=4, warmup_steps=1, checkpoint_every=3, device="cpu")


def _train_base(tmp: Path, tokenizer: str) -> Path:
    text = tmp / "text.txt"
    text.write_text(load_tinyshakespeare()[:4000])
    out = tmp / f"base-{tokenizer}"
    args = ["train", str(text), "--tokenizer", tokenizer, "--out", str(out), "--steps", "2"]
    args += ["--batch-size", "4", "--block-size", "16", "--warmup-steps", "1", "--no-progress"]
    args += ["--eval-every", "2", "--eval-batches", "1", "--sample-tokens", "0", "--device", "cpu"]
    assert main(args + [f"--model={k}={str(v).lower()}" for k, v in TINY.items()]) == 0
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return _train_base(tmp_path_factory.mktemp("base"), "bpe")


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "log.csv") as f:
        return list(csv.DictReader(f))


def _doc_commands() -> list[str]:
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("(`coursepkg finetune`)", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


@pytest.mark.slow  # five real commands one after another (about 20 s): not for make test-fast
def test_the_docs_commands_as_written(base, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(EXAMPLES, tmp_path / "docs" / "examples")
    shutil.copytree(base, tmp_path / "runs" / "base")
    before = _digest(tmp_path / "runs" / "base")
    commands = [c for c in _doc_commands() if c.startswith("coursepkg finetune")]
    assert len(commands) == 4
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, command
    for run in ("sft", "sft-lora", "dpo", "grpo"):
        assert len(_rows(tmp_path / "runs" / run)) == 20
        saved = load_checkpoint(tmp_path / "runs" / run / "model.pt")
        assert not any("lora_" in name for name in saved["model"])  # adapters merged
        assert saved["identity"]["config"]["vocab_size"] == len(chat_tokenizer())
    sft = [float(r["loss"]) for r in _rows(tmp_path / "runs" / "sft")]
    assert sum(sft[-5:]) < sum(sft[:5])  # it learns the answers
    dpo = _rows(tmp_path / "runs" / "dpo")
    assert float(dpo[0]["loss"]) == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
    assert float(dpo[0]["margin"]) == 0.0
    grpo = _rows(tmp_path / "runs" / "grpo")
    assert all(0.0 <= float(r["reward"]) <= 1.0 and float(r["kl"]) >= 0.0 for r in grpo)
    assert _digest(tmp_path / "runs" / "base") == before


def test_lora_trains_only_the_adapters(base, tmp_path):
    out = tmp_path / "lora"
    data = str(EXAMPLES / "arithmetic_chat.jsonl")
    settings = FinetuneSettings(str(base), data, str(out), lora_rank=2, lr=1e-2, **FAST)
    tuned = finetune(settings, progress=False).model.state_dict()
    start = load_checkpoint(base / "checkpoint.pt")["model"]
    changed = {n for n in start if n in tuned and tuned[n].shape == start[n].shape}
    changed = {n for n in changed if not torch.equal(tuned[n], start[n])}
    assert changed == {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.v_proj.weight"}
    saved = load_checkpoint(out / "checkpoint.pt")["model"]
    assert {n for n in saved if "lora_" in n} == {
        f"layers.0.self_attn.{p}.lora_{m}" for p in ("q_proj", "v_proj") for m in "AB"
    }


DATA = {
    "sft": ("arithmetic_chat.jsonl", {}),
    "dpo": ("arithmetic_prefs.jsonl", {"dpo": True}),
    "grpo": ("arithmetic_prompts.jsonl", {"grpo": True, "group_size": 2, "max_new_tokens": 4}),
}


@pytest.mark.parametrize("mode", list(DATA))
@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_resume_is_bit_identical(base, tmp_path, mode):
    name, options = DATA[mode]
    common = dict(base=str(base), data=str(EXAMPLES / name), lora_rank=2, **options, **FAST)
    whole = tmp_path / "whole"
    finetune(FinetuneSettings(out=str(whole), **common), progress=False)
    parts = tmp_path / "parts"
    finetune(FinetuneSettings(out=str(parts), stop_after=3, **common), progress=False)
    assert not (parts / "model.pt").exists()
    finetune(FinetuneSettings(out=str(parts), **common), resume=True, progress=False)
    assert (whole / "log.csv").read_bytes() == (parts / "log.csv").read_bytes()
    assert (whole / "model.pt").read_bytes() == (parts / "model.pt").read_bytes()
    with pytest.raises(CheckpointError, match="other settings"):
        finetune(FinetuneSettings(out=str(parts), beta=0.5, **common), resume=True)


def _write(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


GOOD = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}
PAIR = {"prompt": "1+1?", "chosen": "2", "rejected": "3"}
BAD = {
    "no response": ([GOOD, {"messages": [{"role": "user", "content": "hi"}]}], False, "line 2"),
    "prompt without response": ([GOOD, GOOD, {"prompt": "2+2?"}], False, "line 3"),
    "unknown role": (
        [{"messages": [{"role": "robot", "content": "x"}, GOOD["messages"][1]]}],
        False,
        "line 1: message 0 has the unknown role 'robot'",
    ),
    "prompt too long": (
        [GOOD, {"prompt": "1 2 3 4 5 6 7 8 9 " * 4, "response": "x"}],
        False,
        "line 2: the prompt .* too long for a context of max_len=32",
    ),
    "identical pair": ([PAIR, {**PAIR, "rejected": "2"}], True, "line 2: 'chosen' and 'rejected'"),
    "pairs given to SFT": ([PAIR], False, "line 1: a 'prompt' without a 'response'"),
    "not JSON": ([GOOD, "{oops"], False, "line 2: not valid JSON"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_data_names_its_line_and_writes_nothing(base, tmp_path, case, capsys):
    records, dpo, message = BAD[case]
    data = tmp_path / "data.jsonl"
    if case == "not JSON":
        data.write_text(json.dumps(GOOD) + "\n{oops\n")
    else:
        _write(data, records)
    before = _digest(base)
    out = tmp_path / "out"
    args = ["finetune", str(base), str(data), "--out", str(out), "--device", "cpu"]
    assert main(args + (["--dpo"] if dpo else [])) == 2
    err = capsys.readouterr().err
    assert re.search(f"{re.escape(str(data))}, {message}", err), err
    assert _digest(base) == before
    assert not (out / "checkpoint.pt").exists()


def test_a_character_base_is_refused_naming_the_missing_tokens(tmp_path, capsys):
    base = _train_base(tmp_path, "char")
    before = _digest(base)
    data = str(EXAMPLES / "arithmetic_chat.jsonl")
    assert main(["finetune", str(base), data, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "char tokenizer" in err and all(token in err for token in CHAT_TOKENS)
    assert _digest(base) == before


@pytest.mark.parametrize("out", [".", "checkpoint.pt/.."])
def test_the_base_folder_is_never_the_output(base, out, capsys):
    before = _digest(base)
    data = str(EXAMPLES / "arithmetic_chat.jsonl")
    assert main(["finetune", str(base), data, "--out", str(base / out), "--resume"]) == 2
    assert "fine-tune into another folder" in capsys.readouterr().err
    assert _digest(base) == before


def test_a_finished_run_is_not_overwritten_without_resume(base, tmp_path, capsys):
    data = str(EXAMPLES / "arithmetic_chat.jsonl")
    args = ["finetune", str(base), data, "--out", str(tmp_path / "o"), "--steps", "2"]
    args += ["--warmup-steps", "0", "--device", "cpu", "--no-progress"]
    assert main(args) == 0
    written = _digest(tmp_path / "o")
    assert main(args) == 2 and "--resume" in capsys.readouterr().err
    assert _digest(tmp_path / "o") == written


@pytest.mark.parametrize("family", ["Llama", "Qwen3"])
@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_a_hugging_face_folder_is_a_base(tmp_path, family):
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{family}Config")(
        vocab_size=50257,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = getattr(transformers, f"{family}ForCausalLM")(config)
    folder = tmp_path / family
    hf.save_pretrained(folder)
    before = _digest(folder)
    data = str(EXAMPLES / "arithmetic_chat.jsonl")
    settings = FinetuneSettings(str(folder), data, str(tmp_path / "out"), lr=1e-2, **FAST)
    result = finetune(settings, progress=False)
    losses = [row["loss"] for row in result.rows]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert result.model.config.qk_norm == (family == "Qwen3")
    assert result.model.config.vocab_size == len(chat_tokenizer())
    grown = result.model.embed.weight[50257:]  # the chat tokens' rows: trained from the mean
    assert torch.isfinite(grown).all() and grown.abs().sum() > 0
    assert _digest(folder) == before


GRPO = ["--grpo", "--group-size", "2", "--max-new-tokens", "4", "--steps", "3"]
GRPO += ["--warmup-steps", "0", "--device", "cpu", "--no-progress"]
REWARDS = """
def length(completion, record):
    return len(completion) / 4

def broken(completion, record):
    return record["missing"]

def not_a_number(completion, record):
    return "high"
"""


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_grpo_samples_scores_and_learns_from_prompts(base, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = _digest(base)
    data = str(EXAMPLES / "arithmetic_prompts.jsonl")
    for reward in ("number", "my_rewards:length"):
        out = tmp_path / reward.replace(":", "-")
        assert (
            main(["finetune", str(base), data, "--out", str(out), "--reward", reward] + GRPO) == 0
        )
        assert "reward" in capsys.readouterr().out
        rows = _rows(out)
        assert [r["step"] for r in rows] == ["1", "2", "3"]
        assert all(float(r["kl"]) >= 0 and math.isfinite(float(r["loss"])) for r in rows)
        rewards = [float(r["reward"]) for r in rows]
        if reward == "number":  # a right sum scores 1, so the mean is a fraction
            assert all(0.0 <= x <= 1.0 for x in rewards)
        else:  # the user's reward was called: a random model's answers have characters
            assert all(x > 0 for x in rewards)
        saved = load_checkpoint(out / "model.pt")
        assert saved["identity"]["config"]["vocab_size"] == len(chat_tokenizer())
    assert _digest(base) == before


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (
            "my_rewards:broken",
            r"jsonl, line \d+: the reward function raised on the answer .*KeyError",
        ),
        ("my_rewards:not_a_number", r"jsonl, line \d+: the reward of the answer .* got 'high'"),
        ("my_rewards:absent", "my_rewards has no function 'absent'"),
        ("nonsense", "reward must be one of \\['exact', 'number'\\] or 'module:function'"),
    ],
)
def test_a_bad_reward_is_named_and_nothing_is_written(
    base, tmp_path, monkeypatch, capsys, reward, message
):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = str(EXAMPLES / "arithmetic_prompts.jsonl")
    out = tmp_path / "out"
    assert main(["finetune", str(base), data, "--out", str(out), "--reward", reward] + GRPO) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (out / "checkpoint.pt").exists()


def test_grpo_settings_are_checked(base, tmp_path):
    common = dict(base=str(base), data=str(EXAMPLES / "arithmetic_prompts.jsonl"), grpo=True)
    with pytest.raises(ValueError, match="choose one"):
        FinetuneSettings(dpo=True, **common)
    with pytest.raises(ValueError, match="group_size must be an int >= 2, got 1"):
        FinetuneSettings(group_size=1, **common)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        FinetuneSettings(kl_coef=-0.1, **common)
    settings = FinetuneSettings(out=str(tmp_path / "o"), max_new_tokens=32, **FAST | common)
    with pytest.raises(ValueError, match="max_new_tokens=32 leaves no room"):
        finetune(settings, progress=False)
    long = tmp_path / "long.jsonl"
    _write(long, [{"prompt": "1+1?", "answer": "2"}, {"prompt": "1 2 3 4 5 6 7 8 " * 4}])
    settings = FinetuneSettings(out=str(tmp_path / "p"), max_new_tokens=4, **FAST | common)
    with pytest.raises(ValueError, match=f"{re.escape(str(long))}, line 2: the prompt has"):
        finetune(dataclasses.replace(settings, data=str(long)), progress=False)
