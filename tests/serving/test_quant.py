"""Weight-only quantization and the int8 KV cache (issue 50, item 3). Weights: each element's
error within half its scale (int8 per output channel, int4 per group, packing included); the
bytes held equal the closed form, nearly 4x (int8) / 6.4x (int4, groups of 32) fewer than
fp32's; the quantized model's logits stay close and the cached generation still runs. The int8
cache holds Hkv (Dk + 4) bytes per position, layer and keys-or-values (fp32: 4 Hkv Dk), each
element within half its scale. Bad arguments named."""

from __future__ import annotations

import pytest
import torch
from serving_models import V, llama_pair
from torch import nn

from coursepkg.serving import generate
from coursepkg.serving.cache import CroppableCache
from coursepkg.serving.quant import (
    AWQLinear,
    Int8Cache,
    QuantLinear,
    awq_scales,
    calibration_inputs,
    quantize_linears,
    quantize_linears_awq,
    round_to_nearest,
    weight_bytes,
)


@pytest.mark.parametrize("bits, group", [(8, 32), (4, 8), (4, 32)])
def test_each_error_is_within_half_a_scale(bits, group):
    lin = nn.Linear(64, 24)
    q = QuantLinear(lin, bits, group)
    w, back = lin.weight.detach(), q.dequantized()
    scale = q.scales.repeat_interleave(q.group_size, dim=1)  # (O, I)
    assert ((w - back).abs() <= scale / 2 + 1e-7).all()
    x = torch.randn(5, 64)
    torch.testing.assert_close(q(x), torch.nn.functional.linear(x, back, lin.bias))


def test_int4_packing_round_trips_every_code():
    lin = nn.Linear(16, 15, bias=False)
    with torch.no_grad():  # rows whose values are exactly the 15 codes -7..7 times 0.5
        lin.weight.copy_(torch.arange(-7, 9).roll(1).repeat(15, 1).float()[:, :16].clamp(-7, 7))
        lin.weight.mul_(0.5)
    q = QuantLinear(lin, bits=4, group_size=16)
    assert q.codes.dtype == torch.uint8 and q.codes.shape == (15, 8)
    assert torch.equal(q.dequantized(), lin.weight.detach())


def _closed_form(model, bits, group):
    total = 0
    for layer in model.layers:
        for m in layer.modules():
            if isinstance(m, nn.Linear):
                o, i = m.weight.shape
                total += o * i + 4 * o if bits == 8 else o * i // 2 + 4 * o * (i // group)
    return total


# fp32 holds 4 bytes an element; int8 1 and a 4-byte scale a row (I = 64: 3.76x); int4 half a
# byte and a 4-byte scale per 32 columns (6.4x)
@pytest.mark.parametrize("bits, group, smaller", [(8, 32, 3.7), (4, 32, 6.0)])
def test_bytes_equal_the_closed_form(bits, group, smaller):
    _, lm = llama_pair(hidden_size=64, intermediate_size=128)
    before = weight_bytes(lm)
    expected = _closed_form(lm, bits, group)
    quantize_linears(lm, bits, group)
    assert weight_bytes(lm) == expected
    assert before / weight_bytes(lm) > smaller


def test_logits_stay_close_and_generation_runs():
    """Largest logit error over the logits' spread: int8 within 5%, int4 (groups of 16)
    within 50% and worse than int8."""
    _, lm = llama_pair(hidden_size=64, intermediate_size=128)
    tokens = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = lm(tokens)
    errors = {}
    for bits in (8, 4):
        _, q = llama_pair(hidden_size=64, intermediate_size=128)
        quantize_linears(q, bits, 16)
        with torch.no_grad():
            errors[bits] = float((q(tokens) - ref).abs().max() / ref.std())
        out = generate(q, tokens, 8)  # the cached path reads the dequantized stacked weights
        assert out.shape == (2, 20)
    assert errors[8] < 0.05 and errors[4] < 0.5 and errors[8] < errors[4], errors


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="bits"):
        QuantLinear(nn.Linear(8, 8), bits=3)
    with pytest.raises(ValueError, match="group_size"):
        QuantLinear(nn.Linear(12, 8), bits=4, group_size=8)


def _cached(lm, kind, tokens):
    cache = kind(lm.config.n_layers, tokens.size(1) + 1)
    with torch.no_grad():
        lm(tokens, cache=cache)
        step = lm(tokens[:, -1:], cache=cache)[:, -1]  # (B, V): one decode step after it
    return cache, step


def test_the_int8_cache_is_smaller_and_close():
    _, lm = llama_pair(hidden_size=64)  # Hkv = 2, Dk = 16, 2 layers
    tokens = torch.randint(1, V, (1, 15), generator=torch.Generator().manual_seed(0))
    full, ref = _cached(lm, CroppableCache, tokens)
    small, got = _cached(lm, Int8Cache, tokens)
    n = tokens.size(1) + 1  # positions held (the capacity, all used)
    per_token = [sum(c.bytes_held() for c in cache.self_attn) // n for cache in (full, small)]
    assert per_token == [2 * 2 * 2 * 16 * 4, 2 * 2 * 2 * (16 + 1 * 4)]  # layers, K/V, Hkv, D
    a, b = full.self_attn[0], small.self_attn[0]  # the first layer: the same inputs in both
    for exact, approx, (_, scales) in zip((a.k, a.v), (b.k, b.v), b.storage, strict=True):
        assert ((exact - approx).abs() <= scales[:, :, :n] / 2 + 1e-6).all()
    assert (got - ref).abs().max() / ref.std() < 0.05
    out = generate(lm, tokens, 6, int8_cache=True)
    assert out.shape == (1, 21)


def test_int8_weights_agree_with_torchao_within_one_step():
    """Ours against ``torchao``'s int8 weight-only (skipped where torchao is not installed).

    Both are symmetric with one scale per output channel, but torchao 0.18 uses codes in
    [-128, 127] and the scale max|w| / 127.5, ours [-127, 127] and max|w| / 127: the codes
    differ where the two roundings part. Each dequantised weight lies within half its own
    scale of w, so the two lie within (s + s') / 2 < s of each other, s our scale."""
    tq = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    lin = nn.Linear(64, 24)
    ours = QuantLinear(lin, 8)
    theirs = nn.Sequential(nn.Linear(64, 24))
    theirs[0].load_state_dict(lin.state_dict())
    tq.quantize_(theirs, tq.Int8WeightOnlyConfig())
    weight = theirs[0].weight
    assert weight.qdata.dtype == torch.int8 and weight.scale.shape == (24, 1)
    torch.testing.assert_close(weight.scale, ours.scales * 127 / 127.5)
    gap = (weight.dequantize() - ours.dequantized()).abs()  # (O, I)
    assert (gap <= ours.scales).all()
    assert 0 < float((weight.qdata != ours.codes).float().mean()) < 0.5  # they part, rarely
    x = torch.randn(5, 64)
    with torch.no_grad():
        bound = x.abs() @ ours.scales.expand(24, 64).t()  # (5, 24): |x| times one step per input
        assert ((theirs(x) - ours(x)).abs() <= bound + 1e-5).all()


# ------------------------------------------------------------------ activation-aware int4 (AWQ)
def _outlier_inputs(n=256, i=64, channels=(3, 40), factor=30.0):
    """Calibration inputs whose few channels are much larger than the rest, as LLMs' are."""
    x = torch.randn(n, i, generator=torch.Generator().manual_seed(1))
    x[:, list(channels)] *= factor
    return x


@pytest.mark.parametrize("group", [16, 64])
def test_awq_linear_is_the_scaled_weight_rounded_then_unscaled(group):
    lin = nn.Linear(64, 24)
    s = torch.rand(64, generator=torch.Generator().manual_seed(0)) + 0.25  # (I,)
    q = AWQLinear(lin, s, 4, group)
    w = lin.weight.detach()
    expected = round_to_nearest(w * s, 4, group) / s  # Q(W diag(s)) diag(s)^-1
    torch.testing.assert_close(q.dequantized(), expected)
    step = q.scales.repeat_interleave(group, dim=1) / s  # (O, I): each weight's grid step
    assert ((w - q.dequantized()).abs() <= step / 2 + 1e-6).all()
    plain = QuantLinear(lin, 4, group)
    torch.testing.assert_close(
        AWQLinear(lin, torch.ones(64), 4, group).dequantized(), plain.dequantized()
    )
    x = torch.randn(5, 64)
    torch.testing.assert_close(q(x), nn.functional.linear(x, expected, lin.bias))


def test_awq_scales_are_the_best_power_of_the_mean_input_on_the_grid():
    lin, x, grid = nn.Linear(64, 24), _outlier_inputs(), 10
    w = lin.weight.detach()
    s = awq_scales(w, x, 4, 32, grid)
    torch.testing.assert_close(s.max() * s.min(), torch.tensor(1.0))  # centred on 1
    m = x.abs().mean(0)

    def error(scales):
        return (x @ (round_to_nearest(w * scales, 4, 32) / scales).T - x @ w.T).pow(2).mean()

    candidates = [
        m.pow(k / grid) / (m.pow(k / grid).max() * m.pow(k / grid).min()).sqrt()
        for k in range(grid)
    ]
    errors = torch.stack([error(c) for c in candidates])
    chosen = int(errors.argmin())
    torch.testing.assert_close(s, candidates[chosen])
    assert error(s) <= error(torch.ones(64))  # alpha = 0 is plain round-to-nearest
    assert chosen > 0 and error(s) < 0.7 * error(torch.ones(64))  # outliers: scaling pays


def test_awq_model_beats_round_to_nearest_and_generates():
    _, lm = llama_pair(hidden_size=64, intermediate_size=128)
    tokens = torch.randint(1, V, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = lm(tokens)
    rtn, _ = llama_pair(hidden_size=64, intermediate_size=128)[1], None
    quantize_linears(rtn, 4, 32)
    awq = quantize_linears_awq(llama_pair(hidden_size=64, intermediate_size=128)[1], tokens, 4, 32)
    linears = [m for layer in awq.layers for m in layer.modules() if isinstance(m, QuantLinear)]
    assert linears and all(isinstance(m, AWQLinear) for m in linears)
    assert not any(isinstance(m, nn.Linear) for layer in awq.layers for m in layer.modules())
    with torch.no_grad():
        err = {
            name: float((m(tokens) - ref).pow(2).mean()) for name, m in (("rtn", rtn), ("awq", awq))
        }
    assert err["awq"] < err["rtn"], err
    extra = sum(4 * m.in_features for m in linears)  # one fp32 scale per input feature
    assert weight_bytes(awq) == weight_bytes(rtn) + extra
    assert generate(awq, tokens[:1], 4).shape == (1, 20)


def test_calibration_inputs_are_what_each_linear_receives_and_leave_the_model_as_it_was():
    _, lm = llama_pair(hidden_size=64, intermediate_size=128)
    tokens = torch.randint(1, V, (3, 40), generator=torch.Generator().manual_seed(2))  # 120 rows

    def linear_layers():
        return [m for layer in lm.layers for m in layer.modules() if isinstance(m, nn.Linear)]

    linears = linear_layers()
    with torch.no_grad():
        before = lm(tokens)
    inputs = calibration_inputs(lm, tokens)
    assert [x.shape for x in inputs] == [(120, m.in_features) for m in linears]
    # the model is unchanged: the same modules in place, the same outputs
    assert linear_layers() == linears
    with torch.no_grad():
        torch.testing.assert_close(lm(tokens), before)
    # the first layer's query, key and value projections read the same normalised input
    q, k, v = inputs[:3]
    torch.testing.assert_close(q, k)
    torch.testing.assert_close(q, v)
    # the feed-forward's output layer got what the feed-forward, given its recorded input, gives it
    ffn = lm.layers[0].ffn
    x = inputs[linears.index(ffn.linear1)]  # (120, D)
    seen = []
    hook = ffn.linear2.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            ffn(x)
    finally:
        hook.remove()
    torch.testing.assert_close(inputs[linears.index(ffn.linear2)], seen[0].flatten(0, -2))


def test_calibration_inputs_name_a_linear_the_model_never_calls():
    _, lm = llama_pair(hidden_size=64, intermediate_size=128)
    lm.layers[1].unused = nn.Linear(64, 8)
    with pytest.raises(RuntimeError, match="calibration never called unused"):
        calibration_inputs(lm, torch.randint(1, V, (2, 8)))
    assert isinstance(lm.layers[1].unused, nn.Linear)  # put back


def test_awq_bad_arguments_are_named():
    with pytest.raises(ValueError, match="input_scales must hold in_features=8 positive"):
        AWQLinear(nn.Linear(8, 4), torch.ones(7), 4, 8)
    with pytest.raises(ValueError, match="input_scales must hold in_features=8 positive"):
        AWQLinear(nn.Linear(8, 4), torch.zeros(8), 4, 8)
    with pytest.raises(ValueError, match=r"x must be \(N, I=8\) calibration inputs, got \(3, 5\)"):
        awq_scales(torch.randn(4, 8), torch.randn(3, 5))
