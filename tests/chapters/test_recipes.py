"""The book's ready-made date translator: it trains, is reproducible, and decodes strings."""

from dataclasses import replace

import pytest
import torch

import coursepkg.chapters.recipes as recipes
from coursepkg.chapters.recipes import (
    ISO_LENGTH,
    DateTranslator,
    date_batches,
    train_date_translator,
)
from coursepkg.chapters.run_cache import CACHE_ENV, cache_file
from coursepkg.data.dates import date_vocabs, encode_batch, make_date_pairs

TINY = dict(
    d_model=32, n_heads=2, d_ff=64, n_layers=1, batch_size=16, n_test=12, eval_size=6, average=1
)


def test_length_buckets_use_every_pair_once_with_less_padding():
    src_vocab, tgt_vocab = date_vocabs()
    pairs = make_date_pairs(16 * 20, seed=3)
    batches = list(date_batches(pairs, 16, src_vocab, tgt_vocab, seed=0, bucket=8))
    assert len(batches) == 20
    seen = sorted(
        (src_vocab.decode(row), tgt_vocab.decode(out))
        for b in batches
        for row, out in zip(b.src, b.tgt_out, strict=True)
    )
    assert seen == sorted(pairs)
    plain = [encode_batch(pairs[i : i + 16], src_vocab, tgt_vocab) for i in range(0, 320, 16)]
    padded = sum(b.src.numel() for b in batches)
    assert padded < 0.8 * sum(b.src.numel() for b in plain)


@pytest.fixture(scope="module")
def short_run() -> DateTranslator:
    return train_date_translator(steps=30, seed=0, progress=False, eval_every=10, **TINY)


def test_history_records_every_step_and_evaluation(short_run):
    h = short_run.history
    assert h.step == list(range(1, 31))
    assert len(h.loss) == len(h.lr) == 30
    assert h.eval_step == [10, 20, 30]
    assert len(h.metrics["exact_match"]) == 3
    assert all(0.0 <= a <= 1.0 for a in h.metrics["exact_match"])
    assert short_run.accuracy == h.metrics["exact_match"][-1]
    assert len(short_run.test_pairs) == 12
    assert short_run.seconds > 0


def test_learning_rate_warms_up_then_decays():
    run = train_date_translator(steps=12, progress=False, warmup_steps=4, eval_every=12, **TINY)
    lr = run.history.lr
    assert lr[0] < lr[1] < lr[2] < lr[3]  # linear warm-up
    assert lr[3] == max(lr)  # the peak is the last warm-up step
    assert lr[4] > lr[5] > lr[-1]  # inverse-square-root decay after it


def test_loss_decreases(short_run):
    loss = short_run.history.loss
    assert sum(loss[-5:]) / 5 < 0.8 * sum(loss[:5]) / 5


def test_same_seed_same_run_other_seed_other_run(short_run):
    again = train_date_translator(steps=30, seed=0, progress=False, eval_every=10, **TINY)
    assert again.history.loss == short_run.history.loss
    assert again.test_pairs == short_run.test_pairs
    for p, q in zip(again.model.parameters(), short_run.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    other = train_date_translator(steps=30, seed=1, progress=False, eval_every=10, **TINY)
    assert other.history.loss != short_run.history.loss


def test_translate_returns_one_iso_shaped_string_per_input(short_run):
    assert not short_run.model.training
    texts = ["22 Nov 2026", "Sunday, 22 November 2026", "01/02/1903"]
    for beam_size in (1, 3):
        out = short_run.translate(texts, beam_size=beam_size)
        assert len(out) == len(texts)
        assert all(isinstance(s, str) and len(s) <= ISO_LENGTH + 1 for s in out)
        assert all(set(s) <= set("0123456789-") for s in out)
    src, mask = short_run.encode(texts)
    assert src.shape == mask.shape == (3, len(texts[1]))
    assert mask.sum().item() == sum(len(t) for t in texts)


def test_exact_match_counts_correct_translations(short_run):
    pairs = short_run.test_pairs[:4]
    guesses = short_run.translate([h for h, _ in pairs])
    expected = sum(g == iso for g, (_, iso) in zip(guesses, pairs, strict=True)) / 4
    assert short_run.exact_match(pairs) == expected
    # A wrong reference can never match: this shows the metric is not vacuous.
    assert short_run.exact_match([(h, "not a date") for h, _ in pairs]) == 0.0


def test_checkpoints_keep_earlier_weights():
    run = train_date_translator(steps=6, progress=False, eval_every=6, checkpoints=(1, 3), **TINY)
    assert sorted(run.checkpoints) == [1, 3]
    early, later = run.at_checkpoint(1), run.at_checkpoint(3)
    final = dict(run.model.named_parameters())
    for name, p in early.model.named_parameters():
        # every tensor that training touches has moved between step 1 and the end
        if name.endswith("weight") and p.dim() == 2:
            assert not torch.equal(p, final[name]), name
            assert not torch.equal(p, dict(later.model.named_parameters())[name]), name
    assert not early.model.training
    assert 0.0 <= early.accuracy <= 1.0
    with pytest.raises(ValueError, match="saved checkpoints"):
        run.at_checkpoint(2)
    with pytest.raises(ValueError, match="checkpoints"):
        train_date_translator(steps=6, progress=False, checkpoints=(6,), **TINY)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(steps=0), "steps"),
        (dict(steps=2, batch_size=0), "batch_size"),
        (dict(steps=2, n_test=0), "n_test"),
        (dict(steps=2, cache="yes"), "cache"),
        (dict(steps=2, average=0), "average"),
        (dict(steps=400, average=5, average_every=100), "average=5 checkpoints"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_date_translator(progress=False, **kwargs)


def test_translate_rejects_a_bare_string(short_run):
    with pytest.raises(TypeError, match="sequence of strings"):
        short_run.translate("22 Nov 2026")


def _same_run(a: DateTranslator, b: DateTranslator) -> bool:
    return (
        all(
            torch.equal(x, y)
            for x, y in zip(
                a.model.state_dict().values(), b.model.state_dict().values(), strict=True
            )
        )
        and replace(a.history, seconds=0.0) == replace(b.history, seconds=0.0)
        and a.accuracy == b.accuracy
        and a.test_pairs == b.test_pairs
        and sorted(a.checkpoints) == sorted(b.checkpoints)
        and all(
            torch.equal(a.checkpoints[k][n], b.checkpoints[k][n])
            for k in a.checkpoints
            for n in a.checkpoints[k]
        )
    )


def test_a_saved_run_is_reused_only_with_the_same_settings(tmp_path, monkeypatch):
    """Chapter 8 saves its translator and chapter 9 reuses it: the reused run is the saved one,
    and any other setting trains anew."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = dict(steps=8, progress=False, eval_every=4, checkpoints=(2,), **TINY)
    saved = train_date_translator(cache="save", **args)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    trained = train_date_translator(**args)  # training again gives the same run...
    assert _same_run(saved, trained)

    real_fit = recipes.fit
    calls = []
    monkeypatch.setattr(recipes, "fit", lambda *a, **k: calls.append(1) or real_fit(*a, **k))
    reused = train_date_translator(cache="reuse", **args)  # ...which is what reuse loads
    assert calls == [] and _same_run(saved, reused)
    assert not reused.model.training and reused.at_checkpoint(2).accuracy == saved.accuracy
    other = train_date_translator(cache="reuse", **{**args, "steps": 9})  # not saved yet
    assert calls == [1] and other.history.step[-1] == 9
    assert len(list(tmp_path.glob("*.pt"))) == 2


def test_a_broken_or_unwritable_cache_only_costs_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    args = dict(steps=4, progress=False, eval_every=4, **TINY)
    good = train_date_translator(cache="save", **args)
    (file,) = tmp_path.glob("*.pt")
    file.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable cache"):
        again = train_date_translator(cache="reuse", **args)
    assert _same_run(good, again)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    with pytest.warns(UserWarning, match="could not save"):
        assert _same_run(good, train_date_translator(cache="save", **args))


def test_the_cache_key_names_threads_and_cpu_kernels(tmp_path, monkeypatch):
    """Other thread counts or other vectorised kernels (ATEN_CPU_CAPABILITY) round differently,
    so a run saved under one of them is never reused under another."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    settings = {"steps": 8, "seed": 0}
    here = cache_file(settings, "date_translator")
    assert here == cache_file(dict(settings), "date_translator")  # the key is stable
    assert here != cache_file({**settings, "seed": 1}, "date_translator")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "OTHER")
    assert cache_file(settings, "date_translator") != here
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert cache_file(settings, "date_translator") != here
    finally:
        torch.set_num_threads(threads)


def test_the_final_model_averages_the_last_checkpoints():
    """Sec. 6.1: the final weights are the mean of the last `average` checkpoints, the last one
    being the weights after the last step; its accuracy is measured on those averaged weights."""
    args = dict(steps=9, progress=False, eval_every=3, **{**TINY, "average": 1})
    last = train_date_translator(checkpoints=(3, 6), **args)
    mean = train_date_translator(**{**args, "average": 3, "average_every": 3})
    assert sorted(mean.checkpoints) == []  # the averaged ones are not kept as checkpoints
    for name, value in mean.model.state_dict().items():
        expected = torch.stack(
            [last.checkpoints[3][name], last.checkpoints[6][name], last.model.state_dict()[name]]
        ).mean(0)
        torch.testing.assert_close(value, expected)
    assert mean.history.loss == last.history.loss  # the same training run
    assert mean.accuracy == mean.exact_match(mean.test_pairs)
