"""The project's independent correct implementations, grouped by what they implement, as
sources to compare for similarity (``test_term_similarity.py``); run this file to print the
similarity of every pair within each group::

    .venv/bin/python tests/similarity_corpus.py

Each group holds the solution's answer cell and the correct implementations of the grading
corpora that stand alone (``grading_impls_*``, and the passing entries of
``grading_corpus_layers``/``_training`` that are not built by a shared factory), each renamed
to the name the exercise asks for, as a student would hand it in. The template of a group is
the release's stub for that item.
"""

from __future__ import annotations

import ast
import inspect
import io
import keyword
import re
import sys
import tokenize
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).parent))

import grading_corpus_layers as lay  # noqa: E402
import grading_corpus_training as trn  # noqa: E402
import grading_impls_decoder as dec  # noqa: E402
import grading_impls_encoder as enc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# item (answer cell) -> (assignment, the name the exercise asks for, implementations)
GROUPS = {
    "answer_scaled_dot_product_attention": ("ex01_attention", "scaled_dot_product_attention", [
        lay.sdpa_nan_to_num, lay.sdpa_finfo_then_zero, enc.sdpa_einsum, enc.sdpa_manual_softmax]),
    "answer_additive_score": ("ex01_attention", "additive_score", [
        enc.additive_score_einsum, enc.additive_score_loop]),
    "answer_MultiHeadAttention": ("ex02_multihead", "MultiHeadAttention", [
        lay.MHAStoresWeights, enc.HeadLoopMHA, enc.WeightViewMHA, dec.EinsumMHA, dec.LoopMHA]),
    "answer_sinusoidal_positional_encoding": ("ex03_positions", "sinusoidal_positional_encoding", [
        lay.pe_annotated, lay.pe_numpy_style, enc.pe_python_loops, enc.pe_pow_stack]),
    "answer_LayerNorm": ("ex04_encoder", "LayerNorm", [
        lay.LNRsqrt, enc.VarMeanLayerNorm, enc.SquaresLayerNorm, dec.ManualLayerNorm]),
    "answer_PositionwiseFeedForward": ("ex04_encoder", "PositionwiseFeedForward", [
        lay.FFNDropout, enc.ClampFFN, enc.SequentialishFFN, dec.ReluFFN]),
    "answer_EncoderLayer": ("ex04_encoder", "EncoderLayer", [
        enc.EncoderLayerA, enc.EncoderLayerB]),
    "answer_causal_mask": ("ex05_decoder", "causal_mask", [
        lay.mask_tril_bool, dec.causal_mask_tril, dec.causal_mask_compare]),
    "answer_DecoderLayer": ("ex05_decoder", "DecoderLayer", [
        dec.DecoderLayerEinsum, dec.DecoderLayerLoop]),
    "answer_noam_lr": ("ex06_training", "noam_lr", [
        trn.noam_annotated, dec.noam_lr_min, dec.noam_lr_piecewise]),
    "answer_label_smoothed_cross_entropy": ("ex06_training", "label_smoothed_cross_entropy", [
        trn.ls_scatter, trn.ls_mix, dec.smoothed_ce_gather, dec.smoothed_ce_distribution]),
    "answer_transformer_parameter_count": ("ex07_parameters", "transformer_parameter_count", [
        trn.params_loops, dec.param_count_formula, dec.param_count_modules]),
    "answer_greedy_decode": ("ex08_decoding", "greedy_decode", [
        trn.greedy_cat, dec.greedy_batched, dec.greedy_per_row]),
    "answer_beam_search": ("ex08_decoding", "beam_search", [
        trn.beam_lists, dec.beam_per_source, dec.beam_tensor]),
}  # fmt: skip

_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$", re.M)


def _cell(folder: str, assignment: str, item: str) -> str:
    nb = nbformat.read(str(ROOT / folder / assignment / f"{assignment}.ipynb"), as_version=4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == item]
    return _MARKERS.sub("", cell.source)


def renamed(impl, name: str) -> str:
    """The implementation's source under the name the exercise asks for."""
    return re.sub(rf"\b{impl.__name__}\b", name, inspect.getsource(impl))


def groups() -> dict[str, tuple[dict[str, str], str]]:
    """item -> ({label: source}, the release's stub)."""
    found = {}
    for item, (assignment, name, impls) in GROUPS.items():
        sources = {"solution": _cell("solutions", assignment, item)}
        sources.update({impl.__name__: renamed(impl, name) for impl in impls})
        found[item] = (sources, _cell("exercises", assignment, item))
    return found


if __name__ == "__main__":
    from coursepkg.grading.term.similarity import compare

    total = 0
    for item, (sources, template) in groups().items():
        pairs = compare(sources, template)
        n = len(sources) * (len(sources) - 1) // 2
        total += n
        top = pairs[0] if pairs else None
        print(f"{item}: {len(sources)} implementations, {n} pairs, highest "
              f"{top.similarity if top else 0:.3f} ({top.left if top else ''} / "
              f"{top.right if top else ''})")  # fmt: skip
    print(f"{total} pairs in all")


def class_items(assignment: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """A made-up class of independent students for ``assignment``: student k hands in the
    k-th implementation of each item (the solution first; the stub where an item has fewer).

    Returns:
        ({student: {item: code}}, {item: the release's stub}).
    """
    every = groups()
    items = [i for i, (a, _, _) in GROUPS.items() if a == assignment]
    width = max(len(every[i][0]) for i in items)
    students: dict[str, dict[str, str]] = {f"s{k}": {} for k in range(width)}
    for item in items:
        sources, template = every[item]
        codes = list(sources.values())
        for k, student in enumerate(students):
            students[student][item] = codes[k] if k < len(codes) else template
    return students, {i: every[i][1] for i in items}


def classes() -> dict[str, tuple[dict[str, str], str]]:
    """:func:`class_items` of every assignment, each student's items concatenated in order (as
    ``coursepkg similarity`` compares them): assignment -> ({student: code}, template)."""
    found = {}
    for assignment in dict.fromkeys(a for a, _, _ in GROUPS.values()):
        students, stubs = class_items(assignment)
        joined = {s: "\n\n".join(items.values()) for s, items in students.items()}
        found[assignment] = (joined, "\n\n".join(stubs.values()))
    return found


def _blocks(code: str, indent: str) -> list[str]:
    """``code`` split before each definition at ``indent`` (its decorators kept with it)."""
    parts = re.split(rf"(?m)^(?={indent}(?:def |class |@))", code)
    blocks: list[str] = []
    for part in parts:
        if blocks and blocks[-1].lstrip().startswith("@"):
            blocks[-1] += part  # a decorator stays with what it decorates
        else:
            blocks.append(part)
    return blocks


def _reordered(code: str) -> str:
    """Top-level definitions in reverse order, and the methods of each class too."""
    out = []
    for block in reversed([b for b in _blocks(code, "") if b.strip()]):
        head, *methods = _blocks(block, "    ")
        if methods:
            block = head.rstrip("\n") + "\n\n" + "\n".join(reversed(methods))
        out.append(block.rstrip("\n"))
    return "\n\n\n".join(out) + "\n"


def disguise(code: str, keep: set[str]) -> str:
    """A copy disguised as a student would: every local name, argument and attribute the
    copier defines renamed (not the names in ``keep`` the exercise asks for), each comment
    rewritten, and the functions, classes and methods put in another order."""
    tree = ast.parse(code)
    defined = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    defined |= {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    defined |= {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    rename = {name: f"my_{name.strip('_')}_v2" for name in defined - keep - {"self"}
              if not keyword.iskeyword(name)}  # fmt: skip
    tokens = []
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.NAME and tok.string in rename:
            tok = tok._replace(string=rename[tok.string])
        elif tok.type == tokenize.COMMENT:
            tok = tok._replace(string="# my own working, step by step")
        tokens.append(tok)
    return _reordered(tokenize.untokenize(tokens))
