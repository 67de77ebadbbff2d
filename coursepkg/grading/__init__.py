"""Checks of students' exercise solutions against the reference, naming the mistake when it is
a known one.

Each check takes the student's function or class and either returns a :class:`CheckResult`
(shown as a green box in a notebook) or raises :class:`CheckFailure`, an ``AssertionError``
whose message says what to change. When the check itself crashes it raises
:class:`CheckerError` (a :class:`CheckFailure` whose message says the checker failed, not the
student, and which ``coursepkg grade`` flags for review). ``thorough=True`` (the hidden
tests) tries more and randomised shapes; ``seed`` picks them.

=============================  ==========================================  ==============
check                          what the student implements                 assignment
=============================  ==========================================  ==============
check_scaled_dot_product_...   ``scaled_dot_product_attention``            ex01_attention
check_additive_score           ``additive_score`` (optional)               ex01_attention
check_multi_head_attention     ``MultiHeadAttention``                      ex02_multihead
check_positional_encoding      ``sinusoidal_positional_encoding``          ex03_positions
check_layer_norm               ``LayerNorm``                               ex04_encoder
check_feed_forward             ``PositionwiseFeedForward``                 ex04_encoder
check_encoder_layer            ``EncoderLayer``                            ex04_encoder
check_causal_mask              ``causal_mask``                             ex05_decoder
check_decoder_layer            ``DecoderLayer``                            ex05_decoder
check_noam_lr                  ``noam_lr``                                 ex06_training
check_label_smoothing          the label-smoothed loss                     ex06_training
check_parameter_count          ``transformer_parameter_count``             ex07_parameters
check_greedy_decode            ``greedy_decode``                           ex08_decoding
check_beam_search              ``beam_search``                             ex08_decoding
check_train_bpe                ``train_bpe``                               ex10_tokenizer
check_tokenizer                ``Tokenizer`` (``encode``, ``decode``)      ex10_tokenizer
check_rms_norm                 ``RMSNorm``                                 ex11_modern_block
check_apply_rope               ``apply_rope``                              ex11_modern_block
check_swiglu                   ``SwiGLU``                                  ex11_modern_block
check_grouped_query_attention  ``GroupedQueryAttention``                   ex11_modern_block
check_modern_block             ``ModernDecoderBlock``                      ex11_modern_block
check_tiled_attention          ``TiledAttention`` (forward and backward)   ex12_tiled_attention
check_adamw                    ``AdamW``                                   ex13_training_pieces
check_param_groups             ``param_groups``                            ex13_training_pieces
check_warmup_cosine_lr         ``warmup_cosine_lr``                        ex13_training_pieces
check_clip_grad_norm           ``clip_grad_norm_``                         ex13_training_pieces
check_training_state           ``TrainingState`` (capture, restore)        ex13_training_pieces
check_sft_loss                 ``sft_loss``                                ex14_post_training
check_lora_linear              ``LoRALinear``                              ex14_post_training
check_dpo_loss                 ``dpo_loss``                                ex14_post_training
check_token_entropy            ``token_entropy``                           ex14_post_training
check_masked_mean              ``masked_mean``                             ex14_post_training
check_grpo_clip_loss           ``grpo_clip_loss``                          ex14_post_training
check_group_advantages         ``group_advantages``                        ex14_post_training
check_grpo_loss                ``grpo_loss``                               ex14_post_training
check_naive_ddp                ``NaiveDDP`` (broadcast, average)           ex15_data_parallel
check_bucketed_ddp             ``BucketedDDP`` (hooks, buckets)            ex15_data_parallel
check_sharded_adamw            ``ShardedAdamW`` (ZeRO-1 step)              ex15_data_parallel
check_route_top_k              ``route_top_k`` (a router's top-k)          ex16_experts
check_load_balancing_loss      ``load_balancing_loss``                     ex16_experts
check_compress_latent          ``compress_latent`` (MLA's cached part)     ex16_experts
check_temperature_scale        ``temperature_scale``                       ex17_serving
check_top_k_filter             ``top_k_filter``                            ex17_serving
check_top_p_filter             ``top_p_filter`` (nucleus)                  ex17_serving
check_min_p_filter             ``min_p_filter``                            ex17_serving
check_repetition_penalty       ``repetition_penalty``                      ex17_serving
check_residual_distribution    ``residual_distribution`` (speculative)     ex17_serving
check_speculative_accept       ``speculative_accept`` (statistical)        ex17_serving
check_exact_line_dedup         ``exact_line_dedup``                        ex18_data
check_word_shingles            ``word_shingles``                           ex18_data
check_lsh_candidate_pairs      ``lsh_candidate_pairs`` (LSH banding)       ex18_data
check_gopher_failures          ``gopher_failures``                         ex18_data
check_mask_emails              ``mask_emails``                             ex18_data
check_mask_phone_numbers       ``mask_phone_numbers``                      ex18_data
check_mask_ipv4                ``mask_ipv4``                               ex18_data
check_minhash_signature        ``minhash_signature`` (statistical)         ex18_data
=============================  ==========================================  ==============

``check_training_run`` (ex09_training_run) grades a whole training run (the trained model, the
student's greedy decoder and loss) on a hidden held-out set; it lives in
:mod:`.checks.ex09_training_run` with its own signature and its own list of training mistakes
(``BUGS``, :class:`BugVariant` s named by the evidence the check gathers), outside the
registry of the item checks above.

:func:`catalogue` lists every known mistake (:class:`BugVariant`) the checks recognise.
"""

from __future__ import annotations

from .._lazy import lazy_attributes

# Every check is imported when first used (PEP 562): a notebook's first cell imports its own
# assignment's checks only, and `coursepkg check`'s own process (which reads the notebook and
# starts the kernel) imports no torch. catalogue() and registered_checks() import them all.
_HOMES = {
    "check_additive_score": ".checks.ex01_attention",
    "check_scaled_dot_product_attention": ".checks.ex01_attention",
    "check_multi_head_attention": ".checks.ex02_multihead",
    "check_positional_encoding": ".checks.ex03_positions",
    "check_encoder_layer": ".checks.ex04_encoder",
    "check_feed_forward": ".checks.ex04_encoder",
    "check_layer_norm": ".checks.ex04_encoder",
    "check_causal_mask": ".checks.ex05_decoder",
    "check_decoder_layer": ".checks.ex05_decoder",
    "check_label_smoothing": ".checks.ex06_training",
    "check_noam_lr": ".checks.ex06_training",
    "check_parameter_count": ".checks.ex07_parameters",
    "check_beam_search": ".checks.ex08_decoding",
    "check_greedy_decode": ".checks.ex08_decoding",
    "check_training_run": ".checks.ex09_training_run",
    "check_tokenizer": ".checks.ex10_tokenizer",
    "check_train_bpe": ".checks.ex10_tokenizer",
    "check_apply_rope": ".checks.ex11_modern_block",
    "check_grouped_query_attention": ".checks.ex11_modern_block",
    "check_modern_block": ".checks.ex11_modern_block",
    "check_rms_norm": ".checks.ex11_modern_block",
    "check_swiglu": ".checks.ex11_modern_block",
    "check_tiled_attention": ".checks.ex12_tiled_attention",
    "check_adamw": ".checks.ex13_training_pieces",
    "check_clip_grad_norm": ".checks.ex13_training_pieces",
    "check_param_groups": ".checks.ex13_training_pieces",
    "check_training_state": ".checks.ex13_training_pieces",
    "check_warmup_cosine_lr": ".checks.ex13_training_pieces",
    "check_dpo_loss": ".checks.ex14_post_training",
    "check_group_advantages": ".checks.ex14_post_training",
    "check_grpo_clip_loss": ".checks.ex14_post_training",
    "check_grpo_loss": ".checks.ex14_post_training",
    "check_lora_linear": ".checks.ex14_post_training",
    "check_masked_mean": ".checks.ex14_post_training",
    "check_sft_loss": ".checks.ex14_post_training",
    "check_token_entropy": ".checks.ex14_post_training",
    "check_bucketed_ddp": ".checks.ex15_data_parallel",
    "check_naive_ddp": ".checks.ex15_data_parallel",
    "check_sharded_adamw": ".checks.ex15_data_parallel",
    "check_compress_latent": ".checks.ex16_experts",
    "check_load_balancing_loss": ".checks.ex16_experts",
    "check_route_top_k": ".checks.ex16_experts",
    "check_min_p_filter": ".checks.ex17_serving",
    "check_repetition_penalty": ".checks.ex17_serving",
    "check_residual_distribution": ".checks.ex17_serving",
    "check_speculative_accept": ".checks.ex17_serving",
    "check_temperature_scale": ".checks.ex17_serving",
    "check_top_k_filter": ".checks.ex17_serving",
    "check_top_p_filter": ".checks.ex17_serving",
    "check_exact_line_dedup": ".checks.ex18_data",
    "check_gopher_failures": ".checks.ex18_data",
    "check_lsh_candidate_pairs": ".checks.ex18_data",
    "check_mask_emails": ".checks.ex18_data",
    "check_mask_ipv4": ".checks.ex18_data",
    "check_mask_phone_numbers": ".checks.ex18_data",
    "check_minhash_signature": ".checks.ex18_data",
    "check_word_shingles": ".checks.ex18_data",
    "BugVariant": ".framework",
    "CheckerError": ".framework",
    "CheckFailure": ".framework",
    "CheckResult": ".framework",
    "NotImplementedYet": ".framework",
    "catalogue": ".framework",
    "registered_checks": ".framework",
}


def load_every_check() -> None:
    """Import every check module, so that the registry holds every check: what
    :func:`catalogue` and :func:`registered_checks` (and a check naming an earlier assignment's
    mistake) call first."""
    from importlib import import_module

    for home in sorted(set(_HOMES.values())):
        import_module(home, __name__)


__getattr__ = lazy_attributes(__name__, _HOMES, globals())


__all__ = [
    "BugVariant",
    "CheckFailure",
    "CheckResult",
    "CheckerError",
    "NotImplementedYet",
    "catalogue",
    "check_adamw",
    "check_additive_score",
    "check_apply_rope",
    "check_beam_search",
    "check_bucketed_ddp",
    "check_causal_mask",
    "check_clip_grad_norm",
    "check_compress_latent",
    "check_decoder_layer",
    "check_dpo_loss",
    "check_encoder_layer",
    "check_exact_line_dedup",
    "check_feed_forward",
    "check_gopher_failures",
    "check_greedy_decode",
    "check_group_advantages",
    "check_grouped_query_attention",
    "check_grpo_clip_loss",
    "check_grpo_loss",
    "check_label_smoothing",
    "check_layer_norm",
    "check_load_balancing_loss",
    "check_lora_linear",
    "check_lsh_candidate_pairs",
    "check_mask_emails",
    "check_mask_ipv4",
    "check_mask_phone_numbers",
    "check_masked_mean",
    "check_min_p_filter",
    "check_minhash_signature",
    "check_modern_block",
    "check_multi_head_attention",
    "check_naive_ddp",
    "check_noam_lr",
    "check_param_groups",
    "check_parameter_count",
    "check_positional_encoding",
    "check_repetition_penalty",
    "check_residual_distribution",
    "check_rms_norm",
    "check_route_top_k",
    "check_scaled_dot_product_attention",
    "check_sft_loss",
    "check_sharded_adamw",
    "check_speculative_accept",
    "check_swiglu",
    "check_temperature_scale",
    "check_tiled_attention",
    "check_token_entropy",
    "check_tokenizer",
    "check_top_k_filter",
    "check_top_p_filter",
    "check_train_bpe",
    "check_training_run",
    "check_training_state",
    "check_warmup_cosine_lr",
    "check_word_shingles",
    "registered_checks",
]
