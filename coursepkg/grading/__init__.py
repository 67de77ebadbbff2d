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
=============================  ==========================================  ==============

:func:`catalogue` lists every known mistake (:class:`BugVariant`) the checks recognise.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ._core import BugVariant, CheckerError, CheckFailure, CheckResult, NotImplementedYet

__all__ = [
    "BugVariant",
    "CheckFailure",
    "CheckerError",
    "CheckResult",
    "NotImplementedYet",
    "catalogue",
]

# module -> the checks it defines. Modules written in parallel are imported only once their
# file exists, so the package imports at every stage of the work.
_CHECK_MODULES: dict[str, tuple[str, ...]] = {
    "attention": (
        "check_scaled_dot_product_attention",
        "check_additive_score",
        "check_multi_head_attention",
    ),
    "positions": ("check_positional_encoding",),
    "encoder": ("check_layer_norm", "check_feed_forward", "check_encoder_layer"),
    "decoder": ("check_causal_mask", "check_decoder_layer"),
    "training": ("check_noam_lr", "check_label_smoothing"),
    "parameters": ("check_parameter_count",),
    "decoding": ("check_greedy_decode", "check_beam_search"),
}

_loaded = []
for _module_name, _checks in _CHECK_MODULES.items():
    if not (Path(__file__).parent / f"{_module_name}.py").exists():
        continue
    _module = importlib.import_module(f".{_module_name}", __name__)
    _loaded.append(_module)
    for _check in _checks:
        globals()[_check] = getattr(_module, _check)
        __all__.append(_check)


def catalogue() -> list[BugVariant]:
    """Every known mistake the checks recognise, gathered from each module's ``BUGS`` list."""
    bugs: list[BugVariant] = []
    for module in _loaded:
        bugs.extend(getattr(module, "BUGS", []))
    return bugs


from .checks.ex09_training_run import check_training_run  # noqa: E402, F401 - ex09_training_run
