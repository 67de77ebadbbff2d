"""``coursepkg serve`` through OpenAI's own Python client: greedy answers equal generating each
request alone, 32 streaming clients at once, and every bad input's error object."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
import torch
from served import CACHE, CONTEXT, chat_checkpoint, start_server

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.posttrain.chat import render_chat
from coursepkg.serving import generate
from coursepkg.serving.http import load_served_model
from coursepkg.serving.http.engine import OnlineBatcher, Ticket
from coursepkg.serving.http.launch import ServerProcess
from coursepkg.serving.sampling import SamplingParams


@pytest.fixture(scope="module")
def offline(chat_model_dir):
    """Each request served alone, in this process: the answer's tokens, cut at a stop token."""
    served = load_served_model(chat_model_dir)

    def answer(prompt: str | list[dict], max_tokens: int) -> tuple[str, int]:
        text = (
            render_chat(prompt, add_generation_prompt=True) if isinstance(prompt, list) else prompt
        )
        ids = served.tokenizer.encode(text)
        out = generate(served.model, torch.tensor([ids]), max_tokens)[0, len(ids) :].tolist()
        cut = next((i for i, t in enumerate(out) if t in served.stop_ids), len(out))
        return served.tokenizer.decode(out[:cut]), cut

    return answer


def _client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Question {i}: " + "why " * (i % 7)}]


async def _stream_chat(
    client: openai.AsyncOpenAI, model: str, i: int, n: int
) -> tuple[str, set, str]:
    stream = await client.chat.completions.create(
        model=model, messages=_conversation(i), max_tokens=n, temperature=0, stream=True
    )
    text, ids, finish = "", set(), None
    async for chunk in stream:
        ids.add(chunk.id)
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    return text, ids, finish


def test_models_lists_the_checkpoint(server):
    models = openai.OpenAI(base_url=server.url + "/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == [server.name]


def test_greedy_answers_equal_each_request_served_alone(server, offline):
    async def run():
        client = _client(server)
        chats = [
            client.chat.completions.create(
                model=server.name, messages=_conversation(i), max_tokens=3 + 5 * i, temperature=0
            )
            for i in range(5)
        ]
        texts = [
            client.completions.create(
                model=server.name, prompt="Once upon a time " * i, max_tokens=9 - i, temperature=0
            )
            for i in range(1, 5)
        ]
        return await asyncio.gather(*chats, *texts)

    replies = asyncio.run(run())
    for i, reply in enumerate(replies[:5]):
        text, n = offline(_conversation(i), 3 + 5 * i)
        assert reply.choices[0].message.content == text
        assert reply.usage.completion_tokens == n
        assert reply.choices[0].finish_reason == ("length" if n == 3 + 5 * i else "stop")
    for i, reply in enumerate(replies[5:], start=1):
        text, n = offline("Once upon a time " * i, 9 - i)
        assert (reply.choices[0].text, reply.usage.completion_tokens) == (text, n)


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_ignore_eos_runs_past_every_stop_token(ignore_eos):
    # every token of the vocabulary is a stop token: a request ends at its first token, unless
    # it asks (vLLM's ignore_eos, an extra body field) to run to max_new_tokens
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=40,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=1,
        max_len=64,
        norm_first=True,
        positional="rope",
    )
    engine = OnlineBatcher(DecoderOnlyLM(config).eval(), n_blocks=8, stop_ids=frozenset(range(40)))
    got, done = [], threading.Event()

    def emit(token: int | None, reason: str | None) -> None:
        got.append(reason) if reason else got.append(token)
        if reason:
            done.set()

    engine.start()
    try:
        engine.submit(Ticket([1, 2, 3], 12, SamplingParams(), emit, ignore_eos=ignore_eos))
        assert done.wait(120)
    finally:
        engine.close()
    assert got[-1] == ("length" if ignore_eos else "stop")
    assert len(got) - 1 == (12 if ignore_eos else 0)


def test_32_streaming_clients_all_complete_nothing_lost_or_interleaved(server, offline):
    async def run():
        client = _client(server)
        return await asyncio.gather(
            *(_stream_chat(client, server.name, i, 8 + i % 5) for i in range(32))
        )

    results = asyncio.run(run())
    all_ids = set()
    for i, (text, ids, finish) in enumerate(results):
        expected, n = offline(_conversation(i), 8 + i % 5)
        assert text == expected, f"client {i}"
        assert finish == ("length" if n == 8 + i % 5 else "stop")
        assert len(ids) == 1  # every chunk of a stream belongs to its one request
        all_ids |= ids
    assert len(all_ids) == 32
    health = httpx.get(server.url + "/health").json()
    assert health["in_flight"] == 0 and health["free_blocks"] == health["n_blocks"]


def _post(server: ServerProcess, body: object) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(server.url + "/v1/chat/completions", content=content, headers=headers)


HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        ('{"model": "m", "messages": [', 400, None, "not valid JSON"),
        ({"model": "nope", "messages": HELLO}, 404, "model", "model 'nope' does not exist"),
        ({"model": "$", "messages": []}, 400, "messages", "messages is empty"),
        ({"model": "$", "messages": HELLO, "max_tokens": CONTEXT}, 400, "max_tokens", "context of"),
        (
            {"model": "$", "messages": [{"role": "user", "content": "a " * (CACHE + 10)}]},
            400,
            "messages",
            "more than the server's cache holds",
        ),
        (
            {"model": "$", "messages": [{"role": "bot", "content": "x"}]},
            400,
            "messages.0.role",
            "bot",
        ),
        ({"model": "$", "messages": HELLO, "max_tokens": 0}, 400, "max_tokens", "greater than"),
        ({"messages": HELLO}, 400, "model", "Field required"),
        ({"model": "$", "messages": HELLO, "n": 2}, 400, "n", "less than or equal to 1"),
        ({"model": "$", "messages": HELLO, "stop": ["\n"]}, 400, "stop", "not supported"),
    ],
)
def test_bad_input_gets_openai_error_naming_it(server, body, status, param, words):
    if isinstance(body, dict) and body.get("model") == "$":
        body = {**body, "model": server.name}
    reply = _post(server, body)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert error["type"] == "invalid_request_error"


def _wait_health(server: ServerProcess, ready, timeout: float = 30) -> dict:
    # polls the server's own state until the condition holds (never a fixed sleep)
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(server.url + "/health").json()
        if ready(health) or time.monotonic() > deadline:
            return health


def test_client_leaving_mid_stream_frees_its_slot(server, offline):
    before = httpx.get(server.url + "/health").json()["cancelled"]
    body = {"model": server.name, "messages": HELLO, "max_tokens": CACHE - 20, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    # the others are unaffected, and the one that left is cancelled with its blocks freed
    reply = openai.OpenAI(base_url=server.url + "/v1", api_key="unused").chat.completions.create(
        model=server.name, messages=_conversation(3), max_tokens=6, temperature=0
    )
    assert reply.choices[0].message.content == offline(_conversation(3), 6)[0]
    health = _wait_health(server, lambda h: h["cancelled"] > before and h["in_flight"] == 0)
    assert health["cancelled"] == before + 1
    assert health["free_blocks"] == health["n_blocks"]


def test_full_server_answers_429_with_retry_after(tmp_path):
    # One row, no waiting room: while a long request streams (up to 32k tokens), the next is
    # turned away; leaving the stream cancels the long one.
    context = 32768
    options = ("--max-batch", "1", "--max-waiting", "0", "--cache-tokens", str(context))
    small = start_server(chat_checkpoint(tmp_path, context=context), *options)
    second = {"model": small.name, "messages": HELLO, "max_tokens": 2}
    try:
        with httpx.Client(base_url=small.url) as http:
            http.get("/health")  # the connection is open before the long request starts
            # ignore_eos: the answer runs to max_tokens whatever the model samples
            body = {**second, "max_tokens": context - 10, "stream": True, "ignore_eos": True}
            with http.stream("POST", "/v1/chat/completions", json=body) as first:
                # kept: a line iterator dropped here is closed, which closes the connection
                # under it, and the server (rightly) cancels the long request when it notices,
                # sometimes in time for the next request to take its row
                lines = first.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                busy = http.post("/v1/chat/completions", json=second)
                health = http.get("/health").json()
            assert busy.status_code == 429, f"{busy.text}\n{health}\n{''.join(small.log)}"
            assert busy.headers["Retry-After"] == "1"
            error = busy.json()["error"]
            assert error["type"] == "rate_limit_error" and "max_batch=1" in error["message"]
            _wait_health(small, lambda h: h["in_flight"] == 0)
            again = http.post("/v1/chat/completions", json=second)
            assert again.status_code == 200, again.text
    finally:
        small.stop()
