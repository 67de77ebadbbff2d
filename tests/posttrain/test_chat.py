"""Tests of coursepkg.posttrain.chat: the template's text and ids, the response mask, the
``transformers`` twin (same ids through ``apply_chat_template``), and the errors on bad data."""

from __future__ import annotations

import json

import pytest

from coursepkg.posttrain.chat import (
    CHAT_TOKENS,
    END_OF_TURN,
    encode_chat,
    hf_chat_tokenizer,
    prompt_messages,
    read_chat_jsonl,
    render_chat,
    with_chat_tokens,
)
from coursepkg.tokenizer import Tokenizer

SYSTEM = {"role": "system", "content": "Answer briefly."}
CONVERSATIONS = {
    "one turn": [
        {"role": "user", "content": "What is two plus three?"},
        {"role": "assistant", "content": " Five."},
    ],
    "with a system turn": [
        SYSTEM,
        {"role": "user", "content": "Reverse the word cat"},
        {"role": "assistant", "content": "tac"},
    ],
    "two turns": [
        {"role": "user", "content": "Sort 3 1 2"},
        {"role": "assistant", "content": "1 2 3"},
        {"role": "user", "content": "Count the letters of dog"},
        {"role": "assistant", "content": " three.\n"},
    ],
    "unicode and spaces": [
        {"role": "user", "content": "  héllo 😀\n\nworld  "},
        {"role": "assistant", "content": "naïve — ok "},
    ],
}


def test_the_template_writes_marker_content_and_end_of_turn():
    messages = CONVERSATIONS["one turn"]
    assert (
        render_chat(messages) == "<|user|>What is two plus three?<|end|><|assistant|> Five.<|end|>"
    )
    assert render_chat(messages[:1], add_generation_prompt=True).endswith("<|end|><|assistant|>")


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_encoding_piece_by_piece_gives_the_ids_of_the_whole_text(chat_tokenizer, name):
    messages = CONVERSATIONS[name]
    example = encode_chat(chat_tokenizer, messages)
    assert example.ids == chat_tokenizer.encode(render_chat(messages))
    assert len(example.response_mask) == len(example.ids)


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_the_response_mask_covers_exactly_the_assistants_words_and_their_end(chat_tokenizer, name):
    messages = CONVERSATIONS[name]
    example = encode_chat(chat_tokenizer, messages)
    learned = [i for i, m in zip(example.ids, example.response_mask, strict=True) if m]
    given = [i for i, m in zip(example.ids, example.response_mask, strict=True) if not m]
    answers = [m["content"] + END_OF_TURN for m in messages if m["role"] == "assistant"]
    assert chat_tokenizer.decode(learned) == "".join(answers)
    # Everything else is the prompt: every marker, and every other role's words.
    assert chat_tokenizer.decode(given).count("<|assistant|>") == len(answers)
    assert all(
        m["content"] in chat_tokenizer.decode(given) for m in messages if m["role"] != "assistant"
    )


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_transformers_apply_chat_template_gives_the_same_ids(
    chat_tokenizer, name, generation_prompt
):
    pytest.importorskip("transformers")
    hf = hf_chat_tokenizer(chat_tokenizer)
    messages = CONVERSATIONS[name]
    text = render_chat(messages, add_generation_prompt=generation_prompt)
    assert (
        hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        == text
    )
    encoded = hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt
    )
    assert list(encoded["input_ids"]) == chat_tokenizer.encode(text)
    assert hf.decode(encoded["input_ids"]) == text


def test_the_chat_tokens_are_one_id_each_and_plain_text_keeps_its_ids(chat_tokenizer):
    plain = Tokenizer(chat_tokenizer.vocab, chat_tokenizer.merges)
    text = "The cat sat on the mat."
    assert chat_tokenizer.encode(text) == plain.encode(text)
    ids = [chat_tokenizer.encode(token) for token in CHAT_TOKENS]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(CHAT_TOKENS)
    assert with_chat_tokens(chat_tokenizer).vocab == chat_tokenizer.vocab  # adding twice: no-op


def test_a_response_past_the_context_is_cut_but_the_prompt_is_kept(chat_tokenizer):
    messages = CONVERSATIONS["with a system turn"]
    whole = encode_chat(chat_tokenizer, messages)
    prompt = whole.response_mask.index(True)
    cut = encode_chat(chat_tokenizer, messages, max_len=prompt + 1)
    assert cut.ids == whole.ids[: prompt + 1] and cut.response_mask == [False] * prompt + [True]


def test_a_prompt_longer_than_the_context_is_refused(chat_tokenizer):
    messages = CONVERSATIONS["with a system turn"]
    prompt = encode_chat(chat_tokenizer, messages).response_mask.index(True)
    with pytest.raises(
        ValueError, match=f"has {prompt} tokens, too long for a context of max_len={prompt}"
    ):
        encode_chat(chat_tokenizer, messages, max_len=prompt)


def test_an_unknown_role_is_named(chat_tokenizer):
    messages = [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}]
    with pytest.raises(ValueError, match=r"message 0 has the unknown role 'bot'"):
        encode_chat(chat_tokenizer, messages)
    with pytest.raises(ValueError, match="unknown role 'bot'"):
        render_chat(messages)


def test_a_conversation_without_a_response_is_refused(chat_tokenizer):
    with pytest.raises(ValueError, match="no assistant message"):
        encode_chat(chat_tokenizer, [{"role": "user", "content": "hi"}])


def test_a_tokenizer_without_the_chat_tokens_is_told_how_to_get_them(chat_tokenizer):
    plain = Tokenizer(chat_tokenizer.vocab, chat_tokenizer.merges, ["<|endoftext|>"])
    with pytest.raises(
        ValueError, match=r"lacks the chat template's special tokens .*with_chat_tokens"
    ):
        encode_chat(plain, CONVERSATIONS["one turn"])
    with pytest.raises(ValueError, match="with_chat_tokens"):
        hf_chat_tokenizer(plain)


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_reads_both_shapes_of_record(tmp_path):
    path = _write(
        tmp_path / "chat.jsonl",
        [
            json.dumps({"messages": CONVERSATIONS["two turns"]}),
            "",
            json.dumps({"prompt": "What is two plus three?", "response": " Five."}),
        ],
    )
    conversations = read_chat_jsonl(path)
    assert conversations[0] == CONVERSATIONS["two turns"]
    assert conversations[1] == CONVERSATIONS["one turn"]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "hi"}, "line 2: a 'prompt' without a 'response'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "line 2: no assistant message"),
        (
            {"messages": [{"role": "robot", "content": "hi"}]},
            "line 2: message 0 has the unknown role 'robot'",
        ),
        (
            {"messages": [{"role": "user"}]},
            "line 2: message 0 must be a dict with 'role' and 'content'",
        ),
        ({"text": "hi"}, "line 2: expected 'messages' or 'prompt' \\+ 'response'"),
    ],
)
def test_a_bad_jsonl_line_is_named_by_its_number(tmp_path, record, message):
    good = json.dumps({"prompt": "a", "response": "b"})
    path = _write(tmp_path / "chat.jsonl", [good, json.dumps(record)])
    with pytest.raises(ValueError, match=message):
        read_chat_jsonl(path)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = _write(tmp_path / "chat.jsonl", ['{"prompt": "a", "response": "b"}', "{oops"])
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        read_chat_jsonl(path)


@pytest.mark.parametrize("prompt", ["2+2?", [SYSTEM, {"role": "user", "content": "2+2?"}]])
def test_a_prompt_is_one_user_turn_or_its_own_turns_copied(prompt):
    """What DPO's pairs and GRPO's prompts read as the turns before the answer."""
    messages = prompt_messages(prompt, "here")
    if isinstance(prompt, str):
        assert messages == [{"role": "user", "content": prompt}]
    else:
        assert messages == prompt and messages is not prompt


@pytest.mark.parametrize(
    "prompt, message",
    [
        (3, "here: 'prompt' must be a str or a list of messages"),
        ({"role": "user", "content": "x"}, "here: 'prompt' must be a str or a list"),
        ([{"role": "robot", "content": "x"}], "here: message 0 has the unknown role 'robot'"),
    ],
)
def test_a_bad_prompt_is_named(prompt, message):
    with pytest.raises(ValueError, match=message):
        prompt_messages(prompt, "here")


def test_gpt2s_own_vocabulary_gives_the_same_ids_through_transformers():
    pytest.importorskip("transformers")
    tokenizer = with_chat_tokens(Tokenizer.gpt2())
    hf = hf_chat_tokenizer(tokenizer)
    for messages in CONVERSATIONS.values():
        ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        assert list(ids["input_ids"]) == encode_chat(tokenizer, messages).ids
    assert tokenizer.encode(END_OF_TURN) == [len(tokenizer) - 1]  # new ids after GPT-2's 50,257
