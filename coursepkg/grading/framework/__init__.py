"""The toolkit every check is written with, one concern per module.

- :mod:`.results`: what a check returns or raises (:class:`CheckResult`, :class:`CheckFailure`,
  :class:`CheckerError`, :class:`NotImplementedYet`), the known mistakes (:class:`BugVariant`),
  the :class:`CheckReport` a body fills, :func:`run_check` and :func:`checking`.
- :mod:`.registry`: :func:`public_check`, the decorator that makes a body a public check and
  records it; :func:`catalogue` reads the known mistakes from it.
- :mod:`.calling`: calling student code (:func:`call_student`), the one tensor guard
  (:func:`expect_tensor`), the number guard (:func:`expect_number`) and the honesty rules
  (:func:`forbidden_calls`, :func:`reject_reference_class`).
- :mod:`.compare`: the tolerances and comparisons (:func:`assert_close`, :func:`expect_close`),
  recognising a mistake by its outputs (:func:`diagnose`) and gradients, a function's value
  and gradients against the reference's (:func:`compare_value_and_grads`).
- :mod:`.weights`: building a student's module, copying weights by name, parameter tables.
- :mod:`.modules`: the one module check (build, count, copy weights, dtypes, gradients).
- :mod:`.inputs`: the shape tables of the checks and seeded random inputs.
- :mod:`.masks`: the four mask properties, written once for any callable under test
  (:class:`MaskedBlock`, :class:`MaskCases`, :func:`run_mask_properties`), and an attention
  block's inputs for them (:func:`run_attention_cases`).
- :mod:`.self_attention`: a self-attention block called as ``f(x, mask, cache)`` (today's
  decoder): its mask properties on one sequence (:func:`run_self_attention_cases`) and
  decoding with a dict key/value cache (:func:`decode_with_cache`, :func:`cache_equals_whole`,
  :func:`cache_stage`).
- :mod:`.locate`: which piece of a student's layer is wrong, and its known mistake.
- :mod:`.norms`: a LayerNorm's mistake read from the module itself (:func:`analyse_norm`).
- :mod:`.pieces`: the pieces of a layer check (:func:`guarded`, :func:`attention_piece`,
  :func:`feed_forward_piece`, :func:`layer_norm_piece`), each naming its mistake with the
  catalogue of the check that grades it (:func:`mistakes_of`).
- :mod:`.variants`: blocks written without the reference for the mistakes named by a built-in
  call, which the tests run as a student's code (:class:`HeadsBlock`,
  :class:`FeedForwardBlock`), and the textbook :func:`masked_attention`; the other mistakes
  subclass the reference, let through the honesty rule by :func:`.calling.is_catalogued`.
- :mod:`.post_training`: the references ex14's checks compare with and its catalogue builds
  on, with the stubs' signatures; imported as ``framework.post_training`` by ex14 only.
- :mod:`.curation_inputs`: the held-out corpora, texts, sets and signatures ex18's checks
  generate from a seed; imported as ``framework.curation_inputs`` by ex18 only.
- :mod:`.sampling`: checking code that samples: next-token scores compared as the
  distributions they define (:func:`compare_filter`), and a random rule's draws tested against
  its probabilities and against a known mistake's draws (Pearson's chi-square:
  :func:`chi_square_fit`, :func:`chi_square_same`, :func:`same_as_mistake`).
- :mod:`.ranks`: what a check that forks ranks over gloo needs from the machine (the
  loopback network, a stderr without PyTorch's hostname warning); imported as
  ``framework.ranks`` by ex15 only.
- :mod:`.watch`: the watch over a kernel that trains a model (optimiser steps, files read,
  processes, connections), for the checks of a training run (ex09); imported as
  ``framework.watch``, since it installs hooks a check needs only there.

Modules import each other downwards only: results <- inputs <- calling <- compare <- weights
<- masks, locate, modules, norms; self_attention sits on masks and modules; registry needs
results and calling (it records each catalogue's classes there, for the honesty rule); pieces
sits on locate, norms and registry; sampling on compare; variants, post_training,
curation_inputs, ranks and watch need nothing of the framework.
A check module imports the framework and its own catalogue, never another check module.
"""

from __future__ import annotations

from .calling import (
    call_student,
    expect_number,
    expect_tensor,
    forbidden_calls,
    is_reference_module,
    name_forbidden_call,
    reject_reference_class,
)
from .compare import (
    DIAGNOSE_TOLERANCE,
    TOLERANCES,
    assert_close,
    check_gradients,
    compare_value_and_grads,
    diagnose,
    expect_close,
    max_abs_error,
    near,
    outputs_match_safely,
    value_and_grads,
)
from .inputs import (
    N_RANDOM_CONFIGS,
    configs,
    describe,
    dtype_name,
    generator,
    randn,
    random_keep,
    register_configs,
    shape_text,
)
from .locate import Piece, is_close, locate, piece_mistake
from .masks import (
    MASK_RULE,
    FullyMasked,
    Invariance,
    MaskCases,
    MaskedBlock,
    change_later,
    hide_padding,
    run_attention_cases,
    run_mask_properties,
)
from .modules import (
    BuiltModule,
    ModuleSpec,
    Stage,
    check_module,
    dtypes_for,
    each_dtype,
    gradients_reach,
    prepare_module,
)
from .norms import analyse_norm, combined
from .pieces import (
    attention_piece,
    feed_forward_piece,
    guarded,
    layer_norm_piece,
    norm_probe,
    piece_count_mistake,
)
from .registry import CheckEntry, catalogue, mistakes_of, public_check, registered_checks
from .results import (
    CHECKER_FAILED,
    BugVariant,
    CheckerError,
    CheckFailure,
    CheckReport,
    CheckResult,
    ForbiddenCall,
    NotImplementedYet,
    checking,
    diagnosis_message,
    run_check,
)
from .sampling import (
    MIN_EXPECTED,
    SAME_RULE,
    ChiSquare,
    chi_square_fit,
    chi_square_same,
    compare_filter,
    count_cells,
    distribution,
    misfit_message,
    same_as_mistake,
)
from .self_attention import (
    cache_equals_whole,
    cache_stage,
    decode_with_cache,
    norm_gains_stage,
    run_self_attention_cases,
)
from .variants import FeedForwardBlock, HeadsBlock, masked_attention
from .weights import (
    NAMING_CONTRACT,
    build_module,
    clone_module,
    copy_weights,
    diagnose_structure,
    materialise_lazy,
    module_runner,
    param_gap,
    parameter_table,
    structure,
    swap_in,
)

__all__ = [
    "MIN_EXPECTED",
    "SAME_RULE",
    "ChiSquare",
    "chi_square_fit",
    "chi_square_same",
    "compare_filter",
    "count_cells",
    "distribution",
    "misfit_message",
    "same_as_mistake",
    "run_mask_properties",
    "run_self_attention_cases",
    "cache_equals_whole",
    "cache_stage",
    "norm_gains_stage",
    "decode_with_cache",
    "MaskedBlock",
    "MaskCases",
    "Invariance",
    "FullyMasked",
    "HeadsBlock",
    "CHECKER_FAILED",
    "DIAGNOSE_TOLERANCE",
    "MASK_RULE",
    "N_RANDOM_CONFIGS",
    "NAMING_CONTRACT",
    "ModuleSpec",
    "Stage",
    "TOLERANCES",
    "BugVariant",
    "BuiltModule",
    "CheckEntry",
    "CheckFailure",
    "CheckReport",
    "CheckResult",
    "CheckerError",
    "FeedForwardBlock",
    "ForbiddenCall",
    "NotImplementedYet",
    "Piece",
    "analyse_norm",
    "assert_close",
    "attention_piece",
    "build_module",
    "call_student",
    "catalogue",
    "change_later",
    "check_gradients",
    "check_module",
    "checking",
    "clone_module",
    "combined",
    "compare_value_and_grads",
    "configs",
    "copy_weights",
    "describe",
    "diagnose",
    "diagnose_structure",
    "diagnosis_message",
    "dtypes_for",
    "each_dtype",
    "dtype_name",
    "expect_close",
    "expect_number",
    "expect_tensor",
    "feed_forward_piece",
    "forbidden_calls",
    "name_forbidden_call",
    "generator",
    "guarded",
    "hide_padding",
    "gradients_reach",
    "is_close",
    "is_reference_module",
    "layer_norm_piece",
    "locate",
    "materialise_lazy",
    "masked_attention",
    "max_abs_error",
    "mistakes_of",
    "module_runner",
    "near",
    "norm_probe",
    "piece_count_mistake",
    "outputs_match_safely",
    "param_gap",
    "parameter_table",
    "piece_mistake",
    "prepare_module",
    "public_check",
    "randn",
    "random_keep",
    "register_configs",
    "registered_checks",
    "reject_reference_class",
    "run_attention_cases",
    "run_check",
    "shape_text",
    "structure",
    "swap_in",
    "value_and_grads",
]
