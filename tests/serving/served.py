"""What the HTTP tests serve: a small chat checkpoint written as ``coursepkg finetune`` writes
its ``model.pt``, and ``coursepkg serve`` started on it on 127.0.0.1 (the fixtures are in
``conftest.py``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.posttrain.trainer import CHAT_BPE, MODEL, chat_tokenizer
from coursepkg.serving.http.launch import ServerProcess
from coursepkg.training.checkpoint import save_checkpoint

#: The served model's context; the server's cache holds fewer positions (CACHE), so that a
#: prompt can fit the context and not the cache.
CONTEXT, CACHE, MAX_BATCH = 2048, 1024, 8


def chat_checkpoint(folder: Path, context: int = CONTEXT) -> Path:
    """A seeded random chat model (rotary positions, GPT-2's BPE with the chat tokens) saved
    in the ``model.pt`` format of ``coursepkg finetune``, its context ``context`` tokens."""
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=len(chat_tokenizer()),
        d_model=32,
        n_heads=2,
        d_ff=64,
        n_layers=2,
        dropout=0.0,
        max_len=context,
        norm_first=True,
        positional="rope",
        activation="gelu",
    )
    model = DecoderOnlyLM(config)
    identity = {"tokenizer": CHAT_BPE, "config": dataclasses.asdict(config)}
    save_checkpoint(folder / MODEL, {"identity": identity, "model": model.state_dict()})
    return folder


def start_server(checkpoint: Path, *options: str) -> ServerProcess:
    """``coursepkg serve CHECKPOINT --port 0 OPTIONS``, returned once it says it is ready."""
    return ServerProcess(checkpoint, *options).start()
