"""Figures and explorations draw what they are given; their static HTML is self-contained."""

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from coursepkg.chapters import viz  # noqa: E402


def test_attention_heatmap_labels_and_shape_errors():
    w = torch.softmax(torch.randn(3, 5), dim=-1)
    ax = viz.attention_heatmap(w, list("abc"), list("vwxyz"), title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == list("vwxyz")
    assert ax.images[0].get_array().shape == (3, 5)
    plt.close("all")
    with pytest.raises(ValueError, match="keys has 2 labels"):
        viz.attention_heatmap(w, None, ["a", "b"])
    with pytest.raises(ValueError, match="2-D"):
        viz.attention_heatmap(torch.ones(2, 3, 4))


def test_head_grid_draws_one_map_per_head():
    fig = viz.head_grid(torch.rand(6, 4, 4), ncols=4, colorbar=False)
    assert sum(1 for ax in fig.axes if ax.images) == 6
    assert len(fig.axes) == 8  # 2 rows of 4, the last two blank, and no colour bar
    plt.close(fig)


def test_head_grid_shares_one_colour_bar():
    w = torch.softmax(torch.randn(3, 5, 5), dim=-1)
    w[1] = torch.eye(5)  # one head with weight 1: the top of the shared scale
    fig = viz.head_grid(w, ncols=3)
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 3
    assert {ax.images[0].get_clim() for ax in maps} == {(0.0, 1.0)}  # same scale for all
    bars = [ax for ax in fig.axes if ax not in maps and ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and bars[0].get_ylabel() == "attention weight"
    plt.close(fig)


def _render(k, label="x"):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot(range(k))
    ax.set_title(f"{label}{k}")
    return fig


def test_explore_prerenders_every_combination_without_external_urls():
    e = viz.explore(_render, title="demo", k=[1, 2, 3], label=["a", "b"])
    frames = e.frames()
    assert sorted(frames) == [f"{i},{j}" for i in range(3) for j in range(2)]
    assert len(set(frames.values())) == 6  # each frame really differs
    page = e.static_html()
    assert page.count('type="range"') == 2
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    bundle = e._repr_mimebundle_()
    assert "text/html" in bundle and "text/plain" in bundle


def test_explore_rejects_bad_controls():
    with pytest.raises(ValueError, match="at least one control"):
        viz.explore(_render)
    with pytest.raises(ValueError, match="at most"):
        viz.explore(_render, k=list(range(100)))
    with pytest.raises(ValueError, match="not one of"):
        viz.explore(_render, k=[1, 2], defaults={"k": 5})
