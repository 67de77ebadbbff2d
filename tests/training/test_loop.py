"""``coursepkg train`` on one process: the files it writes, gradient accumulation, exact resume,
checkpoint errors, settings from files and flags."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from coursepkg.cli import main
from coursepkg.data.text import load_tinyshakespeare
from coursepkg.tokenizer import Tokenizer
from coursepkg.training import CheckpointError, TrainSettings, load_settings, train
from coursepkg.training.checkpoint import load_checkpoint, save_checkpoint
from coursepkg.training.loop import LOG_FIELDS, MOE_FIELDS, load_fields

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1)
# For comparisons "within fp32 tolerance": no biases. The key projection's bias has a gradient
# of exactly 0 in exact arithmetic (softmax ignores a constant added to every score), so its
# computed gradient is rounding noise, which Adam's normalisation turns into full-size steps
# whose sign depends on the order of the sums.
EXACT = {**TINY, "bias": False}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    path.write_text(load_tinyshakespeare()[:20_000])
    return path


def tiny(corpus: Path, out: Path, **changes) -> TrainSettings:
    base = dict(
        data=str(corpus),
        out=str(out),
        steps=12,
        batch_size=8,
        block_size=16,
        warmup_steps=2,
        eval_every=4,
        eval_batches=2,
        checkpoint_every=4,
        sample_tokens=20,
        device="cpu",
        model=TINY,
    )
    return TrainSettings(**{**base, **changes})


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_command_writes_log_plot_samples_and_reuses_tokens(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", str(corpus), "--out", str(out), "--steps", "8", "--batch-size", "4"]
    args += ["--block-size", "16", "--eval-every", "4", "--sample-tokens", "30", "--device", "cpu"]
    args += ["--warmup-steps", "2", "--no-progress"]
    args += [f"--model={k}={v}" for k, v in TINY.items()]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "held-out loss" in printed and printed.count("-----") == 2
    with open(out / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    assert [r["step"] for r in rows if r["val_loss"]] == ["4", "8"]
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    samples = (out / "samples.txt").read_text().split("\n\n-----\n\n")
    assert len(samples) == 2 and all(len(s) >= 31 for s in samples)  # prompt + 30
    tokens = out / "tokens" / "train.bin"
    written = tokens.stat().st_mtime_ns
    # a second run into the same folder reuses the token file (and wants --resume)
    assert main([*args, "--steps", "10", "--resume"]) == 0
    assert tokens.stat().st_mtime_ns == written
    assert main(args) == 2  # a checkpoint is there and no --resume: refused
    assert "--resume" in capsys.readouterr().err


def test_accumulating_two_micro_batches_equals_one_batch_of_twice_the_size(corpus, tmp_path):
    settings = dict(steps=5, sample_tokens=0, model=EXACT)
    one = train(tiny(corpus, tmp_path / "one", **settings), progress=False)
    two = train(tiny(corpus, tmp_path / "two", grad_accum=2, **settings), progress=False)
    for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    losses = [[r["loss"] for r in run.rows] for run in (one, two)]
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(losses[1]))


def test_checkpointed_activations_train_the_same_model(corpus, tmp_path):
    """``--checkpoint-activations`` recomputes the blocks in backward, replaying the dropout
    masks: the same losses and weights, and a run may resume with or without it."""
    settings = dict(steps=6, sample_tokens=0, model={**EXACT, "dropout": 0.1})
    plain = train(tiny(corpus, tmp_path / "plain", **settings), progress=False)
    part = tiny(corpus, tmp_path / "ckpt", checkpoint_activations=True, stop_after=3, **settings)
    train(part, progress=False)
    part.stop_after, part.checkpoint_activations = 0, False
    resumed = train(part, resume=True, progress=False)
    losses = [[r["loss"] for r in run.rows] for run in (plain, resumed)]
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=0, atol=1e-6)
    for a, b in zip(plain.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_an_unknown_parallel_scheme_is_refused(corpus, tmp_path):
    with pytest.raises(ValueError, match="parallel must be one of .*'course-bucketed'.*'zero3'"):
        tiny(corpus, tmp_path, parallel="zero3")
    assert tiny(corpus, tmp_path, parallel="course-ddp").parallel == "course-ddp"


@pytest.mark.parametrize("scheme", ["fsdp", "course-fsdp"])
@pytest.mark.parametrize("flag", ["checkpoint_activations", "compile"])
def test_fully_sharded_schemes_refuse_recomputation_and_compiling(corpus, tmp_path, scheme, flag):
    with pytest.raises(ValueError, match=f"parallel='{scheme}' does not combine with {flag}"):
        tiny(corpus, tmp_path, parallel=scheme, **{flag: True})
    assert tiny(corpus, tmp_path, parallel="course-zero1", **{flag: True}).parallel


def test_a_checkpoint_of_another_optimizer_layout_is_refused(corpus, tmp_path):
    """One process trains replicated whatever --parallel says (nothing to shard); a
    checkpoint whose optimizer state is laid out for a sharded scheme is refused by name."""
    settings = tiny(corpus, tmp_path / "run", steps=8, stop_after=4, parallel="course-fsdp")
    train(settings, progress=False)
    path = tmp_path / "run" / "checkpoint.pt"
    saved = load_checkpoint(path)
    assert saved["optimizer_layout"] == "replicated"
    save_checkpoint(path, {**saved, "optimizer_layout": "course-fsdp"})
    settings.stop_after = 0
    with pytest.raises(CheckpointError, match="laid out for 'course-fsdp'.*uses 'replicated'"):
        train(settings, resume=True, progress=False)


def test_training_leaves_the_callers_matplotlib_backend_alone(corpus, tmp_path):
    """The loss plot is drawn on a Figure of its own: a notebook that trains and then plots
    (chapter 17) still shows its figures."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        train(tiny(corpus, tmp_path / "run", steps=4, sample_tokens=0), progress=False)
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_resume_is_bit_identical(corpus, tmp_path):
    # dropout on: the resumed run must also continue the random masks exactly
    model = {**TINY, "dropout": 0.1}
    whole = train(tiny(corpus, tmp_path / "whole", model=model), progress=False)
    part = tiny(corpus, tmp_path / "part", model=model, stop_after=6)
    stopped = train(part, progress=False)
    assert len(stopped.rows) == 6 and stopped.samples == []
    part.stop_after = 0
    resumed = train(part, resume=True, progress=False)
    assert (tmp_path / "part" / "log.csv").read_bytes() == (tmp_path / "whole/log.csv").read_bytes()
    for a, b in zip(
        whole.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    assert resumed.samples == whole.samples


def test_other_settings_or_a_damaged_checkpoint_are_refused(corpus, tmp_path):
    settings = tiny(corpus, tmp_path / "run", steps=4, sample_tokens=0)
    train(settings, progress=False)
    path = tmp_path / "run" / "checkpoint.pt"
    other = tiny(corpus, tmp_path / "run", steps=8, model={**TINY, "d_model": 48})
    with pytest.raises(CheckpointError, match="config.d_model: checkpoint 32, now 48") as err:
        train(other, resume=True, progress=False)
    assert "n_heads" not in str(err.value)  # only the settings that differ are named
    with pytest.raises(CheckpointError, match="lr: checkpoint 0.01, now 0.02"):
        train(tiny(corpus, tmp_path / "run", steps=8, lr=0.02), resume=True, progress=False)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="damaged"):
        train(tiny(corpus, tmp_path / "run", steps=8), resume=True, progress=False)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a coursepkg checkpoint"):
        load_checkpoint(path)


def test_a_checkpoint_from_before_the_hf_options_moved_resumes(corpus, tmp_path):
    # Checkpoints written before config.hf kept its options flat: config.logits_bias, ...
    part = tiny(corpus, tmp_path / "part", stop_after=6)
    train(part, progress=False)
    path = tmp_path / "part" / "checkpoint.pt"
    saved = load_checkpoint(path)
    config = saved["identity"]["config"]
    config.update(config.pop("hf"))
    assert config["logits_bias"] is False and "hf" not in config
    part.stop_after = 0
    config["logits_bias"] = True  # an older run with another option: refused, naming it
    save_checkpoint(path, saved)
    with pytest.raises(CheckpointError, match="config.hf.logits_bias: checkpoint True, now False"):
        train(part, resume=True, progress=False)
    config["logits_bias"] = False
    save_checkpoint(path, saved)
    resumed = train(part, resume=True, progress=False)
    assert [row["step"] for row in resumed.rows] == list(range(1, 13))


def test_a_checkpoint_from_before_an_option_existed_resumes_with_its_default(corpus, tmp_path):
    # An option added to TransformerConfig after the run started: the old checkpoint lacks it.
    part = tiny(corpus, tmp_path / "part", stop_after=6)
    train(part, progress=False)
    path = tmp_path / "part" / "checkpoint.pt"
    saved = load_checkpoint(path)
    assert saved["identity"]["config"].pop("sliding_window") is None
    save_checkpoint(path, saved)
    part.stop_after = 0
    windowed = tiny(corpus, tmp_path / "part", model={**TINY, "sliding_window": 4})
    with pytest.raises(CheckpointError, match="config.sliding_window: checkpoint None, now 4"):
        train(windowed, resume=True, progress=False)
    resumed = train(part, resume=True, progress=False)
    assert [row["step"] for row in resumed.rows] == list(range(1, 13))


def test_checkpoint_write_leaves_no_temporary_file(tmp_path):
    save_checkpoint(tmp_path / "c.pt", {"w": torch.arange(3)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]
    assert torch.equal(load_checkpoint(tmp_path / "c.pt")["w"], torch.arange(3))


def test_settings_from_yaml_toml_and_flags(tmp_path, corpus):
    (tmp_path / "run.yaml").write_text(f"data: {corpus}\nsteps: 50\nmodel:\n  d_model: 48\n")
    (tmp_path / "run.toml").write_text(f'data = "{corpus}"\nsteps = 50\n[model]\nd_model = 48\n')
    for name in ("run.yaml", "run.toml"):
        s = load_settings(tmp_path / name, steps=60, model={"n_layers": 3})
        assert (s.steps, s.model) == (60, {"d_model": 48, "n_layers": 3})
    with pytest.raises(ValueError, match="unknown settings \\['stepz'\\]"):
        load_settings(None, data=str(corpus), stepz=3)
    with pytest.raises(ValueError, match="not TransformerConfig fields"):
        train(tiny(corpus, tmp_path / "bad", model={"d_modle": 3}), progress=False)
    with pytest.raises(ValueError, match="tokenizer must be 'char', 'bpe' or a fold.*'wordpiece'"):
        train(tiny(corpus, tmp_path / "wp", tokenizer="wordpiece"), progress=False)
    with pytest.raises(ValueError, match="batch_size=6 must be divisible"):
        train(tiny(corpus, tmp_path / "acc", batch_size=6, grad_accum=4), progress=False)


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_bpe_tokens_are_gpt2s_ids_and_the_samples_decode_to_text(corpus, tmp_path):
    out = tmp_path / "bpe"
    result = train(tiny(corpus, out, tokenizer="bpe", steps=4, checkpoint_every=4), progress=False)
    gpt2 = Tokenizer.gpt2()
    ids = gpt2.encode(corpus.read_text())
    stored = [
        np.fromfile(out / "tokens" / f"{part}.bin", dtype=np.uint16) for part in ("train", "val")
    ]
    # the token files are GPT-2's ids for the corpus, split in order
    assert np.concatenate(stored).tolist() == ids
    assert result.model.config.vocab_size == len(gpt2) == 50257
    # the samples are decoded with the same tokenizer: the prompt comes back as text
    assert all(isinstance(s, str) and s for s in result.samples)


def test_a_mixture_of_experts_logs_its_aux_loss_and_resumes(corpus, tmp_path):
    model = {**TINY, "moe": {"n_experts": 4, "top_k": 2, "d_ff": 16}}
    whole = train(tiny(corpus, tmp_path / "whole", model=model, sample_tokens=0), progress=False)
    with open(tmp_path / "whole" / "log.csv") as f:
        rows = list(csv.DictReader(f))
    aux = [float(r["aux_loss"]) for r in rows]
    assert len(aux) == 12 and all(np.isfinite(aux)) and min(aux) > 0
    assert [r["aux_loss"] for r in whole.rows] == aux
    part = tiny(corpus, tmp_path / "part", model=model, sample_tokens=0, stop_after=6)
    train(part, progress=False)
    part.stop_after = 0
    train(part, resume=True, progress=False)
    assert (tmp_path / "part" / "log.csv").read_bytes() == (tmp_path / "whole/log.csv").read_bytes()
    with pytest.raises(ValueError, match="aux_loss_coef must be a number >= 0, got -1"):
        tiny(corpus, tmp_path / "bad", aux_loss_coef=-1)


def test_the_log_summarises_each_moe_layers_expert_load(corpus, tmp_path):
    # layers 1 and 3 are MoE (moe.every=2); E=4, k=2: an even load is 1, all on k experts E/k
    model = {**TINY, "n_layers": 4, "moe": {"n_experts": 4, "top_k": 2, "d_ff": 16, "every": 2}}
    result = train(tiny(corpus, tmp_path, model=model, sample_tokens=0, steps=3), progress=False)
    names = ["load_max_1", "load_min_1", "load_max_3", "load_min_3"]
    assert load_fields(result.model.config) == tuple(names)
    with open(tmp_path / "log.csv") as f:
        header = next(csv.reader(f))
        rows = list(csv.DictReader(f, fieldnames=header))
    assert header == [*LOG_FIELDS, *MOE_FIELDS, *names] and len(rows) == 3
    for row in rows:
        for layer in (1, 3):
            high, low = float(row[f"load_max_{layer}"]), float(row[f"load_min_{layer}"])
            # a token's k choices are k distinct experts: no expert holds more than 1/k
            assert 0.0 <= low <= 1.0 <= high <= 4 / 2
    # k = E: every token goes to every expert, an even load by construction
    every = {**TINY, "moe": {"n_experts": 3, "top_k": 3, "d_ff": 16}}
    run = train(
        tiny(corpus, tmp_path / "all", model=every, sample_tokens=0, steps=2, warmup_steps=0), False
    )
    assert [(r["load_max_0"], r["load_min_0"]) for r in run.rows] == [(1.0, 1.0)] * 2
    dense = train(tiny(corpus, tmp_path / "dense", sample_tokens=0, steps=1, warmup_steps=0), False)
    assert load_fields(dense.model.config) == () and set(dense.rows[0]) == set(LOG_FIELDS)


def test_a_moe_checkpoint_from_before_the_load_columns_resumes(corpus, tmp_path):
    model = {**TINY, "moe": {"n_experts": 4, "top_k": 2, "d_ff": 16}}
    settings = tiny(corpus, tmp_path, model=model, sample_tokens=0, steps=6, stop_after=4)
    train(settings, progress=False)
    path = tmp_path / "checkpoint.pt"
    saved = load_checkpoint(path)
    saved["rows"] = [row[: len(LOG_FIELDS) + 1] for row in saved["rows"]]  # up to aux_loss
    save_checkpoint(path, saved)
    settings.stop_after = 0
    rows = train(settings, resume=True, progress=False).rows
    assert [r["load_max_0"] is None for r in rows] == [True] * 4 + [False] * 2
    assert all(r["aux_loss"] > 0 for r in rows)


def test_the_aux_loss_coefficient_changes_the_training(corpus, tmp_path):
    model = {**TINY, "moe": {"n_experts": 4, "top_k": 1, "d_ff": 16}}
    runs = [
        train(
            tiny(corpus, tmp_path / str(c), model=model, sample_tokens=0, steps=4, aux_loss_coef=c),
            progress=False,
        )
        for c in (0.0, 1.0)
    ]
    assert [r["loss"] for r in runs[0].rows][0] == [r["loss"] for r in runs[1].rows][0]
    assert [r["loss"] for r in runs[0].rows][1:] != [r["loss"] for r in runs[1].rows][1:]


def test_the_choice_bias_moves_with_the_load_and_resumes_with_the_checkpoint(corpus, tmp_path):
    # DeepSeek-V3's balancing without the auxiliary loss: only the bias moves the load
    moe = {"n_experts": 4, "top_k": 1, "d_ff": 16, "router": "sigmoid"}
    model = {**TINY, "moe": {**moe, "bias_update_rate": 0.125}}
    still = {**TINY, "moe": {**moe, "bias_update_rate": 0.0}}
    changes = dict(sample_tokens=0, steps=8, aux_loss_coef=0.0)
    whole = train(tiny(corpus, tmp_path / "whole", model=model, **changes), progress=False)
    bias = whole.model.layers[0].ffn.choice_bias
    steps = bias / 0.125  # each step moved each expert's bias by -1, 0 or +1 rates
    assert bias.abs().sum() > 0 and torch.equal(steps, steps.round()) and steps.abs().max() <= 8
    fixed = train(tiny(corpus, tmp_path / "still", model=still, **changes), progress=False)
    assert torch.equal(fixed.model.layers[0].ffn.choice_bias, torch.zeros(4))
    # the bias is in the checkpoint: stopping and resuming gives the same run
    part = tiny(corpus, tmp_path / "part", model=model, stop_after=4, **changes)
    train(part, progress=False)
    part.stop_after = 0
    resumed = train(part, resume=True, progress=False)
    assert (tmp_path / "part" / "log.csv").read_bytes() == (tmp_path / "whole/log.csv").read_bytes()
    assert torch.equal(resumed.model.layers[0].ffn.choice_bias, bias)
