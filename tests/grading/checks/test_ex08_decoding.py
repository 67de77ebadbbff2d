"""Tests of the ex08 checks (greedy decoding, beam search): the reference and independent decoders
pass, its catalogue (each mistake rerun: test_check_protocol.py), the cases are not trivial,
calling the reference decoders is named."""

from __future__ import annotations

import grading_impls_decoder as impls
import pytest
import torch

from coursepkg.decoding import beam_search, greedy_decode
from coursepkg.grading import (
    CheckFailure,
    catalogue,
    check_beam_search,
    check_greedy_decode,
)
from coursepkg.grading.checks import ex08_decoding as grading
from coursepkg.grading.checks import ex08_decoding_mistakes as mistakes
from coursepkg.grading.framework import configs

BOS, EOS = mistakes.BOS, mistakes.EOS


def _padded(a: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(a, (0, width - a.size(1)), value=EOS)


# ---------------------------------------------------------------------------------------------
# The cases themselves
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", configs(grading.GREEDY_ITEM), ids=str)
def test_greedy_cases_mix_early_eos_and_full_length(config) -> None:
    model, src = grading.decoding_case(config)
    out = greedy_decode(model, src, config["max_len"], BOS, EOS)
    early = (out[:, 1 : config["max_len"]] == EOS).any(dim=1)
    assert bool(early.any())
    if config["B"] > 1:
        assert not bool(early.all())  # some row runs to max_len
    model2, src2 = grading.decoding_case(config)
    assert torch.equal(src, src2)  # deterministic


@pytest.mark.parametrize("config", configs(grading.BEAM_ITEM)[1:3], ids=str)
def test_beam_cases_make_the_beam_and_the_normalisation_matter(config) -> None:
    model, src = grading.decoding_case(config)
    args = (config["beam"], config["max_len"], BOS, EOS)
    beam, _ = beam_search(model, src, *args, config["alpha"])
    raw, _ = beam_search(model, src, *args, 0.0)
    greedy = greedy_decode(model, src, config["max_len"], BOS, EOS)
    width = 1 + config["max_len"]
    assert not torch.equal(_padded(beam, width), _padded(greedy, width))
    assert not torch.equal(_padded(beam, width), _padded(raw, width))


def test_cases_are_fresh_models() -> None:
    config = configs(grading.GREEDY_ITEM)[1]
    model, _ = grading.decoding_case(config)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    again, _ = grading.decoding_case(config)
    assert bool(again.lm_head.weight.abs().sum() > 0)


# ---------------------------------------------------------------------------------------------
# check_greedy_decode
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl", [greedy_decode, impls.greedy_batched, impls.greedy_per_row], ids=lambda f: f.__name__
)
def test_greedy_accepts_correct_decoders(impl) -> None:
    assert check_greedy_decode(impl).passed


def test_greedy_thorough_mode_with_two_seeds() -> None:
    a, b = configs(grading.GREEDY_ITEM, True, 0), configs(grading.GREEDY_ITEM, True, 1)
    assert a != b and a[:3] == configs(grading.GREEDY_ITEM)
    assert check_greedy_decode(impls.greedy_batched, thorough=True, seed=1).passed


def test_greedy_failure_shows_the_rows() -> None:
    with pytest.raises(CheckFailure, match=r"Row \d: yours \[1, .*\], reference \[1, "):
        check_greedy_decode(grading.GREEDY_BUGS[0].impl)


def test_greedy_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="calls coursepkg.decoding.greedy_decode"):
        check_greedy_decode(lambda *args: greedy_decode(*args))


def test_greedy_with_a_no_grad_helper_is_not_flagged() -> None:
    # A decorated helper of the student's own must not look like a reference call.
    @torch.no_grad()
    def next_token(model, out, memory):
        return model.decode(out, memory)[:, -1].argmax(-1)

    def greedy(model, src, max_len, bos_id, eos_id):
        memory = model.encode(src)
        out = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
        done = torch.zeros(src.size(0), dtype=torch.bool)
        for _ in range(max_len):
            nxt = next_token(model, out, memory).masked_fill(done, eos_id)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == eos_id
            if bool(done.all()):
                break
        return out

    assert check_greedy_decode(greedy).passed


def test_greedy_float_tokens_are_reported() -> None:
    with pytest.raises(CheckFailure, match="token ids are integers"):
        check_greedy_decode(lambda *args: impls.greedy_batched(*args).float())


# ---------------------------------------------------------------------------------------------
# check_beam_search
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "impl", [beam_search, impls.beam_per_source, impls.beam_tensor], ids=lambda f: f.__name__
)
def test_beam_accepts_correct_searches(impl) -> None:
    result = check_beam_search(impl)
    assert result.passed
    assert "beam_size=1 equals greedy" in str(result)


def test_beam_thorough_mode_with_two_seeds() -> None:
    a, b = configs(grading.BEAM_ITEM, True, 0), configs(grading.BEAM_ITEM, True, 1)
    assert a != b and a[:4] == configs(grading.BEAM_ITEM)
    assert check_beam_search(impls.beam_tensor, thorough=True, seed=1).passed


def test_beam_calling_the_reference_is_named() -> None:
    with pytest.raises(CheckFailure, match="calls coursepkg.decoding.beam_search"):
        check_beam_search(lambda *args: beam_search(*args))


def test_beam_must_return_tokens_and_scores() -> None:
    with pytest.raises(CheckFailure, match=r"a pair \(tokens, scores\)"):
        check_beam_search(lambda *args: impls.beam_tensor(*args)[0])


def test_catalogue_lists_the_decoding_bugs() -> None:
    assert {bug.id for bug in mistakes.BUGS} <= {bug.id for bug in catalogue()}


def test_beam_near_ties_are_accepted_and_other_rows_are_not() -> None:
    config = configs(grading.BEAM_ITEM)[2]
    model, src = grading.decoding_case(config)
    k, max_len, alpha = config["beam"], config["max_len"], config["alpha"]
    tokens, _ = beam_search(model, src, k, max_len, BOS, EOS, alpha)
    tie = grading._ties_only
    assert not tie(model, src, tokens, tokens, EOS, max_len, alpha)  # identical: nothing to do
    # A row whose score is the reference's is a tie, whatever its tokens: here the same row
    # with junk after EOS would score the same, so it must be refused as malformed.
    finished = next(i for i in range(tokens.size(0)) if EOS in tokens[i, 1:].tolist())
    junk = tokens.clone()
    first_eos = tokens[finished, 1:].tolist().index(EOS) + 1
    if first_eos + 1 < tokens.size(1):
        junk[finished, first_eos + 1] = 5
        assert not tie(model, src, junk, tokens, EOS, max_len, alpha)
    # Another well-formed hypothesis with a different score is not a tie.
    other = tokens.clone()
    other[finished, 1:] = EOS
    assert not tie(model, src, other, tokens, EOS, max_len, alpha)
    # The reference's own hypothesis scores as the reference says.
    _, scores = beam_search(model, src, k, max_len, BOS, EOS, alpha)
    mine = grading._hypothesis_score(
        model, src[finished], tokens[finished].tolist(), EOS, max_len, alpha
    )
    assert abs(mine - float(scores[finished])) < 1e-5
