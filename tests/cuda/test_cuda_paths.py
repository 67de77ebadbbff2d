"""The package's paths on an accelerator give what they give on CPU.

Every test builds its module on CPU from a seed, copies it to the device under test with
``.to(device)`` and compares the two runs: outputs, gradients, tokens, losses, checkpoints. The
device is ``COURSE_TEST_DEVICE`` (default ``cuda``); the module skips, with the reason, when that
device is not available. ``COURSE_TEST_DEVICE=cpu`` runs it CPU against CPU, which is how it is
debugged without a GPU (``scripts/device_check.sh`` runs it on the GPU machine).

Tolerances, stated once (fp32, TF32 switched off below):
- forward outputs and gradients: relative 1e-4, absolute 1e-5 (:data:`FP32`): the devices sum
  in other orders, and CUDA's ``index_add_`` (the experts' outputs) adds in no fixed order;
- tokens (greedy, cached or not, speculative, batched), routes, quantized codes: exact, after
  checking that the CPU run's top-2 logit margin exceeds :data:`MARGIN`, far above the
  devices' rounding differences;
- fp16/bf16 tiled attention against the fp32 reference: absolute 1e-2 / 4e-2 (:data:`HALF`);
- the course's DDP, bucketed DDP, ZeRO-1 and FSDP on one nccl rank against plain AdamW on the
  same device: relative 1e-5, absolute 1e-6;
- training: the trainer autocasts to bf16 on CUDA (``training/lifecycle.py``), so the first step's
  loss agrees to relative 2e-2 (:data:`BF16_LOSS`) with CPU's fp32 run and the next ones to
  5e-2; exactly on CPU. ``coursepkg finetune`` shares that lifecycle (autocast included):
  SFT and DPO likewise, GRPO only checked finite (it samples from the device's own stream).
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from model_shapes import LLAMA_STYLE
from torch.testing import assert_close

from coursepkg import (
    DecoderOnlyLM,
    EncoderOnlyLM,
    LatentConfig,
    MoEConfig,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    beam_search,
    causal_mask,
    greedy_decode,
    scaled_dot_product_attention,
)
from coursepkg.data.text import load_tinyshakespeare
from coursepkg.efficient_attention import linear_attention, tiled_attention
from coursepkg.fast_attention import FastMultiHeadAttention
from coursepkg.layers import RMSNorm
from coursepkg.mla import MultiHeadLatentAttention
from coursepkg.moe import MoEFeedForward
from coursepkg.parallel import FSDP, BucketedDDP, NaiveDDP, ShardedOptimizer
from coursepkg.parallel.checkpointing import checkpoint_blocks
from coursepkg.parallel.compare import Run
from coursepkg.positional import RopeAngles, rope_frequencies
from coursepkg.posttrain import (
    add_lora,
    dpo_loss,
    group_advantages,
    grpo_loss,
    merge_lora,
    sft_loss,
)
from coursepkg.posttrain.dpo import response_logprobs
from coursepkg.posttrain.trainer import FinetuneSettings, finetune
from coursepkg.serving import (
    ContinuousBatcher,
    Request,
    SamplingParams,
    process_logits,
    quantize_linears,
    serve_one_at_a_time,
    serve_static_batches,
    speculative_generate,
)
from coursepkg.serving import generate as serve_generate
from coursepkg.serving.packed import PackedBatcher
from coursepkg.training import TrainSettings, train
from coursepkg.training.checkpoint import load_checkpoint
from coursepkg.training.lifecycle import CHECKPOINT

NAME = os.environ.get("COURSE_TEST_DEVICE", "cuda")


def _why_not(name: str) -> str | None:
    """None when ``name`` can run here, else the reason it cannot."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        return f"COURSE_TEST_DEVICE={name!r} is not a torch device: {error}"
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"COURSE_TEST_DEVICE={name!r}, but PyTorch sees no CUDA device"
    if device.type not in ("cpu", "cuda"):
        return f"COURSE_TEST_DEVICE={name!r}: only cpu and cuda are compared here"
    return None


REASON = _why_not(NAME)
DEV = torch.device(NAME if REASON is None else "cpu")
CUDA = DEV.type == "cuda"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

# fp32 must mean fp32 on the GPU too (PyTorch's default already, stated here so nothing flips it).
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

FP32 = dict(rtol=1e-4, atol=1e-5)
MARGIN = 1e-3
HALF = {torch.float16: 1e-2, torch.bfloat16: 4e-2}
BF16_LOSS = 2e-2 if CUDA else 0.0

BASE = dict(vocab_size=23, d_model=32, n_heads=4, d_ff=48, n_layers=2, dropout=0.0, max_len=64)
MODERN = dict(
    **LLAMA_STYLE,
    n_kv_heads=2,
    qk_norm=True,
)
MLA = dict(
    MODERN, n_kv_heads=None, qk_norm=False, d_k=6, d_v=5, latent=LatentConfig(kv_rank=12, d_rope=4)
)


def _on_device(module: torch.nn.Module) -> torch.nn.Module:
    """The same weights on the device under test (the CPU module is left where it is)."""
    return copy.deepcopy(module).to(DEV)


def _same(on_dev: torch.Tensor, on_cpu: torch.Tensor, **tol) -> None:
    """``on_dev`` lives on the device, has ``on_cpu``'s dtype, and equals it within ``tol``."""
    assert on_dev.device.type == DEV.type, f"expected a {DEV.type} tensor, got {on_dev.device}"
    assert on_dev.dtype == on_cpu.dtype, f"dtype {on_dev.dtype} on {DEV}, {on_cpu.dtype} on CPU"
    assert_close(on_dev.cpu(), on_cpu, **(tol or FP32))


def _tokens(batch: int, length: int, vocab: int = 23, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=g)  # (B, L)


def _lm(seed: int = 0, **fields) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    return DecoderOnlyLM(TransformerConfig(**{**BASE, **fields})).eval()


# ---------------------------------------------------------------- reference models

MODELS = {
    "transformer": (Transformer, {}),
    "gpt": (DecoderOnlyLM, dict(norm_first=True, positional="learned")),
    "modern": (DecoderOnlyLM, MODERN),
    "sliding": (DecoderOnlyLM, dict(MODERN, sliding_window=5)),
    "bert": (EncoderOnlyLM, dict(activation="gelu", positional="learned")),
    "latent": (DecoderOnlyLM, MLA),
    "experts": (DecoderOnlyLM, dict(MODERN, moe=MoEConfig(n_experts=4, top_k=2, d_ff=16))),
}


def _run(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    if isinstance(model, Transformer):
        return model(tokens, tokens.roll(1, dims=1))  # (B, L, V)
    return model(tokens)  # (B, L, V)


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_logits_and_gradients_equal_cpus(name):
    cls, fields = MODELS[name]
    torch.manual_seed(0)
    cpu = cls(TransformerConfig(**{**BASE, **fields})).eval()
    dev = _on_device(cpu)
    tokens = _tokens(3, 11)
    outs = []
    for model, x in ((cpu, tokens), (dev, tokens.to(DEV))):
        logits = _run(model, x)  # (B, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), x.roll(-1, dims=1).flatten())
        loss.backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (cpu_logits, cpu_grads), (dev_logits, dev_grads) = outs
    _same(dev_logits, cpu_logits)
    assert dev_grads.keys() == cpu_grads.keys()
    for key, grad in cpu_grads.items():
        if grad is None:
            assert dev_grads[key] is None, key
        else:
            _same(dev_grads[key], grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "n_kv, qk_norm, rope", [(4, False, False), (2, True, True), (1, True, False)]
)
def test_the_fast_attention_equals_the_plain_one_on_the_device(n_kv, qk_norm, rope):
    torch.manual_seed(0)
    norm = (lambda d: RMSNorm(d, eps=1e-6)) if qk_norm else None
    plain = MultiHeadAttention(32, 4, 8, 8, n_kv_heads=n_kv, qk_norm=norm).to(DEV).eval()
    fast = FastMultiHeadAttention(32, 4, 8, 8, n_kv_heads=n_kv, qk_norm=norm).to(DEV).eval()
    fast.load_state_dict(plain.state_dict())
    x = torch.randn(2, 9, 32).to(DEV).requires_grad_()  # (B, L, D)
    angles = RopeAngles(torch.arange(9, device=DEV), rope_frequencies(8).to(DEV)) if rope else None
    mask = causal_mask(9, 9, device=DEV)
    got = fast(x, x, x, mask=mask, rope=angles)  # (B, L, D)
    want = plain(x, x, x, mask=mask, rope=angles)  # (B, L, D)
    assert got.device.type == DEV.type
    assert_close(got, want, **FP32)
    grad = torch.randn_like(got)
    for a, b in zip(
        torch.autograd.grad(got, x, grad), torch.autograd.grad(want, x, grad), strict=True
    ):
        assert_close(a, b, **FP32)


def _margin(model: DecoderOnlyLM, seq: torch.Tensor, prompt_len: int) -> float:
    """The smallest top-1 minus top-2 logit over the greedy choices of ``seq`` (CPU run)."""
    logits = model(seq[:, :-1])[:, prompt_len - 1 :]  # (B, new, V)
    top = logits.topk(2, dim=-1).values  # (B, new, 2)
    return float((top[..., 0] - top[..., 1]).min())


@pytest.mark.parametrize("name", ["gpt", "modern", "sliding", "latent", "experts"])
def test_greedy_generation_equals_cpus_with_and_without_the_cache(name):
    _, fields = MODELS[name]
    cpu = _lm(**fields)
    dev = _on_device(cpu)
    prompt = _tokens(2, 4)
    want = cpu.generate(prompt, 12)
    with torch.no_grad():
        assert _margin(cpu, want, 4) > MARGIN, "the seed gives a near tie: pick another"
    for use_cache in (True, False):
        got = dev.generate(prompt.to(DEV), 12, use_cache=use_cache)
        assert got.device.type == DEV.type and got.dtype == torch.long
        assert torch.equal(got.cpu(), want), f"use_cache={use_cache}"


def test_greedy_decoding_and_beam_search_of_the_encoder_decoder_equal_cpus():
    torch.manual_seed(0)
    cpu = Transformer(TransformerConfig(**BASE)).eval()
    dev = _on_device(cpu)
    src = _tokens(3, 7)
    with torch.no_grad():
        want = greedy_decode(cpu, src, 10, bos_id=1, eos_id=2)
        for use_cache in (True, False):
            got = greedy_decode(dev, src.to(DEV), 10, bos_id=1, eos_id=2, use_cache=use_cache)
            assert got.device.type == DEV.type
            assert torch.equal(got.cpu(), want)
        beams, scores = beam_search(cpu, src, 3, 10, bos_id=1, eos_id=2)
        got_beams, got_scores = beam_search(dev, src.to(DEV), 3, 10, bos_id=1, eos_id=2)
    assert torch.equal(got_beams.cpu(), beams)
    _same(got_scores, scores)


# ---------------------------------------------------------------- attention at length


def _qkv(dtype=torch.float32, length=130, keys=150, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, length, 16), (2, 3, keys, 16), (2, 3, keys, 8)]
    return [torch.randn(s, generator=g).to(DEV, dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("kind", ["none", "mask", "causal", "window"])
def test_tiled_attention_equals_plain_attention_on_the_device(kind):
    q, k, v = _qkv()
    mask = causal_mask(130, 150, device=DEV, window=None if kind != "window" else 20)
    options = dict(mask=mask) if kind == "mask" else {}
    if kind == "causal":
        options = dict(causal=True)
    if kind == "window":
        options = dict(causal=True, window=20)
    got = tiled_attention(q, k, v, block=(32, 24), **options)  # (B, H, L, Dv)
    want, _ = scaled_dot_product_attention(q, k, v, mask=None if kind == "none" else mask)
    assert got.device.type == DEV.type and got.dtype == torch.float32
    assert_close(got, want, **FP32)
    grad = torch.randn_like(got)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), grad),
        torch.autograd.grad(want, (q, k, v), grad),
        strict=True,
    ):
        assert_close(a, b, rtol=1e-4, atol=5e-5)
    cpu = tiled_attention(*(t.detach().cpu() for t in (q, k, v)), block=(32, 24), **_cpu(options))
    _same(got.detach(), cpu)


def _cpu(options: dict) -> dict:
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in options.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiled_attention_in_half_precision_stays_near_fp32(dtype):
    q, k, v = _qkv(dtype)
    got = tiled_attention(q, k, v, block=32, causal=True)  # (B, H, L, Dv)
    assert got.dtype == dtype and got.device.type == DEV.type
    full = [t.detach().float() for t in (q, k, v)]
    want, _ = scaled_dot_product_attention(*full, mask=causal_mask(130, 150, device=DEV))
    assert_close(got.float(), want, rtol=0, atol=HALF[dtype])


def test_linear_attention_equals_cpus():
    q, k, v = (t.detach() for t in _qkv(length=40, keys=40))
    for causal in (False, True):
        got = linear_attention(q, k, v, causal=causal)  # (B, H, L, Dv)
        _same(got, linear_attention(q.cpu(), k.cpu(), v.cpu(), causal=causal))


# ---------------------------------------------------------------- experts and latent attention


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_mixture_of_experts_forward_equals_cpus(router):
    moe = dict(n_experts=8, top_k=2, d_ff=16, shared_experts=1)
    if router == "sigmoid":
        moe.update(router="sigmoid", groups=4, top_groups=2, top_k=3)
    config = TransformerConfig(**{**BASE, **MODERN}, moe=MoEConfig(**moe))
    torch.manual_seed(0)
    cpu = MoEFeedForward.from_block(config.block(0)).eval()
    dev = _on_device(cpu)
    x = torch.randn(3, 10, 32)  # (B, L, D)
    with torch.no_grad():
        want = cpu(x)
        got = dev(x.to(DEV))
    _same(got, want)
    assert torch.equal(dev.routing.experts.cpu(), cpu.routing.experts)


def test_latent_attention_forward_equals_cpus():
    torch.manual_seed(0)
    cpu = MultiHeadLatentAttention(32, 4, kv_rank=8, d_nope=6, d_rope=4, d_v=5, q_rank=12).eval()
    dev = _on_device(cpu)
    x = torch.randn(2, 7, 32)  # (B, L, D)
    outs = []
    for module, where in ((cpu, torch.device("cpu")), (dev, DEV)):
        rope = RopeAngles(torch.arange(7, device=where), rope_frequencies(4).to(where))
        with torch.no_grad():
            outs.append(module(x.to(where), mask=causal_mask(7, 7, device=where), rope=rope))
    _same(outs[1], outs[0])


# ---------------------------------------------------------------- training


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    path.write_text(load_tinyshakespeare()[:20_000])
    return path


def _settings(corpus, out, device: str, **changes) -> TrainSettings:
    fields = dict(
        data=str(corpus),
        out=str(out),
        steps=4,
        batch_size=8,
        block_size=16,
        warmup_steps=2,
        eval_every=4,
        eval_batches=2,
        checkpoint_every=2,
        sample_tokens=0,
        device=device,
        model=dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, bias=False),
    )
    return TrainSettings(**{**fields, **changes})


def _losses(rows: list[dict]) -> torch.Tensor:
    return torch.tensor([row["loss"] for row in rows], dtype=torch.float64)


def _near(got: torch.Tensor, want: torch.Tensor, first: float) -> None:
    """Losses finite, the first step's within ``first`` (relative), the later ones within
    ``2.5 * first`` (the bf16 differences compound through the updates)."""
    assert torch.isfinite(got).all(), got
    assert_close(got[:1], want[:1], rtol=first, atol=0)
    assert_close(got[1:], want[1:], rtol=2.5 * first, atol=0)


def test_the_trainer_on_the_device_follows_cpus_losses(corpus, tmp_path):
    cpu = train(_settings(corpus, tmp_path / "cpu", "cpu"), progress=False)
    dev = train(_settings(corpus, tmp_path / "dev", DEV.type), progress=False)
    assert len(dev.rows) == len(cpu.rows) == 4
    _near(_losses(dev.rows), _losses(cpu.rows), BF16_LOSS)
    assert all(p.device.type == "cpu" for p in dev.model.parameters()), "result.model on CPU"


@pytest.mark.parametrize(
    "first, then", [(DEV.type, "cpu"), ("cpu", DEV.type)], ids=["device-to-cpu", "cpu-to-device"]
)
def test_a_checkpoint_resumes_on_the_other_device(corpus, tmp_path, first, then):
    out = tmp_path / "run"
    half = train(_settings(corpus, out, first, stop_after=2), progress=False)
    saved = load_checkpoint(out / CHECKPOINT)
    assert saved["step"] == 2
    state = half.model.state_dict()
    for name, tensor in saved["model"].items():  # bit-identical, on CPU whatever wrote it
        assert tensor.device.type == "cpu", name
        assert torch.equal(tensor, state[name]), name
    shutil.copytree(out, tmp_path / "same")
    moved = train(_settings(corpus, out, then), resume=True, progress=False)
    stayed = train(_settings(corpus, tmp_path / "same", first), resume=True, progress=False)
    assert [r["loss"] for r in moved.rows[:2]] == [r["loss"] for r in half.rows]
    tol = BF16_LOSS if CUDA else 0.0
    _near(_losses(moved.rows[2:]), _losses(stayed.rows[2:]), tol)


# ---------------------------------------------------------------- torch.distributed, one rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank():
    """A process group of one rank on 127.0.0.1: nccl on CUDA, gloo on CPU."""
    backend = "nccl" if CUDA else "gloo"
    address = f"tcp://127.0.0.1:{_free_port()}"
    dist.init_process_group(backend, init_method=address, rank=0, world_size=1)
    try:
        yield backend
    finally:
        dist.destroy_process_group()


def _lm_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


@pytest.mark.parametrize("scheme", ["ddp", "bucketed", "zero1", "fsdp"])
def test_the_course_schemes_on_one_rank_equal_plain_training(one_rank, scheme):
    run = Run()
    alone, model = run.make_model().to(DEV), run.make_model().to(DEV)
    plain_opt = torch.optim.AdamW(alone.parameters(), lr=run.lr)
    sync, weights = None, None
    if scheme == "fsdp":
        sharded = FSDP(model)
        call, opt, weights = (
            model,
            torch.optim.AdamW(model.parameters(), lr=run.lr),
            sharded.full_state,
        )
    else:
        call = BucketedDDP(model, run.bucket_bytes) if scheme == "bucketed" else NaiveDDP(model)
        sync = call.sync_gradients
        if scheme == "zero1":
            opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, call.comm, lr=run.lr)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=run.lr)
    for tokens in run.batches():
        tokens = tokens.to(DEV)
        for net, optimizer in ((alone, plain_opt), (call, opt)):
            optimizer.zero_grad()
            _lm_loss(net, tokens).backward()
            if net is call and sync is not None:
                sync()
            optimizer.step()
    got = weights() if weights is not None else model.state_dict()
    for name, want in alone.state_dict().items():
        _same(got[name].detach(), want.detach().cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("autocast", [False, True])
def test_activation_checkpointing_replays_the_devices_dropout(autocast):
    """The recomputed blocks draw the same dropout masks (the device's RNG is replayed), so the
    gradients equal those of the plain model; under the trainer's bf16 autocast (CUDA only)
    the two runs do the same bf16 arithmetic, compared to absolute 1e-3."""
    if autocast and not CUDA:
        pytest.skip("bf16 autocast is the trainer's CUDA path")
    plain = _on_device(_lm(0, **dict(MODERN, dropout=0.2, attention_dropout=0.1))).train()
    recomputed = checkpoint_blocks(copy.deepcopy(plain))
    tokens = _tokens(3, 12).to(DEV)
    grads = []
    for model in (plain, recomputed):
        torch.manual_seed(7)
        with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=autocast):
            _lm_loss(model, tokens).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    tol = dict(rtol=1e-2, atol=1e-3) if autocast else FP32
    for name, grad in grads[0].items():
        assert_close(grads[1][name], grad, **tol, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------- serving


def test_the_sampling_filters_give_cpus_scores():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 50, generator=g) * 3  # (B, V)
    seen = torch.randint(0, 50, (4, 9), generator=g)  # (B, T)
    for params in (
        SamplingParams(),
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(temperature=0.7, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
    ):
        want = process_logits(logits, seen, params)
        got = process_logits(logits.to(DEV), seen.to(DEV), params)
        assert torch.equal(got.isinf().cpu(), want.isinf()), params  # the same tokens kept
        _same(got, want)


def test_speculative_greedy_tokens_equal_the_target_alone():
    target, draft = _lm(0, **MODERN), _lm(1, **dict(MODERN, n_layers=1))
    dev_target, dev_draft = _on_device(target), _on_device(draft)
    prompt = _tokens(1, 5)
    alone = serve_generate(target, prompt, 12)
    with torch.no_grad():
        assert _margin(target, alone, 5) > MARGIN, "the seed gives a near tie: pick another"
    result = speculative_generate(dev_target, dev_draft, prompt.to(DEV), 12, k=3)
    assert result.tokens.device.type == DEV.type
    assert torch.equal(result.tokens.cpu(), alone)
    assert torch.equal(serve_generate(dev_target, prompt.to(DEV), 12).cpu(), alone)


def test_continuous_batching_over_the_paged_cache_equals_one_at_a_time():
    cpu = _lm(0, **MODERN)
    dev = _on_device(cpu)
    g = torch.Generator().manual_seed(5)
    lengths, news = [3, 7, 4, 9, 5], [6, 3, 8, 4, 5]
    prompts = [torch.randint(1, 23, (n,), generator=g) for n in lengths]
    want = serve_one_at_a_time(cpu, [Request(p, n) for p, n in zip(prompts, news, strict=True)])
    requests = [Request(p.to(DEV), n) for p, n in zip(prompts, news, strict=True)]
    batched = ContinuousBatcher(dev, n_blocks=16, block_size=4, max_batch=3).run(requests)
    packed = PackedBatcher(dev, n_blocks=16, block_size=4, max_batch=3).run(requests)
    alone = serve_one_at_a_time(dev, requests)
    static = serve_static_batches(dev, requests, 2)
    for got, *others, expected in zip(batched, packed, alone, static, want, strict=True):
        assert got.device.type == DEV.type
        assert all(torch.equal(x.cpu(), expected) for x in (got, *others))
    # The repetition penalty reads each row's history; CPU prompts are served on the device.
    penalty = SamplingParams(repetition_penalty=1.3)
    on_cpu = ContinuousBatcher(cpu, n_blocks=16, block_size=4, max_batch=3, params=penalty)
    on_dev = ContinuousBatcher(dev, n_blocks=16, block_size=4, max_batch=3, params=penalty)
    cpu_requests = [Request(p, n) for p, n in zip(prompts, news, strict=True)]
    for got, expected in zip(on_dev.run(cpu_requests), on_cpu.run(cpu_requests), strict=True):
        assert got.device.type == "cpu" and torch.equal(got, expected)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_model_gives_cpus_logits(bits):
    cpu = quantize_linears(_lm(0, **MODERN), bits=bits, group_size=16)
    dev = quantize_linears(_on_device(_lm(0, **MODERN)), bits=bits, group_size=16)
    for (name, a), (_, b) in zip(cpu.named_buffers(), dev.named_buffers(), strict=True):
        if name.endswith("codes"):
            assert torch.equal(b.cpu(), a), f"{name}: the devices quantize differently"
    tokens = _tokens(2, 9)
    with torch.no_grad():
        _same(dev(tokens.to(DEV)), cpu(tokens))


# ---------------------------------------------------------------- post-training


def test_lora_forward_and_merge_equal_cpus():
    cpu = _lm(0, **MODERN)
    add_lora(cpu, targets=("q_proj", "v_proj", "linear1"), r=4, alpha=8.0)
    with torch.no_grad():
        for p in cpu.parameters():
            if p.requires_grad:  # the adapters: B starts at zero, which would hide them
                p.copy_(torch.randn_like(p) * 0.1)
    dev = _on_device(cpu)
    tokens = _tokens(2, 8)
    with torch.no_grad():
        want, got = cpu(tokens), dev(tokens.to(DEV))
        _same(got, want)
        merge_lora(cpu)
        merge_lora(dev)
        _same(dev(tokens.to(DEV)), want)
        _same(dev(tokens.to(DEV)), cpu(tokens))


def _logits_pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 10, 23, generator=g)  # (B, L, V)
    return logits.requires_grad_(), logits.detach().to(DEV).requires_grad_()


def _grads_equal(loss_of) -> None:
    """``loss_of(logits, tokens, mask)`` on CPU and on the device: loss and its gradient."""
    cpu, dev = _logits_pair()
    tokens = _tokens(4, 10)
    mask = torch.arange(10)[None] >= torch.tensor([[3], [5], [2], [7]])  # (B, L) the answers
    want = loss_of(cpu, tokens, mask)
    got = loss_of(dev, tokens.to(DEV), mask.to(DEV))
    _same(got.detach(), want.detach())
    want.backward()
    got.backward()
    _same(dev.grad, cpu.grad)


def test_the_sft_loss_equals_cpus():
    for normalise in ("token", "sequence"):
        _grads_equal(lambda lg, t, m, n=normalise: sft_loss(lg, t, m, normalise=n))


def test_the_dpo_loss_equals_cpus():
    def loss(logits, tokens, mask):
        logp = response_logprobs(logits, tokens, mask)  # (B,)
        chosen, rejected = logp[:2], logp[2:]
        return dpo_loss(chosen, rejected, chosen.detach() * 0.9, rejected.detach() * 1.1).loss

    _grads_equal(loss)


def test_the_grpo_loss_equals_cpus():
    def loss(logits, tokens, mask):
        logp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]  # (B, T)
        rewards = torch.tensor([[1.0, 0.0], [0.5, 2.0]], device=logits.device)  # (P, G)
        adv = group_advantages(rewards).flatten()  # (B,)
        old, ref = logp.detach() + 0.05, logp.detach() - 0.1
        return grpo_loss(logp, old, ref, adv, mask[:, 1:], clip_eps=0.2, kl_coef=0.04).loss

    _grads_equal(loss)


EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
FINETUNE = {
    "sft-lora": ("arithmetic_chat.jsonl", dict(lora_rank=2)),
    "dpo": ("arithmetic_prefs.jsonl", dict(dpo=True)),
    "grpo": ("arithmetic_prompts.jsonl", dict(grpo=True, group_size=2, max_new_tokens=4)),
}


@pytest.fixture(scope="module")
def base(corpus, tmp_path_factory):
    """A tiny BPE base trained on CPU by ``coursepkg train`` (what ``finetune`` starts from)."""
    out = tmp_path_factory.mktemp("base") / "base"
    model = dict(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32, bias=False)
    settings = _settings(
        corpus, out, "cpu", tokenizer="bpe", steps=2, warmup_steps=1, eval_every=2, model=model
    )
    train(settings, progress=False)
    return out


@pytest.mark.parametrize("mode", list(FINETUNE))
def test_finetuning_on_the_device_follows_cpu(base, tmp_path, mode):
    """SFT (LoRA) and DPO autocast to bf16 on CUDA as pretraining does: their losses follow
    CPU's fp32 ones as the trainer's do (:func:`_near`, exactly on CPU). GRPO samples its
    answers from the device's own random stream, so on CUDA its losses are only checked
    finite, with rewards in [0, 1] and a KL >= 0."""
    name, options = FINETUNE[mode]
    common = dict(base=str(base), data=str(EXAMPLES / name), steps=3, batch_size=4)
    common.update(warmup_steps=1, checkpoint_every=3, lr=1e-2, **options)
    rows = []
    for i, device in enumerate(("cpu", DEV.type)):
        out = str(tmp_path / f"run{i}")
        result = finetune(FinetuneSettings(out=out, device=device, **common), progress=False)
        assert all(p.device.type == "cpu" for p in result.model.parameters())
        rows.append(result.rows)
    got, want = _losses(rows[1]), _losses(rows[0])
    assert torch.isfinite(got).all() and len(got) == 3
    if mode == "grpo":
        for row in rows[1]:
            assert 0.0 <= row["reward"] <= 1.0 and row["kl"] >= -1e-6, row
        if CUDA:
            return
    _near(got, want, BF16_LOSS)
