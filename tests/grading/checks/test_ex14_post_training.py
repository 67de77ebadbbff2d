"""Tests of the ex14 checks (``checks/ex14_post_training.py``): its catalogue (each mistake rerun
and named by its own id: test_check_protocol.py), independent correct answers in other styles pass
in visible and thorough mode, public code's mistakes get their ids, and the catalogue's correct
answers are :mod:`coursepkg.posttrain`'s."""

from __future__ import annotations

import grading_impls_posttrain as impls
import pytest
import torch

from coursepkg import grading
from coursepkg.grading import CheckFailure
from coursepkg.grading.checks import ex14_post_training_mistakes as catalogue
from coursepkg.grading.checks.ex14_mistakes import dpo, grpo, lora, sft
from coursepkg.grading.framework import post_training as references

CHECK_OF_ITEM = {
    sft.SFT_ITEM: grading.check_sft_loss,
    lora.LORA_ITEM: grading.check_lora_linear,
    dpo.DPO_ITEM: grading.check_dpo_loss,
    grpo.ENTROPY_ITEM: grading.check_token_entropy,
    grpo.MASKED_MEAN_ITEM: grading.check_masked_mean,
    grpo.PG_ITEM: grading.check_grpo_clip_loss,
    grpo.ADVANTAGES_ITEM: grading.check_group_advantages,
    grpo.GRPO_ITEM: grading.check_grpo_loss,
}
ANSWERS = {
    grading.check_sft_loss: [impls.sft_labels_minus_100, impls.sft_gather_and_index],
    grading.check_lora_linear: [impls.LoRAMergedOnTheFly, impls.LoRAEinsum],
    grading.check_dpo_loss: [impls.dpo_softplus, impls.dpo_logratios],
    grading.check_group_advantages: [
        impls.advantages_repeat_interleave,
        impls.advantages_std_mean,
    ],
    grading.check_grpo_loss: [impls.grpo_two_losses, impls.grpo_from_pieces],
    grading.check_token_entropy: [impls.entropy_categorical, impls.entropy_logsumexp],
    grading.check_masked_mean: [impls.masked_mean_float_mask, impls.masked_mean_masked_fill],
    grading.check_grpo_clip_loss: [impls.pg_ppo_two_losses, impls.pg_trl_coefs],
}


def test_the_issue_s_mistakes_are_catalogued_once_each():
    ids = [b.id for b in catalogue.BUGS]
    assert len(ids) == len(set(ids))
    assert {
        "sft.prompt_in_loss",
        "sft.padding_in_loss",
        "sft.per_sequence_mean",
        "lora.b_not_zero",
        "lora.no_scaling",
        "dpo.reference_gradient",
        "dpo.sign_flipped",
        "dpo.beta_left_out",
        "advantages.batch_normalised",
        "advantages.zero_std",
        "grpo.clip_wrong_side",
        "grpo.kl_sign",
        # issue 65's: the two wrong verdicts, then the named mistakes
        "lora.both_zero",
        "grpo.old_gradient",
        "grpo.all_tokens",
        "grpo.clip_upper_only",
        "grpo.clip_lower_only",
        "advantages.baseline_after_scaling",
        "sft.mask_not_shifted",
        "dpo.no_reference",
        # issue 65's per-token pieces
        "entropy.log_of_softmax",
        "entropy.sign_flipped",
        "masked_mean.all_entries",
        "masked_mean.divided_by_all",
        "pg.sign_flipped",
        "pg.clip_wrong_side",
        "pg.old_gradient",
    } <= set(ids)


@pytest.mark.parametrize(
    ("check", "impl"),
    [(check, impl) for check, answers in ANSWERS.items() for impl in answers],
    ids=lambda x: x.__name__,
)
@pytest.mark.parametrize("seed", [None, 0], ids=["visible", "thorough"])
def test_independent_answers_pass(check, impl, seed):
    result = check(impl, thorough=seed is not None, seed=seed)
    assert result.passed and result.messages


@pytest.mark.parametrize(
    ("check", "impl", "bug_id"),
    [
        (grading.check_sft_loss, impls.sft_labels_from_attention_mask, "sft.prompt_in_loss"),
        (grading.check_lora_linear, impls.LoRAGaussianB, "lora.b_not_zero"),
        (grading.check_dpo_loss, impls.dpo_unfrozen_reference, "dpo.reference_gradient"),
        (grading.check_grpo_loss, impls.grpo_dr_grpo_token_sum, "grpo.token_mean"),
        # the two verdicts that were wrong: both were accepted
        (grading.check_lora_linear, impls.LoRAZeros, "lora.both_zero"),
        (grading.check_grpo_loss, impls.grpo_old_attached, "grpo.old_gradient"),
        (grading.check_sft_loss, impls.sft_labels_mask_unshifted, "sft.mask_not_shifted"),
        (grading.check_dpo_loss, impls.dpo_reference_free, "dpo.no_reference"),
        (
            grading.check_group_advantages,
            impls.advantages_scale_then_centre,
            "advantages.baseline_after_scaling",
        ),
        (grading.check_grpo_loss, impls.grpo_clamp_max, "grpo.clip_upper_only"),
        (grading.check_grpo_loss, impls.grpo_unmasked_mean, "grpo.all_tokens"),
        # issue 65's per-token pieces, written as public code writes them
        (grading.check_token_entropy, impls.entropy_log_of_probs, "entropy.log_of_softmax"),
        (grading.check_masked_mean, impls.masked_mean_product_mean, "masked_mean.divided_by_all"),
        (grading.check_grpo_clip_loss, impls.pg_min_of_losses, "pg.clip_wrong_side"),
        (grading.check_grpo_clip_loss, impls.pg_old_attached, "pg.old_gradient"),
        (grading.check_grpo_clip_loss, impls.pg_objective, "pg.sign_flipped"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_mistake_in_another_style_is_named(check, impl, bug_id):
    with pytest.raises(CheckFailure) as info:
        check(impl)
    assert info.value.diagnosis == bug_id, str(info.value)


@pytest.mark.parametrize("check", list(ANSWERS), ids=lambda c: c.__name__)
def test_the_catalogue_s_answers_are_the_reference_s(check):
    item = next(item for item, c in CHECK_OF_ITEM.items() if c is check)
    reference = {
        sft.SFT_ITEM: references.sft_reference,
        lora.LORA_ITEM: references.LoRAReference,
        dpo.DPO_ITEM: references.dpo_reference,
        grpo.ENTROPY_ITEM: references.entropy_reference,
        grpo.MASKED_MEAN_ITEM: references.masked_mean_reference,
        grpo.PG_ITEM: references.pg_reference,
        grpo.ADVANTAGES_ITEM: references.advantages_reference,
        grpo.GRPO_ITEM: references.grpo_reference,
    }[item]
    assert check(reference, thorough=True, seed=5).passed


def test_an_equal_group_is_in_the_visible_rewards():
    # the zero-std mistake shows only on a group whose rewards are all equal
    with pytest.raises(CheckFailure) as info:
        grading.check_group_advantages(grpo.group_advantages_zero_std)
    assert "nan" in str(info.value).lower()
    rewards = torch.tensor([[1.0, 1.0, 1.0]])
    assert torch.equal(references.advantages_reference(rewards), torch.zeros(1, 3))


def test_the_entropy_inputs_underflow_a_probability_in_both_dtypes():
    # the log-of-softmax mistake shows only where a probability is exactly 0
    with pytest.raises(CheckFailure) as info:
        grading.check_token_entropy(grpo.token_entropy_log_of_softmax)
    assert "nan" in str(info.value).lower()
    for dtype, gap in ((torch.float32, 120.0), (torch.float64, 800.0)):
        logits = torch.tensor([[gap, 0.0, -1.0]], dtype=dtype)
        assert torch.softmax(logits, -1)[0, 1] == 0
        assert torch.isfinite(references.entropy_reference(logits)).all()


def test_grpo_assembled_from_the_pieces_is_the_reference_grpo():
    # the pieces' references, put together as the notebook suggests, are the graded grpo_loss
    gen = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=gen, dtype=torch.float64)
    old, ref = lp + 0.3 * torch.randn(2, 3, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, generator=gen, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = mask[2, 1:] = False
    per_token = references.pg_reference(lp, old, adv, 0.2) + 0.1 * references.k3(lp, ref)
    assembled = references.masked_mean_reference(per_token, mask, 1).mean()
    torch.testing.assert_close(
        assembled, references.grpo_reference(lp, old, ref, adv, mask, 0.2, 0.1)
    )
