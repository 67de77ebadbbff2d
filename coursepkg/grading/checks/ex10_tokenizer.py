"""Checks of assignment ex10_tokenizer: byte-level BPE training, encoding and decoding.

``check_train_bpe`` trains the student's ``train_bpe`` and the reference
(:func:`coursepkg.tokenizer.train_bpe`) on the same corpora and special-token sets and asks for
the same merges, in the same order, and the same vocabulary; in thorough mode it adds randomised
corpora and a larger one under a budget of lines of Python run (counted, never timed, so a
slow machine never fails a correct trainer) that a careful implementation recounting every pair
after every merge meets with a wide margin. ``check_tokenizer`` builds the student's
``Tokenizer`` from the reference's vocabulary and merges and asks for the reference's ids on
texts chosen to tell the mistakes apart (multi-byte characters, whitespace runs, special tokens,
words whose pairs occur out of rank order), the round trip, and the reference's decoding of ids
that cut a character in the middle.

The catalogue of known mistakes these checks name is in :mod:`.ex10_tokenizer_mistakes`.
"""

from __future__ import annotations

import functools
import random
import sys
from typing import Any

from ...data import load_tinyshakespeare
from ...tokenizer import Tokenizer as _Reference
from ...tokenizer import train_bpe as _reference_train
from ..framework import (
    BugVariant,
    CheckFailure,
    CheckReport,
    call_student,
    forbidden_calls,
    public_check,
)
from .ex10_tokenizer_mistakes import BPE_BUGS, BPE_ITEM, TOKENIZER_BUGS, TOKENIZER_ITEM

__all__ = ["check_tokenizer", "check_train_bpe"]

EOT = "<|endoftext|>"

#: Lines of Python the student's train_bpe may run on the thorough mode's larger corpus (600
#: merges' worth of vocabulary), counted with ``sys.settrace``, never timed. Measured on Python
#: 3.11: the reference runs 0.8 million, an incremental trainer 2.2 million, a careful one that
#: recounts every pair of each distinct pre-token after every merge 29 million (the test
#: fixtures' ``train_recount``). The budget is about 5 times that; counting slows the run ~3x,
#: so a trainer over it is stopped after about a minute, not left to run.
LINE_BUDGET = 150_000_000

_REFERENCE_CALLS = [
    (_reference_train, "coursepkg.tokenizer.train_bpe"),
    (_Reference.__init__, "coursepkg.tokenizer.Tokenizer"),
    (_Reference.encode, "coursepkg.tokenizer.Tokenizer.encode"),
    (_Reference.decode, "coursepkg.tokenizer.Tokenizer.decode"),
]


def _forbidden() -> list:
    """The reference, and OpenAI's tokenizer where it is installed (it would encode with the
    given ranks: not the exercise either); imported here, so importing the checks stays light."""
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - tiktoken is optional
        return _REFERENCE_CALLS
    return _REFERENCE_CALLS + [
        (tiktoken.Encoding.__init__, "tiktoken.Encoding"),
        (tiktoken.Encoding.encode, "tiktoken.Encoding.encode"),
    ]


_ADVICE = "write the BPE yourself (regex, collections.Counter and dicts are all you need)"

# ---------------------------------------------------------------------------------------------
# Corpora: (name, text, vocab_size, special tokens)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _shakespeare() -> str:
    return load_tinyshakespeare()


def _with_specials(text: str, every: int, special: str) -> str:
    """``text`` with ``special`` put in at the first line end after every ``every`` characters."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + every)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return special.join(out)


_MIXED = (
    "Größe über alles, Müller's Straße! 日本語のテキスト 😀😀 naïve café\n\n"
    "def f(x):\n    return x ** 2  # 😀\n\t\tpass\n"
    "banana bandana bananas, Mississippi aaaaaa abababab   \n"
)
_TIES = "ab ba ab ba abc cba aab baa xy yx " * 3 + "aaaa bbbb"
_WORDS = ["the cat sat", "a dog ran", "we sat down", "hi there", "x and y"]


def _visible_corpora() -> list[tuple[str, str, int, list[str]]]:
    shakespeare = _with_specials(_shakespeare()[:6000], 700, EOT)
    mixed = _with_specials(_MIXED * 6, 120, "<|pad|>").replace("  \n", f"  \n{EOT}")
    return [
        ("Shakespeare with <|endoftext|>", shakespeare, 340, [EOT]),
        ("tied pairs", _TIES, 266, []),
        ("mixed scripts, code and two special tokens", mixed, 330, [EOT, "<|pad|>"]),
    ]


#: Documents that each start with "<s></s>" (an empty turn) and hold "<s>" in the middle, with
#: both special tokens listed shorter first: the longer must win, or "</s>" is trained on.
OVERLAP_CORPUS = (
    "overlapping special tokens <s> and <s></s>",
    "".join(f"<s></s>{_WORDS[i % 5]} {i}<s>{_WORDS[i * 3 % 5]}\n" for i in range(24)),
    290,
    ["<s>", "<s></s>"],
)


def _random_corpus(rng: random.Random) -> tuple[str, str, int, list[str]]:
    alphabet = list("abcde é日😀'\n\t") + ["  ", "'s", "ab", "ba"]
    specials = rng.choice([[], [EOT], ["<s>", "<s></s>"]])
    parts = [rng.choice(alphabet) for _ in range(rng.randint(50, 400))]
    for _ in range(rng.randint(0, 6) if specials else 0):
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(specials))
    vocab_size = 256 + len(specials) + rng.randint(0, 60)
    return (f"random corpus (seed {rng.random():.6f})", "".join(parts), vocab_size, specials)


def _corpora(thorough: bool, seed: int | None) -> list[tuple[str, str, int, list[str]]]:
    corpora = _visible_corpora()
    if thorough:
        rng = random.Random(0 if seed is None else seed)
        corpora += [_random_corpus(rng) for _ in range(3)]
    return corpora


@functools.lru_cache(maxsize=16)
def _reference_training(text: str, vocab_size: int, specials: tuple[str, ...]):
    return _reference_train(text, vocab_size, list(specials))


# ---------------------------------------------------------------------------------------------
# check_train_bpe
# ---------------------------------------------------------------------------------------------


def _as_training(value: Any, where: str) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """The student's ``(vocab, merges)``, with lists of two bytes accepted as pairs."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise CheckFailure(
            f"train_bpe should return a pair (vocab, merges), but returned "
            f"{type(value).__name__} {where}."
        )
    vocab, merges = value
    if not isinstance(vocab, dict) or not all(
        isinstance(k, int) and isinstance(v, bytes) for k, v in vocab.items()
    ):
        raise CheckFailure(
            f"vocab should be a dict from int ids to bytes (e.g. {{97: b'a'}}) {where}; "
            f"yours is a {type(vocab).__name__} starting {str(vocab)[:80]}."
        )
    pairs = []
    for rank, merge in enumerate(merges):
        if not (
            isinstance(merge, (tuple, list))
            and len(merge) == 2
            and all(isinstance(part, bytes) for part in merge)
        ):
            raise CheckFailure(
                f"merges[{rank}] should be a pair of bytes like (b'a', b'b') {where}, "
                f"got {merge!r}."
            )
        pairs.append((merge[0], merge[1]))
    return vocab, pairs


class _OverBudget(BaseException):
    """Raised inside the student's code once it has run more lines than the budget (a
    BaseException, so that ``except Exception`` in student code lets it through)."""


class _LineCount:
    """Counts the lines of Python run while it is installed (``sys.settrace``); once past
    ``budget`` it stops the run by raising :class:`_OverBudget` in the running code."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lines = 0

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines > self.budget:
                raise _OverBudget
        return self._line

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        return self._line

    def __enter__(self) -> _LineCount:
        self._previous = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: Any) -> bool:
        sys.settrace(self._previous)
        return exc[0] is _OverBudget  # the count says it; the check fails below


def _call_train(impl: Any, text: str, vocab_size: int, specials: list[str], where: str):
    """The student's ``(vocab, merges)`` on one corpus."""
    with forbidden_calls(BPE_ITEM, extra=_forbidden(), advice=_ADVICE):
        out = call_student(impl, text, vocab_size, list(specials), item=BPE_ITEM)
    return _as_training(out, where)


def _count_train(impl: Any, corpus: tuple, budget: int) -> tuple[tuple | None, int]:
    """The student's ``(vocab, merges)`` on ``corpus`` (None when stopped over the budget) and
    the lines of Python the training ran."""
    _, text, vocab_size, specials = corpus
    out = None
    with forbidden_calls(BPE_ITEM, extra=_forbidden(), advice=_ADVICE), _LineCount(budget) as count:
        out = call_student(impl, text, vocab_size, list(specials), item=BPE_ITEM)
    if count.lines > budget:
        return None, count.lines
    return _as_training(out, "(larger corpus)"), count.lines


def _diagnose_training(student: tuple, text: str, vocab_size: int, specials: list[str]):
    """The catalogued training mistake whose vocab and merges are exactly the student's."""
    reference = _reference_training(text, vocab_size, tuple(specials))
    for bug in BPE_BUGS:
        try:
            variant = bug.impl(text, vocab_size, list(specials))
        except Exception:  # noqa: BLE001 - a variant that cannot run here names nothing
            continue
        if variant != reference and variant == student:
            return bug
    return None


def _first_difference(got: list, expected: list) -> int:
    return next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )


def _compare_training(report: CheckReport, student: tuple, corpus: tuple) -> None:
    name, text, vocab_size, specials = corpus
    vocab, merges = student
    ref_vocab, ref_merges = _reference_training(text, vocab_size, tuple(specials))
    where = f"(corpus: {name}, vocab_size={vocab_size}, special_tokens={specials})"
    if merges != ref_merges:
        i = _first_difference(merges, ref_merges)
        yours = merges[i] if i < len(merges) else "nothing (your list ends)"
        expected = ref_merges[i] if i < len(ref_merges) else "nothing (the list ends)"
        report.fail(
            f"your merges differ from the reference's {where}: the first {i} agree, then "
            f"merge {i} is {yours!r}, expected {expected!r}. You learned {len(merges)} merges, "
            f"the reference {len(ref_merges)}.",
            _diagnose_training(student, text, vocab_size, specials),
        )
    if vocab != ref_vocab:
        i = next(k for k in sorted(set(vocab) | set(ref_vocab)) if vocab.get(k) != ref_vocab.get(k))
        report.fail(
            f"your merges are right but your vocab differs {where}: id {i} is "
            f"{vocab.get(i)!r}, expected {ref_vocab.get(i)!r}. Ids 0-255 are the bytes, then "
            "one id per merge in order (the two parts joined), then the special tokens.",
            _diagnose_training(student, text, vocab_size, specials),
        )


@public_check(assignment="ex10_tokenizer", implements="train_bpe", bugs=BPE_BUGS)
def check_train_bpe(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``train_bpe(text, vocab_size, special_tokens)`` against the
    reference: the same merges in the same order and the same vocabulary, corpus by corpus."""
    for corpus in _corpora(thorough, seed):
        name, text, vocab_size, specials = corpus
        where = f"(corpus: {name})"
        student = _call_train(impl, text, vocab_size, specials, where)
        _compare_training(report, student, corpus)
    report.ok(
        "the same merges, in the same order, and the same vocab as the reference on: "
        + "; ".join(c[0] for c in _corpora(thorough, seed))
    )
    overlap = OVERLAP_CORPUS
    _compare_training(report, _call_train(impl, *overlap[1:], f"(corpus: {overlap[0]})"), overlap)
    report.ok("where special tokens overlap (<s> and <s></s>), the longer one is cut out whole")
    if thorough:
        corpus = (
            "the first 60,000 characters of Tiny Shakespeare",
            _shakespeare()[:60000],
            600,
            [EOT],
        )
        student, lines = _count_train(impl, corpus, LINE_BUDGET)
        if student is None:
            report.fail(
                f"train_bpe ran more than {LINE_BUDGET:,} lines of Python on {corpus[0]} "
                "(vocab 600) and was stopped: count each distinct pre-token once (a Counter), "
                "not every occurrence, and update only the words a merge touches."
            )
        _compare_training(report, student, corpus)
        report.ok(
            f"a 60,000-character corpus trained in {lines:,} lines of Python run (budget "
            f"{LINE_BUDGET:,})"
        )


# ---------------------------------------------------------------------------------------------
# check_tokenizer
# ---------------------------------------------------------------------------------------------

_PROBES = [
    "",
    "banana bandana, Mississippi aaaaaa abababab",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n\nAll:\n  Speak, speak.",
    f"one{EOT}two {EOT}{EOT} three\n",
    "Größe über Straße, naïve café 😀 日本語",
    "tabs\t\tand   spaces   \n\n  \t end   ",
    "def f(x):\n    return x ** 2  # 😀\n",
]


def _probes(specials: list[str]) -> list[str]:
    texts = list(_PROBES)
    for special in specials:
        texts.append(f"x{special}y {special}\n{special}")
    if "<s>" in specials:
        texts.append("a<s></s>b<s>c</s>")  # overlapping: the longer wins
    return texts


def _as_ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        raise CheckFailure(
            f"encode should return a list of ints, got {type(value).__name__} "
            f"{str(value)[:80]} {where}."
        )
    return list(value)


def _run_tokenizer(impl: Any, vocab, merges, specials, texts, decode_ids) -> tuple[list, list]:
    """The student's encode of each text and decode of each id list, in the forbidden block."""
    with forbidden_calls(TOKENIZER_ITEM, extra=_forbidden(), advice=_ADVICE):
        tok = call_student(impl, dict(vocab), list(merges), list(specials), item=TOKENIZER_ITEM)
        encoded = [
            _as_ids(call_student(tok.encode, t, item="Tokenizer.encode"), f"for {t!r}")
            for t in texts
        ]
        decoded = [
            call_student(tok.decode, list(ids), item="Tokenizer.decode") for ids in decode_ids
        ]
    return encoded, decoded


def _diagnose_tokenizer(student_output: tuple, setting: tuple, which: str) -> BugVariant | None:
    vocab, merges, specials, texts, decode_ids = setting
    reference = _reference_outputs(vocab, merges, specials, texts, decode_ids)
    index = 0 if which == "encode" else 1
    for bug in TOKENIZER_BUGS:
        try:
            variant = bug.impl(vocab, merges, specials)
            outputs = (
                [variant.encode(t) for t in texts],
                [variant.decode(ids) for ids in decode_ids],
            )
        except Exception:  # noqa: BLE001 - a variant that cannot run here names nothing
            continue
        if outputs[index] != reference[index] and outputs[index] == student_output[index]:
            return bug
    return None


def _reference_outputs(vocab, merges, specials, texts, decode_ids) -> tuple[list, list]:
    tok = _Reference(vocab, merges, specials)
    return [tok.encode(t) for t in texts], [tok.decode(ids) for ids in decode_ids]


def _decode_cases(tok: _Reference, texts: list[str]) -> list[list[int]]:
    """The reference ids of each text, and of each multi-byte character cut after its first
    token (where a character spans several tokens)."""
    cases = [tok.encode(t) for t in texts]
    for char in "😀日ö":
        ids = tok.encode(char)
        if len(ids) > 1:
            cases.append(ids[:1])
            cases.append(tok.encode("a" + char + "b"))
    return cases


def _check_one_tokenizer(report: CheckReport, impl: Any, name: str, training, specials) -> None:
    vocab, merges = training
    texts = _probes(specials)
    reference = _Reference(vocab, merges, specials)
    decode_ids = _decode_cases(reference, texts)
    setting = (vocab, merges, specials, texts, decode_ids)
    expected = _reference_outputs(*setting)
    got = _run_tokenizer(impl, *setting)
    where = f"(vocabulary trained on: {name}; special_tokens={specials})"
    for text, ids, ref in zip(texts, got[0], expected[0], strict=True):
        if ids != ref:
            i = _first_difference(ids, ref)
            report.fail(
                f"encode({text!r}) {where} returned {ids}, expected {ref}: the first {i} ids "
                f"agree; yours then gives {ids[i : i + 4]}, expected {ref[i : i + 4]}.",
                _diagnose_tokenizer(got, setting, "encode"),
            )
    for ids, text, ref in zip(decode_ids, got[1], expected[1], strict=True):
        if text != ref:
            report.fail(
                f"decode({ids}) {where} returned {text!r}, expected {ref!r}.",
                _diagnose_tokenizer(got, setting, "decode"),
            )


@public_check(
    assignment="ex10_tokenizer", implements="Tokenizer", bugs=TOKENIZER_BUGS, kind="class"
)
def check_tokenizer(report: CheckReport, impl: Any, thorough: bool, seed: int | None) -> None:
    """Check the student's ``Tokenizer(vocab, merges, special_tokens)``: ``encode`` gives the
    reference's ids and ``decode`` the reference's text, round trip and cut characters
    included, on vocabularies trained by the reference."""
    corpora = _corpora(thorough, seed)
    for name, text, vocab_size, specials in [*corpora, OVERLAP_CORPUS]:
        training = _reference_training(text, vocab_size, tuple(specials))
        _check_one_tokenizer(report, impl, name, training, specials)
    report.ok(
        "encode gives the reference's ids (special tokens, whitespace runs, multi-byte "
        "characters, merges in rank order)"
    )
    report.ok("decode inverts encode, and a character cut in the middle decodes to U+FFFD")
    if thorough:
        gpt2 = _Reference.gpt2()
        training = (gpt2.vocab, gpt2.merges)
        _check_one_tokenizer(report, impl, "GPT-2's own vocabulary (50,257 ids)", training, [EOT])
        report.ok("GPT-2's own vocabulary and merges give GPT-2's ids")
