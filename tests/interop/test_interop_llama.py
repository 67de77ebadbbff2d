"""Today's decoders loaded into the reference (issue 30): randomly initialised Llama, Qwen3 and
Mistral models built from small configs (nothing is downloaded), their weights copied, and the
logits compared (fp32, atol 1e-5) without padding, with right and with left padding; greedy
generation with our KV cache gives the tokens of ``model.generate``; the way back to Llama;
closed-form parameter counts equal Hugging Face's on the meta device at full size."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from coursepkg import TransformerConfig, count_parameters  # noqa: E402
from coursepkg.interop import (  # noqa: E402
    from_hf_llama,
    from_hf_mistral,
    from_hf_qwen3,
    llama_config,
    to_hf_llama,
)
from coursepkg.positional import positions_from_mask  # noqa: E402

V = 97
SMALL = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=0,
    attn_implementation="eager",
)

LLAMAS = {
    "mha_tied": dict(num_key_value_heads=4, tie_word_embeddings=True),
    "gqa2_untied": dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0),
    "mqa_tied": dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=1000.0),
    "gqa2_biases": dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    "head_dim_32": dict(num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5),
}
QWENS = {
    "qwen3_tied": dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    "qwen3_untied_mqa": dict(num_key_value_heads=1, head_dim=16, rope_theta=1e6),
}
MISTRALS = {"mistral_window_5": dict(num_key_value_heads=2, sliding_window=5)}


def _build(family: str, fields: dict, seed: int = 0):
    """A random Hugging Face model (its norms' gains randomised too) and ours from it."""
    cls, cfg, load = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig, from_hf_llama),
        "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config, from_hf_qwen3),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig, from_hf_mistral),
    }[family]
    torch.manual_seed(seed)
    hf = cls(cfg(**{**SMALL, **fields})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
    return hf, load(hf).eval()


CASES = [("llama", k, v) for k, v in LLAMAS.items()]
CASES += [("qwen3", k, v) for k, v in QWENS.items()]
CASES += [("mistral", k, v) for k, v in MISTRALS.items()]
IDS = [c[1] for c in CASES]


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family, name, fields", CASES, ids=IDS)
def test_equal_logits_without_padding(family, name, fields) -> None:
    hf, lm = _build(family, fields)
    tokens = _tokens(3, 12)
    with torch.no_grad():
        assert_close(lm(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("family, name, fields", CASES, ids=IDS)
def test_equal_logits_with_padding(family, name, fields, side) -> None:
    """Rows of 12, 9 and 4 real tokens; Hugging Face gets the attention mask and the position
    ids generate() derives from it (for right padding: the same as its default)."""
    hf, lm = _build(family, fields)
    tokens = _tokens(3, 12)
    lengths = torch.tensor([12, 9, 4])
    ar = torch.arange(12)
    mask = ar < lengths[:, None] if side == "right" else ar >= 12 - lengths[:, None]  # (B, L)
    with torch.no_grad():
        ours = lm(tokens, mask)
        theirs = hf(tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask))
    assert_close(ours[mask], theirs.logits[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family, name, fields", CASES, ids=IDS)
def test_same_greedy_tokens_as_generate(family, name, fields) -> None:
    hf, lm = _build(family, fields)
    prompt = _tokens(2, 6, seed=3)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=64
        )
    ours = lm.generate(prompt, 64)
    assert theirs.shape == (2, 70) and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["mha_tied", "gqa2_untied", "gqa2_biases", "head_dim_32"])
def test_the_way_back_to_llama(name) -> None:
    hf, lm = _build("llama", LLAMAS[name])
    back = to_hf_llama(lm, attn_implementation="eager").eval()
    tokens = _tokens(2, 10)
    with torch.no_grad():
        assert_close(back(tokens).logits, hf(tokens).logits, atol=1e-5, rtol=1e-5)
    assert back.config.num_key_value_heads == hf.config.num_key_value_heads
    assert (back.lm_head.weight is back.model.embed_tokens.weight) is lm.config.tie_embeddings


def test_what_the_reference_cannot_do_is_refused() -> None:
    c = tf.LlamaConfig(**SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        llama_config(c)
    with pytest.raises(ValueError, match="attention_bias=True and mlp_bias=False differ"):
        llama_config(tf.LlamaConfig(**SMALL, attention_bias=True))
    q = tf.Qwen3Config(**SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="sliding-window layers"):
        llama_config(q, "Qwen3")
    with pytest.raises(TypeError, match="must be a LlamaForCausalLM"):
        from_hf_llama(tf.Qwen3ForCausalLM(tf.Qwen3Config(**SMALL)))
    _, mistral = _build("mistral", MISTRALS["mistral_window_5"])
    with pytest.raises(ValueError, match="not Llama shaped"):
        to_hf_llama(mistral)


def _meta_count(cls, config) -> int:
    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.parameters())  # tied matrices are counted once


LLAMA_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    tie_word_embeddings=True,
    rope_theta=5e5,
)
QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=1e6,
)


@pytest.mark.parametrize(
    "cls_name, cfg_name, fields, family, expected",
    [
        ("LlamaForCausalLM", "LlamaConfig", LLAMA_1B, "Llama", 1_235_814_400),
        ("Qwen3ForCausalLM", "Qwen3Config", QWEN3_06B, "Qwen3", 596_049_920),
    ],
    ids=["llama_3.2_1b", "qwen3_0.6b"],
)
def test_closed_form_counts_equal_hugging_faces(cls_name, cfg_name, fields, family, expected):
    hf_config = getattr(tf, cfg_name)(**fields)
    ours: TransformerConfig = llama_config(hf_config, family)
    assert count_parameters(ours, "decoder-only") == expected
    assert _meta_count(getattr(tf, cls_name), hf_config) == expected
