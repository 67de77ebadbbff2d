"""GPT-2's tokenizer three ways, shared by the tokenizer's tests: ours from the shipped files, and
Hugging Face ``tokenizers`` and ``tiktoken`` built offline from the same files."""

from __future__ import annotations

from importlib import resources

import pytest

from coursepkg.tokenizer import GPT2_PATTERN, Tokenizer

EOT = "<|endoftext|>"
GPT2_DIR = resources.files("coursepkg") / "data" / "gpt2"


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    return Tokenizer.gpt2()


@pytest.fixture(scope="module")
def hf_gpt2():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    with (
        resources.as_file(GPT2_DIR / "vocab.json") as vocab,
        resources.as_file(GPT2_DIR / "merges.txt") as merges,
    ):
        tok = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    return tok


@pytest.fixture(scope="module")
def tiktoken_gpt2(gpt2: Tokenizer):
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {token: index for index, token in gpt2.vocab.items() if index != 50256}
    return tiktoken.Encoding(
        name="gpt2-offline",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT: 50256},
    )
