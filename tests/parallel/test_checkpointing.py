"""Activation checkpointing of the reference's blocks: the same loss and gradients (dropout
included: the random state is replayed), and only each block's input held for backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coursepkg import DecoderOnlyLM, TransformerConfig
from coursepkg.parallel.checkpointing import checkpoint_blocks, saved_bytes

CONFIGS = {
    "gpt": dict(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=3, max_len=16),
    "llama": dict(
        vocab_size=13,
        d_model=16,
        n_heads=4,
        n_kv_heads=2,
        d_ff=24,
        n_layers=2,
        max_len=16,
        positional="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        norm_first=True,
    ),
}


def _model(name: str, dropout: float) -> DecoderOnlyLM:
    torch.manual_seed(0)
    return DecoderOnlyLM(TransformerConfig(**CONFIGS[name], dropout=dropout)).train()


def _loss(model, tokens):
    logits = model(tokens[:, :-1])  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_checkpointed_blocks_give_the_same_loss_and_gradients(name, dropout):
    tokens = torch.randint(13, (3, 9), generator=torch.Generator().manual_seed(1))
    plain, checkpointed = _model(name, dropout), checkpoint_blocks(_model(name, dropout))
    results = []
    for model in (plain, checkpointed):
        torch.manual_seed(2)  # the same dropout masks, if the recomputation replays them
        loss = _loss(model, tokens)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=0)
    assert grads_a.keys() == grads_b.keys()
    for n in grads_a:
        torch.testing.assert_close(grads_b[n], grads_a[n], rtol=1e-6, atol=1e-7)


def test_only_each_blocks_input_is_held_for_backward():
    """Through the blocks alone: checkpointed, backward keeps n_layers inputs of (B, L, D)
    float32 and nothing else; plain, many times that."""
    b, n, d = 3, 8, CONFIGS["gpt"]["d_model"]
    x = torch.randn(b, n, d, requires_grad=True)

    def through(model):
        def run():
            h = x
            for layer in model.layers:
                h = layer(h, None)  # (B, L, D)
            return h.sum()

        return run

    plain, checkpointed = _model("gpt", 0.0), checkpoint_blocks(_model("gpt", 0.0))
    held = saved_bytes(checkpointed, through(checkpointed))
    assert held == CONFIGS["gpt"]["n_layers"] * b * n * d * 4
    assert saved_bytes(plain, through(plain)) > 5 * held


def test_checkpointing_leaves_names_and_inference_alone():
    model = _model("gpt", 0.0).eval()
    names = [n for n, _ in model.named_parameters()]
    tokens = torch.randint(13, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(tokens)
        checkpoint_blocks(model)
        after = model(tokens)
    assert [n for n, _ in model.named_parameters()] == names
    torch.testing.assert_close(after, before, rtol=0, atol=0)
