"""The chat page ``coursepkg serve`` serves, driven in headless Chromium: type a question, send
it, watch the answer stream in, read it; it equals the model's greedy answer generated offline."""

from __future__ import annotations

import json

import torch
from browser import Browser, chromium_or_skip

from coursepkg.posttrain.chat import render_chat
from coursepkg.serving import generate
from coursepkg.serving.http import load_served_model

QUESTION = "What is the capital of France?"
MAX_TOKENS = 12


def _offline_answer(folder) -> str:
    served = load_served_model(folder)
    text = render_chat([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    ids = served.tokenizer.encode(text)
    out = generate(served.model, torch.tensor([ids]), MAX_TOKENS)[0, len(ids) :].tolist()
    cut = next((i for i, t in enumerate(out) if t in served.stop_ids), len(out))
    return served.tokenizer.decode(out[:cut])


def test_chat_page_streams_the_models_answer(server, chat_model_dir, tmp_path):
    executable = chromium_or_skip()
    with Browser(executable, width=900, height=600) as browser:
        browser.goto(server.url + "/")
        assert browser.wait_for("document.body.dataset.ready === '1'", timeout=30)
        assert browser.evaluate("document.getElementById('model').textContent") == server.name
        browser.evaluate(f"document.getElementById('max').value = {MAX_TOKENS}")
        browser.evaluate("document.getElementById('prompt').focus()")
        browser.send("Input.insertText", text=QUESTION)  # typed, as a keyboard would
        # count the answer's updates: a streamed answer is written in more than one piece
        browser.evaluate(
            "window.pieces = 0; new MutationObserver(() => window.pieces++).observe("
            "document.getElementById('log'), {subtree: true, childList: true, characterData: true})"
        )
        browser.evaluate("document.getElementById('send').click()")
        assert browser.wait_for(
            "document.body.dataset.state === 'idle'"
            " && document.querySelector('.assistant') !== null",
            timeout=60,
        ), browser.errors
        answer = browser.evaluate("document.querySelector('.assistant .content').textContent")
        question = browser.evaluate("document.querySelector('.user .content').textContent")
        shot = tmp_path / "chat-page.png"
        browser.screenshot(shot)
        assert browser.errors == []
        pieces = browser.evaluate("window.pieces")
    assert question == QUESTION
    assert answer == _offline_answer(chat_model_dir), json.dumps(answer)
    assert pieces >= 2  # the bubbles appear, then the answer's text arrives
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
