"""DeepSeek-V3's multi-head latent attention loaded into the reference (issue 51): random dense
DeepseekV3 models built from small configs (nothing is downloaded), with and without a query
latent, in both RoPE layouts; logits (fp32, atol 1e-5) without and with padding, greedy tokens
against ``model.generate``, the closed-form count against a DeepSeek-V3-shaped model on the
meta device, and what is refused."""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing import assert_close

os.environ.setdefault("HF_HUB_OFFLINE", "1")
tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

from coursepkg import count_parameters  # noqa: E402
from coursepkg.interop import deepseek_v3_config, from_hf_deepseek_v3  # noqa: E402
from coursepkg.params import kv_cache_bytes_per_token  # noqa: E402
from coursepkg.positional import positions_from_mask  # noqa: E402

V = 97
SMALL = dict(
    vocab_size=V, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=12, v_head_dim=10, first_k_dense_replace=2, max_position_embeddings=128,
    eos_token_id=None, bos_token_id=None, pad_token_id=0, attn_implementation="eager",
)  # fmt: skip
CASES = {
    "query_latent_interleaved": dict(q_lora_rank=24, rope_interleave=True),
    "query_projection_halves_tied": dict(
        q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True
    ),
}
IDS = list(CASES)


def _build(fields: dict, seed: int = 0):
    torch.manual_seed(seed)
    hf = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(**{**SMALL, **fields})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    return hf, from_hf_deepseek_v3(hf).eval()


def _tokens(b: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("side", [None, "right", "left"])
@pytest.mark.parametrize("name", IDS)
def test_equal_logits(name, side) -> None:
    hf, lm = _build(CASES[name])
    tokens = _tokens(3, 12)
    ar = torch.arange(12)
    lengths = torch.tensor([12, 9, 4])[:, None]
    mask = {None: ar < 12, "right": ar < lengths, "left": ar >= 12 - lengths}[side]
    mask = mask.expand(3, 12)  # (B, L)
    with torch.no_grad():
        ours = lm(tokens, None if side is None else mask)
        theirs = hf(tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask))
    assert_close(ours[mask], theirs.logits[mask], atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("name", IDS)
def test_same_greedy_tokens_as_generate(name) -> None:
    hf, lm = _build(CASES[name])
    prompt = _tokens(2, 6, seed=3)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24
        )
    assert torch.equal(lm.generate(prompt, 24), theirs)


DEEPSEEK_V3_DENSE = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
    num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=61,
)  # fmt: skip


def test_a_deepseek_v3_shaped_model_counts_and_caches_in_closed_form() -> None:
    hf_config = tf.DeepseekV3Config(**DEEPSEEK_V3_DENSE)
    with torch.device("meta"):
        model = tf.DeepseekV3ForCausalLM(hf_config)
    config = deepseek_v3_config(hf_config)
    assert count_parameters(config, "decoder-only") == sum(p.numel() for p in model.parameters())
    # 61 layers of 512 + 64 numbers in bf16, against 128 heads of (192 + 128) without the latent
    assert kv_cache_bytes_per_token(config, 2) == 61 * (512 + 64) * 2
    full = config.replace(kv_rank=None, q_rank=None, d_rope=0, d_k=192)
    assert kv_cache_bytes_per_token(full, 2) / kv_cache_bytes_per_token(config, 2) > 70


def test_what_the_reference_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="expert layers .* are not supported"):
        deepseek_v3_config(tf.DeepseekV3Config(**{**SMALL, "first_k_dense_replace": 1}))
    with pytest.raises(ValueError, match="rms_norm_eps=1e-05 differs"):
        deepseek_v3_config(tf.DeepseekV3Config(**SMALL, rms_norm_eps=1e-5))
    with pytest.raises(TypeError, match="must be a DeepseekV3ForCausalLM"):
        from_hf_deepseek_v3(torch.nn.Linear(2, 2))
