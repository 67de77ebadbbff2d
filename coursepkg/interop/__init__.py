"""Weight transfer between the reference models and public implementations.

- :func:`from_torch_transformer`: ``torch.nn.Transformer`` -> the encoder-decoder stack.
- :func:`from_hf_gpt2`, :func:`from_hf_bert`, :func:`from_hf_marian`: Hugging Face GPT-2,
  BERT and Marian (OPUS-MT) -> :class:`~coursepkg.DecoderOnlyLM`,
  :class:`~coursepkg.EncoderOnlyLM`, :class:`~coursepkg.Transformer`; :func:`to_hf_gpt2` goes
  back. These need the optional extra: ``pip install 'coursepkg[interop]'``.
- :func:`from_hf_llama`, :func:`from_hf_qwen3`, :func:`from_hf_mistral`: today's decoders
  (RoPE, RMSNorm, SwiGLU, grouped-query attention) -> :class:`~coursepkg.DecoderOnlyLM`;
  :func:`to_hf_llama` goes back (same optional extra).
- :func:`from_hf_mixtral`, :func:`from_hf_qwen3_moe`: the mixtures of experts ->
  :class:`~coursepkg.DecoderOnlyLM` with a ``moe`` group; :func:`to_hf_mixtral` and
  :func:`to_hf_qwen3_moe` go back.
- :func:`from_hf_deepseek_v3`: DeepSeek-V3's latent attention and its sigmoid-routed experts
  -> :class:`~coursepkg.DecoderOnlyLM` with a ``latent`` group and ``moe.router="sigmoid"``;
  :func:`to_hf_deepseek_v3` goes back.
"""

from .deepseek import deepseek_v3_config, from_hf_deepseek_v3, to_hf_deepseek_v3
from .hf import (
    bert_config,
    from_hf_bert,
    from_hf_gpt2,
    from_hf_marian,
    gpt2_config,
    marian_config,
    marian_en_de_hf_config,
    to_hf_gpt2,
)
from .llama import (
    from_hf_llama,
    from_hf_mistral,
    from_hf_mixtral,
    from_hf_qwen3,
    from_hf_qwen3_moe,
    llama_config,
    to_hf_llama,
    to_hf_mixtral,
    to_hf_qwen3_moe,
)
from .torch_nn import from_torch_transformer

__all__ = [
    "bert_config",
    "deepseek_v3_config",
    "from_hf_bert",
    "from_hf_deepseek_v3",
    "from_hf_gpt2",
    "from_hf_llama",
    "from_hf_marian",
    "from_hf_mistral",
    "from_hf_mixtral",
    "from_hf_qwen3",
    "from_hf_qwen3_moe",
    "from_torch_transformer",
    "gpt2_config",
    "llama_config",
    "marian_config",
    "marian_en_de_hf_config",
    "to_hf_deepseek_v3",
    "to_hf_gpt2",
    "to_hf_llama",
    "to_hf_mixtral",
    "to_hf_qwen3_moe",
]
