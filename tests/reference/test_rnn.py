"""Tests of AdditiveAttention (Bahdanau) and coursepkg.rnn (GRU encoder-decoders)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from coursepkg.attention import AdditiveAttention
from coursepkg.data import BOS_ID, EOS_ID, PAD_ID, make_copy_batch
from coursepkg.rnn import Seq2SeqRNN, _unrolled_encoder_states, encoder_state_gradient_norms

SRC_V, TGT_V, EMB, HID = 11, 13, 8, 16


def make_model(attention: bool, seed: int = 0) -> Seq2SeqRNN:
    torch.manual_seed(seed)
    return Seq2SeqRNN(SRC_V, TGT_V, EMB, HID, attention=attention)


def random_src(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, SRC_V, (batch, length), generator=g)  # no padding


# ---------------------------------------------------------------------- AdditiveAttention
def test_additive_attention_submodules() -> None:
    attn = AdditiveAttention(query_dim=5, key_dim=7, attn_dim=3)
    assert attn.query_proj.weight.shape == (3, 5) and attn.query_proj.bias is None
    assert attn.key_proj.weight.shape == (3, 7) and attn.key_proj.bias is not None
    assert attn.score.weight.shape == (1, 3) and attn.score.bias is None


def test_additive_attention_matches_formula_and_shapes() -> None:
    torch.manual_seed(0)
    attn = AdditiveAttention(5, 7, 3)
    q, k = torch.randn(2, 5), torch.randn(2, 4, 7)
    context, weights = attn(q, k)
    assert context.shape == (2, 7) and weights.shape == (2, 4)
    # score_i = v^T tanh(W_q q + W_k k_i + b), alpha = softmax(score), c = sum_i alpha_i k_i
    w_q, w_k, b_k = attn.query_proj.weight, attn.key_proj.weight, attn.key_proj.bias
    v = attn.score.weight[0]
    scores = torch.tanh((q @ w_q.T)[:, None, :] + k @ w_k.T + b_k) @ v  # (B, S)
    expected = scores.softmax(-1)
    assert_close(weights, expected)
    assert_close(context, torch.einsum("bs,bsd->bd", expected, k))


def test_additive_attention_mask_and_fully_masked_row() -> None:
    torch.manual_seed(0)
    attn = AdditiveAttention(4, 6, 5)
    q = torch.randn(3, 4, requires_grad=True)
    k = torch.randn(3, 5, 6, requires_grad=True)
    mask = torch.tensor(
        [[True, True, False, True, False], [True] * 5, [False] * 5]
    )  # row 2 fully masked
    context, weights = attn(q, k, mask)
    assert torch.all(weights[~mask] == 0)
    assert_close(weights[:2].sum(-1), torch.ones(2))
    assert torch.all(weights[2] == 0) and torch.all(context[2] == 0)
    (context.sum() + weights.sum()).backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    # Masked keys do not influence the result at all.
    k2 = k.detach().clone()
    k2[~mask] = 100.0
    _, weights2 = attn(q, k2, mask)
    assert_close(weights2, weights.detach())


def test_additive_attention_precomputed_keys() -> None:
    torch.manual_seed(0)
    attn = AdditiveAttention(4, 6, 5)
    q, k = torch.randn(2, 4), torch.randn(2, 3, 6)
    out = attn(q, k)
    out_pre = attn(q, k, keys_proj=attn.key_proj(k))
    assert_close(out_pre[0], out[0])
    assert_close(out_pre[1], out[1])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mask": torch.ones(2, 3, dtype=torch.long)}, TypeError, "mask must be a bool"),
        ({"mask": torch.ones(2, 4, dtype=torch.bool)}, ValueError, r"mask must have shape"),
        ({"query": torch.randn(2, 5)}, ValueError, r"query must have shape \(B, 4\)"),
        ({"keys": torch.randn(2, 3, 5)}, ValueError, r"keys must have shape \(B, S, 6\)"),
        ({"keys": torch.randn(3, 3, 6)}, ValueError, "batch size"),
    ],
)
def test_additive_attention_bad_inputs(kwargs: dict, error: type, match: str) -> None:
    attn = AdditiveAttention(4, 6, 5)
    args = {"query": torch.randn(2, 4), "keys": torch.randn(2, 3, 6), "mask": None}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        attn(args["query"], args["keys"], args["mask"])


# ---------------------------------------------------------------------- Seq2SeqRNN shapes
@pytest.mark.parametrize("attention", [False, True])
def test_forward_and_greedy_shapes(attention: bool) -> None:
    model = make_model(attention)
    src = random_src(3, 6)
    tgt_in = torch.randint(4, TGT_V, (3, 5))
    assert model(src, tgt_in).shape == (3, 5, TGT_V)
    tokens, attn = model.greedy(src, max_len=7, bos_id=BOS_ID)
    assert tokens.shape == (3, 7) and tokens.dtype == torch.long
    if attention:
        assert attn is not None and attn.shape == (3, 7, 6)
        assert model.encoder.bidirectional and model.memory_dim == 2 * HID
    else:
        assert attn is None
        assert not model.encoder.bidirectional and model.attention is None


def test_bottleneck_model_sees_only_final_state() -> None:
    # Without attention, the decoder output is a function of s_0 = h_S alone: feeding the same
    # s_0 with a *different* memory tensor changes nothing.
    model = make_model(False)
    src, tgt_in = random_src(2, 6), torch.randint(4, TGT_V, (2, 4))
    memory, state, mask = model.encode(src)
    assert_close(state, memory[:, -1])  # s_0 is the last encoder state
    logits, _ = model.decode(tgt_in, memory, state, mask)
    logits_other, _ = model.decode(tgt_in, torch.randn_like(memory), state, mask)
    assert_close(logits, logits_other)
    assert_close(logits, model(src, tgt_in))


# ---------------------------------------------------------------------- masking and padding
def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    src = random_src(3, 7)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 2 + [False] * 5])
    return src.masked_fill(~mask, PAD_ID), mask


def test_attention_weights_sum_to_one_and_skip_padding() -> None:
    model = make_model(True)
    src, mask = padded_batch()
    tgt_in = torch.randint(4, TGT_V, (3, 5))
    memory, state, _ = model.encode(src, mask)
    _, attn = model.decode(tgt_in, memory, state, mask)
    assert attn.shape == (3, 5, 7)
    assert_close(attn.sum(-1), torch.ones(3, 5))
    assert torch.all(attn.masked_select(~mask[:, None, :].expand_as(attn)) == 0)
    _, attn_greedy = model.greedy(src, max_len=4, bos_id=BOS_ID, src_mask=mask)
    assert_close(attn_greedy.sum(-1), torch.ones(3, 4))
    assert torch.all(attn_greedy.masked_select(~mask[:, None, :].expand_as(attn_greedy)) == 0)


@pytest.mark.parametrize("attention", [True, False])
def test_padding_invariance(attention: bool) -> None:
    # A padded row gives the same logits as that row alone, unpadded, or with extra padding.
    model = make_model(attention)
    src, mask = padded_batch()
    tgt_in = torch.randint(4, TGT_V, (3, 5))
    logits = model(src, tgt_in, mask)
    for row, length in enumerate(mask.sum(1).tolist()):
        alone = model(src[row : row + 1, :length], tgt_in[row : row + 1])
        assert_close(logits[row : row + 1], alone)
    more = torch.cat([src, torch.full((3, 4), PAD_ID)], dim=1)  # (B, S + 4)
    more_mask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], dim=1)
    assert_close(model(more, tgt_in, more_mask), logits)
    # An omitted mask is derived from pad_id.
    assert_close(model(src, tgt_in), logits)


@pytest.mark.parametrize("attention", [True, False])
def test_greedy_agrees_with_teacher_forcing(attention: bool) -> None:
    model = make_model(attention, seed=3)
    src, mask = padded_batch()
    tokens, _ = model.greedy(src, max_len=6, bos_id=BOS_ID, src_mask=mask)
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tokens[:, :-1]], dim=1)  # (B, 6)
    assert torch.equal(model(src, tgt_in, mask).argmax(-1), tokens)


def test_greedy_stops_rows_at_eos() -> None:
    model = make_model(True)
    with torch.no_grad():  # make EOS the only likely token: every row ends at step 0
        model.out_proj.bias.fill_(-10.0)
        model.out_proj.bias[EOS_ID] = 10.0
    src, mask = padded_batch()
    tokens, attn = model.greedy(src, max_len=5, bos_id=BOS_ID, eos_id=EOS_ID, src_mask=mask)
    assert torch.all(tokens[:, 0] == EOS_ID) and torch.all(tokens[:, 1:] == PAD_ID)
    assert_close(attn[:, 0].sum(-1), torch.ones(3))
    assert torch.all(attn[:, 1:] == 0)


# ---------------------------------------------------------------------- gradient demo
@pytest.mark.parametrize("attention", [False, True])
def test_unrolled_encoder_matches_encode(attention: bool) -> None:
    model = make_model(attention)
    src = random_src(2, 5)
    memory, _, _ = model.encode(src)
    fwd, bwd = _unrolled_encoder_states(model, src)
    unrolled = torch.stack(fwd, 1)
    if attention:
        unrolled = torch.cat([unrolled, torch.stack(bwd, 1)], dim=-1)
    assert_close(unrolled, memory)


@pytest.mark.parametrize("attention", [False, True])
def test_encoder_state_gradient_norms(attention: bool) -> None:
    model = make_model(attention)
    batch = make_copy_batch(4, 6, SRC_V, torch.Generator().manual_seed(0), reverse=True)
    norms = encoder_state_gradient_norms(model, batch.src, batch.tgt_in, batch.tgt_out)
    assert norms.shape == (6,)
    assert torch.isfinite(norms).all() and torch.all(norms > 0)
    assert all(p.grad is None for p in model.parameters())  # parameters' .grad untouched
    if not attention:
        # Without attention the last encoder state *is* s_0, so its gradient is dL/ds_0.
        memory, state, mask = model.encode(batch.src)
        state = state.detach().requires_grad_(True)
        logits, _ = model.decode(batch.tgt_in, memory, state, mask)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD_ID)
        (grad,) = torch.autograd.grad(loss, state)
        assert_close(norms[-1], grad.norm())


def test_gradient_reaches_early_tokens_only_with_attention() -> None:
    # The chapter's picture: through the bottleneck the gradient fades with distance from the
    # end of the source; attention gives every source position a short path to the loss.
    batch = make_copy_batch(8, 20, SRC_V, torch.Generator().manual_seed(0), reverse=True)
    ratios = {}
    for attention in (False, True):
        norms = encoder_state_gradient_norms(
            make_model(attention), batch.src, batch.tgt_in, batch.tgt_out
        )
        ratios[attention] = (norms[0] / norms[-1]).item()
    assert ratios[False] < 1e-2 and ratios[True] > 0.1, ratios


def test_gradient_norms_reject_padding() -> None:
    model = make_model(False)
    src, _ = padded_batch()
    tgt = torch.randint(4, TGT_V, (3, 4))
    with pytest.raises(ValueError, match="pad_id"):
        encoder_state_gradient_norms(model, src, tgt, tgt)


def test_int32_ids_are_accepted() -> None:
    model = make_model(True)
    src, mask = padded_batch()
    tgt_in = torch.randint(4, TGT_V, (3, 5))
    assert_close(model(src.int(), tgt_in.int(), mask), model(src, tgt_in, mask))


# ---------------------------------------------------------------------- training
@pytest.fixture
def one_thread():
    # A model this small trains fastest on one thread; on a busy 2-core machine, intra-op
    # threads fight over the cores and the run gets ~10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_attention_model_learns_reversal(one_thread: None) -> None:
    torch.manual_seed(0)
    vocab = 12
    model = Seq2SeqRNN(vocab, vocab, emb_dim=32, hidden_dim=64, attention=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(150):
        src, tgt_in, tgt_out, src_mask, _ = make_copy_batch(64, 8, vocab, g, reverse=True)
        logits = model(src, tgt_in, src_mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.2 * first, (first, last)
    test = make_copy_batch(32, 8, vocab, torch.Generator().manual_seed(99), reverse=True)
    tokens, attn = model.greedy(test.src, max_len=9, bos_id=BOS_ID, eos_id=EOS_ID)
    exact = (tokens == test.tgt_out).all(dim=1).float().mean().item()
    assert exact > 0.8, exact
    # The learned alignment of reversal is the anti-diagonal: step t looks at position 7 - t.
    assert torch.equal(attn[:, :8].argmax(-1)[0], torch.arange(7, -1, -1))


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("src", "tgt_in", "mask", "error", "match"),
    [
        (torch.rand(2, 5), None, None, TypeError, r"src must hold integer token ids"),
        ([[4, 5]], None, None, TypeError, "src must be a torch.Tensor"),
        (torch.full((2, 5), SRC_V), None, None, ValueError, r"src holds id 11.*\[0, 11\)"),
        (torch.full((2, 5), -1), None, None, ValueError, r"src holds id -1"),
        (None, torch.full((2, 4), TGT_V), None, ValueError, r"tgt_in holds id 13.*\[0, 13\)"),
        (None, torch.ones(2, 4), None, TypeError, r"tgt_in must hold integer token ids"),
        (None, torch.ones(3, 4, dtype=torch.long), None, ValueError, "batch size"),
        (None, None, torch.ones(2, 4, dtype=torch.bool), ValueError, r"src_mask must have shape"),
        (None, None, torch.ones(2, 5), TypeError, r"src_mask must be a bool tensor"),
        (
            None,
            None,
            torch.tensor([[False, True, True, True, True]] * 2),
            ValueError,
            "right padding",
        ),
        (
            None,
            None,
            torch.tensor([[True, False, True, True, True]] * 2),
            ValueError,
            "right-padded",
        ),
        (torch.ones(5, dtype=torch.long), None, None, ValueError, r"src must have shape \(B, L\)"),
    ],
)
def test_forward_bad_inputs(src, tgt_in, mask, error: type, match: str) -> None:
    model = make_model(True)
    src = random_src(2, 5) if src is None else src
    tgt_in = torch.randint(4, TGT_V, (2, 4)) if tgt_in is None else tgt_in
    with pytest.raises(error, match=match):
        model(src, tgt_in, mask)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_len": 0}, "max_len must be a positive int"),
        ({"bos_id": TGT_V}, r"bos_id must be an int in \[0, 13\)"),
        ({"eos_id": -1}, "eos_id must be an int"),
    ],
)
def test_greedy_bad_inputs(kwargs: dict, match: str) -> None:
    model = make_model(False)
    args = {"max_len": 3, "bos_id": BOS_ID, "eos_id": None}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        model.greedy(random_src(2, 4), **args)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"hidden_dim": 0}, ValueError, "hidden_dim must be a positive int"),
        ({"src_vocab": 2.5}, ValueError, "src_vocab must be a positive int"),
        ({"attention": 1}, TypeError, "attention must be a bool"),
        ({"pad_id": 11}, ValueError, r"pad_id must be an int in \[0, 11\)"),
        (
            {"attention": False, "bidirectional": True},
            ValueError,
            "bidirectional=True needs attention=True",
        ),
    ],
)
def test_constructor_bad_args(kwargs: dict, error: type, match: str) -> None:
    args = {
        "src_vocab": SRC_V,
        "tgt_vocab": TGT_V,
        "emb_dim": EMB,
        "hidden_dim": HID,
        "attention": True,
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Seq2SeqRNN(**args)


# ---------------------------------------------------------------------- the ablation's model
def test_attention_over_a_unidirectional_encoder() -> None:
    """attention=True, bidirectional=False: attention over one-direction states (width H),
    with the same padding invariance, greedy/teacher-forcing agreement and unrolled states."""
    torch.manual_seed(0)
    model = Seq2SeqRNN(SRC_V, TGT_V, EMB, HID, attention=True, bidirectional=False)
    assert not model.encoder.bidirectional and model.memory_dim == HID
    src, mask = padded_batch()
    tgt_in = torch.randint(4, TGT_V, (3, 5))
    memory, state, _ = model.encode(src, mask)
    assert memory.shape == (3, 7, HID) and state.shape == (3, HID)
    logits = model(src, tgt_in, mask)
    for row, length in enumerate(mask.sum(1).tolist()):
        assert_close(
            logits[row : row + 1], model(src[row : row + 1, :length], tgt_in[row : row + 1])
        )
    tokens, attn = model.greedy(src, max_len=6, bos_id=BOS_ID, src_mask=mask)
    assert attn is not None and attn.shape == (3, 6, 7)
    teacher = torch.cat([torch.full((3, 1), BOS_ID), tokens[:, :-1]], dim=1)  # (B, 6)
    assert torch.equal(model(src, teacher, mask).argmax(-1), tokens)
    fwd, _ = _unrolled_encoder_states(model, random_src(2, 5))
    assert_close(torch.stack(fwd, 1), model.encode(random_src(2, 5))[0])
    # A default-built attention model is still the bidirectional one.
    assert make_model(True).bidirectional and not make_model(False).bidirectional
