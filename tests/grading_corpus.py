"""A corpus of implementations in the habits of widely used public Transformer code, each with
the verdict the exercise's docstring calls for and, for a wrong one, the mistake a check must
name. The suite runs every entry in visible and thorough mode (``test_grading_corpus.py``);
run this file to count verdicts, named mistakes and checker errors::

    .venv/bin/python tests/grading_corpus.py

An entry's ``named`` is a catalogue id (matched against the failure's ``diagnosis``) or a
tuple of phrases that must all appear in the message (case-insensitive).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import grading_corpus_layers as lay  # noqa: E402
import grading_corpus_training as trn  # noqa: E402
import grading_impls_tokenizer as tok  # noqa: E402

from coursepkg import grading  # noqa: E402
from coursepkg.grading import CheckFailure  # noqa: E402

#: Text that marks a failure of the checker itself (before and after the fix).
CHECKER_ERROR_MARKS = ("the check stopped on an unexpected error", "the checker itself failed")


@dataclass(frozen=True)
class Entry:
    """One implementation, the check that judges it, and what it must say."""

    id: str
    check: str
    impl: Any
    passes: bool
    named: str | tuple[str, ...] | None = None


E = Entry
CORPUS: list[Entry] = [
    # ex01
    E("sdpa.annotated_minus_1e9", "check_scaled_dot_product_attention", lay.sdpa_annotated,
      False, "sdpa.masked_row_uniform"),
    E("sdpa.nan_to_num", "check_scaled_dot_product_attention", lay.sdpa_nan_to_num, True),
    E("sdpa.finfo_then_zero", "check_scaled_dot_product_attention", lay.sdpa_finfo_then_zero,
      True),
    E("sdpa.unscaled", "check_scaled_dot_product_attention", lay.sdpa_unscaled, False,
      "sdpa.no_scaling"),
    E("sdpa.where_minus_1e4", "check_scaled_dot_product_attention", lay.sdpa_where_minus_1e4,
      False, "sdpa.masked_row_uniform"),
    # ex02
    E("mha.stores_weights", "check_multi_head_attention", lay.MHAStoresWeights, True),
    E("mha.linears_list", "check_multi_head_attention", lay.MHALinearsList, False,
      ("same number of parameters under other names", "q_proj")),
    E("mha.fused_c_attn", "check_multi_head_attention", lay.MHAFusedCAttn, False,
      ("same number of parameters under other names", "split a fused")),
    E("mha.self_attention_only", "check_multi_head_attention", lay.MHASelfOnly, False,
      ("ignores its key and value",)),
    E("mha.minus_1e9", "check_multi_head_attention", lay.MHAMinus1e9, False,
      ("finite fill",)),
    E("mha.lazy_linear", "check_multi_head_attention", lay.MHALazy, True),
    E("mha.key_padding_convention", "check_multi_head_attention", lay.MHAKeyPaddingConvention,
      False, "mha.inverted_mask"),
    E("mha.own_keyword_names", "check_multi_head_attention", lay.MHAKwargs, True),
    # ex03
    E("pe.annotated", "check_positional_encoding", lay.pe_annotated, True),
    E("pe.keras_loops", "check_positional_encoding", lay.pe_numpy_style, True),
    E("pe.tensor2tensor", "check_positional_encoding", lay.pe_tensor2tensor, False,
      ("first half",)),
    E("pe.halves_paper_frequencies", "check_positional_encoding", lay.pe_halves_paper_freqs,
      False, "pe.halves_not_interleaved"),
    # ex04
    E("ln.annotated_std_eps", "check_layer_norm", lay.LNAnnotated, False,
      ("unbiased", "standard deviation")),
    E("ln.eps_ignored", "check_layer_norm", lay.LNNoEps, False, "ln.eps_ignored"),
    E("ln.bert_default_eps", "check_layer_norm", lay.LNBert, False, "ln.default_eps"),
    E("ln.rsqrt", "check_layer_norm", lay.LNRsqrt, True),
    E("ln.std_plus_eps", "check_layer_norm", lay.LNStdPlusEps, False, "ln.eps_outside_sqrt"),
    E("ffn.annotated_names", "check_feed_forward", lay.FFNAnnotated, False,
      ("same number of parameters under other names", "linear1")),
    E("ffn.dropout", "check_feed_forward", lay.FFNDropout, True),
    E("enc.stores_weights", "check_encoder_layer", lay.EncoderStoresWeights, True),
    E("enc.pre_ln_stores_weights", "check_encoder_layer", lay.EncoderPreLNStoresWeights, False,
      "enc.pre_ln"),
    E("enc.minus_1e9", "check_encoder_layer", lay.EncoderMinus1e9, False, ("finite fill",)),
    E("enc.kwargs_annotated_norm", "check_encoder_layer", lay.EncoderKwargsUnbiasedNorm, False,
      ("norm1", "unbiased", "the rest of your layer is right")),
    E("enc.kwargs", "check_encoder_layer", lay.EncoderKwargs, True),
    # ex05
    E("mask.subsequent_float", "check_causal_mask", lay.mask_subsequent_float, False,
      "causal_mask.inverted_float"),
    E("mask.tril_bool", "check_causal_mask", lay.mask_tril_bool, True),
    E("mask.batched", "check_causal_mask", lay.mask_batched, False, ("has shape (1,",)),
    E("dec.stores_weights", "check_decoder_layer", lay.DecoderStoresWeights, True),
    E("dec.pre_ln", "check_decoder_layer", lay.DecoderPreLN, False, "decoder_layer.pre_ln"),
    E("dec.minus_1e9", "check_decoder_layer", lay.DecoderMinus1e9, False, ("finite fill",)),
    E("dec.self_attention_only", "check_decoder_layer", lay.DecoderSelfOnly, False,
      ("ignores its key and value",)),
    E("dec.lazy_linear", "check_decoder_layer", lay.DecoderLazy, True),
    # ex06
    E("noam.annotated", "check_noam_lr", trn.noam_annotated, True),
    E("ls.scatter", "check_label_smoothing", trn.ls_scatter, True),
    E("ls.mix", "check_label_smoothing", trn.ls_mix, True),
    E("ls.kl_div", "check_label_smoothing", trn.ls_kl_div, False, ("KL",)),
    E("ls.wenet_kl", "check_label_smoothing", trn.ls_wenet_kl, False,
      "label_smoothing.kl_eps_over_v_minus_1"),
    E("ls.fairseq", "check_label_smoothing", trn.ls_fairseq, False,
      "label_smoothing.eps_over_v_minus_1"),
    E("ls.gather_first", "check_label_smoothing", trn.ls_gather_first, False,
      ("ignore_index=-100",)),
    # ex07
    E("params.loops", "check_parameter_count", trn.params_loops, True),
    E("params.output_bias", "check_parameter_count", trn.params_output_bias, False,
      "parameter_count.output_bias"),
    E("params.no_final_norm", "check_parameter_count", trn.params_no_final_norm, False,
      "parameter_count.final_norm_ignored"),
    E("params.untied_once", "check_parameter_count", trn.params_untied_once, False,
      "parameter_count.untied_embeddings_counted_once"),
    # ex08
    E("greedy.cat", "check_greedy_decode", trn.greedy_cat, True),
    E("greedy.drops_eos", "check_greedy_decode", trn.greedy_drops_eos, False,
      "greedy.drops_eos"),
    E("beam.lists", "check_beam_search", trn.beam_lists, True),
    E("beam.keeps_finished", "check_beam_search", trn.beam_keeps_finished, False,
      "beam.finished_kept_in_beam"),
    E("beam.bos_counted", "check_beam_search", trn.beam_bos_counted, False,
      "beam.length_counts_bos"),
    # ex10: GPT-2's encoder.py, minbpe's trainer (ties to the pair seen first), plain loops
    E("bpe.gpt2_encoder_py", "check_tokenizer", tok.GPT2StyleTokenizer, True),
    E("bpe.sequential_merges", "check_tokenizer", tok.SequentialMergesTokenizer, True),
    E("bpe.incremental_dicts", "check_train_bpe", tok.train_incremental, True),
    E("bpe.minbpe_first_seen_ties", "check_train_bpe", tok.train_first_seen_ties, False,
      ("your merges differ",)),
    E("bpe.gpt2_per_token_decode", "check_tokenizer", tok.GPT2StylePerTokenDecode, False,
      "tokenizer.decode_per_token"),
]  # fmt: skip


@dataclass
class Outcome:
    """What a check said about one entry in one mode."""

    passed: bool
    message: str
    diagnosis: str | None
    checker_error: bool

    def verdict_right(self, entry: Entry) -> bool:
        return self.passed == entry.passes and not self.checker_error

    def named_right(self, entry: Entry) -> bool:
        if entry.passes or self.passed or entry.named is None:
            return False
        if isinstance(entry.named, str):
            return self.diagnosis == entry.named
        text = self.message.lower()
        return all(phrase.lower() in text for phrase in entry.named)


def run(entry: Entry, thorough: bool) -> Outcome:
    """Run the entry's check in one mode."""
    check = getattr(grading, entry.check)
    try:
        check(entry.impl, thorough=thorough)
    except CheckFailure as failure:
        message = str(failure)
        error = any(mark in message for mark in CHECKER_ERROR_MARKS) or bool(
            getattr(failure, "checker_error", False)
        )
        return Outcome(False, message, failure.diagnosis, error)
    return Outcome(True, "", None, False)


def main() -> None:
    rows = []
    start = time.perf_counter()
    for entry in CORPUS:
        for thorough in (False, True):
            outcome = run(entry, thorough)
            rows.append((entry, thorough, outcome))
            mark = "ok " if outcome.verdict_right(entry) else "BAD"
            named = "" if entry.passes else ("named" if outcome.named_right(entry) else "unnamed")
            error = " CHECKER-ERROR" if outcome.checker_error else ""
            mode = "thorough" if thorough else "visible "
            first = outcome.message.splitlines()[0][:110] if outcome.message else ""
            print(f"{mark} {mode} {entry.id:<28} {named:<8}{error} {first}")
    wrong = [r for r in rows if not r[0].passes]
    print(
        f"\n{len(CORPUS)} implementations ({sum(e.passes for e in CORPUS)} correct), "
        f"{len(rows)} runs: verdicts right {sum(o.verdict_right(e) for e, _, o in rows)}/"
        f"{len(rows)}, named mistakes {sum(o.named_right(e) for e, _, o in wrong)}/{len(wrong)}, "
        f"checker errors {sum(o.checker_error for _, _, o in rows)}; "
        f"{time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
