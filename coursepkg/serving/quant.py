"""Weight-only quantization of a model's linear layers: int8 with one scale per output channel
(symmetric), and int4 with one scale per group of input columns, two values packed per byte.

A weight row w is stored as integers round(w / s) clipped to [-Q, Q] (Q = 127 for int8, 7 for
int4) and the scale s = max|w| / Q of its row (int8) or of each group of ``group_size`` columns
(int4: smaller groups follow the weights more closely, at a scale per group). Each element's
error is then at most s / 2. Activations stay in floating point: :class:`QuantLinear`
dequantises its weight at every call, so the model's linear weights are nearly 4x (int8) or,
with float32 scales per 32 columns, 6.4x (int4) smaller (:func:`weight_bytes`), but on a CPU
without int8 kernels it is not faster (dequantising costs time): memory, not speed, is what
this buys here. Code that reads ``layer.weight`` (attention's stacked projections while
generating) gets the dequantized float weight, and a generation keeps that stacked float copy
for its duration.

Activation-aware int4 (AWQ, Lin et al., 2024): before rounding, multiply weight column j by a
scale s_j > 1 where the calibration inputs x_j are large and by s_j < 1 where they are small, and
divide by s_j again after (:class:`AWQLinear`). The columns that meet large inputs then get finer
steps, at the cost of coarser ones where an error is multiplied by small inputs anyway;
:func:`awq_scales` searches s = mean|x|^alpha over alpha for the least output error.

Dimension legend: O output features, I input features, G groups per row (I / group_size),
N calibration rows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .cache import CroppableCache, CroppableLayerCache

__all__ = [
    "AWQLinear",
    "Int8Cache",
    "Int8LayerCache",
    "QuantLinear",
    "awq_scales",
    "calibration_inputs",
    "quantize_linears",
    "quantize_linears_awq",
    "quantized_weight_bytes",
    "round_to_nearest",
    "weight_bytes",
]


class QuantLinear(nn.Module):
    """A linear layer whose weight is held as int8 or packed int4 codes and float scales.

    Args:
        linear: the layer to quantize (its bias is kept in floating point).
        bits: 8 (per output channel) or 4 (per group of ``group_size`` input columns).
        group_size: int4's group width; must divide the input features.

    Buffers ``codes`` (O, I) int8, or (O, I / 2) uint8 holding two int4 codes per byte;
    ``scales`` (O, 1) or (O, G) in the weight's dtype.
    """

    def __init__(self, linear: nn.Linear, bits: int = 8, group_size: int = 32) -> None:
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 8 or 4, got {bits!r}")
        w = linear.weight.detach()  # (O, I)
        o, i = w.shape
        if bits == 4 and (
            isinstance(group_size, bool)
            or not isinstance(group_size, int)
            or group_size < 2
            or i % group_size
            or group_size % 2
        ):
            raise ValueError(
                f"group_size must be an even integer dividing in_features={i}, got {group_size!r}"
            )
        self.bits, self.in_features, self.out_features = bits, i, o
        self.group_size = i if bits == 8 else group_size
        q = 127 if bits == 8 else 7
        groups = w.view(o, i // self.group_size, self.group_size)  # (O, G, I/G)
        scales = groups.abs().amax(-1).clamp(min=1e-12) / q  # (O, G)
        codes = (groups / scales[..., None]).round().clamp(-q, q).to(torch.int8).view(o, i)
        if bits == 4:  # two codes per byte: low nibble the even column, high nibble the odd
            nibbles = (codes + 8).to(torch.uint8)  # (O, I) in [1, 15]
            codes = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)  # (O, I/2)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def dequantized(self) -> Tensor:
        """The weight the codes stand for.

        Shape:
            -> (O, I) in the scales' dtype.
        """
        codes = self.codes
        if self.bits == 4:  # unpack: low nibble the even column, high the odd
            low = (codes & 0xF).to(torch.int8) - 8  # (O, I/2)
            high = (codes >> 4).to(torch.int8) - 8  # (O, I/2)
            codes = torch.stack([low, high], dim=-1).view(self.out_features, self.in_features)
        o, g = self.scales.shape
        groups = codes.view(o, g, self.group_size).to(self.scales.dtype)  # (O, G, I/G)
        return (groups * self.scales[..., None]).view(o, self.in_features)  # (O, I)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight, for code that reads ``layer.weight`` (stacked projections)."""
        return self.dequantized()

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (*, I) -> (*, O)."""
        return F.linear(x, self.dequantized(), self.bias)


class AWQLinear(QuantLinear):
    """A :class:`QuantLinear` of ``W diag(s)`` that divides by ``s`` again: activation-aware
    scaling (AWQ; Lin et al., 2024). The weight it stands for is ``Q(W diag(s)) diag(s)^-1``.

    Args:
        linear: the layer to quantize.
        input_scales: s, one positive scale per input feature (:func:`awq_scales`).
        bits: 4 (or 8).
        group_size: the group width.

    Shape:
        input_scales (I,); buffers as :class:`QuantLinear`'s, plus ``input_scales`` (I,).
    """

    def __init__(
        self, linear: nn.Linear, input_scales: Tensor, bits: int = 4, group_size: int = 32
    ) -> None:
        w = linear.weight.detach()  # (O, I)
        if input_scales.shape != (w.size(1),) or not bool((input_scales > 0).all()):
            raise ValueError(
                f"input_scales must hold in_features={w.size(1)} positive values, got shape "
                f"{tuple(input_scales.shape)} with minimum {input_scales.min().item():.3g}"
            )
        s = input_scales.detach().to(w.dtype)
        super().__init__(SimpleNamespace(weight=w * s, bias=linear.bias), bits, group_size)
        self.register_buffer("input_scales", s.clone())

    def dequantized(self) -> Tensor:
        """Shape: -> (O, I), the scaled weight's codes divided by the scales again."""
        return super().dequantized() / self.input_scales


def round_to_nearest(weight: Tensor, bits: int = 4, group_size: int = 32) -> Tensor:
    """The weight :class:`QuantLinear` holds, as floats: each group rounded to its scale's grid.

    Shape:
        weight (O, I) -> (O, I).
    """
    return QuantLinear(SimpleNamespace(weight=weight, bias=None), bits, group_size).dequantized()


def awq_scales(
    weight: Tensor, x: Tensor, bits: int = 4, group_size: int = 32, grid: int = 20
) -> Tensor:
    """AWQ's per-input-channel scales: ``s = m^alpha`` with ``m`` the mean |x| of each input
    feature, normalised so that sqrt(max s * min s) = 1, for the alpha in {0, 1/grid, ...,
    (grid-1)/grid} whose weight ``Q(W diag(s)) diag(s)^-1`` gives the least mean squared output
    error on ``x``. Alpha 0 is plain round-to-nearest (s = 1), so the search never does worse
    on ``x``.

    Args:
        weight: the float weight W.
        x: calibration inputs of the layer.
        bits: 4 (or 8).
        group_size: the group width.
        grid: how many alphas to try.

    Shape:
        weight (O, I), x (N, I) -> (I,).
    """
    if x.dim() != 2 or x.size(1) != weight.size(1):
        raise ValueError(
            f"x must be (N, I={weight.size(1)}) calibration inputs, got {tuple(x.shape)}"
        )
    weight, x = weight.detach(), x.detach().to(weight.dtype)
    m = x.abs().mean(0).clamp(min=1e-8)  # (I,)
    reference = x @ weight.T  # (N, O)
    best, best_error = torch.ones_like(m), float("inf")
    for alpha in (k / grid for k in range(grid)):
        s = m.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # (I,)
        w = round_to_nearest(weight * s, bits, group_size) / s  # (O, I)
        error = (x @ w.T - reference).pow(2).mean().item()
        if error < best_error:
            best, best_error = s, error
    return best


def quantize_linears_awq(
    model: nn.Module, calibration: Tensor, bits: int = 4, group_size: int = 32, grid: int = 20
) -> nn.Module:
    """:func:`quantize_linears` with activation-aware scales: run ``model`` on ``calibration``,
    record each linear layer's inputs, and replace it by an :class:`AWQLinear` whose scales
    :func:`awq_scales` searched on them.

    Args:
        model: a model with float ``nn.Linear`` s inside ``model.layers``.
        calibration: ids the model reads (a few windows of ordinary text).
        bits: 4 (or 8).
        group_size: the group width.
        grid: how many alphas :func:`awq_scales` tries.

    Shape:
        calibration (B, L).

    Returns:
        ``model``, for chaining.
    """
    targets = _linears(model)
    inputs = calibration_inputs(model, calibration)
    for (parent, name, child), x in zip(targets, inputs, strict=True):
        s = awq_scales(child.weight, x, bits, group_size, grid)
        setattr(parent, name, AWQLinear(child, s, bits, group_size))
    return model


def calibration_inputs(model: nn.Module, calibration: Tensor) -> list[Tensor]:
    """The inputs each ``nn.Linear`` inside ``model.layers`` receives while ``model`` reads
    ``calibration``: what :func:`awq_scales` weighs the channels by.

    Args:
        model: a model with float ``nn.Linear`` s inside ``model.layers``.
        calibration: ids the model reads.

    Shape:
        calibration (B, L) -> a list, in the order of the layers' modules, of (B*L, I) tensors.

    Raises:
        RuntimeError: naming a linear layer the model never called.
    """
    targets = _linears(model)
    recorders = [_Recorder(child) for _, _, child in targets]
    for (parent, name, _), recorder in zip(targets, recorders, strict=True):
        setattr(parent, name, recorder)
    try:
        with torch.inference_mode():
            model(calibration)
    finally:
        for parent, name, child in targets:
            setattr(parent, name, child)
    for (_, name, child), recorder in zip(targets, recorders, strict=True):
        if recorder.inputs is None:
            raise RuntimeError(f"calibration never called {name} ({child}): no inputs to scale by")
    return [recorder.inputs for recorder in recorders]


def quantize_linears(model: nn.Module, bits: int = 8, group_size: int = 32) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` inside ``model.layers`` by a :class:`QuantLinear`
    (the embeddings and the output head, often tied to them, stay in floating point).

    Returns:
        ``model``, for chaining.
    """
    for parent, name, child in _linears(model):
        setattr(parent, name, QuantLinear(child, bits, group_size))
    return model


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute name, layer) of every ``nn.Linear`` inside ``model.layers``."""
    return [
        (parent, name, child)
        for layer in model.layers
        for parent in layer.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]


class _Recorder(nn.Module):
    """Calls ``linear`` and keeps its last input. A wrapper, not a hook: the attention's fused
    routes read a plain ``nn.Linear``'s weight without calling it, and call a wrapped one."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear, self.inputs = linear, None

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (*, I) -> (*, O)."""
        self.inputs = x.flatten(0, -2)  # (N, I)
        return self.linear(x)


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by the linear layers' weights inside ``model.layers``: a float weight's
    elements, or a :class:`QuantLinear`'s codes and scales (and an :class:`AWQLinear`'s input
    scales; biases not counted)."""
    total = 0
    for layer in model.layers:
        for module in layer.modules():
            if isinstance(module, QuantLinear):
                total += sum(t.numel() * t.element_size() for t in module.buffers())
            elif isinstance(module, nn.Linear):
                total += module.weight.numel() * module.weight.element_size()
    return total


def quantized_weight_bytes(model: nn.Module, bits: int | None, group_size: int = 32) -> int:
    """The closed form of :func:`weight_bytes` after ``quantize_linears(model, bits,
    group_size)``, from the float model's shapes: an (O, I) weight of e-byte floats holds
    O I e bytes; as int8, O I codes and O scales, O I + O e; as int4, O I / 2 bytes of packed
    codes and O I / group_size scales, O I / 2 + O (I / group_size) e.

    Args:
        model: a model whose layers hold float ``nn.Linear`` s.
        bits: None (the float weights), 8 or 4.
        group_size: int4's group width.
    """
    if bits not in (None, 4, 8):
        raise ValueError(f"bits must be None, 8 or 4, got {bits!r}")
    total = 0
    for layer in model.layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                (o, i), e = module.weight.shape, module.weight.element_size()
                if bits is None:
                    total += o * i * e
                elif bits == 8:
                    total += o * i + o * e
                else:
                    total += o * i // 2 + o * (i // group_size) * e
    return total


class Int8LayerCache(CroppableLayerCache):
    """One layer's keys and values stored as int8 codes, with one float scale per position and
    head (symmetric: the scale is that vector's max |x| / 127): about 4x less memory than fp32,
    dequantized when attention reads them.

    Storage: ((key codes (B, H, capacity, Dk) int8, key scales (B, H, capacity, 1)), the same
    for values).
    """

    def _allocate(self, k: Tensor, v: Tensor) -> tuple:
        b, h = k.shape[:2]
        return tuple(
            (
                x.new_empty(b, h, self.capacity, x.size(3), dtype=torch.int8),  # codes
                x.new_empty(b, h, self.capacity, 1),  # scales
            )
            for x in (k, v)
        )

    def _store(self, start: int, k: Tensor, v: Tensor) -> None:
        # quantize: update() then returns all held so far, dequantized (_views)
        for (codes, scales), new in zip(self.storage, (k, v), strict=True):
            n = new.size(2)
            scale = new.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127  # (B, H, n, 1)
            codes.narrow(2, start, n).copy_((new / scale).round().clamp(-127, 127))
            scales.narrow(2, start, n).copy_(scale)

    def _views(self) -> None:
        n = self.length
        self.k, self.v = (
            codes.narrow(2, 0, n).to(scales.dtype) * scales.narrow(2, 0, n)  # (B, H, S, D*)
            for codes, scales in self.storage
        )


class Int8Cache(CroppableCache):
    """A :class:`~coursepkg.serving.cache.CroppableCache` whose layers hold int8 keys/values."""

    layer_cache = Int8LayerCache
