"""Every implementation of the corpus (``grading_corpus.py``: the habits of widely used public
Transformer code) gets the verdict its exercise's docstring calls for, in visible and thorough
mode; a wrong one gets its mistake named, and no run ends in a crash of the checker."""

from __future__ import annotations

import grading_corpus as corpus
import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny ops: a second thread only adds synchronisation on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_corpus_is_large_and_mixed():
    ids = [e.id for e in corpus.CORPUS]
    assert len(ids) == len(set(ids)) >= 40
    assert sum(e.passes for e in corpus.CORPUS) >= 15
    # A wrong entry names its mistake, except those marked None (two mistakes at once, or a
    # mistake no check names yet): they count as unnamed in the corpus line, and are few.
    wrong = [e for e in corpus.CORPUS if not e.passes]
    unnamed = [e.id for e in wrong if e.named is None]
    assert len(unnamed) <= 0.1 * len(wrong), unnamed
    assert not any(e.named for e in corpus.CORPUS if e.passes)
    # Every check is exercised.
    assert {e.check for e in corpus.CORPUS} >= {
        "check_scaled_dot_product_attention",
        "check_multi_head_attention",
        "check_positional_encoding",
        "check_layer_norm",
        "check_feed_forward",
        "check_encoder_layer",
        "check_causal_mask",
        "check_decoder_layer",
        "check_noam_lr",
        "check_label_smoothing",
        "check_parameter_count",
        "check_greedy_decode",
        "check_beam_search",
        "check_rms_norm",
        "check_apply_rope",
        "check_grouped_query_attention",
        "check_modern_block",
        "check_tiled_attention",
        "check_adamw",
        "check_param_groups",
        "check_warmup_cosine_lr",
        "check_clip_grad_norm",
        "check_training_state",
        "check_naive_ddp",
        "check_bucketed_ddp",
        "check_sharded_adamw",
        "check_route_top_k",
        "check_load_balancing_loss",
        "check_compress_latent",
        "check_sft_loss",
        "check_lora_linear",
        "check_dpo_loss",
        "check_token_entropy",
        "check_masked_mean",
        "check_grpo_clip_loss",
        "check_group_advantages",
        "check_grpo_loss",
        "check_temperature_scale",
        "check_top_k_filter",
        "check_top_p_filter",
        "check_min_p_filter",
        "check_repetition_penalty",
        "check_residual_distribution",
        "check_speculative_accept",
        "check_exact_line_dedup",
        "check_word_shingles",
        "check_lsh_candidate_pairs",
        "check_gopher_failures",
        "check_mask_emails",
        "check_mask_phone_numbers",
        "check_mask_ipv4",
        "check_minhash_signature",
    }


# The thorough mode (the checks' larger draws) runs in `make test`; `make test-fast` the visible.
THOROUGH = pytest.param(True, marks=pytest.mark.slow)


@pytest.mark.parametrize("thorough", [False, THOROUGH], ids=["visible", "thorough"])
@pytest.mark.parametrize("entry", corpus.CORPUS, ids=lambda e: e.id)
def test_corpus_entry_gets_its_verdict_and_named_mistake(entry, thorough):
    outcome = corpus.run(entry, thorough)
    assert not outcome.checker_error, outcome.message
    assert outcome.passed == entry.passes, outcome.message
    if not entry.passes and entry.named is not None:
        assert outcome.named_right(entry), (entry.named, outcome.diagnosis, outcome.message)
    elif not entry.passes:  # unnamed: no catalogued name may be given
        assert outcome.diagnosis is None, outcome.message
