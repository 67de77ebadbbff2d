"""The cache protocol (issue 61): every cache class implements
:class:`~coursepkg.kv_cache.LayerCache`; the keys a cache says a step will see
(``keys_after``) are the keys its ``update`` returns, for every cache and step size; and
attention reads caches through the protocol only (no type checks, no flags)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

import coursepkg
from coursepkg import kv_cache, mla
from coursepkg.grading.framework import modern_blocks
from coursepkg.kv_cache import AttentionCache, LayerCache, SlidingWindowCache
from coursepkg.serving import cache as serving_cache
from coursepkg.serving import paged, quant

PACKAGE = Path(coursepkg.__file__).parent
MODULES = (kv_cache, mla, serving_cache, paged, quant, modern_blocks)


def test_every_cache_class_implements_the_protocol() -> None:
    caches = [
        cls
        for module in MODULES
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and "Cache" in cls.__name__ and hasattr(cls, "update")
    ]
    caches.append(type(paged.PagedKVCache(1, 2, 4).self_attn[0]))  # a layer's view of the pool
    assert len(caches) >= 7
    assert [c.__name__ for c in caches if not issubclass(c, LayerCache)] == []


@pytest.mark.parametrize(
    "make",
    [
        AttentionCache,
        lambda: AttentionCache(capacity=9),
        lambda: AttentionCache(static=True),
        lambda: SlidingWindowCache(3),
        lambda: serving_cache.CroppableLayerCache(9),
        lambda: quant.Int8LayerCache(9),
    ],
    ids=["growing", "preallocated", "static", "window", "croppable", "int8"],
)
@pytest.mark.parametrize("steps", [(1, 1, 1), (4, 1, 2), (2, 3)])
def test_keys_after_counts_the_keys_update_returns(make, steps) -> None:
    cache = make()
    static = isinstance(cache, AttentionCache) and cache.static
    if static:  # cross-attention's: the same memory at every step
        steps = (steps[0],) * len(steps)
    assert cache.fixed_kv() is None  # nothing held yet
    for n in steps:
        expected = cache.keys_after(n)
        k, v = cache.update(torch.randn(2, 2, n, 4), torch.randn(2, 2, n, 3))
        assert k.size(2) == v.size(2) == expected
    fixed = cache.fixed_kv()
    if static:  # cross-attention's, once filled
        assert fixed is not None and fixed[0] is cache.k and cache.keys_after(5) == steps[-1]
    else:
        assert fixed is None


@pytest.mark.parametrize(
    "make",
    [
        lambda c: AttentionCache(capacity=c),
        serving_cache.CroppableLayerCache,
        quant.Int8LayerCache,
    ],
    ids=["preallocated", "croppable", "int8"],
)
@pytest.mark.parametrize("capacity, first", [(5, 5), (5, 2), (1, 1)])
def test_a_full_preallocated_cache_refuses_more_and_keeps_what_it_holds(
    make, capacity, first
) -> None:
    cache = make(capacity)
    k, v = cache.update(torch.randn(1, 2, first, 4), torch.randn(1, 2, first, 3))
    held = k.clone(), v.clone()
    extra = capacity - first + 1  # one position more than the room left
    with pytest.raises(ValueError, match=rf"capacity={capacity}.*{first} are cached.*{extra} more"):
        cache.update(torch.randn(1, 2, extra, 4), torch.randn(1, 2, extra, 3))
    assert cache.length == first
    torch.testing.assert_close((cache.k, cache.v), held)


@pytest.mark.parametrize("name", ["attention.py", "fast_attention.py"])
def test_attention_reads_caches_through_the_protocol_only(name) -> None:
    tree = ast.parse((PACKAGE / name).read_text())
    type_checks = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and "cache" in ast.unparse(node.args[0]).lower()
    ]
    flags = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "static"
    ]
    assert type_checks == [] and flags == []
