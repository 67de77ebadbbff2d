"""Figures and interactive explorations used by the book.

Two kinds of helpers live here:

* plotting functions (attention heatmaps, a grid of per-head maps, learning-rate curves) that
  draw on a given matplotlib ``Axes`` or make a new figure and return it;
* :func:`explore`, which turns a ``render(**params) -> Figure`` function into an exploration that
  works in two places: live in JupyterLab (ipywidgets controls re-run ``render``) and in the static
  HTML book, where no kernel exists, through frames rendered ahead of time and switched by a few
  lines of inline JavaScript. Nothing is fetched from the network in either case.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "Exploration",
    "attention_heatmap",
    "explore",
    "figure_to_png",
    "head_grid",
    "lr_curves",
]

# The static rendering embeds one PNG per combination of control values; past this many the page
# gets heavy, so `explore` refuses and asks for fewer values.
MAX_FRAMES = 64


def _as_matrix(weights: Tensor | Sequence, name: str) -> Tensor:
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (L, S) matrix; got shape {tuple(w.shape)}")
    return w


def attention_heatmap(
    weights: Tensor,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str = "viridis",
    colorbar: bool = True,
    vmax: float | None = None,
) -> Axes:
    """Draw one attention matrix: row i is how query i spreads its attention over the keys.

    Args:
        weights: attention probabilities, each row summing to 1 (or 0 for a fully masked row).
        queries: labels for the rows (e.g. target tokens); ``None`` numbers them.
        keys: labels for the columns (e.g. source tokens).
        ax: where to draw; a new figure is made when ``None``.
        title: the axes title.
        cmap: matplotlib colour map.
        colorbar: add a colour bar next to the matrix.
        vmax: the weight drawn in the brightest colour (default: the largest weight), so that
            several maps can share one colour scale.

    Shape:
        weights: (L, S)

    Returns:
        The axes drawn on.
    """
    w = _as_matrix(weights, "weights")  # (L, S)
    n_q, n_k = w.shape
    for name, labels, n in (("queries", queries, n_q), ("keys", keys, n_k)):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels but weights has {n} along that axis")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(3.0, 0.32 * n_k + 1.5), max(2.5, 0.32 * n_q + 1.0)))
    top = max(1e-9, float(w.max()) if vmax is None else vmax)
    image = ax.imshow(w.numpy(), cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
    if keys is not None:
        ax.set_xticks(range(n_k), [str(k) for k in keys], rotation=90)
    if queries is not None:
        ax.set_yticks(range(n_q), [str(q) for q in queries])
    ax.set_xlabel("key position (attended to)")
    ax.set_ylabel("query position")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def head_grid(
    weights: Tensor,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    ncols: int = 4,
    title: str | None = None,
    colorbar: bool = True,
) -> Figure:
    """One small heatmap per head, side by side, on one shared colour scale.

    Args:
        weights: per-head attention probabilities of one example.
        queries: row labels shared by every head.
        keys: column labels shared by every head.
        ncols: heads per row of the grid.
        title: the figure's title.
        colorbar: add one colour bar for the whole grid (every head uses its scale, from 0 to
            the largest weight of any head).

    Shape:
        weights: (H, L, S)

    Returns:
        The figure.
    """
    w = torch.as_tensor(weights).detach().float().cpu()
    if w.dim() != 3:
        raise ValueError(f"weights must be (H, L, S); got shape {tuple(w.shape)}")
    n_heads = w.shape[0]
    ncols = max(1, min(ncols, n_heads))
    nrows = -(-n_heads // ncols)
    size = 2.6 if keys is None else max(2.6, 0.22 * len(keys) + 1.2)
    top = max(1e-9, float(w.max()))  # one colour scale for every head
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows), squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= n_heads:
            ax.axis("off")
            continue
        attention_heatmap(w[h], queries, keys, ax=ax, title=f"head {h}", colorbar=False, vmax=top)
        if h % ncols:
            ax.set_ylabel("")
            ax.set_yticks([])
        if h < n_heads - ncols:
            ax.set_xlabel("")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if colorbar:
        drawn = [ax for ax in axes.flat if ax.images]
        bar = fig.colorbar(drawn[0].images[0], ax=list(axes.flat), fraction=0.025, pad=0.02)
        bar.set_label("attention weight")
    return fig


def lr_curves(
    curves: Mapping[str, Sequence[float]],
    ax: Axes | None = None,
    title: str = "learning rate",
    warmup_steps: int | None = None,
) -> Axes:
    """Plot learning-rate (or any per-step) curves against the step number (counted from 1).

    Args:
        curves: label -> values, one per step.
        ax: where to draw; new figure when ``None``.
        title: axes title.
        warmup_steps: if given, a dotted vertical line marks the end of warm-up.

    Returns:
        The axes drawn on.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, values in curves.items():
        ax.plot(range(1, len(values) + 1), list(values), label=label)
    if warmup_steps is not None:
        ax.axvline(warmup_steps, color="grey", linestyle=":", label=f"warm-up = {warmup_steps}")
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.legend()
    return ax


def figure_to_png(fig: Figure, dpi: int = 90) -> bytes:
    """Render a figure to PNG bytes and close it (so notebooks do not also show it)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


class Exploration:
    """A figure with controls, live in JupyterLab and pre-rendered for the static book.

    Made by :func:`explore`; display it as the last expression of a cell. Its output carries two
    representations: an ipywidgets view (JupyterLab shows it when a kernel is running) and an
    HTML fallback with the same controls driving frames rendered ahead of time (what the static
    book shows, since it has no kernel).
    """

    def __init__(
        self,
        render: Callable[..., Figure],
        controls: Mapping[str, Sequence[Any]],
        defaults: Mapping[str, Any],
        title: str,
        dpi: int,
    ) -> None:
        self.render = render
        self.controls = {name: list(values) for name, values in controls.items()}
        self.defaults = dict(defaults)
        self.title = title
        self.dpi = dpi
        self._frames: dict[str, str] | None = None

    def frames(self) -> dict[str, str]:
        """Every combination of control values as a base64 PNG, keyed by its index tuple."""
        if self._frames is None:
            frames = {}
            names = list(self.controls)
            for index in itertools.product(*(range(len(v)) for v in self.controls.values())):
                params = {n: self.controls[n][i] for n, i in zip(names, index, strict=True)}
                png = figure_to_png(self.render(**params), dpi=self.dpi)
                frames[",".join(map(str, index))] = base64.b64encode(png).decode("ascii")
            self._frames = frames
        return self._frames

    def static_html(self) -> str:
        """Controls and frames as self-contained HTML + inline JavaScript (no external scripts)."""
        frames = self.frames()
        uid = "explore-" + uuid.uuid4().hex[:10]
        names = list(self.controls)
        start = [self.controls[n].index(self.defaults[n]) for n in names]
        rows = []
        for k, name in enumerate(names):
            values = self.controls[name]
            rows.append(
                f'<label style="display:block;margin:2px 0">{html.escape(name)} = '
                f'<input type="range" min="0" max="{len(values) - 1}" step="1" value="{start[k]}"'
                f' data-control="{k}" aria-label="{html.escape(name)}"'
                ' style="vertical-align:middle">'
                f' <output data-value="{k}">{html.escape(str(values[start[k]]))}</output></label>'
            )
        labels = [[str(v) for v in self.controls[n]] for n in names]
        first = frames[",".join(map(str, start))]
        script = (
            "(function(){"
            f"var root=document.getElementById({json.dumps(uid)});"
            f"var frames={json.dumps(frames)};var labels={json.dumps(labels)};"
            "var inputs=root.querySelectorAll('input[data-control]');"
            "function update(){var idx=[];inputs.forEach(function(el,k){idx.push(el.value);"
            "root.querySelector('output[data-value=\"'+k+'\"]').textContent=labels[k][el.value];});"
            "root.querySelector('img').src='data:image/png;base64,'+frames[idx.join(',')];}"
            "inputs.forEach(function(el){el.addEventListener('input',update);});"
            "})();"
        )
        title = f"<strong>{html.escape(self.title)}</strong>" if self.title else ""
        return (
            f'<div id="{uid}" class="coursepkg-exploration" '
            'style="border:1px solid #ccc;border-radius:6px;padding:8px;max-width:100%">'
            f"{title}{''.join(rows)}"
            f'<img alt="{html.escape(self.title or "exploration")}" style="max-width:100%" '
            f'src="data:image/png;base64,{first}"/>'
            f'<div style="font-size:smaller;color:#666">Pre-rendered: {len(frames)} frames. '
            "Open this page as a notebook in JupyterLab to explore it live.</div>"
            f"<script>{script}</script></div>"
        )

    def widget(self):
        """The live version: ipywidgets controls that re-run ``render`` (needs a kernel)."""
        import ipywidgets as widgets

        out = widgets.Output()
        sliders = {
            name: widgets.SelectionSlider(
                options=values, value=self.defaults[name], description=name, continuous_update=False
            )
            for name, values in self.controls.items()
        }

        def redraw(_change=None) -> None:
            fig = self.render(**{n: s.value for n, s in sliders.items()})
            with out:
                out.clear_output(wait=True)
                from IPython.display import Image, display

                display(Image(figure_to_png(fig, dpi=self.dpi)))

        for slider in sliders.values():
            slider.observe(redraw, names="value")
        redraw()
        children = ([widgets.HTML(f"<b>{html.escape(self.title)}</b>")] if self.title else []) + [
            *sliders.values(),
            out,
        ]
        return widgets.VBox(children)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        bundle: dict[str, Any] = {
            "text/plain": f"<Exploration {self.title!r}: {len(self.frames())} pre-rendered frames>",
            "text/html": self.static_html(),
        }
        try:
            view = self.widget()._repr_mimebundle_()
        except Exception:  # no ipywidgets / no kernel comm: the HTML fallback is enough
            view = None
        if view:
            bundle.update({k: v for k, v in view.items() if k != "text/plain"})
        return bundle


def explore(
    render: Callable[..., Figure],
    title: str = "",
    dpi: int = 80,
    defaults: Mapping[str, Any] | None = None,
    **controls: Sequence[Any],
) -> Exploration:
    """Make an interactive exploration of ``render`` over the given control values.

    Example: ``explore(lambda temperature: plot_softmax(temperature), temperature=[0.25, 0.5, 1,
    2, 4])``. Each keyword names a control and lists the values it may take (keep the product of
    their lengths at most ``MAX_FRAMES``; the static book embeds one image per combination).

    Args:
        render: called with one value per control; returns a matplotlib figure (closed after
            rendering).
        title: shown above the controls.
        dpi: resolution of the pre-rendered frames.
        defaults: starting value per control (default: the middle value).
        **controls: control name -> the sequence of values it offers.

    Returns:
        An :class:`Exploration`; make it the last expression of a cell to display it.
    """
    if not controls:
        raise ValueError("explore needs at least one control, e.g. explore(render, k=[1, 2, 3])")
    for name, values in controls.items():
        if len(values) == 0:
            raise ValueError(f"control {name!r} has no values")
    n_frames = 1
    for values in controls.values():
        n_frames *= len(values)
    if n_frames > MAX_FRAMES:
        raise ValueError(
            f"explore would pre-render {n_frames} frames (the product of the controls' lengths); "
            f"at most {MAX_FRAMES} are allowed: offer fewer values"
        )
    chosen = {name: list(values)[len(values) // 2] for name, values in controls.items()}
    for name, value in (defaults or {}).items():
        if name not in controls:
            raise ValueError(f"defaults names {name!r}, which is not a control ({list(controls)})")
        if value not in list(controls[name]):
            raise ValueError(f"default {name}={value!r} is not one of {list(controls[name])}")
        chosen[name] = value
    return Exploration(render, controls, chosen, title, dpi)
