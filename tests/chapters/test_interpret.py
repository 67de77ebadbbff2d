"""The residual-stream reading of a decoder-only model, on small random models: the replay
equals the model, only attention moves information between positions, the logit lens ends at
the model's logits, and the feed-forward keys and values are what the FFN computes."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.chapters.interpret import (
    ffn_unit_activations,
    ffn_unit_promotes,
    logit_lens,
    mean_pairwise_cosine,
    residual_stream,
)


def _model(seed: int, **changes) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    options = dict(
        vocab_size=17,
        d_model=16,
        n_heads=2,
        d_ff=24,
        n_layers=2,
        dropout=0.0,
        max_len=32,
        norm_first=True,
        positional="learned",
        activation="gelu",
    )
    options.update(changes)
    model = DecoderOnlyLM(TransformerConfig(**options)).eval()
    with torch.no_grad():  # spread the weights so that every part matters
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


VARIANTS = [
    {},
    {"n_layers": 3, "activation": "relu"},
    {"positional": "sinusoidal", "tie_embeddings": False},
    {"bias": False, "n_heads": 4},
]


@pytest.mark.parametrize("changes", VARIANTS)
def test_the_replay_is_the_model(changes) -> None:
    model = _model(0, **changes)
    tokens = torch.randint(4, 17, (3, 11))
    stream = residual_stream(model, tokens)
    n = model.config.n_layers
    assert stream.states.shape == (1 + 2 * n, 3, 11, 16)
    assert stream.names[0] == "embedding" and stream.names[-1] == f"layer{n - 1}.ffn"
    assert_close(stream.logits, model(tokens))
    # the stream is the embedding plus the sum of the writes
    assert_close(stream.states[-1], stream.states[0] + stream.writes.sum(0))
    lens = logit_lens(model, stream)
    assert lens.shape == (1 + 2 * n, 3, 11, 17)
    assert_close(lens[-1], model(tokens))


def _influence(model: DecoderOnlyLM, tokens: torch.Tensor, skip=()) -> torch.Tensor:
    """[i, j] True when changing token j changes the final stream at position i."""
    base = residual_stream(model, tokens, skip).states[-1]  # (1, T, D)
    t = tokens.size(1)
    out = torch.zeros(t, t, dtype=torch.bool)
    for j in range(t):
        other = tokens.clone()
        other[0, j] = 4 + (int(other[0, j]) - 3) % 13  # another real token
        changed = residual_stream(model, other, skip).states[-1]
        out[:, j] = (changed - base).abs().amax(-1)[0] > 1e-6
    return out


def test_only_attention_moves_information_between_positions() -> None:
    model = _model(1)
    tokens = torch.randint(4, 17, (1, 9))
    causal = torch.ones(9, 9).tril().bool()
    assert torch.equal(_influence(model, tokens), causal)
    no_attention = ("layer0.attn", "layer1.attn")
    assert torch.equal(_influence(model, tokens, no_attention), torch.eye(9, dtype=torch.bool))
    skipped = residual_stream(model, tokens, no_attention)
    assert not skipped.writes[0].any() and not skipped.writes[2].any()
    assert skipped.writes[1].abs().sum() > 0


def test_ffn_keys_and_values_rebuild_the_ffn_write() -> None:
    model = _model(2)
    tokens = torch.randint(4, 17, (2, 7))
    stream = residual_stream(model, tokens)
    for layer in range(2):
        acts = ffn_unit_activations(model, stream, layer)  # (B, T, F)
        assert acts.shape == (2, 7, 24)
        ffn = model.layers[layer].ffn
        write = acts @ ffn.linear2.weight.T + ffn.linear2.bias  # sum of value vectors
        assert_close(write, stream.writes[stream.names.index(f"layer{layer}.ffn") - 1])
        promotes = ffn_unit_promotes(model, layer)  # (F, V)
        assert promotes.shape == (24, 17)
        # a unit's effect on the logits through the final norm's gain and the tied head
        unit = 5
        direction = ffn.linear2.weight[:, unit] * model.norm.weight
        assert_close(promotes[unit], model.embed.weight @ direction)


def test_bad_inputs_are_named() -> None:
    model = _model(3)
    tokens = torch.randint(4, 17, (1, 5))
    with pytest.raises(ValueError, match="skip names unknown sublayers"):
        residual_stream(model, tokens, ("layer9.attn",))
    with pytest.raises(ValueError, match="layer must be in"):
        ffn_unit_promotes(model, 2)
    with pytest.raises(ValueError, match="pre-LN"):
        residual_stream(_model(3, norm_first=False), tokens)
    with pytest.raises(TypeError, match="DecoderOnlyLM"):
        residual_stream(torch.nn.Linear(2, 2), tokens)
    with pytest.raises(ValueError, match="n >= 2"):
        mean_pairwise_cosine(torch.ones(1, 4))


def test_mean_pairwise_cosine() -> None:
    assert mean_pairwise_cosine(torch.ones(4, 3)) == pytest.approx(1.0)
    assert mean_pairwise_cosine(torch.eye(3)) == pytest.approx(0.0)
    v = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert mean_pairwise_cosine(v) == pytest.approx(-1.0)
