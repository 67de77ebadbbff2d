"""Tests of the ex16 checks (``checks/ex16_experts.py``): its catalogue (each mistake rerun and
named by its own id: test_check_protocol.py), independent correct solutions (Hugging Face's
Qwen3-MoE router and Mixtral loss, Switch's loss, DeepSeek's down-projection) pass in visible and
thorough mode, public habits that are wrong here get their id, and a call to the course's own
router or a wrong return type is told."""

from __future__ import annotations

import grading_impls_experts as impls
import pytest
import torch

from coursepkg.grading import (
    CheckFailure,
    check_compress_latent,
    check_load_balancing_loss,
    check_route_top_k,
)
from coursepkg.grading.checks import ex16_experts_mistakes as catalogue

CHECKS = {
    catalogue.ROUTER_ITEM: check_route_top_k,
    catalogue.AUX_LOSS_ITEM: check_load_balancing_loss,
    catalogue.LATENT_ITEM: check_compress_latent,
}


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids)) == 15
    assert {b.item for b in catalogue.BUGS} == set(CHECKS)
    assert {"router.topk_before_softmax", "aux_loss.no_expert_factor"} <= set(ids)
    assert "latent.rope_with_latent" in ids


@pytest.mark.parametrize(
    ("check", "impl"),
    [
        (check_route_top_k, impls.qwen3_moe_router),
        (check_route_top_k, impls.unsorted_gather_router),
        (check_load_balancing_loss, impls.mixtral_aux_loss),
        (check_load_balancing_loss, impls.switch_aux_loss),
        (check_compress_latent, impls.deepseek_compress),
    ],
    ids=lambda x: x.__name__,
)
@pytest.mark.parametrize("seed", [None, 0], ids=["visible", "thorough"])
def test_independent_solutions_pass(check, impl, seed):
    result = check(impl, thorough=seed is not None, seed=seed)
    assert result.passed and result.messages


@pytest.mark.parametrize(
    ("check", "impl", "bug_id"),
    [
        (check_route_top_k, impls.mixtral_router, "router.topk_before_softmax"),
        (
            check_load_balancing_loss,
            impls.switch_factor_with_sum,
            "aux_loss.experts_squared_with_sum",
        ),
        (check_load_balancing_loss, impls.aux_loss_without_e, "aux_loss.no_expert_factor"),
        (check_compress_latent, impls.compress_then_rotate_all, "latent.rope_with_latent"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_mistake_in_another_style_is_named(check, impl, bug_id):
    with pytest.raises(CheckFailure) as info:
        check(impl)
    assert info.value.diagnosis == bug_id, str(info.value)


def test_calling_the_course_s_router_and_returning_one_tensor_are_told():
    from coursepkg.moe import route_top_k

    def borrowed(logits, k, renormalize=True):
        routing = route_top_k(logits, k, renormalize)
        return routing.weights, routing.experts

    with pytest.raises(CheckFailure, match="coursepkg.moe.route_top_k"):
        check_route_top_k(borrowed)
    with pytest.raises(CheckFailure, match="should be a pair of tensors, but your code returned"):
        check_route_top_k(lambda logits, k, renormalize=True: logits.topk(k).values)
    with pytest.raises(CheckFailure, match=r"your loss \(.*\) has shape \(1,\), expected \(\)"):
        check_load_balancing_loss(lambda p, e, n: impls.mixtral_aux_loss(p, e, n)[None])


def test_a_loss_without_gradient_is_told():
    def detached(probs, experts, n_experts):
        return impls.mixtral_aux_loss(probs.detach(), experts, n_experts)

    with pytest.raises(CheckFailure, match="does not require grad"):
        check_load_balancing_loss(detached)
    assert torch.is_grad_enabled()
