"""What a student's LayerNorm divides by, read from the module itself: the variance (biased or
not), where eps goes (inside the square root, added to the standard deviation, or nowhere) and
the default eps. Shared by the LayerNorm check and by every layer check whose layer holds
LayerNorms (the encoder and decoder layers name a wrong norm's mistake with it).

Dimension legend: D d_model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .results import BugVariant
from .weights import clone_module

__all__ = ["analyse_norm", "combined"]


def _norm_denominators(module: nn.Module, d: int) -> tuple[float, float] | None:
    """What the student's LayerNorm (gain 1, shift 0) divides two centred rows by: one of
    biased variance 1 and one of 1e-4 (where eps matters). None when that cannot be read."""
    z = torch.linspace(-1.0, 1.0, d, dtype=torch.float64) ** 3  # (D,)
    z = (z - z.mean()) / z.var(unbiased=False).sqrt()  # mean 0, biased variance 1
    x = torch.stack([z + 0.3, 0.01 * z + 0.3])[None]  # (1, 2, D)
    try:
        probe = clone_module(module).double()
        with torch.no_grad():
            params = dict(probe.named_parameters())
            params["weight"].fill_(1.0)
            params["bias"].fill_(0.0)
            y = probe(x)  # (1, 2, D)
    except Exception:  # noqa: BLE001 - a module that cannot be probed is judged by numbers
        return None
    if not isinstance(y, Tensor) or y.shape != x.shape or not bool(torch.isfinite(y).all()):
        return None
    c = x - x.mean(-1, keepdim=True)  # (1, 2, D)
    dens = (c * c).sum(-1) / (c * y).sum(-1)  # (1, 2)
    return float(dens[0, 0]), float(dens[0, 1])


def analyse_norm(module: nn.Module, d: int, bugs: Sequence[BugVariant]) -> list[BugVariant]:
    """Name each LayerNorm mistake of the student's module by rerunning its class with a
    controlled eps: the variance (biased or not), where eps goes (inside the square root,
    added to the standard deviation, or nowhere) and the default eps. Several at once are all
    named.

    Args:
        module: a student's LayerNorm (its class is built again as ``cls(d, eps=0.5)`` and
            ``cls(d)``; the module itself is not changed).
        d: d_model.
        bugs: LayerNorm's catalogue (``check_layer_norm``'s), where the mistakes found are
            looked up by id (``ln.unbiased_variance``, ``ln.eps_outside_sqrt``,
            ``ln.eps_ignored``, ``ln.default_eps``).

    Returns:
        The catalogued mistakes found, in a fixed order; an empty list when none of these
        explains the output (other mistakes, such as the wrong axis, are then matched against
        the catalogue).
    """
    if d < 2:
        return []
    by_id = {bug.id: bug for bug in bugs}
    cls = type(module)
    try:
        big = cls(d, eps=0.5)
        plain = cls(d)
    except Exception:  # noqa: BLE001 - not constructible the stub's way: nothing to say
        return []
    measured = _norm_denominators(big, d)
    if measured is None:
        return []
    found = None
    for unbiased in (False, True):
        for mode in ("inside", "outside", "none"):
            expected = [
                _denominator(var * (d / (d - 1) if unbiased else 1.0), 0.5, mode)
                for var in (1.0, 1e-4)
            ]
            if all(abs(m - e) <= 1e-3 * e for m, e in zip(measured, expected, strict=True)):
                found = (unbiased, mode)
    if found is None:
        return []
    unbiased, mode = found
    bugs = []
    if unbiased:
        bugs.append(by_id["ln.unbiased_variance"])
    if mode == "outside":
        bugs.append(by_id["ln.eps_outside_sqrt"])
    if mode == "none":
        bugs.append(by_id["ln.eps_ignored"])
    else:
        default = _norm_denominators(plain, d)
        if default is not None:
            var = 1e-4 * (d / (d - 1) if unbiased else 1.0)
            eps = default[1] ** 2 - var if mode == "inside" else default[1] - var**0.5
            if abs(eps - 1e-5) > 2e-6:
                bugs.append(by_id["ln.default_eps"])
    return bugs


def _denominator(var: float, eps: float, mode: str) -> float:
    if mode == "inside":
        return (var + eps) ** 0.5
    if mode == "outside":
        return var**0.5 + eps
    return var**0.5


def combined(bugs: Sequence[BugVariant]) -> BugVariant | None:
    """One known mistake, or several at once as a single entry naming each (its id is the
    first one's)."""
    if len(bugs) <= 1:
        return bugs[0] if bugs else None
    first = bugs[0]
    return BugVariant(
        first.id,
        first.item,
        "several at once: " + "; and ".join(b.description.rstrip(".") for b in bugs),
        " ".join(b.advice for b in bugs),
        first.impl,
    )
