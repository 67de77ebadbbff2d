"""The diagrams draw, fit the book's column, use only plain glyphs, and show the structure they
stand for: as many boxes, squares and arrows as the idea has parts."""

import ast
import io
import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from coursepkg.chapters import diagrams  # noqa: E402
from coursepkg.chapters.diagrams.primitives import PALETTE  # noqa: E402


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


# ---- the conceptual diagrams: what is drawn matches the structure it stands for ----


CONCEPTUAL = [
    "additive_score_diagram",
    "attention_decoder_step_diagram",
    "attention_patterns_diagram",
    "attention_products_diagram",
    "beam_diagram",
    "bert_embeddings_diagram",
    "block_table_diagram",
    "bottleneck_diagram",
    "bpe_merge_tree_diagram",
    "bytes_diagram",
    "checkpoint_diagram",
    "ddp_diagram",
    "dense_vs_routed_diagram",
    "dpo_pair_diagram",
    "encoder_layer_diagram",
    "feed_forward_diagram",
    "ffn_memory_diagram",
    "flops_per_weight_diagram",
    "gpt_stack_diagram",
    "gqa_grouping_diagram",
    "grad_accumulation_diagram",
    "gradient_path_diagram",
    "greedy_trap_diagram",
    "head_parameters_diagram",
    "kv_cache_diagram",
    "label_smoothing_diagram",
    "latent_attention_diagram",
    "linear_attention_state_diagram",
    "logit_lens_diagram",
    "lora_diagram",
    "loss_mask_diagram",
    "lsh_bands_diagram",
    "masks_diagram",
    "memory_per_parameter_diagram",
    "mlm_corruption_diagram",
    "model_parallel_diagram",
    "moe_routing_diagram",
    "next_token_diagram",
    "norm_placement_diagram",
    "packed_mask_diagram",
    "parameter_map_diagram",
    "positional_clocks_diagram",
    "positions_enter_diagram",
    "pretokens_diagram",
    "qkv_lookup_diagram",
    "qkv_projection_diagram",
    "recurrence_diagram",
    "residual_stream_diagram",
    "ring_allreduce_diagram",
    "rope_rotation_diagram",
    "sharding_diagram",
    "shift_rotation_diagram",
    "shifted_targets_diagram",
    "sliding_window_diagram",
    "speculative_diagram",
    "split_heads_diagram",
    "teacher_forcing_diagram",
    "tiled_attention_diagram",
    "training_step_diagram",
    "weight_tying_diagram",
]


def _patches(fig, kind, colour=None):
    found = [p for ax in fig.axes for p in ax.patches if isinstance(p, kind)]
    if colour is not None:
        found = [p for p in found if to_hex(p.get_facecolor()) == to_hex(colour)]
    return found


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("name", CONCEPTUAL)
def test_conceptual_diagrams_fit_the_column_and_stay_readable(name, close_figures):
    """About 7 inches wide (the book's column), no text under 9 pt, plain ASCII, a PNG out."""
    fig = getattr(diagrams, name)()
    width, height = fig.get_size_inches()
    assert 6.5 <= width <= 7.5 and height <= 4.5, (name, width, height)
    texts = [t for ax in fig.axes for t in ax.texts]
    assert texts, name
    small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 9]
    assert not small, small
    assert all(t.isascii() for t in _texts(fig))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=40)
    assert buffer.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_diagram_is_exported():
    assert sorted(set(CONCEPTUAL) | {"encoder_decoder_diagram", "multi_head_diagram"}) == sorted(
        diagrams.__all__
    )


@pytest.mark.parametrize(("source_len", "target_len"), [(4, 3), (2, 5)])
def test_bottleneck_has_one_context_vector_and_attention_one_path_per_pair(
    source_len, target_len, close_figures
):
    recurrent = (source_len - 1) + (target_len - 1)
    inputs_outputs = source_len + target_len
    plain = diagrams.bottleneck_diagram(False, source_len, target_len)
    assert len(_patches(plain, FancyArrowPatch)) == recurrent + inputs_outputs + 2
    assert f"c = h{source_len}" in _texts(plain)
    paths = diagrams.bottleneck_diagram(True, source_len, target_len)
    blue = [a for a in _patches(paths, FancyArrowPatch) if to_hex(a.get_edgecolor()) == "#0072b2"]
    assert len(blue) == source_len * target_len
    assert f"c = h{source_len}" not in _texts(paths)


def test_lookup_weights_are_the_softmax_of_the_scores(close_figures):
    scores = (1.0, -1.0, 0.5)
    fig = diagrams.qkv_lookup_diagram(scores)
    bars = _patches(fig, Rectangle, PALETTE["blue"])
    widths = torch.tensor([b.get_width() for b in bars])
    assert len(bars) == len(scores)
    assert torch.allclose(widths / widths.sum(), torch.softmax(torch.tensor(scores), 0))


def test_clock_hands_turn_by_position_times_frequency(close_figures):
    positions, d_model = 5, 4
    fig = diagrams.positional_clocks_diagram(positions, d_model)
    hands = fig.axes[0].lines
    assert len(hands) == positions * d_model // 2
    for k, hand in enumerate(hands):
        i, p = divmod(k, positions)
        xs, ys = hand.get_data()
        angle = math.atan2(xs[1] - xs[0], ys[1] - ys[0]) % (2 * math.pi)
        assert angle == pytest.approx(p * 10000 ** (-2 * i / d_model) % (2 * math.pi), abs=1e-6)


def test_masks_fill_exactly_the_allowed_pairs(close_figures):
    s, t, pad = 5, 4, 2
    fig = diagrams.masks_diagram(s, t, pad)
    allowed = len(_patches(fig, Rectangle, PALETTE["blue"])) - 1  # less the legend's square
    assert allowed == s * (s - pad) + t * (t + 1) // 2 + t * (s - pad)


def test_teacher_forcing_feeds_back_each_guess_but_the_last(close_figures):
    fig = diagrams.teacher_forcing_diagram(length=5)
    dashed = [a for a in _patches(fig, FancyArrowPatch) if a.get_linestyle() == "--"]
    assert len(dashed) == 4
    assert "y4" in _texts(fig) and "y^4" in _texts(fig)


def test_beam_keeps_k_per_step_and_the_best_totals(close_figures):
    beam, steps, vocab = 3, 3, ("a", "b", "c", "d")
    history = diagrams.generation.beam_steps(beam, steps, vocab)
    for step, candidates in enumerate(history):
        assert len(candidates) == len(vocab) * (1 if step == 0 else beam)
        kept = sorted((s for *_, s, k in candidates if k), reverse=True)
        assert kept == sorted((s for *_, s, _ in candidates), reverse=True)[:beam]
    fig = diagrams.beam_diagram(beam, steps, vocab)
    assert len(_patches(fig, FancyBboxPatch, diagrams.generation.KEPT)) == 1 + beam * steps


def test_kv_cache_squares_grow_by_one_key_and_value_per_step(close_figures):
    steps = 5
    fig = diagrams.kv_cache_diagram(steps)
    new = _patches(fig, Rectangle, PALETTE["orange"])
    old = _patches(fig, Rectangle, "#cfe3f2")
    assert len(new) == 3 * steps  # a query, a key and a value per step
    assert len(old) == 2 * sum(range(steps))


def test_bert_sees_everything_and_gpt_the_past(close_figures):
    n = 5
    fig = diagrams.attention_patterns_diagram(tuple("abcde"))
    assert len(_patches(fig, Rectangle, PALETTE["blue"])) == n * n + n * (n + 1) // 2


def test_residual_stream_has_one_addition_per_sublayer(close_figures):
    fig = diagrams.residual_stream_diagram(layers=3)
    assert len(_patches(fig, Circle)) == 6
    assert sum(t.startswith("attention") for t in _texts(fig)) == 3


def test_bpe_tree_applies_the_merges_to_a_single_root(close_figures):
    merges = [("l", "o"), ("e", "r"), ("lo", "w"), ("low", "er")]
    fig = diagrams.bpe_merge_tree_diagram("lower", merges)
    texts = _texts(fig)
    assert {"lo", "er", "low", "lower"} <= set(texts)
    assert len(_patches(fig, FancyBboxPatch)) == len("lower") + len(merges)
    # a merge that never applies draws no node
    other = diagrams.bpe_merge_tree_diagram("lower", [*merges, ("x", "y")])
    assert len(_patches(other, FancyBboxPatch)) == len("lower") + len(merges)


def test_parameter_map_matches_the_counts(close_figures):
    from coursepkg import TransformerConfig
    from coursepkg.params import parameter_breakdown

    config = TransformerConfig.base()
    fig = diagrams.parameter_map_diagram(config)
    segments = _patches(fig, Rectangle)
    parts = {k: n for k, n in parameter_breakdown(config).items() if n}
    whole = segments[: len(parts)]
    total = sum(parts.values())
    for seg, n in zip(whole, parts.values(), strict=True):
        assert seg.get_width() == pytest.approx(14.0 * n / total)


def test_tiled_attention_draws_every_tile(close_figures):
    fig = diagrams.tiled_attention_diagram(blocks=5, row=2, done=3)
    assert len(_patches(fig, Rectangle)) == 25
    assert len(_patches(fig, Rectangle, PALETTE["sky"])) == 3


@pytest.mark.parametrize(("length", "window", "layers"), [(12, 3, 3), (10, 4, 2), (6, 3, 4)])
def test_sliding_window_reach_grows_by_w_minus_one_per_layer(length, window, layers, close_figures):
    reach = diagrams.scaling.receptive_field(length, window, layers)
    for depth, reached in enumerate(reach):
        assert int(reached.sum()) == min(length, 1 + depth * (window - 1))
    fig = diagrams.sliding_window_diagram(length, window, layers)
    filled = _patches(fig, Circle, PALETTE["vermillion"])
    assert len(filled) == sum(int(r.sum()) for r in reach)


def test_norm_placement_puts_the_norm_on_or_off_the_skip_path(close_figures):
    texts = _texts(diagrams.norm_placement_diagram())
    assert "post-norm: x = Norm(x + F(x))" in texts and "pre-norm: x = x + F(Norm(x))" in texts
    assert texts.count("LayerNorm") == 2 and texts.count("+") == 2


def test_rope_turns_each_vector_by_its_position(close_figures):
    m, n, omega = 4, 2, 0.3
    fig = diagrams.rope_rotation_diagram(m, n, omega)
    arrows = _patches(fig, FancyArrowPatch)
    angles = []
    for a in arrows:
        (x0, y0), (x1, y1) = a._posA_posB  # the arrow's two ends in data coordinates
        angles.append(math.atan2(y1 - y0, x1 - x0))
    (q_before, q_after, k_before, k_after) = angles
    assert q_after - q_before == pytest.approx(m * omega)
    assert k_after - k_before == pytest.approx(n * omega)


def test_ddp_averages_over_every_rank(close_figures):
    texts = _texts(diagrams.ddp_diagram(workers=3))
    assert sum(t.startswith("rank ") for t in texts) == 3
    assert "all-reduce: every rank receives g = (g0 + ... + g2) / 3" in texts


def test_checkpoint_diagram_lists_what_training_saves(close_figures):
    """The payload dict written in coursepkg/training/lifecycle.py: the diagram cannot fall
    behind."""
    loop = Path(diagrams.__file__).parents[2] / "training" / "lifecycle.py"
    saved = [
        [k.value for k in node.value.keys]
        for node in ast.walk(ast.parse(loop.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", None) == "payload"
        and isinstance(node.value, ast.Dict)
    ]
    assert saved == [list(diagrams.training.CHECKPOINT_PARTS)]
    texts = _texts(diagrams.checkpoint_diagram())
    assert all(key in texts for key in diagrams.training.CHECKPOINT_PARTS)


def test_weight_tying_draws_one_matrix_with_two_uses(close_figures):
    fig = diagrams.weight_tying_diagram()
    texts = _texts(fig)
    assert sum(t.startswith("E\n") for t in texts) == 1
    blue = [a for a in _patches(fig, FancyArrowPatch) if to_hex(a.get_edgecolor()) == "#0072b2"]
    assert len(blue) == 2


@pytest.mark.parametrize(("n_experts", "chosen"), [(6, (1, 4)), (5, (0, 2, 4)), (4, (3,))])
def test_moe_routing_draws_every_expert_and_two_arrows_per_chosen_one(
    n_experts, chosen, close_figures
):
    fig = diagrams.moe_routing_diagram(n_experts, chosen)
    texts = _texts(fig)
    experts = [t for t in texts if t.startswith("expert ")]
    assert len(experts) == n_experts
    assert sorted(int(t.split()[1]) for t in experts if "idle" not in t) == sorted(chosen)
    blue = [a for a in _patches(fig, FancyArrowPatch) if to_hex(a.get_edgecolor()) == "#0072b2"]
    assert len(blue) == 2 * len(chosen)
    with pytest.raises(ValueError, match="chosen must name experts in"):
        diagrams.moe_routing_diagram(3, (3,))


def test_latent_attention_caches_the_latent_and_the_rotated_key_only(close_figures):
    fig = diagrams.latent_attention_diagram()
    texts = _texts(fig)
    assert "latent c (Dc,)" in texts and "RoPE(k_r) (Dr,)" in texts
    frames = [p for p in _patches(fig, Rectangle) if p.get_linestyle() == "--"]
    assert len(frames) == 1  # one frame: the cache, around the two cached boxes
    x, y = frames[0].get_x(), frames[0].get_y()
    w, h = frames[0].get_width(), frames[0].get_height()
    inside = [
        t.get_text()
        for t in fig.axes[0].texts
        if x <= t.get_position()[0] <= x + w and y <= t.get_position()[1] <= y + h
    ]
    assert sorted(inside) == ["RoPE(k_r) (Dr,)", "latent c (Dc,)"]


@pytest.mark.parametrize(("vocab", "eps"), [(8, 0.1), (5, 0.3)])
def test_label_smoothing_targets_sum_to_one_and_match_torch(vocab, eps, close_figures):
    fig = diagrams.label_smoothing_diagram(vocab, eps, true=1)
    bars = _patches(fig, Rectangle)
    assert len(bars) == 2 * vocab
    heights = torch.tensor([b.get_height() for b in bars]).view(2, vocab) / 4.0  # (2, V)
    assert torch.allclose(heights.sum(1), torch.ones(2, dtype=heights.dtype))
    # the smoothed target is the one F.cross_entropy(label_smoothing=eps) compares against
    logits = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.cross_entropy(
        logits[None], torch.tensor([1]), label_smoothing=eps
    ).backward()
    assert torch.allclose(torch.softmax(logits, 0) - logits.grad, heights[1].double())


BOOK = Path(__file__).resolve().parents[2] / "book"
CELL = re.compile(
    r"^```\{code-cell\}[^\n]*\n(?:---\n(?P<options>.*?)\n---\n)?(?P<code>.*?)^```$", re.M | re.S
)


def test_every_diagram_cell_in_the_book_has_alt_text_and_every_chapter_a_diagram():
    """The accessibility check needs an alt text saying what each picture shows (myst-nb puts
    ``mystnb: image: alt:`` on the <img>); the issue asks for a diagram in every chapter."""
    chapters, missing = {}, []
    for page in sorted(BOOK.glob("[0-9][0-9]_*.md")):
        for cell in CELL.finditer(page.read_text(encoding="utf-8")):
            drawn = re.findall(
                r"^from coursepkg\.chapters\.diagrams import (\w+)", cell["code"], re.M
            )
            if not drawn:
                continue
            chapters.setdefault(page.stem, []).extend(drawn)
            alt = re.search(r"^    alt: (.+)$", cell["options"] or "", re.M)
            if not (alt and len(alt[1]) > 60):
                missing.append((page.stem, drawn))
    assert not missing, f"diagram cells without a describing alt text: {missing}"
    pages = sorted(p.stem for p in BOOK.glob("[0-9][0-9]_*.md"))
    assert sorted(chapters) == pages, sorted(set(pages) - set(chapters))
    used = {name for names in chapters.values() for name in names}
    assert used == set(diagrams.__all__), set(diagrams.__all__) - used


def test_speculative_rounds_keep_a_prefix_and_add_one_target_token(close_figures):
    trace = [(4, 4), (4, 2), (3, 0), (4, 3)]
    fig = diagrams.speculative_diagram(trace)
    fills = diagrams.serving.SPECULATIVE_FILLS
    count = {kind: len(_patches(fig, Rectangle, colour)) for kind, colour in fills.items()}
    assert count["kept"] == sum(n for _, n in trace)
    assert count["rejected"] == sum(n < p for p, n in trace)
    assert count["discarded"] == sum(p - n - 1 for p, n in trace if n < p)
    assert count["target"] == len(trace)
    with pytest.raises(ValueError, match="trace"):
        diagrams.speculative_diagram([(2, 3)])


@pytest.mark.parametrize(
    ("lengths", "block_size", "n_blocks"), [((10, 5, 7), 4, 10), ((3, 9), 2, 12)]
)
def test_block_tables_hold_each_sequence_and_share_one_pool(
    lengths, block_size, n_blocks, close_figures
):
    tables, pool = diagrams.serving.paged_tables(lengths, block_size, n_blocks)
    held = [b for t in tables for b in t.blocks]
    assert len(held) == len(set(held))  # no block in two tables
    assert [len(t.blocks) for t in tables] == [-(-n // block_size) for n in lengths]
    assert sorted(held + pool.free) == list(range(n_blocks))
    fig = diagrams.block_table_diagram(lengths, block_size, n_blocks)
    squares = _patches(fig, Rectangle)
    assert len(squares) == len(held) + n_blocks  # table entries, then the pool
    labels = _texts(fig)
    assert labels.count("free") == n_blocks - len(held)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sharding_draws_a_bar_per_rank_and_kind_a_shard_one_nth_long(ranks, close_figures):
    fig = diagrams.sharding_diagram(ranks)
    bars = _patches(fig, Rectangle)
    assert len(bars) == 3 * ranks * 3
    whole = max(b.get_width() for b in bars)
    shards = [b for b in bars if b.get_width() < whole]
    expected = sum(sum(kinds) for kinds in diagrams.parallel.SHARDED.values()) * ranks
    assert len(shards) == expected
    assert all(math.isclose(b.get_width(), whole / ranks) for b in shards)
    # the shards of one kind tile the whole bar: every rank at its own place
    lefts = {round(b.get_x(), 6) for b in shards}
    columns = sum(any(kinds) for kinds in diagrams.parallel.SHARDED.values())
    assert len(lefts) == columns * ranks
    with pytest.raises(ValueError, match="ranks must be"):
        diagrams.sharding_diagram(5)


@pytest.mark.parametrize(("stages", "micro"), [(1, 1), (3, 4), (4, 2)])
def test_pipeline_runs_each_micro_batch_once_per_stage_in_order(stages, micro, close_figures):
    table = diagrams.parallel.pipeline_schedule(stages, micro)
    assert all(len(row) == 2 * (micro + stages - 1) for row in table)
    for row in table:
        jobs = [j for j in row if j]
        assert jobs == [f"F{m}" for m in range(1, micro + 1)] + [
            f"B{m}" for m in range(1, micro + 1)
        ]
        idle = row.count("")
        assert idle == 2 * (stages - 1)  # the bubble
    for m in range(1, micro + 1):  # a stage's forward waits for the stage before
        slots = [row.index(f"F{m}") for row in table]
        assert slots == sorted(slots) and len(set(slots)) == stages
        back = [row.index(f"B{m}") for row in table]
        assert back == sorted(back, reverse=True)
    fig = diagrams.model_parallel_diagram(stages, micro)
    cells = [t for t in _texts(fig) if re.fullmatch(r"[FB]\d+", t)]
    assert len(cells) == 2 * stages * micro


def test_the_loss_mask_colours_exactly_the_learned_tokens(close_figures):
    """One square per token (and two in the key); the learned colour on exactly the tokens the
    response mask keeps, in their places; mismatched lengths are refused."""
    from coursepkg.chapters.diagrams.posttraining import LOSS_MASK_FILLS

    tokens = [
        "<|user|>",
        "r",
        "e",
        "v",
        " ",
        "a",
        "b",
        "<|end|>",
        "<|assistant|>",
        "b",
        "a",
        "<|end|>",
    ]
    learned = [False] * 9 + [True] * 3
    fig = diagrams.loss_mask_diagram(tokens, learned)
    squares = [p for p in _patches(fig, Rectangle) if p.get_y() >= 0]  # the row, not the key
    assert len(squares) == len(tokens)
    kept = sorted(
        p.get_x() for p in squares if to_hex(p.get_facecolor()) == to_hex(LOSS_MASK_FILLS[True])
    )
    assert kept == [float(i) for i, keep in enumerate(learned) if keep]
    assert "<|assistant|>" in _texts(fig)
    with pytest.raises(ValueError, match="same non-zero length"):
        diagrams.loss_mask_diagram(tokens, learned[:-1])


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_grouping_draws_one_arrow_per_query_head_to_its_own_group(
    n_heads, n_kv_heads, close_figures
):
    fig = diagrams.gqa_grouping_diagram(n_heads, n_kv_heads)
    texts = _texts(fig)
    assert sum(re.fullmatch(r"q\d+", t) is not None for t in texts) == n_heads
    assert sum(t.startswith("k") and ", v" in t for t in texts) == n_kv_heads
    assert len(_patches(fig, FancyArrowPatch)) == n_heads
    # each query head is coloured as the key/value head it reads: the model's repeat_interleave
    fills = [to_hex(p.get_facecolor()) for p in _patches(fig, FancyBboxPatch)]
    group = n_heads // n_kv_heads
    assert fills[:n_heads] == [fills[n_heads + h // group] for h in range(n_heads)]
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        diagrams.gqa_grouping_diagram(6, 4)


def test_lora_diagram_reads_its_shapes_from_a_real_adapter(close_figures):
    fig = diagrams.lora_diagram(d_in=48, d_out=32, r=4, alpha=16.0)
    texts = _texts(fig)
    assert "A  trained\n4 x 48" in texts and "B  trained\n32 x 4, zeros" in texts
    assert "x 4\n(alpha / r)" in texts
    note = next(t for t in texts if t.startswith("trained:"))
    assert f"trained: {4 * (48 + 32)} numbers" in note and f"frozen: {48 * 32 + 32}" in note


@pytest.mark.parametrize(
    ("n_new", "n_keys"), [((1, 1, 3), (5, 3, 3)), ((2,), (4,)), ((1, 4), (7, 4))]
)
def test_packed_mask_diagram_colours_exactly_the_packed_masks_true_entries(
    n_new, n_keys, close_figures
):
    from coursepkg.masks import PackedMask

    fig = diagrams.packed_mask_diagram(n_new, n_keys)
    squares = _patches(fig, Rectangle)
    assert len(squares) == sum(n_new) * sum(n_keys)
    coloured = sum(to_hex(s.get_facecolor()) != "#ffffff" for s in squares)
    kept = int(PackedMask(list(n_new), list(n_keys)).dense.sum())
    assert coloured == kept
    assert any(t.startswith(f"{kept} of {sum(n_new) * sum(n_keys)} scores") for t in _texts(fig))


@pytest.mark.parametrize("ranks", [2, 3, 4, 5])
def test_ring_schedule_sends_each_chunk_once_per_phase_and_leaves_the_sum(ranks):
    sends = diagrams.parallel.ring_schedule(ranks)  # raises unless every rank ends with the sum
    assert all(len(row) == 2 * (ranks - 1) for row in sends)
    for t in range(2 * (ranks - 1)):  # at each step the N ranks send N different chunks
        assert sorted(row[t] for row in sends) == list(range(ranks))
    with pytest.raises(ValueError, match="at least 2"):
        diagrams.parallel.ring_schedule(1)


def test_ring_allreduce_diagram_draws_the_ring_and_the_schedule(close_figures):
    fig = diagrams.ring_allreduce_diagram(4)
    texts = _texts(fig)
    assert sum(t.startswith("rank ") for t in texts) == 2 * 4  # the ring's boxes, the grid's rows
    assert sum(re.fullmatch(r"c\d", t) is not None for t in texts) == 4 * 6
    assert len(_patches(fig, FancyArrowPatch)) == 4


def test_bert_embeddings_diagram_splits_segments_at_the_first_sep(close_figures):
    fig = diagrams.bert_embeddings_diagram(("[CLS]", "a", "[SEP]", "b", "c", "[SEP]"))
    texts = _texts(fig)
    assert [t for t in texts if t.startswith("seg ")] == ["seg A"] * 3 + ["seg B"] * 3
    assert [t for t in texts if t.startswith("pos ")] == [f"pos {i}" for i in range(6)]
    assert {"embed", "token_types", "positions"} <= set(texts)
    with pytest.raises(ValueError, match="must start with \\[CLS\\]"):
        diagrams.bert_embeddings_diagram(("a", "[SEP]"))


def test_recurrence_chains_its_states_and_attention_takes_one_step(close_figures):
    fig = diagrams.recurrence_diagram(5)
    red = [
        a
        for a in _patches(fig, FancyArrowPatch)
        if to_hex(a.get_edgecolor()) == PALETTE["vermillion"].lower()
    ]
    assert len(red) == 4  # h1 -> h2 -> ... -> h5
    assert sum(t.startswith("z") for t in _texts(fig)) == 5


def test_gradient_path_names_one_jacobian_per_step(close_figures):
    texts = _texts(diagrams.gradient_path_diagram(6))
    assert [t for t in texts if re.fullmatch(r"J\d", t)] == [f"J{t}" for t in range(2, 7)]


def test_head_parameters_are_read_off_a_real_module(close_figures):
    from coursepkg import MultiHeadAttention

    fig = diagrams.head_parameters_diagram(64, 4)
    total = sum(p.numel() for p in MultiHeadAttention(64, 4).parameters())
    assert any(t.startswith(f"total {total:,} ") for t in _texts(fig))
    assert total == 4 * 64 * 64 + 4 * 64


def test_shift_rotation_draws_the_tables_own_pair_on_the_unit_circle(close_figures):
    from coursepkg.positional import sinusoidal_table

    fig = diagrams.shift_rotation_diagram(d_model=8, pair=1, positions=5, k=2)
    points = [line.get_xydata()[0] for line in fig.axes[0].lines if line.get_marker() == "o"]
    table = sinusoidal_table(5, 8)
    expected = torch.stack([table[:, 3], table[:, 2]], dim=1)  # (cos, sin) of pair 1
    assert torch.allclose(torch.tensor(np.array(points), dtype=expected.dtype), expected, atol=1e-6)
    with pytest.raises(ValueError, match="pair must be in"):
        diagrams.shift_rotation_diagram(d_model=8, pair=4)


@pytest.mark.parametrize(("d_model", "n_heads"), [(8, 2), (12, 3), (4, 4)])
def test_split_heads_colours_each_heads_columns(d_model, n_heads, close_figures):
    fig = diagrams.split_heads_diagram(d_model, n_heads)
    squares = _patches(fig, Rectangle)
    assert len(squares) == 2 * 4 * d_model  # the projection, then the heads' blocks
    assert sum(t.startswith("head ") for t in _texts(fig)) == n_heads


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_draws_two_sublayers_with_their_norms(norm_first, close_figures):
    texts = _texts(diagrams.encoder_layer_diagram(norm_first))
    assert {"self_attn", "ffn", "norm1 (LayerNorm)", "norm2 (LayerNorm)"} <= set(texts)
    assert texts.count("+") == 2


def test_greedy_trap_marks_greedy_and_the_best_sequence(close_figures):
    texts = _texts(diagrams.greedy_trap_diagram((0.6, 0.4), ((0.4, 0.3), (0.9, 0.1))))
    note = next(t for t in texts if t.startswith("red: greedy"))
    assert "(0.24)" in note and "(0.36)" in note


def test_pretokens_and_bytes_are_the_tokenizers_own(close_figures):
    from coursepkg.tokenizer import pretokenize

    text = "It's 42 here"
    texts = _texts(diagrams.pretokens_diagram(text))
    assert [t for t in texts if t in {c.replace(" ", "_") for c in pretokenize(text)}] == [
        c.replace(" ", "_") for c in pretokenize(text)
    ]
    texts = _texts(diagrams.bytes_diagram("ab\u00e9"))
    assert "195\nU+00C3" in texts and "169\nU+00A9" in texts and "97\na" in texts
    assert any(t.startswith("3 characters, 4 bytes") for t in texts)


def test_mlm_corruption_shares_add_up(close_figures):
    texts = _texts(diagrams.mlm_corruption_diagram(0.2, 0.5, 0.25))
    assert any(t.startswith("[MASK]: 50% of those\n= 10.0% of all") for t in texts)
    assert any(t.startswith("kept: 25% of those\n= 5.0% of all") for t in texts)
    with pytest.raises(ValueError, match="mask \\+ random <= 1"):
        diagrams.mlm_corruption_diagram(0.15, 0.8, 0.3)


def test_memory_per_parameter_totals(close_figures):
    texts = _texts(diagrams.memory_per_parameter_diagram(10**9))
    assert {"2 B: 2.00 GB", "4 B: 4.00 GB", "16 B: 16.00 GB"} <= set(texts)


@pytest.mark.parametrize(("n_experts", "top_k"), [(8, 2), (4, 1)])
def test_dense_vs_routed_lights_k_experts(n_experts, top_k, close_figures):
    fig = diagrams.dense_vs_routed_diagram(n_experts, top_k)
    lit = [p for p in _patches(fig, FancyBboxPatch)][1:]  # the dense box first
    colours = [to_hex(p.get_facecolor()) for p in lit]
    assert len(colours) == n_experts
    assert colours.count(colours[0]) == top_k


def test_lsh_bands_show_each_position_and_a_candidate_only_where_a_band_agrees(close_figures):
    sig_a, sig_b = diagrams.data.LSH_EXAMPLE
    fig = diagrams.lsh_bands_diagram(sig_a, sig_b, bands=4)
    agree = sum(a == b for a, b in zip(sig_a, sig_b, strict=True))
    fills = diagrams.data.LSH_FILLS
    assert len(_patches(fig, Rectangle, fills[True])) == 2 * agree
    assert len(_patches(fig, Rectangle, fills[False])) == 2 * (len(sig_a) - agree)
    texts = _texts(fig)
    same = [a == b for a, b in zip(sig_a, sig_b, strict=True)]
    whole = [all(same[i : i + 4]) for i in (0, 4, 8, 12)]
    assert sum(t.endswith("\ncandidate") for t in texts) == sum(whole) == 1
    assert sum(t.endswith("\nno match") for t in texts) == 3
    assert sum(t == f"{sig_a[0] % 100:02d}" for t in texts) >= 2  # each value, written out
    with pytest.raises(ValueError, match="divide"):
        diagrams.lsh_bands_diagram(sig_a, sig_b, bands=3)
    with pytest.raises(ValueError, match="one length"):
        diagrams.lsh_bands_diagram(sig_a, sig_b[:-1])
