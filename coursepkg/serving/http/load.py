"""``coursepkg serve`` measured from outside, through OpenAI's own client: whether each greedy
answer equals the model's answer generated offline for that request alone, and the same requests
sent all at once (the continuous-batching scheduler serves them together) against one at a time,
alternated round by round on one server so that machine noise hits both alike.

Wall clock: the client and the server are two processes. The pipeline's report card
(:mod:`coursepkg.training.pipeline`) and ``benchmarks/http_serve.py`` use it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import torch

from coursepkg.serving.http.launch import ServerProcess

__all__ = ["alternated_rounds", "measure_serving", "offline_answers", "percentile", "summary"]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``q`` in [0, 1]).

    Raises:
        ValueError: no values, or ``q`` outside [0, 1].
    """
    if not values or not 0 <= q <= 1:
        raise ValueError(f"percentile needs values and 0 <= q <= 1, got {len(values)} and {q}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def offline_answers(checkpoint: str | Path, prompts: list[str], max_tokens: int) -> list[dict]:
    """Each prompt as a one-turn chat, answered greedily by the model in this process alone.

    Args:
        checkpoint: the served model (what ``coursepkg serve`` takes).
        prompts: one user message each.
        max_tokens: each answer's limit, lowered where the prompt leaves less of the context.

    Returns:
        One ``{"text", "tokens", "max_tokens"}`` per prompt: the answer cut at the first stop
        token, how many tokens came before it, and the limit it was given.

    Raises:
        ValueError: a prompt that fills the model's whole context (it is named).
    """
    from coursepkg.posttrain.chat import render_chat
    from coursepkg.serving.generate import generate
    from coursepkg.serving.http.engine import load_served_model

    served = load_served_model(checkpoint)
    answers = []
    for prompt in prompts:
        text = render_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = served.tokenizer.encode(text)
        limit = min(max_tokens, served.context - len(ids))
        if limit < 1:
            raise ValueError(
                f"the prompt {prompt!r} is {len(ids)} tokens as a chat, the model's whole "
                f"context of {served.context}: no room for an answer"
            )
        with torch.no_grad():
            out = generate(served.model, torch.tensor([ids]), limit)  # (1, L + limit)
        new = out[0, len(ids) :].tolist()
        cut = next((i for i, t in enumerate(new) if t in served.stop_ids), len(new))
        text = served.tokenizer.decode(new[:cut])
        answers.append({"text": text, "tokens": cut, "max_tokens": limit})
    return answers


async def _one(client: Any, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy streaming chat request: its text, latency and time to its first text."""
    start = time.perf_counter()
    first, text = None, ""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text += chunk.choices[0].delta.content
    end = time.perf_counter()
    return {"text": text, "latency": end - start, "ttft": (first or end) - start}


async def _round(client: Any, model: str, requests: list[tuple[str, int]], together: bool):
    start = time.perf_counter()
    if together:
        rows = await asyncio.gather(*(_one(client, model, p, n) for p, n in requests))
    else:
        rows = [await _one(client, model, p, n) for p, n in requests]
    return {"wall": time.perf_counter() - start, "rows": list(rows)}


async def alternated_rounds(
    url: str, model: str, requests: list[tuple[str, int]], rounds: int
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` rounds of the prompts one at a time, then all at once, alternated, after a
    warm-up round (the first calls pay one-off costs).

    Args:
        url: the server's ``http://127.0.0.1:PORT``.
        model: the served model's id.
        requests: ``(prompt, max_tokens)`` pairs, one chat request each.
        rounds: rounds of each kind (>= 1).

    Returns:
        ``{"one at a time": [...], "all at once": [...]}``, each a list of rounds
        ``{"wall", "rows": [{"text", "latency", "ttft"} per prompt]}``.
    """
    import openai

    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    await _round(client, model, requests[:4], True)
    results: dict[str, list[dict[str, Any]]] = {"one at a time": [], "all at once": []}
    for _ in range(rounds):
        for label, together in (("one at a time", False), ("all at once", True)):
            results[label].append(await _round(client, model, requests, together))
    await client.close()
    return results


def summary(results: dict[str, list[dict[str, Any]]], tokens: list[int]) -> dict[str, Any]:
    """Throughput, latency and time to first text of each kind of round.

    Args:
        results: :func:`alternated_rounds`' result.
        tokens: each prompt's completion tokens (the same in every round: greedy answers).

    Returns:
        Per kind: ``tokens_per_second`` and the p50/p99 of ``latency`` and ``ttft`` (seconds);
        ``ratio``: all at once / one at a time, in tokens per second.
    """
    out: dict[str, Any] = {}
    for label, rounds in results.items():
        wall = sum(r["wall"] for r in rounds)
        latency = [row["latency"] for r in rounds for row in r["rows"]]
        ttft = [row["ttft"] for r in rounds for row in r["rows"]]
        out[label] = {
            "tokens_per_second": sum(tokens) * len(rounds) / wall,
            "latency_p50": percentile(latency, 0.5),
            "latency_p99": percentile(latency, 0.99),
            "ttft_p50": percentile(ttft, 0.5),
            "ttft_p99": percentile(ttft, 0.99),
        }
    together, alone = out["all at once"], out["one at a time"]
    out["ratio"] = together["tokens_per_second"] / alone["tokens_per_second"]
    return out


def measure_serving(
    checkpoint: str | Path, prompts: list[str], max_tokens: int = 24, rounds: int = 2
) -> dict[str, Any]:
    """Serve ``checkpoint`` with ``coursepkg serve`` (all prompts decoded together) and measure it.

    Args:
        checkpoint: a chat model (a ``coursepkg finetune`` run folder).
        prompts: the requests, one user message each.
        max_tokens: each request's limit (lowered where a prompt leaves less of the context).
        rounds: alternated rounds of each kind.

    Returns:
        ``requests``, ``max_tokens``, ``rounds``, ``greedy_equal`` (how many of the served answers
        of every round equal the offline ones), ``completion_tokens`` and :func:`summary`'s
        figures.
    """
    if not prompts:
        raise ValueError("measure_serving needs at least one prompt")
    offline = offline_answers(checkpoint, prompts, max_tokens)
    requests = [(p, a["max_tokens"]) for p, a in zip(prompts, offline, strict=True)]
    with ServerProcess(checkpoint, "--max-batch", str(len(prompts))) as server:
        results = asyncio.run(alternated_rounds(server.url, server.name, requests, rounds))
    equal = sum(
        all(r["rows"][i]["text"] == want["text"] for rs in results.values() for r in rs)
        for i, want in enumerate(offline)
    )
    tokens = [a["tokens"] for a in offline]
    figures = summary(results, tokens)
    return {
        "requests": len(prompts),
        "max_tokens": max_tokens,
        "rounds": rounds,
        "greedy_equal": equal,
        "completion_tokens": sum(tokens),
        **figures,
    }
