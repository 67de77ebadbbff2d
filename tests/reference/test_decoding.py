"""Generation: KV cache == no cache, greedy decoding (EOS handling), beam search (k=1 == greedy,
exhaustive beam == brute force, length normalisation), and DecoderOnlyLM.generate."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from coursepkg import KVCache, beam_search, greedy_decode
from coursepkg.decoding import length_penalty
from coursepkg.kv_cache import AttentionCache

V, BOS, EOS = 11, 1, 2


def _chunks_to_slices(chunks):
    start = 0
    for n in chunks:
        yield slice(start, start + n)
        start += n


# ------------------------------------------------------------------------------------ KV cache
@torch.no_grad()
@pytest.mark.parametrize("chunks", [(1, 1, 1, 1, 1, 1), (3, 1, 2), (6,)])
@pytest.mark.parametrize(("norm_first", "positional"), [(False, "sinusoidal"), (True, "learned")])
def test_transformer_cache_equals_teacher_forcing(
    norm_first, positional, chunks, make_model, make_tokens
) -> None:
    model = make_model(norm_first=norm_first, positional=positional, n_decoder_layers=3)
    src, tgt = make_tokens(3, 5, V), make_tokens(3, 6, V, seed=2)
    src_mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] + [0] * 4], dtype=torch.bool)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask)  # (B, T, V), teacher forced
    cache = model.new_cache()
    steps = [
        model.decode(tgt[:, s], memory, src_mask, cache=cache) for s in _chunks_to_slices(chunks)
    ]
    assert cache.length == 6
    assert all(c.length == 5 for c in cache.cross_attn)  # static: the source length
    assert_close(torch.cat(steps, 1), full)


@torch.no_grad()
@pytest.mark.parametrize("chunks", [(1, 1, 1, 1, 1, 1, 1), (4, 1, 2), (2, 5)])
@pytest.mark.parametrize(
    ("norm_first", "positional"),
    [(False, "sinusoidal"), (True, "sinusoidal"), (False, "learned"), (True, "learned")],
)
def test_decoder_only_cache_equals_full_forward(
    norm_first, positional, chunks, make_model, make_tokens
) -> None:
    model = make_model(kind="decoder-only", norm_first=norm_first, positional=positional)
    tokens = make_tokens(2, 7, V)
    full = model(tokens)
    cache = model.new_cache()
    assert cache.cross_attn is None
    steps = [model(tokens[:, s], cache=cache) for s in _chunks_to_slices(chunks)]
    assert cache.length == 7
    assert_close(torch.cat(steps, 1), full)


def test_attention_cache_update_and_reorder() -> None:
    grow, static = AttentionCache(), AttentionCache(static=True)
    k1, v1 = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 5)
    k2, v2 = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 5)
    grow.update(k1, v1)
    k, v = grow.update(k2, v2)
    assert grow.length == 3
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    static.update(k1, v1)
    static.update(k2, v2)
    assert static.length == 2  # replaced, not appended
    grow.reorder(torch.tensor([2, 2, 0]))
    assert torch.equal(grow.k[1], k[2]) and torch.equal(grow.v[2], v[0])
    cache = KVCache(2, cross=True)
    assert cache.length == 0 and len(cache.cross_attn) == 2 and cache.cross_attn[0].static


# ------------------------------------------------------------------------------ DecoderOnlyLM
@pytest.mark.parametrize("overrides", [{}, dict(norm_first=True), dict(positional="learned")])
def test_generate_greedy_same_with_and_without_cache(overrides, make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only", **overrides)
    prompt = make_tokens(3, 2, V)
    with_cache = model.generate(prompt, 12, use_cache=True)
    assert with_cache.shape == (3, 14) and torch.equal(with_cache[:, :2], prompt)
    assert torch.equal(model.generate(prompt, 12, use_cache=False), with_cache)
    # greedy: every new token is the argmax of the teacher-forced logits before it
    with torch.no_grad():
        logits = model(with_cache[:, :-1])
    assert torch.equal(logits[:, 1:].argmax(-1), with_cache[:, 2:])


def _first_generated_token(out, start, exclude):
    """The first token (row by row, left to right) generated at or after column ``start`` that
    is not in ``exclude``: a token the model really produces, to be declared the pad id."""
    for row in out[:, start:].tolist():
        for tok in row:
            if tok not in exclude:
                return tok
    raise AssertionError("the model generated nothing usable")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_greedy_same_with_and_without_cache_when_config_has_pad_id(
    seed, make_model, make_tokens
) -> None:
    """The pad id is an ordinary token to the model; the cached and uncached paths must treat
    a generated pad id alike (here pad_id is a token the model itself generates)."""
    prompts = torch.arange(V)[:, None]  # (V, 1): every one-token prompt
    plain = make_model(kind="decoder-only", seed=seed).generate(prompts, 12)
    pad = next(t for r in range(V) for t in plain[r, 1:].tolist() if t != r)
    keep = [r for r in range(V) if r != pad]  # every prompt except the pad id itself
    prompt, plain = prompts[keep], plain[keep]
    model = make_model(kind="decoder-only", seed=seed, pad_id=pad)  # the same weights
    with_cache = model.generate(prompt, 12, use_cache=True)
    assert torch.equal(with_cache, plain)  # the prompt holds no pad id
    without = model.generate(prompt, 12, use_cache=False)
    assert torch.equal(without, with_cache), (
        f"pad_id={pad}, generated mid-sequence, changes the uncached path:\n{without}\n"
        f"vs cached\n{with_cache}"
    )


def test_generate_sampling_is_reproducible_and_top_k_1_is_greedy(make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only")
    prompt = make_tokens(3, 2, V)

    def sample(seed, **kw):
        return model.generate(prompt, 15, generator=torch.Generator().manual_seed(seed), **kw)

    a = sample(7, temperature=1.0)
    assert torch.equal(sample(7, temperature=1.0), a)
    assert not torch.equal(sample(8, temperature=1.0), a)
    greedy = model.generate(prompt, 15)
    assert not torch.equal(a, greedy)
    for temperature in (0.5, 1.0, 3.0):
        assert torch.equal(sample(3, temperature=temperature, top_k=1), greedy)


def test_generate_top_k_samples_only_among_the_top_k(make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only")
    prompt = make_tokens(4, 2, V)
    out = model.generate(
        prompt, 15, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = model(out[:, :-1])[:, 1:]  # (B, 15, V): the logits each new token came from
    top3 = logits.topk(3, dim=-1).indices
    assert bool((top3 == out[:, 2:, None]).any(-1).all())
    assert not torch.equal(out[:, 2:], top3[..., 0])  # not simply greedy


def test_generate_zero_new_tokens_returns_the_prompt(make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only")
    prompt = make_tokens(2, 3, V)
    assert torch.equal(model.generate(prompt, 0), prompt)


# ------------------------------------------------------------------------------------- greedy
def _unstopped_greedy(model, src, steps):
    """Greedy by repeated teacher forcing with the full forward pass and no stopping."""
    tokens = torch.full((src.size(0), 1), BOS)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(src, tokens, tgt_mask=torch.ones_like(tokens, dtype=torch.bool))
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return tokens


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("overrides", [{}, dict(norm_first=True, positional="learned")])
def test_greedy_same_with_and_without_cache(seed, overrides, make_model, make_tokens) -> None:
    model = make_model(seed=seed, **overrides)
    src = make_tokens(3, 5, V, seed=seed)
    src_mask = torch.tensor([[1] * 5, [1] * 4 + [0], [1] * 2 + [0] * 3], dtype=torch.bool)
    a = greedy_decode(model, src, 10, BOS, EOS, src_mask=src_mask, use_cache=True)
    b = greedy_decode(model, src, 10, BOS, EOS, src_mask=src_mask, use_cache=False)
    assert torch.equal(a, b)
    assert a[:, 0].eq(BOS).all() and a.size(1) <= 11


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_and_beam_same_with_and_without_cache_when_config_has_pad_id(
    seed, make_model, make_tokens
) -> None:
    """As for generate: a generated token equal to pad_id must not be masked in only one path.
    The source mask is explicit, so pad_id only matters on the target side."""
    src = make_tokens(3, 5, V, seed=seed)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    plain = greedy_decode(make_model(seed=seed), src, 10, BOS, EOS, src_mask=src_mask)
    pad = _first_generated_token(plain, 1, exclude={BOS, EOS})
    model = make_model(seed=seed, pad_id=pad)  # the same weights
    runs = {
        (algo, cache): (
            greedy_decode(model, src, 10, BOS, EOS, src_mask=src_mask, use_cache=cache)
            if algo == "greedy"
            else beam_search(model, src, 2, 10, BOS, EOS, src_mask=src_mask, use_cache=cache)[0]
        )
        for algo in ("greedy", "beam")
        for cache in (True, False)
    }
    for algo in ("greedy", "beam"):
        cached, uncached = runs[algo, True], runs[algo, False]
        assert torch.equal(uncached, cached), (
            f"{algo}, pad_id={pad}: uncached\n{uncached}\nvs cached\n{cached}"
        )


@pytest.mark.parametrize("pad_id", [None, 0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_stops_at_eos_and_pads_after_it(seed, pad_id, make_model, make_tokens) -> None:
    model = make_model(seed=seed, pad_id=pad_id)
    src = make_tokens(4, 5, V, low=1, seed=seed)
    max_len = 8
    ref = _unstopped_greedy(model, src, max_len)  # (B, 1 + max_len)
    eos = int(ref[0, 3])  # row 0 must stop after its third token at the latest
    pad = eos if pad_id is None else pad_id
    out = greedy_decode(model, src, max_len, BOS, eos)
    stops = []
    for i in range(4):
        hits = (ref[i, 1:] == eos).nonzero()
        stops.append(int(hits[0]) + 1 if len(hits) else None)  # index of the first EOS
    assert stops[0] is not None and stops[0] <= 3
    width = 1 + max_len if None in stops else 1 + max(stops)
    assert out.shape == (4, width)  # decoding ends as soon as every row has stopped
    for i, stop in enumerate(stops):
        end = width if stop is None else stop + 1
        assert torch.equal(out[i, :end], ref[i, :end])  # the greedy tokens up to EOS
        assert bool((out[i, end:] == pad).all())  # then only padding


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_tokens_are_the_teacher_forced_argmax(seed, make_model, make_tokens) -> None:
    model = make_model(seed=seed)
    src = make_tokens(3, 6, V, seed=seed)
    out = greedy_decode(model, src, 9, BOS, EOS)
    with torch.no_grad():
        logits = model(src, out[:, :-1])
    for i in range(3):
        hits = (out[i, 1:] == EOS).nonzero()
        end = int(hits[0]) + 1 if len(hits) else out.size(1) - 1
        assert torch.equal(logits[i, :end].argmax(-1), out[i, 1 : end + 1])


# -------------------------------------------------------------------------------- beam search
def _normalised_score(model, src, hyp, eos, alpha, src_mask=None):
    """log p(hyp | src) / len^alpha by teacher forcing; len counts generated tokens incl. EOS."""
    toks = hyp.tolist()
    if eos in toks[1:]:
        toks = toks[: toks.index(eos, 1) + 1]
    t = torch.tensor([toks])
    inp = t[:, :-1]
    real = torch.ones_like(inp, dtype=torch.bool)  # a generated pad id is still a real token
    with torch.no_grad():
        logits = model(src[None], inp, None if src_mask is None else src_mask[None], real)
    logp = torch.log_softmax(logits.double(), -1)[0].gather(1, t[0, 1:, None]).sum()
    return float(logp) / (len(toks) - 1) ** alpha


BEAM_MODELS = [
    dict(seed=0),
    dict(seed=1, norm_first=True),
    dict(seed=2, positional="learned", n_decoder_layers=1),
    dict(seed=3, src_vocab_size=7, share_embeddings=False),
    dict(seed=4, pad_id=0),
]


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("model_kw", BEAM_MODELS, ids=lambda kw: f"seed{kw['seed']}")
def test_beam_size_one_equals_greedy(model_kw, alpha, make_model, make_tokens) -> None:
    model = make_model(**model_kw)
    src = make_tokens(3, 5, model.config.source_vocab_size, low=1, seed=model_kw["seed"])
    greedy = greedy_decode(model, src, 8, BOS, EOS)
    tokens, scores = beam_search(model, src, 1, 8, BOS, EOS, length_penalty=alpha)
    assert torch.equal(tokens, greedy)
    want = [_normalised_score(model, src[i], greedy[i], EOS, alpha) for i in range(3)]
    assert_close(scores.double(), torch.tensor(want, dtype=torch.float64), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(6))
def test_beam_score_at_least_greedy_score(seed, alpha, make_model, make_tokens) -> None:
    """A wider beam should not do worse, by its own criterion, than the greedy output.

    (Not a theorem: pruning may lose the greedy path. On these tiny models it does not; what
    makes this test fail is a source being declared done, with its live hypotheses dropped,
    as soon as it collects beam_size finished ones, even at the last step, where the docstring
    says open hypotheses are ranked too.)"""
    model = make_model(seed=seed)
    src = make_tokens(3, 5, V, low=3, seed=seed)
    greedy = greedy_decode(model, src, 6, BOS, EOS)
    g = [_normalised_score(model, src[i], greedy[i], EOS, alpha) for i in range(3)]
    for beam_size in (2, 4):
        tokens, scores = beam_search(model, src, beam_size, 6, BOS, EOS, length_penalty=alpha)
        for i in range(3):
            got = _normalised_score(model, src[i], tokens[i], EOS, alpha)
            assert float(scores[i]) == pytest.approx(got, abs=1e-4)  # the score is honest
            assert float(scores[i]) >= g[i] - 1e-4, (
                f"row {i}: beam(k={beam_size}) returned {tokens[i].tolist()} scoring "
                f"{float(scores[i]):.4f}, but greedy's {greedy[i].tolist()} scores {g[i]:.4f}"
            )


def _brute_force(model, src, max_len, alpha, vocab):
    """Every hypothesis (ending at its first EOS, or running max_len tokens without one),
    scored by teacher forcing, best first."""
    others = [t for t in range(vocab) if t != EOS]
    groups = [
        [[BOS, *body, EOS] for body in itertools.product(others, repeat=n - 1)]
        for n in range(1, max_len + 1)
    ]
    groups.append([[BOS, *body] for body in itertools.product(others, repeat=max_len)])
    ranked = []
    for hyps in groups:
        t = torch.tensor(hyps)  # (N, 1 + n): all of one length
        with torch.no_grad():
            logits = model(src[None].expand(len(hyps), -1), t[:, :-1])
        logp = torch.log_softmax(logits.double(), -1).gather(2, t[:, 1:, None]).sum((1, 2))
        n = t.size(1) - 1
        ranked += [(float(lp) / n**alpha, h) for lp, h in zip(logp, hyps, strict=True)]
    return sorted(ranked, reverse=True)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_exhaustive_beam_equals_brute_force(seed, alpha, make_model, make_tokens) -> None:
    """With more beams than hypotheses nothing is pruned: the beam must find the optimum."""
    vocab, max_len = 4, 3
    model = make_model(seed=seed, vocab_size=vocab)
    src = make_tokens(1, 4, vocab, seed=seed)
    ranked = _brute_force(model, src[0], max_len, alpha, vocab)
    assert len(ranked) == 1 + 3 + 9 + 27
    tokens, scores = beam_search(
        model, src, vocab**max_len, max_len, BOS, EOS, length_penalty=alpha
    )
    assert float(scores[0]) == pytest.approx(ranked[0][0], abs=1e-4)
    assert ranked[0][0] - ranked[1][0] > 1e-3  # no near-tie, so the argmax is well defined
    hyp = tokens[0].tolist()[: len(ranked[0][1])]
    assert hyp == ranked[0][1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_length_penalty_zero_ranks_raw_log_prob_and_prefers_short(
    seed, make_model, make_tokens
) -> None:
    """alpha=0 ranks by log p (favouring short outputs), alpha=1 by log p per token: with an
    exhaustive beam the alpha=0 winner is never longer than the alpha=1 winner, and each
    returned score is the teacher-forced log-probability normalised by len**alpha."""
    vocab, max_len = 4, 3
    model = make_model(seed=seed, vocab_size=vocab)
    src = make_tokens(2, 4, vocab, seed=seed)
    k = vocab**max_len
    t0, s0 = beam_search(model, src, k, max_len, BOS, EOS, length_penalty=0.0)
    t1, s1 = beam_search(model, src, k, max_len, BOS, EOS, length_penalty=1.0)

    def length(hyp):
        toks = hyp.tolist()
        return toks.index(EOS, 1) if EOS in toks[1:] else len(toks) - 1

    for i in range(2):
        assert float(s0[i]) == pytest.approx(
            _normalised_score(model, src[i], t0[i], EOS, 0.0), abs=1e-4
        )
        assert float(s1[i]) == pytest.approx(
            _normalised_score(model, src[i], t1[i], EOS, 1.0), abs=1e-4
        )
        assert length(t0[i]) <= length(t1[i])
        # the alpha=0 winner has the higher raw log-probability
        raw1 = _normalised_score(model, src[i], t1[i], EOS, 0.0)
        assert float(s0[i]) >= raw1 - 1e-4


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("model_kw", BEAM_MODELS[:4], ids=lambda kw: f"seed{kw['seed']}")
def test_beam_same_with_and_without_cache(model_kw, beam_size, make_model, make_tokens) -> None:
    model = make_model(**model_kw)
    src = make_tokens(3, 5, model.config.source_vocab_size, low=1, seed=model_kw["seed"])
    src_mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0]], dtype=torch.bool)
    a, sa = beam_search(model, src, beam_size, 7, BOS, EOS, src_mask=src_mask, use_cache=True)
    b, sb = beam_search(model, src, beam_size, 7, BOS, EOS, src_mask=src_mask, use_cache=False)
    assert torch.equal(a, b)
    assert_close(sa, sb, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_batch_equals_each_source_alone(seed, make_model, make_tokens) -> None:
    model = make_model(seed=seed)
    src = make_tokens(3, 5, V, low=1, seed=seed)
    tokens, scores = beam_search(model, src, 3, 7, BOS, EOS)
    pad = EOS  # no pad_id in the config
    for i in range(3):
        alone, score = beam_search(model, src[i : i + 1], 3, 7, BOS, EOS)
        n = alone.size(1)
        assert torch.equal(tokens[i, :n], alone[0])
        assert bool((tokens[i, n:] == pad).all())
        assert_close(scores[i], score[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- GNMT length penalty
def test_length_penalty_forms() -> None:
    lengths = torch.arange(1, 40, dtype=torch.float64)
    for form in ("power", "gnmt"):
        assert torch.all(length_penalty(lengths, 0.0, form) == 1)  # alpha = 0: raw log p
        lp = length_penalty(lengths, 0.6, form)
        assert torch.all(lp[1:] > lp[:-1])  # longer hypotheses get a larger divisor
    assert length_penalty(1, 0.6, "gnmt") == pytest.approx(1.0)
    assert length_penalty(7, 1.0, "gnmt") == pytest.approx(2.0)  # (5 + 7) / 6
    assert length_penalty(7, 0.5, "power") == pytest.approx(7**0.5)
    # the GNMT divisor grows more slowly than the plain power of the length
    assert torch.all(length_penalty(lengths[1:], 0.6, "gnmt") < lengths[1:] ** 0.6)
    with pytest.raises(ValueError, match="form must be one of"):
        length_penalty(3, 0.6, "wu")
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        length_penalty(3, -1.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_gnmt_exhaustive_beam_equals_brute_force(seed, make_model, make_tokens) -> None:
    """Ranked by log p / ((5 + len) / 6)^alpha, an exhaustive beam finds the best hypothesis."""
    vocab, max_len, alpha = 4, 3, 0.6
    model = make_model(seed=seed, vocab_size=vocab)
    src = make_tokens(1, 4, vocab, seed=seed)
    raw = _brute_force(model, src[0], max_len, 0.0, vocab)  # (log p, hyp)
    ranked = sorted(((lp / ((5 + len(h) - 1) / 6) ** alpha, h) for lp, h in raw), reverse=True)
    tokens, scores = beam_search(
        model, src, vocab**max_len, max_len, BOS, EOS, length_penalty=alpha, length_norm="gnmt"
    )
    assert float(scores[0]) == pytest.approx(ranked[0][0], abs=1e-4)
    assert tokens[0].tolist()[: len(ranked[0][1])] == ranked[0][1]
    assert len(ranked[0][1]) > 2  # longer than one token, where both forms divide by 1
    with pytest.raises(ValueError, match="length_norm"):
        beam_search(model, src, 2, max_len, BOS, EOS, length_norm="GNMT")


# ------------------------------------------------------------------ beam search: when to stop
@pytest.mark.parametrize(("alpha", "form"), [(0.0, "power"), (0.6, "gnmt"), (1.0, "power")])
@pytest.mark.parametrize("beam_size", [2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_bound_stopping_returns_what_never_stopping_returns(
    seed, beam_size, alpha, form, make_model, make_tokens
) -> None:
    """stopping="bound" stops a source only when no open hypothesis can still win, so its
    output is the one of running every source to max_len; the K-finished heuristic can only do
    worse by its own score (it sees a prefix of the same search)."""
    model = make_model(seed=seed)
    src = make_tokens(4, 5, V, low=3, seed=seed)

    def run(stopping):
        return beam_search(
            model, src, beam_size, 7, BOS, EOS, alpha, length_norm=form, stopping=stopping
        )

    never_tokens, never_scores = run("never")
    bound_tokens, bound_scores = run("bound")
    heuristic_tokens, heuristic_scores = run("k_finished")
    assert torch.equal(bound_tokens, never_tokens)
    assert_close(bound_scores, never_scores)
    assert bool((heuristic_scores <= never_scores + 1e-6).all()), (heuristic_scores, never_scores)


def test_k_finished_stopping_can_miss_a_longer_winner_when_alpha_is_positive(
    make_model, make_tokens
) -> None:
    """The heuristic is not exact for alpha > 0: over a handful of random models some source
    gets a strictly better hypothesis when the search goes on (what the bound rule finds)."""
    missed = 0
    for seed in range(8):
        model = make_model(seed=seed)
        src = make_tokens(6, 5, V, low=3, seed=seed)
        _, heuristic = beam_search(model, src, 2, 8, BOS, EOS, 1.0, stopping="k_finished")
        _, bound = beam_search(model, src, 2, 8, BOS, EOS, 1.0, stopping="bound")
        missed += int((bound > heuristic + 1e-6).sum())
    assert missed > 0


def test_unknown_stopping_rule_is_named(make_model, make_tokens) -> None:
    model = make_model()
    with pytest.raises(ValueError, match="stopping must be one of"):
        beam_search(model, make_tokens(1, 3, V, low=3), 2, 4, BOS, EOS, stopping="soon")
