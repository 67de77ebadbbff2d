"""Chat data: a conversation as text, as ids, and which ids the model learns from.

A conversation is a list of messages ``{"role": ..., "content": ...}`` with roles
:data:`ROLES`. The course's template writes each message as its role marker, its content and the
end-of-turn token, with nothing in between::

    <|user|>What is 2+3?<|end|><|assistant|>5<|end|>

The four markers are special tokens (one id each), so a marker never merges with the text around
it and the model can learn to stop by emitting ``<|end|>``. :data:`CHAT_TEMPLATE` is the same
template in Jinja, the language Hugging Face tokenizers keep their chat template in;
:func:`hf_chat_tokenizer` builds a ``transformers`` tokenizer from the course tokenizer's own
vocabulary and merges (offline), whose ``apply_chat_template`` gives the same ids.

:func:`encode_chat` returns the ids and the **response mask**: True on the tokens the assistant
wrote (its content and its ``<|end|>``), the only tokens supervised fine-tuning learns from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..tokenizer import Tokenizer, bytes_to_unicode

__all__ = [
    "CHAT_PREFIX",
    "CHAT_TEMPLATE",
    "CHAT_TOKENS",
    "END_OF_TURN",
    "ROLES",
    "ChatExample",
    "chat_records",
    "check_messages",
    "encode_chat",
    "hf_chat_tokenizer",
    "jsonl_records",
    "prompt_messages",
    "read_chat_jsonl",
    "recorded_chat_tokenizer",
    "render_chat",
    "role_marker",
    "with_chat_tokens",
]

#: The roles a message may have.
ROLES = ("system", "user", "assistant")
#: Ends every message; the model learns to emit it when its answer is complete.
END_OF_TURN = "<|end|>"


def role_marker(role: str) -> str:
    """The special token that opens a message of ``role`` (``"user"`` -> ``"<|user|>"``)."""
    return f"<|{role}|>"


#: Every special token the template writes.
CHAT_TOKENS = (*(role_marker(role) for role in ROLES), END_OF_TURN)

#: The tokenizer a chat model records: ``"bpe-chat"`` alone is GPT-2's with the chat tokens;
#: this prefix then a folder is a BPE its base learned on a corpus, with the chat tokens.
CHAT_BPE = "bpe-chat"
CHAT_PREFIX = "bpe-chat:"

#: :func:`render_chat` as a Jinja template, for ``transformers``' ``apply_chat_template``.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class ChatExample:
    """One tokenised conversation: its ids and its response mask (equal lengths).

    Attributes:
        ids: the token ids, a list of L ints.
        response_mask: L bools, True where the token was written by the assistant.
    """

    __slots__ = ("ids", "response_mask")

    def __init__(self, ids: list[int], response_mask: list[bool]) -> None:
        if len(ids) != len(response_mask):
            raise ValueError(
                f"ids and response_mask must have equal lengths, got {len(ids)} and "
                f"{len(response_mask)}"
            )
        self.ids = ids
        self.response_mask = response_mask

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"ChatExample({len(self.ids)} ids, {sum(self.response_mask)} in the response)"


def check_messages(messages: object, where: str = "messages") -> list[Mapping[str, str]]:
    """Raise a clear error unless ``messages`` is a list of ``{"role", "content"}`` dicts with
    known roles and string contents, holding at least one assistant message.

    Args:
        messages: the conversation.
        where: how errors name it (e.g. ``"data.jsonl, line 3"``).

    Returns:
        The messages, as a list.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(f"{where}: messages must be a list of dicts, got {type(messages).__name__}")
    for number, message in enumerate(messages):
        if not isinstance(message, Mapping) or not {"role", "content"} <= set(message):
            raise ValueError(
                f"{where}: message {number} must be a dict with 'role' and 'content', "
                f"got {message!r}"
            )
        if message["role"] not in ROLES:
            raise ValueError(
                f"{where}: message {number} has the unknown role {message['role']!r}, "
                f"expected one of {ROLES}"
            )
        if not isinstance(message["content"], str):
            raise TypeError(
                f"{where}: message {number}'s content must be a str, got "
                f"{type(message['content']).__name__}"
            )
    if not any(message["role"] == "assistant" for message in messages):
        raise ValueError(f"{where}: no assistant message, so there is no response to learn")
    return list(messages)


def prompt_messages(prompt: object, where: str) -> list[Mapping[str, str]]:
    """A record's ``prompt`` (a DPO pair's, a GRPO prompt's) as the turns before the answer.

    Args:
        prompt: a str (one user turn) or a list of messages, checked as :func:`check_messages`
            checks a conversation (but with no assistant turn needed).
        where: how errors name it (e.g. ``"data.jsonl, line 3"``).

    Returns:
        The messages, as a new list.
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Sequence):
        raise ValueError(f"{where}: 'prompt' must be a str or a list of messages")
    # check_messages wants a response; the prompt's turns are checked with a stand-in one.
    check_messages([*prompt, {"role": "assistant", "content": ""}], where)
    return list(prompt)


def render_chat(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
    """The conversation as text, in the course's template.

    Args:
        messages: ``{"role", "content"}`` dicts, roles in :data:`ROLES`.
        add_generation_prompt: end with ``<|assistant|>``, the cue for the model to answer.

    Returns:
        The text.
    """
    for number, message in enumerate(messages):
        if message.get("role") not in ROLES:
            raise ValueError(
                f"message {number} has the unknown role {message.get('role')!r}, "
                f"expected one of {ROLES}"
            )
    text = "".join(role_marker(m["role"]) + m["content"] + END_OF_TURN for m in messages)
    return text + (role_marker("assistant") if add_generation_prompt else "")


def with_chat_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """The same tokenizer with :data:`CHAT_TOKENS` added as special tokens (new ids at the end
    of the vocabulary for those it lacks); text without them encodes to the same ids.

    Args:
        tokenizer: a course :class:`~coursepkg.tokenizer.Tokenizer`.

    Returns:
        A new tokenizer.
    """
    extra = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
    return Tokenizer(tokenizer.vocab, tokenizer.merges, [*tokenizer.special_tokens, *extra])


def recorded_chat_tokenizer(checkpoint: str | os.PathLike) -> tuple[Tokenizer, str, bool]:
    """The chat tokenizer of the model saved in ``checkpoint``: its run's own BPE (GPT-2's, or
    one learned on its corpus, read from the run) with the chat tokens.

    Args:
        checkpoint: a ``coursepkg train`` checkpoint or a ``coursepkg finetune`` ``model.pt``
            (a Hugging Face folder gets GPT-2's, as ``coursepkg finetune`` fits it to).

    Returns:
        The tokenizer, the name a fine-tune of this model records (:data:`CHAT_BPE`, or
        :data:`CHAT_PREFIX` and the learned tokenizer's folder), and whether the model was
        already a chat model.

    Raises:
        ValueError: a run whose tokenizer is not saved (``char``) or cannot be found.
    """
    from ..training.checkpoint import load_checkpoint
    from ..training.data import recorded_tokenizer

    kind = "bpe"
    if not os.path.isdir(checkpoint):
        kind = load_checkpoint(checkpoint).get("identity", {}).get("tokenizer", "char")
    chat = kind == CHAT_BPE or kind.startswith(CHAT_PREFIX)
    base = "bpe" if kind == CHAT_BPE else kind.removeprefix(CHAT_PREFIX)
    name = CHAT_BPE if base == "bpe" else CHAT_PREFIX + base
    return with_chat_tokens(recorded_tokenizer(base, checkpoint)), name, chat


def _check_chat_tokens(tokenizer: Tokenizer) -> dict[str, int]:
    """The id of each chat token, or a clear error naming those the tokenizer lacks."""
    missing = [t for t in CHAT_TOKENS if t not in tokenizer.special_tokens]
    if missing:
        raise ValueError(
            f"the tokenizer lacks the chat template's special tokens {missing} (its special "
            f"tokens are {tokenizer.special_tokens}); build it with with_chat_tokens(tokenizer)"
        )
    return {token: tokenizer.encode(token)[0] for token in CHAT_TOKENS}


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, str]],
    max_len: int | None = None,
) -> ChatExample:
    """Tokenise a conversation and mark the assistant's tokens.

    Each message is encoded piece by piece (marker, content, end-of-turn): special tokens cut the
    text before pre-tokenisation, so the pieces' ids joined are exactly the ids of
    :func:`render_chat`'s text, and each id knows which message it came from.

    Args:
        tokenizer: a tokenizer holding :data:`CHAT_TOKENS` (see :func:`with_chat_tokens`).
        messages: the conversation (:func:`check_messages` rules).
        max_len: the model's context. Everything before the last assistant message's content
            (the prompt) must fit in ``max_len - 1`` tokens, so that at least one response token
            is learned; a response running past ``max_len`` is cut there.

    Returns:
        A :class:`ChatExample`: ids (L,) and response mask (L,), L <= ``max_len``.
    """
    messages = check_messages(messages)
    special = _check_chat_tokens(tokenizer)
    ids: list[int] = []
    mask: list[bool] = []
    prompt_len = 0
    for message in messages:
        learned = message["role"] == "assistant"
        ids.append(special[role_marker(message["role"])])
        mask.append(False)  # the marker is given, not written by the model
        if learned:
            prompt_len = len(ids)
        content = tokenizer.encode(message["content"])
        ids += [*content, special[END_OF_TURN]]
        mask += [learned] * (len(content) + 1)
    if max_len is not None:
        if prompt_len >= max_len:
            raise ValueError(
                f"the prompt (the tokens before the last response) has {prompt_len} tokens, "
                f"too long for a context of max_len={max_len} (it must leave room for at least "
                f"one response token)"
            )
        ids, mask = ids[:max_len], mask[:max_len]
    return ChatExample(ids, mask)


def _messages_of_record(record: Any, where: str) -> list[Mapping[str, str]]:
    """A JSONL record's conversation: ``{"messages": [...]}`` or ``{"prompt", "response"}``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        return check_messages(record["messages"], where)
    if "prompt" not in record:
        raise ValueError(f"{where}: expected 'messages' or 'prompt' + 'response', got {record!r}")
    if "response" not in record:
        raise ValueError(f"{where}: a 'prompt' without a 'response', got keys {sorted(record)}")
    messages = [
        {"role": "user", "content": record["prompt"]},
        {"role": "assistant", "content": record["response"]},
    ]
    return check_messages(messages, where)


def read_chat_jsonl(path: str | os.PathLike) -> list[list[Mapping[str, str]]]:
    """Read conversations from a JSONL file, one JSON object a line: either
    ``{"messages": [{"role": ..., "content": ...}, ...]}`` or ``{"prompt": ..., "response": ...}``
    (a user turn and an assistant turn). Blank lines are skipped.

    Args:
        path: the file.

    Returns:
        One list of messages per line; a bad line raises ``ValueError`` naming its number.
    """
    return [messages for messages, _ in chat_records(path)]


def chat_records(path: str | os.PathLike) -> Iterator[tuple[list[Mapping[str, str]], str]]:
    """The conversations of a JSONL file as :func:`read_chat_jsonl` reads them, each with where
    it stands (``"FILE, line N"``), so that a later error (a prompt too long for the model)
    can name its line too."""
    for record, where in jsonl_records(path):
        yield _messages_of_record(record, where), where


def jsonl_records(path: str | os.PathLike) -> Iterator[tuple[Any, str]]:
    """The JSON value of each non-blank line of ``path``, with where it stands
    (``"FILE, line N"``, for error messages); a line that is not JSON raises ``ValueError``
    naming its number."""
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{os.fspath(path)}, line {number}"
            try:
                yield json.loads(line), where
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg})") from None


def hf_chat_tokenizer(tokenizer: Tokenizer):
    """A ``transformers.PreTrainedTokenizerFast`` with the course tokenizer's vocabulary, merges
    and special tokens and :data:`CHAT_TEMPLATE`, built offline (nothing is downloaded).

    Its ``apply_chat_template(messages)`` gives the ids of ``tokenizer.encode(render_chat(
    messages))``: the same byte-level BPE (GPT-2's pre-tokenisation, merges in rank order) with
    the chat tokens as added tokens.

    Args:
        tokenizer: a course tokenizer holding :data:`CHAT_TOKENS`.

    Returns:
        The ``PreTrainedTokenizerFast`` (needs the ``interop`` extra: ``transformers``).
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast

    _check_chat_tokens(tokenizer)
    table = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    # A special token is an added token, written as itself, not in GPT-2's byte characters.
    special = {t.encode("utf-8"): t for t in tokenizer.special_tokens}
    vocab = {special.get(token) or text(token): i for i, token in tokenizer.vocab.items()}
    merges = [(text(a), text(b)) for a, b in tokenizer.merges]
    rust = RustTokenizer(models.BPE(vocab=vocab, merges=merges))
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    rust.add_special_tokens([AddedToken(t, special=True) for t in tokenizer.special_tokens])
    return PreTrainedTokenizerFast(
        tokenizer_object=rust,
        chat_template=CHAT_TEMPLATE,
        eos_token=END_OF_TURN,
    )
