"""Every scheme of ``coursepkg.parallel`` on 2 and 4 gloo ranks on 127.0.0.1: the weights after
3 AdamW steps equal one process with the whole batch and PyTorch's own implementation; each
rank's bytes and each step's collectives equal their closed forms. One spawn per world size
serves every assertion (starting ranks is the slow part)."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from processes import budget

from coursepkg.optim import param_groups
from coursepkg.parallel import FSDP, NaiveDDP, ShardedOptimizer, run_ranks
from coursepkg.parallel.comm import Collectives, ring_bytes_sent
from coursepkg.parallel.compare import OURS, PYTORCH, Run, split_batch, train_alone, train_ranks
from coursepkg.parallel.ddp import make_buckets
from coursepkg.parallel.fsdp import smaller_than
from coursepkg.parallel.memory import payload_per_step, per_rank_bytes, unit_numels

pytestmark = pytest.mark.slow  # each spawn starts 2 or 4 Python processes that import torch

RUN = Run()  # d_model 9, vocab 13: no unit's size is a multiple of 2 or 4
RUN4 = Run(batch=8)
FOUR = ("ddp", "bucketed", "zero1", "fsdp", "torch-fsdp")
FP32 = tuple(s for s in OURS + PYTORCH if not s.endswith("bf16"))
TIMEOUT = 240.0  # seconds for a whole spawn on a quiet machine (scaled: processes.budget)


def _extras(rank: int, world_size: int) -> dict:
    """What the schemes do beyond training: buffers synchronised, the buckets launched
    during backward, a batch that does not divide."""
    out = {}
    for name, wrap in (("ddp", NaiveDDP), ("fsdp", FSDP)):
        model = RUN.make_model()
        model.register_buffer("marker", torch.full((3,), float(rank)))  # differs per rank
        wrap(model)
        out[f"buffer {name}"] = model.marker.tolist()
    try:
        split_batch(torch.zeros(world_size + 1, 2), rank, world_size)
    except ValueError as error:
        out["uneven batch"] = str(error)
    return out


def _bucket_launches(rank: int, world_size: int) -> dict:
    from coursepkg.parallel.ddp import BucketedDDP

    model = RUN.make_model()
    ddp = BucketedDDP(model, RUN.bucket_bytes)
    tokens = split_batch(RUN.batches()[0], rank, world_size)
    ddp(tokens[:, :-1]).float().pow(2).mean().backward()
    launched = sum(bucket.handle is not None for bucket in ddp.buckets)
    ddp.sync_gradients()
    return dict(launched=launched, buckets=len(ddp.buckets))


def _fsdp_frees(rank: int, world_size: int) -> dict:
    """How many of the full vectors FSDP gathered are still alive after forward, and after
    backward (each gather's result watched through a weak reference)."""
    model = RUN.make_model()
    gathered = []
    for unit in FSDP(model).units:

        def gather(plain=unit.gather):
            full = plain()
            gathered.append(weakref.ref(full))
            return full

        unit.gather = gather
    tokens = split_batch(RUN.batches()[0], rank, world_size)
    loss = model(tokens[:, :-1]).float().pow(2).mean()
    gc.collect()  # what is alive is what something still refers to, not garbage awaiting gc
    forward = (len(gathered), sum(ref() is not None for ref in gathered))
    loss.backward()
    gc.collect()
    backward = (len(gathered), sum(ref() is not None for ref in gathered))
    return dict(fsdp_forward=forward, fsdp_backward=backward)


def _lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _grouped_zero(rank: int, world_size: int) -> dict:
    """ZeRO-1 over two parameter groups (matrices decayed, vectors not), as the trainer uses
    it; its state gathered whole, then cut again into a new optimizer's shards."""
    model = RUN.make_model()
    ddp = NaiveDDP(model)
    optimizer = ShardedOptimizer(param_groups(model, 0.1), torch.optim.AdamW, lr=RUN.lr)
    for tokens in RUN.batches():
        optimizer.zero_grad()
        _lm_loss(ddp, split_batch(tokens, rank, world_size)).backward()
        ddp.sync_gradients()
        optimizer.step()
    state = optimizer.state_dict()
    again = ShardedOptimizer(param_groups(model, 0.1), torch.optim.AdamW, lr=RUN.lr)
    again.load_state_dict(state)
    pairs = zip(optimizer.optimizer.state.values(), again.optimizer.state.values(), strict=True)
    resharded = all(torch.equal(a[k], b[k]) for a, b in pairs for k in a)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"grouped weights": weights, "grouped state": state, "resharded": resharded}


def _fsdp_replicated(rank: int, world_size: int) -> dict:
    """FSDP keeping the parameters of fewer than 10 elements (the norms' weights) whole: 3
    AdamW steps, the weights gathered, the collectives of the last step counted."""
    model = RUN.make_model()
    comm = Collectives()
    fsdp = FSDP(model, comm=comm, replicate=smaller_than(10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=RUN.lr)
    for tokens in RUN.batches():
        comm.reset()
        optimizer.zero_grad()
        _lm_loss(model, split_batch(tokens, rank, world_size)).backward()
        optimizer.step()
    calls = dict(comm.calls)
    by_name = FSDP(RUN.make_model(), replicate=["layers.1.norm2.weight", "layers.0.norm1.weight"])
    return {
        "replicated weights": fsdp.full_state(),
        "replicated": fsdp.replicated,
        "replicated calls": calls,
        "by name": by_name.replicated,
    }


def _worker(rank: int, world_size: int, run: Run, schemes: tuple[str, ...]) -> dict:
    extras = _extras(rank, world_size) | _bucket_launches(rank, world_size)
    extras |= _grouped_zero(rank, world_size) | _fsdp_replicated(rank, world_size)
    return train_ranks(rank, world_size, run, schemes) | {
        "extras": extras | _fsdp_frees(rank, world_size)
    }


@pytest.fixture(scope="module")
def two() -> list[dict]:
    return run_ranks(_worker, 2, RUN, OURS + PYTORCH, timeout=budget(TIMEOUT))


@pytest.fixture(scope="module")
def four() -> list[dict]:
    return run_ranks(_worker, 4, RUN4, FOUR, timeout=budget(TIMEOUT))


def _close(ours: dict, reference: dict) -> None:
    params = dict(RUN.make_model().named_parameters(remove_duplicate=False))
    assert set(params) <= set(ours)  # every parameter, a tied one under both its names
    for name in set(ours) & set(reference):
        torch.testing.assert_close(ours[name], reference[name], rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def alone() -> dict:
    return train_alone(RUN)


@pytest.mark.parametrize("scheme", FP32)
def test_two_ranks_equal_one_process(two, alone, scheme):
    for rank in two:
        _close(rank[scheme]["weights"], alone)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ("ddp", "torch-ddp"),
        ("bucketed", "torch-ddp"),
        ("zero1", "torch-zero1"),
        ("fsdp", "torch-fsdp"),
    ],
)
def test_two_ranks_equal_pytorchs_own(two, ours, theirs):
    for rank in two:
        _close(rank[ours]["weights"], rank[theirs]["weights"])


@pytest.mark.parametrize("scheme", FOUR)
def test_four_ranks_equal_one_process(four, scheme):
    reference = train_alone(RUN4)
    for rank in four:
        _close(rank[scheme]["weights"], reference)


def test_the_runs_are_uneven():
    """The sizes that shard: none divides by 2 or 4, so the padding is exercised."""
    numels = unit_numels(RUN.make_model())
    assert all(n % 4 for n in numels) and sum(numels) % 2


@pytest.mark.parametrize(
    "world, scheme",
    [("two", s) for s in OURS] + [("four", s) for s in OURS if s in FOUR],
)
def test_bytes_per_rank_and_per_step_equal_the_closed_forms(world, scheme, request):
    ranks, run = request.getfixturevalue(world), RUN if world == "two" else RUN4
    model = run.make_model()
    numels, n = unit_numels(model), len(ranks)
    tensors = len(list(model.parameters()))
    kind = {"bucketed": "ddp", "fsdp-bf16": "fsdp"}.get(scheme, scheme)
    memory = per_rank_bytes(kind, numels, tensors, n)  # the shards stay float32
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    element = 2 if scheme == "fsdp-bf16" else 4  # bfloat16 travels at half the bytes
    payload = payload_per_step(kind, numels, n, buffers, element)
    for rank in ranks:
        assert {k: rank[scheme][k] for k in ("params", "grads", "state")} == memory
        assert rank[scheme]["payload"] == payload


def test_sharding_divides_the_optimizer_state_by_the_world_size(two, four):
    for ranks in (two, four):
        n = len(ranks)
        ddp, zero = ranks[0]["ddp"]["state"], ranks[0]["zero1"]["state"]
        moments = ddp - 4 * len(list(RUN.make_model().parameters()))  # without the step counts
        assert 0 <= (zero - 4) * n - moments < 2 * 4 * n  # 1/N, but for the padding
        assert ranks[0]["fsdp"]["params"] * n >= ranks[0]["ddp"]["params"]
        assert ranks[0]["fsdp"]["params"] * n - ranks[0]["ddp"]["params"] < 4 * n * 3


def test_bytes_sent_by_ring_match_the_textbook_ratios(two):
    """ZeRO's paper: DDP sends 2Ψ per step, ZeRO-1 (here with an all-gather) 3Ψ, FSDP 3Ψ,
    each times (N-1)/N."""
    psi = sum(unit_numels(RUN.make_model())) * 4
    sent = {
        s: sum(
            ring_bytes_sent(k, b, 2) for k, b in two[0][s]["payload"].items() if k != "broadcast"
        )
        for s in ("ddp", "bucketed", "zero1", "fsdp")
    }
    assert sent["ddp"] == sent["bucketed"] == pytest.approx(psi)  # 2Ψ (N-1)/N with N = 2
    assert sent["zero1"] == pytest.approx(1.5 * psi, rel=0.01)  # the padding
    assert sent["fsdp"] == pytest.approx(1.5 * psi, rel=0.01)  # the padding of 3 units


def test_buffers_are_rank_zeros_and_the_batch_must_divide(two, four):
    for ranks in (two, four):
        for rank in ranks:
            extras = rank["extras"]
            assert extras["buffer ddp"] == extras["buffer fsdp"] == [0.0, 0.0, 0.0]
            assert f"world_size={len(ranks)}" in extras["uneven batch"]
            assert str(len(ranks) + 1) in extras["uneven batch"]


def test_buckets_are_all_launched_during_backward(two):
    for rank in two:
        extras = rank["extras"]
        assert extras["buckets"] > 1 and extras["launched"] == extras["buckets"]
    params = list(RUN.make_model().parameters())
    assert two[0]["bucketed"]["calls"]["all_reduce"] == len(make_buckets(params[::-1], 1000))
    assert two[0]["ddp"]["calls"]["all_reduce"] == len(params)


def test_fsdp_frees_each_full_vector_after_use(two, four):
    """Forward gathers each of the 3 units once and keeps none; backward gathers each again
    and keeps none either (the parameters saved for backward were kept as places, not
    tensors)."""
    for rank in two + four:
        assert rank["extras"]["fsdp_forward"] == (3, 0)
        assert rank["extras"]["fsdp_backward"] == (6, 0)


def test_zero1_keeps_parameter_groups_and_its_state_gathers_whole(two, four):
    """ShardedOptimizer over the trainer's two groups (weight decay on matrices only) equals
    one process's AdamW over the same groups; its gathered state is that AdamW's moments,
    each group's parameters end to end, and cuts again into the same shards."""
    model = RUN.make_model()
    groups = param_groups(model, 0.1)
    plain = torch.optim.AdamW(groups, lr=RUN.lr)
    for tokens in RUN.batches():
        plain.zero_grad()
        _lm_loss(model, tokens).backward()
        plain.step()
    assert 0 < len(groups[1]["params"]) < len(list(model.parameters()))  # two real groups
    for rank in two + four:
        extras = rank["extras"]
        _close(extras["grouped weights"], _plain_weights(model))
        for index, group in enumerate(groups):
            for key in ("exp_avg", "exp_avg_sq"):
                whole = torch.cat([plain.state[p][key].flatten() for p in group["params"]])
                gathered = extras["grouped state"]["state"][index][key]
                torch.testing.assert_close(gathered, whole, rtol=0, atol=1e-6)
        assert extras["resharded"]


def _plain_weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _raises_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here for ever


def _never_returns(rank: int, world_size: int) -> None:
    if rank == 0:
        threading.Event().wait()  # a collective rank 1 never meets
    dist.barrier()


def test_a_rank_that_raises_ends_the_others():
    first = "_raises_on_rank_one failed on 2 ranks: rank1: RuntimeError: rank 1 fails on purpose"
    with pytest.raises(RuntimeError, match=first):
        run_ranks(_raises_on_rank_one, 2, timeout=budget(TIMEOUT))


def test_a_run_that_hangs_is_ended_at_the_timeout():
    with pytest.raises(TimeoutError, match="2 ranks of _never_returns still running after 10"):
        run_ranks(_never_returns, 2, timeout=10.0)


def test_fsdp_keeps_the_named_parameters_whole_and_all_reduces_their_gradients(two, four, alone):
    """replicate=smaller_than(10) keeps the four norm weights (9 elements) whole on every rank:
    training equals one process, each step all-reduces them once each (and gathers and
    reduce-scatters the 3 units as before); names select parameters too."""
    model = RUN.make_model()
    small = [n for n, p in model.named_parameters() if p.numel() < 10]
    assert len(small) == 4 and all("norm" in name for name in small)
    for rank in two + four:
        extras = rank["extras"]
        assert extras["replicated"] == small
        _close(extras["replicated weights"], alone)
        assert extras["replicated calls"] == {"all_reduce": 4, "all_gather": 6, "reduce_scatter": 3}
        assert extras["by name"] == ["layers.0.norm1.weight", "layers.1.norm2.weight"]
