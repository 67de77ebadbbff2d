"""What ``coursepkg serve`` refuses to load, each with an error naming why."""

from __future__ import annotations

import dataclasses

import pytest

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.posttrain.trainer import CHAT_BPE, MODEL, chat_tokenizer
from coursepkg.serving.http import load_served_model
from coursepkg.training.checkpoint import save_checkpoint


def _save(folder, tokenizer: str, positional: str, vocab: int) -> None:
    config = TransformerConfig(
        vocab_size=vocab, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16,
        dropout=0.0, norm_first=True, positional=positional,
    )  # fmt: skip
    identity = {"tokenizer": tokenizer, "config": dataclasses.asdict(config)}
    save_checkpoint(
        folder / MODEL, {"identity": identity, "model": DecoderOnlyLM(config).state_dict()}
    )


@pytest.mark.parametrize(
    "tokenizer, positional, words",
    [
        ("char", "rope", "trained with the 'char' tokenizer"),
        (CHAT_BPE, "learned", "--model positional=rope"),
    ],
)
def test_unservable_checkpoints_are_named(tmp_path, tokenizer, positional, words):
    _save(tmp_path, tokenizer, positional, len(chat_tokenizer()) if tokenizer != "char" else 40)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        load_served_model(tmp_path)


def test_a_chat_model_stops_at_end_of_turn(tmp_path):
    _save(tmp_path, CHAT_BPE, "rope", len(chat_tokenizer()))
    served = load_served_model(tmp_path, name="m")
    ids = {served.tokenizer.encode(t)[0] for t in ("<|end|>", "<|endoftext|>")}
    assert served.chat and served.stop_ids == ids and served.name == "m"
