"""The book's training loop: it learns, records what it did, and rejects bad arguments."""

import pytest
import torch
from torch import nn

from coursepkg.chapters.train import History, fit, fit_warmup_decay, seed_everything


def _regression_batches(generator, n=64):
    w = torch.tensor([[2.0], [-3.0]])
    while True:
        x = torch.randn(n, 2, generator=generator)
        yield x, x @ w


def _mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def test_fit_reduces_loss_and_records_history():
    g = seed_everything(0)
    model = nn.Linear(2, 1)
    calls = []

    def evaluate(m):
        calls.append(m.training)
        return {"w0": float(m.weight[0, 0])}

    h = fit(
        model,
        _regression_batches(g),
        _mse,
        steps=200,
        lr=0.05,
        eval_fn=evaluate,
        eval_every=50,
        progress=False,
    )
    assert h.step == list(range(1, 201))
    assert len(h.loss) == len(h.lr) == 200
    assert h.eval_step == [50, 100, 150, 200]
    assert calls == [False] * 4  # evaluation runs in eval mode
    assert h.loss[-1] < 0.01 * h.loss[0]
    assert h.metrics["w0"][-1] == pytest.approx(2.0, abs=0.05)
    assert h.seconds > 0


def test_fit_cycles_a_finite_list_and_steps_the_scheduler():
    g = seed_everything(1)
    data = [next(_regression_batches(g)) for _ in range(3)]
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    h = fit(model, data, _mse, steps=7, optimizer=opt, scheduler=sched, progress=False)
    assert h.lr[:3] == pytest.approx([0.1, 0.05, 0.1 / 3])


def test_fit_stops_on_nan_naming_the_step():
    model = nn.Linear(2, 1)

    def bad(m, batch):
        return m(batch).sum() * float("nan")

    with pytest.raises(FloatingPointError, match="step 1"):
        fit(model, [torch.ones(1, 2)], bad, steps=3, progress=False)


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": 2, "eval_every": 0}])
def test_fit_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError):
        fit(nn.Linear(2, 1), [torch.ones(1, 2)], lambda m, b: m(b).sum(), progress=False, **kwargs)


def test_smoothed_loss_is_a_running_mean():
    h = History(loss=[4.0, 2.0, 0.0, 2.0])
    assert h.smoothed_loss(window=2) == [4.0, 3.0, 1.0, 1.0]


def _warmup_decay_run() -> tuple[History, dict[str, torch.Tensor]]:
    g = seed_everything(3)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))  # four parameters
    heldout = [next(_regression_batches(torch.Generator().manual_seed(9)))]
    history = fit_warmup_decay(
        model,
        _regression_batches(g),
        _mse,
        _mse,
        heldout,
        steps=12,
        lr=0.05,
        warmup=3,
        eval_every=4,
    )
    return history, model.state_dict()


def test_fit_warmup_decay_s_adam_gives_the_per_parameter_loop_s_numbers(per_parameter_adam):
    history, weights = _warmup_decay_run()
    per_parameter_adam()
    looped_history, looped_weights = _warmup_decay_run()
    history.seconds = looped_history.seconds = 0.0  # the one field that is a timing
    assert history == looped_history  # every loss, rate and held-out loss, bit for bit
    assert history.loss[-1] < history.loss[0]
    for name, value in weights.items():
        assert torch.equal(value, looped_weights[name]), name
