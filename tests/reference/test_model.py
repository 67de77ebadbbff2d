"""The models: shapes over several configurations, weight sharing and tying, dtypes, masks
(explicit == derived from pad_id), padding invariance and causal invariance."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from coursepkg import Decoder, DecoderOnlyLM, Encoder, EncoderDecoder, EncoderLayer, Transformer
from coursepkg.layers import LayerNorm

V = 11  # the tiny vocabulary (conftest.TINY)

CONFIGS = {
    "default": {},
    "learned": dict(positional="learned"),
    "separate_vocab": dict(src_vocab_size=13, share_embeddings=False),
    "unshared_same_vocab": dict(share_embeddings=False),
    "untied": dict(tie_embeddings=False),
    "untied_separate": dict(tie_embeddings=False, src_vocab_size=7, share_embeddings=False),
    "pre_ln": dict(norm_first=True),
    "layers_1_3": dict(n_layers=1, n_decoder_layers=3),
    "dk_dv": dict(n_heads=3, d_k=3, d_v=5),
    "no_bias_gelu": dict(bias=False, activation="gelu"),
    "post_ln_final_norm": dict(final_norm=True),
}


def _lengths_mask(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n)


@pytest.mark.parametrize(("b", "s", "t"), [(1, 1, 1), (3, 7, 5), (2, 4, 9)])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_transformer_output_shape(name, b, s, t, make_model, make_tokens) -> None:
    model = make_model(**CONFIGS[name])
    cfg = model.config
    src = make_tokens(b, s, cfg.source_vocab_size)
    tgt = make_tokens(b, t, cfg.vocab_size, seed=2)
    logits = model(src, tgt)
    assert logits.shape == (b, t, cfg.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sharing_and_tying(name, make_model) -> None:
    model = make_model(**CONFIGS[name])
    cfg = model.config
    assert (model.src_embed is model.tgt_embed) is cfg.share_embeddings
    assert model.src_embed.weight.shape == (cfg.source_vocab_size, cfg.d_model)
    assert model.tgt_embed.weight.shape == (cfg.vocab_size, cfg.d_model)
    assert model.lm_head.weight.shape == (cfg.vocab_size, cfg.d_model)
    assert model.lm_head.bias is None
    assert (model.lm_head.weight is model.tgt_embed.weight) is cfg.tie_embeddings
    assert len(model.encoder.layers) == cfg.n_layers
    assert len(model.decoder.layers) == cfg.decoder_layers
    assert (model.encoder.norm is not None) is cfg.use_final_norm
    assert (model.decoder.norm is not None) is cfg.use_final_norm
    n_distinct = len({id(p) for p in model.parameters()})
    assert n_distinct == len(list(model.parameters()))  # parameters() lists a tied matrix once


def test_tied_head_trains_the_embedding(make_model, make_tokens) -> None:
    model = make_model(tie_embeddings=True).train()
    src, tgt = make_tokens(2, 4, V), make_tokens(2, 3, V, seed=2)
    model(src, tgt).sum().backward()
    emb = model.tgt_embed.weight
    assert emb.grad is not None and model.lm_head.weight.grad is emb.grad
    # every row gets a gradient through the output projection, used or not as an input
    assert bool((emb.grad.abs().sum(-1) > 0).all())


def test_embeddings_are_scaled_by_sqrt_d(make_model, make_tokens) -> None:
    model = make_model()
    tokens = make_tokens(2, 5, V)
    d = model.config.d_model
    assert_close(model.src_embed(tokens), model.src_embed.weight[tokens] * math.sqrt(d))


@pytest.mark.parametrize("kind", ["encoder-decoder", "decoder-only"])
def test_dtype_follows_the_model(kind, make_model, make_tokens) -> None:
    m32 = make_model(kind=kind)
    m64 = make_model(kind=kind, dtype=torch.float64)
    src, tgt = make_tokens(2, 5, V), make_tokens(2, 4, V, seed=2)
    args = (src, tgt) if kind == "encoder-decoder" else (tgt,)
    out64 = m64(*args)
    assert out64.dtype == torch.float64
    assert_close(out64.float(), m32(*args), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["default", "pre_ln", "separate_vocab"])
def test_pad_id_masks_equal_explicit_masks(name, make_model) -> None:
    overrides = CONFIGS[name]
    with_pad = make_model(pad_id=0, **overrides)
    without_pad = make_model(**overrides)  # same seed: the same weights
    src = torch.tensor([[3, 4, 5, 6, 7], [5, 6, 2, 0, 0], [8, 0, 0, 0, 0]])
    tgt = torch.tensor([[1, 3, 4, 0], [1, 5, 0, 0], [1, 2, 3, 4]])
    src_mask, tgt_mask = src != 0, tgt != 0
    want = with_pad(src, tgt, src_mask, tgt_mask)
    assert_close(with_pad(src, tgt), want)
    assert_close(without_pad(src, tgt, src_mask, tgt_mask), want)
    # and the masks matter: ignoring the padding changes the logits
    assert not torch.allclose(without_pad(src, tgt)[1, :2], want[1, :2])


@pytest.mark.parametrize("kind", ["encoder-decoder", "decoder-only"])
def test_train_with_zero_dropout_equals_eval_and_eval_is_deterministic(
    kind, make_model, make_tokens
) -> None:
    model = make_model(kind=kind)
    src, tgt = make_tokens(2, 5, V), make_tokens(2, 4, V, seed=2)
    args = (src, tgt) if kind == "encoder-decoder" else (tgt,)
    ev = model(*args)
    assert torch.equal(model(*args), ev)
    assert_close(model.train()(*args), ev)
    dropped = make_model(kind=kind, dropout=0.3).train()
    assert not torch.allclose(dropped(*args), dropped(*args))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_padding_invariance(norm_first, tiny_config) -> None:
    enc = Encoder(tiny_config(norm_first=norm_first)).eval()
    x = torch.randn(3, 6, 16)
    mask = _lengths_mask([6, 4, 1], 6)
    out = enc(x, mask)
    x2 = torch.where(mask[..., None], x, 30 * torch.randn_like(x))  # new padded embeddings
    assert_close(enc(x2, mask)[mask], out[mask])
    assert not torch.allclose(enc(x2)[mask], out[mask])  # without the mask they leak in


@pytest.mark.parametrize("name", ["default", "pre_ln", "learned", "separate_vocab"])
def test_transformer_source_padding_invariance(name, make_model) -> None:
    model = make_model(**CONFIGS[name])
    vs = model.config.source_vocab_size
    src = torch.randint(0, vs, (3, 6))
    tgt = torch.randint(0, V, (3, 4))
    src_mask = _lengths_mask([6, 3, 1], 6)
    out = model(src, tgt, src_mask)
    src2 = torch.where(src_mask, src, torch.randint(0, vs, src.shape))
    assert not torch.equal(src2, src)
    assert_close(model(src2, tgt, src_mask), out)


@pytest.mark.parametrize("name", ["default", "pre_ln", "learned"])
def test_padded_batch_equals_each_sentence_alone(name, make_model) -> None:
    """Right padding of source and target changes nothing at the real target positions."""
    model = make_model(pad_id=0, **CONFIGS[name])
    srcs = [[3, 4, 5, 6, 7], [5, 6, 2], [8]]
    tgts = [[1, 3, 4], [1, 5, 9, 2], [1]]
    src = torch.tensor([s + [0] * (5 - len(s)) for s in srcs])
    tgt = torch.tensor([t + [0] * (4 - len(t)) for t in tgts])
    batch = model(src, tgt)
    for i, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        alone = model(torch.tensor([s]), torch.tensor([t]))[0]
        assert_close(batch[i, : len(t)], alone)


@pytest.mark.parametrize("name", ["default", "pre_ln", "learned", "layers_1_3"])
def test_transformer_causal_invariance(name, make_model, make_tokens) -> None:
    model = make_model(**CONFIGS[name])
    src, tgt = make_tokens(2, 5, V), make_tokens(2, 6, V, seed=2)
    out = model(src, tgt)
    for i in range(5):
        tgt2 = tgt.clone()
        tgt2[:, i + 1 :] = make_tokens(2, 5 - i, V, seed=10 + i)
        out2 = model(src, tgt2)
        assert_close(out2[:, : i + 1], out[:, : i + 1])
    assert not torch.allclose(out2[:, 1:], out[:, 1:])  # the changed positions did change


@pytest.mark.parametrize("name", ["default", "pre_ln", "learned"])
def test_decoder_only_causal_invariance(name, make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only", **CONFIGS[name])
    tokens = make_tokens(2, 7, V)
    out = model(tokens)
    for i in range(6):
        t2 = tokens.clone()
        t2[:, i + 1 :] = make_tokens(2, 6 - i, V, seed=20 + i)
        assert_close(model(t2)[:, : i + 1], out[:, : i + 1])


def test_encode_decode_compose_to_forward(make_model, make_tokens) -> None:
    model = make_model(pad_id=0)
    src, tgt = make_tokens(2, 5, V, low=1), make_tokens(2, 4, V, seed=2, low=1)
    src[1, 3:] = 0
    src_mask = model.source_mask(src)
    assert torch.equal(src_mask, src != 0)
    memory = model.encode(src)
    assert memory.shape == (2, 5, 16)
    assert_close(model.decode(tgt, memory, src_mask), model(src, tgt))


def test_encoder_decoder_stack_matches_transformer_pieces(make_model, make_tokens) -> None:
    model = make_model(positional="learned")
    stack = EncoderDecoder(model.config)
    stack.encoder.load_state_dict(model.encoder.state_dict())
    stack.decoder.load_state_dict(model.decoder.state_dict())
    stack.eval()
    assert isinstance(stack.decoder, Decoder)
    src, tgt = make_tokens(2, 5, V), make_tokens(2, 3, V, seed=2)
    src_emb = model.positions(model.src_embed(src))
    tgt_emb = model.positions(model.tgt_embed(tgt))
    assert_close(model.lm_head(stack(src_emb, tgt_emb)), model(src, tgt))


@pytest.mark.parametrize("name", ["default", "learned", "untied_separate", "pre_ln"])
def test_gradients_reach_every_parameter(name, make_model, make_tokens) -> None:
    model = make_model(**CONFIGS[name]).train()
    src = make_tokens(2, 5, model.config.source_vocab_size)
    tgt = make_tokens(2, 4, V, seed=2)
    (model(src, tgt) * torch.randn(2, 4, V)).sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


# ------------------------------------------------------------------------------ DecoderOnlyLM
@pytest.mark.parametrize("name", ["default", "untied", "pre_ln", "learned", "dk_dv"])
def test_decoder_only_structure_and_shape(name, make_model, make_tokens) -> None:
    model = make_model(kind="decoder-only", **CONFIGS[name])
    cfg = model.config
    assert isinstance(model, DecoderOnlyLM)
    assert all(isinstance(layer, EncoderLayer) for layer in model.layers)
    assert len(model.layers) == cfg.n_layers
    assert (model.lm_head.weight is model.embed.weight) is cfg.tie_embeddings
    assert isinstance(model.norm, LayerNorm) if cfg.use_final_norm else model.norm is None
    for b, t in [(1, 1), (3, 7)]:
        assert model(make_tokens(b, t, V)).shape == (b, t, V)


def test_decoder_only_left_padding_gives_no_nan(make_model) -> None:
    """A left-padded row has queries that see no key at all: zeros inside, never NaN."""
    model = make_model(kind="decoder-only", pad_id=0)
    tokens = torch.tensor([[0, 0, 3, 4, 5], [2, 3, 4, 5, 6]])
    logits = model(tokens)
    assert torch.isfinite(logits).all()
    right = model(torch.tensor([[3, 4, 5, 0, 0]]))
    assert_close(right[0, :3], model(torch.tensor([[3, 4, 5]]))[0])


def test_transformer_accepts_no_pad_id_and_no_masks(make_model, make_tokens) -> None:
    model = make_model()
    assert model.source_mask(make_tokens(2, 3, V)) is None
    assert isinstance(model, Transformer)


# ------------------------------------------------------------------------------ package layout
def _package_imports() -> dict[str, set[str]]:
    """Each coursepkg module (outside grading/) and the coursepkg modules it imports, counting
    imports under ``if TYPE_CHECKING:`` too."""
    import ast
    from pathlib import Path

    root = Path(__import__("coursepkg").__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] in ("grading", "stubs"):
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
                deps.add(target)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("coursepkg"):
                deps.add(node.module.removeprefix("coursepkg").lstrip("."))
        graph[name] = {d for d in deps if d != name}
    return graph


def test_the_model_modules_have_no_import_cycle() -> None:
    graph = _package_imports()
    assert {"attention", "kv_cache", "layers", "model", "decoding"} <= set(graph)
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in graph.get(node, ()):
            if dep not in graph or dep == "":
                continue
            assert state.get(dep) != "open", f"import cycle: {' -> '.join([*path, dep])}"
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # The cache sits below attention; attention and the layers know nothing of generation.
    assert "decoding" not in graph["attention"] | graph["layers"] | graph["model"]
    assert graph["kv_cache"] == set()


def test_inputs_are_checked_once_per_forward(monkeypatch, make_model, make_tokens) -> None:
    """Transformer.forward checks its token masks once each, not once per stack (it did 4x)."""
    import coursepkg.model as model_module

    calls: list[str] = []
    real = model_module.check_token_mask

    def counting(name, mask, shape):
        calls.append(name)
        return real(name, mask, shape)

    monkeypatch.setattr(model_module, "check_token_mask", counting)
    model = make_model(norm_first=False, positional="sinusoidal")
    src, tgt = make_tokens(2, 5, 11), make_tokens(2, 4, 11, seed=1)
    src_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with torch.no_grad():
        model(src, tgt, src_mask, torch.ones(2, 4, dtype=torch.bool))
    assert sorted(calls) == ["src_mask", "tgt_mask"]


def test_generate_returns_an_ordinary_tensor(make_model, make_tokens) -> None:
    """generate() runs in inference mode inside, but its output can feed a training step."""
    model = make_model(kind="decoder-only", norm_first=True, positional="learned")
    out = model.generate(make_tokens(2, 3, 11), 4)
    assert not out.is_inference()
    model.train()
    model(out).sum().backward()  # the embedding saves the ids for backward
    assert model.embed.weight.grad is not None


@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
def test_decoder_only_attn_mask_takes_the_place_of_the_causal_mask(
    make_model, make_tokens, positional
):
    from coursepkg.masks import causal_mask

    model = make_model(kind="decoder-only", positional=positional)
    tokens = make_tokens(2, 7, model.config.vocab_size, low=1)  # (B, L)
    causal = causal_mask(7, 7).expand(2, 1, 7, 7)  # (B, 1, L, L)
    torch.testing.assert_close(model(tokens, attn_mask=causal), model(tokens), rtol=0, atol=0)
    # A block-diagonal mask (two documents): the second one's logits do not see the first.
    blocks = causal.clone()
    blocks[..., 4:, :4] = False
    alone = model(tokens[:, :4])  # (B, 4, V)
    torch.testing.assert_close(model(tokens, attn_mask=blocks)[:, :4], alone)
    changed = tokens.clone()
    changed[:, :4] = (changed[:, :4] % (model.config.vocab_size - 1)) + 1
    out, other = model(tokens, attn_mask=blocks), model(changed, attn_mask=blocks)
    torch.testing.assert_close(out[:, 4:], other[:, 4:])
    assert not torch.allclose(out[:, :4], other[:, :4])


def test_decoder_only_attn_mask_with_a_cache_counts_the_cached_keys(make_model, make_tokens):
    """With a cache, attn_mask's last axis is every key the step sees: the causal mask given
    explicitly (with the positions) is the default step; a mask of the new keys only is named."""
    from coursepkg.masks import causal_mask

    model = make_model(kind="decoder-only", positional="rope")
    tokens = make_tokens(2, 9, model.config.vocab_size, low=1)  # (B, L)
    given, default = model.new_cache(), model.new_cache()
    for cache in (given, default):
        model(tokens[:, :5], cache=cache)  # the same 5 positions cached in both
    new = tokens[:, 5:]  # (B, 4)
    out = model(new, cache=given, positions=torch.arange(5, 9), attn_mask=causal_mask(4, 9))
    torch.testing.assert_close(out, model(new, cache=default), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(L, S\)=\(4, 13\)"):
        model(new, cache=given, attn_mask=causal_mask(4, 4))


def test_decoder_only_attn_mask_bad_input_is_named(make_model, make_tokens):
    model = make_model(kind="decoder-only")
    tokens = make_tokens(2, 5, model.config.vocab_size, low=1)  # (B, L)
    with pytest.raises(ValueError, match="attn_mask must be bool"):
        model(tokens, attn_mask=torch.ones(2, 1, 5, 5))
    with pytest.raises(ValueError, match="attn_mask must be bool"):
        model(tokens, attn_mask=torch.ones(2, 1, 5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="give attn_mask without token_mask"):
        model(tokens, token_mask=tokens > 0, attn_mask=torch.ones(5, 5, dtype=torch.bool))
