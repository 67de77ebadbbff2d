"""The rewards of ``coursepkg finetune --grpo`` (:mod:`coursepkg.posttrain.rewards`): the built-in
rewards, loading one by name, scoring with errors that name the line, reading prompts."""

from __future__ import annotations

import json

import pytest

from coursepkg.posttrain.chat import render_chat
from coursepkg.posttrain.rewards import (
    BUILT_IN,
    GRPOPrompt,
    exact_answer,
    load_reward,
    number_answer,
    parse_choice,
    parse_number,
    prompt_records,
    score,
)


@pytest.mark.parametrize(
    ("completion", "answer", "exact", "number"),
    [
        ("27", "27", 1.0, 1.0),
        (" 27 ", 27, 1.0, 1.0),
        ("It is 27.", "27", 0.0, 1.0),
        ("26 or 27", "27", 0.0, 1.0),
        ("27 or 26", "27", 0.0, 0.0),
        ("-8", "-8", 1.0, 1.0),
        ("2.50", "2.5", 0.0, 1.0),
        ("", "0", 0.0, 0.0),
        ("twenty-seven", "27", 0.0, 0.0),
    ],
)
def test_the_built_in_rewards(completion, answer, exact, number):
    record = {"prompt": "?", "answer": answer}
    assert exact_answer(completion, record) == exact
    assert number_answer(completion, record) == number


def test_a_reward_is_loaded_by_name_or_as_module_function(tmp_path, monkeypatch):
    assert load_reward("exact") is BUILT_IN["exact"] is exact_answer
    (tmp_path / "scorer.py").write_text("def half(c, r):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("scorer:half")("x", {}) == 0.5
    with pytest.raises(ValueError, match="scorer has no function 'whole'"):
        load_reward("scorer:whole")
    with pytest.raises(ValueError, match="cannot import 'no_such_module_here'"):
        load_reward("no_such_module_here:f")
    with pytest.raises(ValueError, match="or 'module:function', got 'exactly'"):
        load_reward("exactly")


def test_score_names_the_line_of_a_raising_or_non_numeric_reward():
    prompt = GRPOPrompt([1, 2], {"prompt": "?", "answer": "3"}, "data.jsonl, line 7")
    assert score(exact_answer, "3", prompt) == 1.0
    assert score(lambda c, r: True, "3", prompt) == 1.0  # a bool counts as 0 or 1
    with pytest.raises(ValueError, match=r"line 7: the reward function raised .*ZeroDivision"):
        score(lambda c, r: 1 / 0, "3", prompt)
    for bad in (float("nan"), None, "1"):
        with pytest.raises(ValueError, match="line 7: the reward of the answer '3' must be"):
            score(lambda c, r, bad=bad: bad, "3", prompt)


def test_prompts_are_read_with_the_cue_to_answer_and_bad_lines_named(chat_tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    system = {"role": "system", "content": "Be brief."}
    lines = [
        {"prompt": "1+1?", "answer": "2"},
        {"prompt": [system, {"role": "user", "content": "2+2?"}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    first, second = prompt_records(path, chat_tokenizer, longest=64)
    user = [{"role": "user", "content": "1+1?"}]
    assert first.ids == chat_tokenizer.encode(render_chat(user, add_generation_prompt=True))
    assert first.record["answer"] == "2" and second.where == f"{path}, line 2"
    with pytest.raises(ValueError, match="line 1: the prompt has .* more than the 3"):
        list(prompt_records(path, chat_tokenizer, longest=3))
    for bad, message in (
        ({"question": "?"}, "line 1: expected a 'prompt' key"),
        ({"prompt": 3}, "line 1: 'prompt' must be a str or a list"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, "unknown role 'robot'"),
    ):
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=message):
            list(prompt_records(path, chat_tokenizer, longest=64))


@pytest.mark.parametrize("seed", range(3))
def test_a_number_written_in_any_gsm8k_style_parses_back(seed):
    import random

    rng = random.Random(seed)
    for _ in range(50):
        n = rng.choice([rng.randint(-(10**6), 10**6), round(rng.uniform(-999, 999), 2)])
        text = rng.choice(
            [
                f"Step 1: 3 + 4 = 7 apples.\n#### {n:,}",
                f"So she pays ${n:,}.",
                f"The answer is \\boxed{{{n}}}, not 12.",
                f"#### {n}\n",
                f"{n}",
            ]
        )
        assert parse_number(text) == pytest.approx(n), text


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("#### 72", 72.0),
        ("48 + 24 = 72\n#### 72 clips", 72.0),
        ("no number", None),
        ("7 then 8", 8.0),
        ("\\boxed{3} and 9", 3.0),
        ("1,234.5 in all", 1234.5),
        ("####", None),
    ],
)
def test_parse_number_takes_the_marked_answer_first(text, number):
    assert parse_number(text) == number


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("The answer is (B).", "B"),
        ("answer: c", None),
        ("Answer: C", "C"),
        ("(D)", "D"),
        ("B", "B"),
        ("I think it is A.", "A"),
        ("A cat sat. The answer is D", "D"),
        ("A or C", None),
        ("none of them", None),
        ("E", None),
        ("It's B", "B"),
    ],
)
def test_parse_choice_takes_the_stated_or_the_only_letter(text, letter):
    assert parse_choice(text) == letter
    assert parse_choice(text, "ABCDE") == ("E" if text == "E" else letter)
