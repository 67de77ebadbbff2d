"""What ``coursepkg serve`` refuses to load, each with an error naming why."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.posttrain.trainer import CHAT_BPE, MODEL, chat_tokenizer
from coursepkg.serving.http import load_served_model
from coursepkg.training.checkpoint import save_checkpoint


def _save(folder, tokenizer: str, positional: str, vocab: int) -> None:
    config = TransformerConfig(
        vocab_size=vocab,
        d_model=8,
        n_heads=2,
        d_ff=16,
        n_layers=1,
        max_len=16,
        dropout=0.0,
        norm_first=True,
        positional=positional,
    )
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


def test_a_run_on_a_learned_tokenizer_is_served_with_it(tmp_path):
    """A ``coursepkg train`` run on a BPE learned from its corpus carries that tokenizer: the
    server loads it from the run (the learned folder itself deleted), and ids round-trip."""
    import shutil

    from coursepkg.tokenizer import Tokenizer, train_bpe
    from coursepkg.training import TrainSettings, train

    text = "the lord is my shepherd; I shall not want. " * 40
    vocab, merges = train_bpe(text, 256 + 40 + 1, ["<|endoftext|>"])
    learned = Tokenizer(vocab, merges, ["<|endoftext|>"])
    (tmp_path / "tok").mkdir()
    learned.save(tmp_path / "tok" / "vocab.json", tmp_path / "tok" / "merges.txt")
    (tmp_path / "corpus.txt").write_text(text)
    model = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, positional="rope")
    run = TrainSettings(
        data=str(tmp_path / "corpus.txt"),
        out=str(tmp_path / "run"),
        tokenizer=str(tmp_path / "tok"),
        steps=2,
        batch_size=2,
        block_size=8,
        warmup_steps=0,
        eval_every=2,
        eval_batches=1,
        checkpoint_every=2,
        device="cpu",
        samples=1,
        sample_tokens=4,
        model=model,
    )
    trained = train(run)
    shutil.rmtree(tmp_path / "tok")
    served = load_served_model(tmp_path / "run")
    assert served.model.config.vocab_size == len(learned) == 256 + len(merges) + 1
    assert served.tokenizer.merges == learned.merges and not served.chat
    probe = "I shall not want, the lord"
    ids = served.tokenizer.encode(probe)
    assert ids == learned.encode(probe) and served.tokenizer.decode(ids) == probe
    assert len(ids) < len(probe.encode())  # the learned merges are used
    torch.testing.assert_close(
        served.model(torch.tensor([ids])), trained.model(torch.tensor([ids]))
    )
