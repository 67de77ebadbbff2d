"""The architecture diagrams draw, carry the book's shape letters, and use only plain glyphs."""

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from coursepkg import diagrams  # noqa: E402


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]


@pytest.mark.parametrize(
    ("draw", "expected"),
    [
        (
            diagrams.encoder_decoder_diagram,
            [
                "(B, S) ids",
                "(B, S, D)",
                "(B, L, D)",
                "(B, L, V)",
                "N x encoder layer",
                "N x decoder layer",
                "memory",
                "K, V: (B, S, D)",
            ],
        ),
        (
            diagrams.multi_head_diagram,
            [
                "(B, L, D)",
                "(B, H, L, Dk)",
                "(B, H, S, Dk)",
                "weights (B, H, L, S)",
                "x WQ   (D x D)",
                "x WO   (D x D)",
            ],
        ),
    ],
)
def test_diagram_labels_and_rendering(draw, expected):
    fig = draw()
    texts = _texts(fig)
    for label in expected:
        assert label in texts, f"{label!r} missing from {draw.__name__}"
    # ASCII only: nothing that a font without the glyph would draw as a box or "?"
    assert all(t.isascii() for t in texts)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=40)
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close(fig)
