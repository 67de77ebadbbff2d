"""Tests of the ex13 checks (``checks/ex13_training_pieces.py``): its catalogue (each mistake rerun
and named by its own id: test_check_protocol.py), independent correct answers in several styles
pass in visible and thorough mode, the same styles with a mistake get its id, and the catalogue's
correct pieces are the reference's and PyTorch's (so a variant differs by its own mistake only)."""

from __future__ import annotations

import grading_impls_training_pieces as impls
import pytest
import torch

from coursepkg import optim
from coursepkg.grading import (
    CheckFailure,
    check_adamw,
    check_clip_grad_norm,
    check_param_groups,
    check_training_state,
    check_warmup_cosine_lr,
    registered_checks,
)
from coursepkg.grading.checks import ex13_training_pieces as check_module
from coursepkg.grading.checks import ex13_training_pieces_mistakes as catalogue
from coursepkg.grading.checks.ex13_mistakes import optimiser, resume
from coursepkg.grading.framework import configs

CHECK_OF = {
    bug.id: entry.check
    for entry in registered_checks()
    if entry.assignment == "ex13_training_pieces"
    for bug in entry.bugs
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == len(CHECK_OF) == 30
    assert {
        "adamw.l2_decay",
        "adamw.no_bias_correction",
        "adamw.bias_correction_off_by_one",
        "param_groups.decays_vectors",
        "warmup_cosine.warmup_off_by_one",
        "warmup_cosine.cosine_past_the_end",
        "clip.per_tensor",
        "resume.no_rng_state",
        "resume.no_data_position",
    } <= set(ids)


CORRECT = [
    (check_adamw, impls.LoopAdamW),
    (check_adamw, impls.FunctionalAdamW),
    (check_adamw, impls.ForeachAdamW),
    (check_param_groups, impls.nanogpt_groups),
    (check_param_groups, impls.seen_set_groups),
    (check_warmup_cosine_lr, impls.nanogpt_lr),
    (check_warmup_cosine_lr, impls.multiplier_lr),
    (check_clip_grad_norm, impls.clip_by_squares),
    (check_clip_grad_norm, impls.clip_by_stacked_norms),
    (check_clip_grad_norm, impls.clip_by_concatenation),
    (check_clip_grad_norm, impls.clip_without_eps),
    (check_training_state, impls.FlatState),
    (check_training_state, impls.NestedState),
]


@pytest.mark.parametrize(("check", "impl"), CORRECT, ids=lambda x: x.__name__)
@pytest.mark.parametrize("seed", [None, 0, 5], ids=["visible", "thorough0", "thorough5"])
def test_independent_answers_pass(check, impl, seed):
    result = check(impl, thorough=seed is not None, seed=seed)
    assert result.passed and result.messages


WRONG = [
    (check_adamw, impls.LoopAdamWL2, "adamw.l2_decay"),
    (check_adamw, impls.FunctionalAdamWNoCorrection, "adamw.no_bias_correction"),
    (check_adamw, impls.ForeachAdamWCountFromOne, "adamw.bias_correction_off_by_one"),
    (check_adamw, impls.ForeachAdamWEpsUnderRoot, "adamw.eps_inside_sqrt"),
    (check_adamw, impls.LoopAdamWOneDecay, "adamw.decay_every_group"),
    (check_adamw, impls.FunctionalAdamWKeepsLr, "adamw.lr_read_once"),
    (check_adamw, impls.SubclassesTorchAdamW, "adamw.builtin"),
    (check_param_groups, impls.hf_no_decay_names, "param_groups.norm_gains_decayed"),
    (check_param_groups, impls.everything_decayed, "param_groups.decays_vectors"),
    (check_warmup_cosine_lr, impls.nanogpt_lr_old_warmup, "warmup_cosine.warmup_off_by_one"),
    (check_warmup_cosine_lr, impls.multiplier_lr_unclamped, "warmup_cosine.cosine_past_the_end"),
    (check_clip_grad_norm, impls.clip_each_tensor, "clip.per_tensor"),
    (check_clip_grad_norm, impls.clip_with_torch, "clip.builtin"),
    (check_training_state, impls.FlatStateNoRng, "resume.no_rng_state"),
    (check_training_state, impls.NestedStateNoData, "resume.no_data_position"),
    (check_training_state, impls.WeightsOnlyState, "resume.no_optimizer_state"),
]


@pytest.mark.parametrize(
    ("check", "impl", "bug_id"), WRONG, ids=lambda x: getattr(x, "__name__", x)
)
@pytest.mark.parametrize("seed", [None, 7], ids=["visible", "thorough7"])
def test_a_mistake_in_another_style_is_named(check, impl, bug_id, seed):
    with pytest.raises(CheckFailure) as info:
        check(impl, thorough=seed is not None, seed=seed)
    assert info.value.diagnosis == bug_id, str(info.value)


def _clip_needs_a_list(parameters, max_norm):
    grads = [parameters[i].grad for i in range(len(parameters))]  # an iterator has no len()
    return torch.stack([g.norm() for g in grads if g is not None]).norm()


def _clip_rejects_large_gradients(parameters, max_norm):
    for p in parameters:
        if p.grad is not None and p.grad.abs().max() > max_norm:
            raise ValueError("gradient too large")
    return torch.tensor(0.0)


@pytest.mark.parametrize("impl", [_clip_needs_a_list, _clip_rejects_large_gradients])
def test_a_crash_the_missing_gradient_did_not_cause_is_not_named_after_it(impl):
    # clip.grad_none_crashes needs the evidence that the same call without that parameter
    # runs and is right; these raise without it too, and stay the student's errors.
    with pytest.raises(CheckFailure) as info:
        check_clip_grad_norm(impl)
    said = str(info.value)
    assert info.value.diagnosis is None, said
    assert "clip_grad_norm_ raised" in said and "checker itself failed" not in said


def test_the_reference_s_own_pieces_are_named_as_calls():
    with pytest.raises(CheckFailure) as info:
        check_adamw(optim.AdamW)
    assert info.value.diagnosis == "adamw.builtin"
    with pytest.raises(CheckFailure) as info:
        check_clip_grad_norm(torch.nn.utils.clip_grad_norm_)
    assert info.value.diagnosis == "clip.builtin"


@pytest.mark.parametrize("cfg", configs(optimiser.ADAMW_ITEM, True, 3), ids=str)
def test_the_catalogue_s_adamw_is_torch_s_and_the_reference_s(cfg):
    inputs = (cfg, *check_module._adamw_gradients(cfg, 3, torch.float64))
    expected = check_module._adamw_trajectory(check_module._torch_adamw, inputs)
    for optimizer in (optimiser.AdamWSteps, optim.AdamW):
        got = check_module._adamw_trajectory(optimizer, inputs)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_the_catalogue_s_groups_and_resume_are_the_reference_s():
    model = check_module._GroupsProbe()
    mine = check_module._decay_table(optimiser.correct_param_groups(model, 0.3), model)
    theirs = check_module._decay_table(optim.param_groups(model, 0.3), model)
    assert torch.equal(mine, theirs) and set(mine.tolist()) == {0.0, 0.3}
    cfg = configs(resume.RESUME_ITEM)[0]
    resumed = check_module.resume_run(
        resume.ResumeSteps.capture, resume.ResumeSteps.restore, cfg, 0
    )
    assert torch.equal(resumed, check_module.run_uninterrupted(cfg, 0))


def test_each_resume_mistake_changes_the_weights():
    """The interrupted run really depends on each piece of the state (dropout is on, the
    batches are random, Adam has moments and the schedule warms up)."""
    cfg = configs(resume.RESUME_ITEM)[0]
    whole = check_module.run_uninterrupted(cfg, 0)
    finals = [
        check_module.resume_run(bug.impl.capture, bug.impl.restore, cfg, 0)
        for bug in resume.RESUME_BUGS
    ]
    assert all(not torch.equal(f, whole) for f in finals)
    assert all(not torch.equal(a, b) for i, a in enumerate(finals) for b in finals[i + 1 :])


def test_a_state_torch_save_cannot_write_is_told():
    class KeepsAFunction(impls.FlatState):
        @staticmethod
        def capture(model, optimizer, step, batches):
            state = impls.FlatState.capture(model, optimizer, step, batches)
            return {**state, "lr": lambda s: 1e-2}

    with pytest.raises(CheckFailure, match="torch.save cannot write"):
        check_training_state(KeepsAFunction)


def test_a_parameter_in_two_groups_is_told():
    def twice(model, weight_decay):
        params = list(model.parameters())
        return [
            {"params": params, "weight_decay": weight_decay},
            {"params": params[:1], "weight_decay": 0.0},
        ]

    with pytest.raises(CheckFailure, match="in two groups"):
        check_param_groups(twice)


def test_a_clip_that_walks_the_parameters_twice_is_told():
    def walks_twice(parameters, max_norm):
        total = torch.sqrt(sum((p.grad**2).sum() for p in parameters if p.grad is not None))
        for p in parameters:  # the iterator is spent: nothing is scaled
            p.grad.mul_(min(1.0, max_norm / float(total)))
        return total

    with pytest.raises(CheckFailure, match="one-pass iterator") as info:
        check_clip_grad_norm(walks_twice)
    assert info.value.diagnosis is None


def test_a_wrong_clip_that_walks_once_is_not_told_about_iterators():
    def squared_factor(parameters, max_norm):
        grads = [p.grad for p in parameters if p.grad is not None]
        total = torch.cat([g.flatten() for g in grads]).norm()
        for g in grads:
            g.mul_(min(1.0, (max_norm / float(total)) ** 2))  # the factor squared
        return total

    with pytest.raises(CheckFailure) as info:
        check_clip_grad_norm(squared_factor)
    assert "clipped gradients" in str(info.value)
    assert "one-pass iterator" not in str(info.value)
