"""Rewards for ``coursepkg finetune --grpo``: the prompts of a JSONL file and the function that
scores an answer to one of them.

A GRPO data file holds one prompt a line, ``{"prompt": str or messages, ...}``; every other key
of the line is kept for the reward (the expected answer, a test to run). A reward is
``reward(completion, record) -> float``: the answer's text, without its end-of-turn token, and
the line's JSON object. ``--reward`` names one: a built-in of :data:`BUILT_IN`, or
``module:function`` of an importable module (a file next to the data needs its folder on
``PYTHONPATH``).
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from ..tokenizer import Tokenizer
from .chat import jsonl_records, prompt_messages, render_chat

__all__ = [
    "BUILT_IN",
    "GRPOPrompt",
    "RewardFn",
    "exact_answer",
    "load_reward",
    "number_answer",
    "parse_choice",
    "parse_number",
    "prompt_records",
    "score",
]

#: reward(completion, record) -> a number.
RewardFn = Callable[[str, Mapping[str, Any]], float]


class GRPOPrompt(NamedTuple):
    """A prompt of a GRPO data file: its ids (ending with the cue ``<|assistant|>``), its JSON
    object (for the reward) and where it stands (``"FILE, line N"``)."""

    ids: list[int]
    record: Mapping[str, Any]
    where: str


def exact_answer(completion: str, record: Mapping[str, Any]) -> float:
    """1.0 when the completion, stripped of surrounding spaces, is the line's ``"answer"``."""
    return float(completion.strip() == str(record["answer"]).strip())


def number_answer(completion: str, record: Mapping[str, Any]) -> float:
    """1.0 when the completion's answer (:func:`parse_number`) equals the line's ``"answer"``."""
    value = parse_number(completion)
    return float(value is not None and math.isclose(value, float(record["answer"])))


_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"  # 1,234.5 with its thousands separators


def parse_number(text: str) -> float | None:
    """The numeric answer of a completion, in the conventions of GSM8K-style data.

    The answer is the number after the last ``####`` (GSM8K's own answers), else the number in
    the last ``\\boxed{...}`` (MATH's), else the last number of the text. Thousands separators
    and a leading ``$`` are ignored (``$1,234.`` is 1234).

    Args:
        text: the model's completion.

    Returns:
        The number, or None when there is none where the answer should be.
    """
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    else:
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
        if boxed:
            text = boxed[-1]
    numbers = re.findall(_NUMBER, text)
    return float(numbers[-1].replace(",", "")) if numbers else None


def parse_choice(text: str, choices: str = "ABCD") -> str | None:
    """The letter of a multiple-choice answer (MMLU-style), or None when it is not clear.

    First the letter after "answer is" or "answer:" (``The answer is (B)``), the last such;
    else the one letter of ``choices`` standing alone in the text (``B``, ``(B)``, ``B.``).
    Several different lone letters (``A cat ... C``) give None rather than a guess.

    Args:
        text: the model's completion.
        choices: the letters of the options, upper case.

    Returns:
        One of ``choices``, or None.
    """
    if not choices or not choices.isalpha() or not choices.isupper():
        raise ValueError(f"choices must be upper-case letters, got {choices!r}")
    letter = f"[{choices}]"
    stated = re.findall(rf"answer\s*(?:is|:)\s*\(?({letter})\b", text, flags=re.IGNORECASE)
    stated = [s for s in stated if s in choices]  # IGNORECASE let lower case through
    if stated:
        return stated[-1]
    alone = set(re.findall(rf"(?<![\w'])\(?({letter})\)?(?![\w'])", text))
    return alone.pop() if len(alone) == 1 else None


#: The rewards ``--reward`` knows by name; both read the line's ``"answer"``.
BUILT_IN: dict[str, RewardFn] = {"exact": exact_answer, "number": number_answer}


def load_reward(spec: str) -> RewardFn:
    """The reward named by ``spec``: a key of :data:`BUILT_IN` or ``"module:function"``.

    Raises:
        ValueError: naming ``spec`` when it is neither, or when the module or the function
            cannot be found.
    """
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(
            f"reward must be one of {sorted(BUILT_IN)} or 'module:function', got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward {spec!r}: cannot import {module_name!r} ({err})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"reward {spec!r}: {module_name} has no function {function_name!r}")
    return function


def prompt_records(
    path: str | os.PathLike, tokenizer: Tokenizer, longest: int
) -> Iterator[GRPOPrompt]:
    """The prompts of a GRPO data file, tokenised with the cue to answer.

    Args:
        path: the JSONL file: ``{"prompt": str or a list of messages, ...}`` a line.
        tokenizer: a tokenizer with the chat tokens.
        longest: the most ids a prompt may have (the context less the answer's room).

    Returns:
        One :class:`GRPOPrompt` a line; a bad line raises ``ValueError`` naming it.
    """
    for record, where in jsonl_records(path):
        if not isinstance(record, Mapping) or "prompt" not in record:
            got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
            raise ValueError(f"{where}: expected a 'prompt' key, got {got}")
        prompt = prompt_messages(record["prompt"], where)
        ids = tokenizer.encode(render_chat(prompt, add_generation_prompt=True))
        if len(ids) > longest:
            raise ValueError(
                f"{where}: the prompt has {len(ids)} tokens, more than the {longest} that leave "
                f"room for the answer in the model's context"
            )
        yield GRPOPrompt(ids, record, where)


def score(reward: RewardFn, completion: str, prompt: GRPOPrompt) -> float:
    """``reward(completion, prompt.record)`` as a float; an error, or a value that is not a
    finite number, raises ``ValueError`` naming the prompt's line."""
    try:
        value = reward(completion, prompt.record)
    except Exception as err:
        raise ValueError(
            f"{prompt.where}: the reward function raised on the answer {completion!r}: "
            f"{type(err).__name__}: {err}"
        ) from err
    number = float(value) if isinstance(value, (bool, int, float)) else math.nan
    if not math.isfinite(number):
        raise ValueError(
            f"{prompt.where}: the reward of the answer {completion!r} must be a finite number, "
            f"got {value!r}"
        )
    return number
