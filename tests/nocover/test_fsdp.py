"""FSDP2 (``fully_shard``) training on gloo ranks with ``ring_ref.distributed.RingReduceScatter`` and
``RingAllGather``, bit for bit against a single-process replay, and against DDP with ``ring_hook``.

The replay is written here without ``ring_ref``: it runs the unsharded model on every rank's batch,
reduces each gradient element with the left fold the reduce-scatter ring makes for the shard that
element lies in (FSDP2 cuts every parameter's rows into ``N`` shards of ``ceil(rows / N)`` rows and
rank ``r`` reduce-scatters shard ``r`` of each: the fold over ranks ``r + d, r + 2d, ..., r``),
divides once by ``N`` (FSDP2 asks for ``ReduceOp.AVG`` on float32), and steps the same optimizer.
Learning rate and momentum are powers of two, so every product in SGD's update is exact and a
fused multiply-add gives the same bits as a multiply and an add, whatever shape the update runs on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ring_ref._processes._gloo import ProcessRing
from ring_ref.distributed import RingAllGather, RingReduceScatter, ring_hook
from ring_ref.schedule import RingSchedule
from tests.common.oracles import same_bits

LR, MOMENTUM = 2.0**-3, 0.5
STEPS = 4
CALL_TIMEOUT_S = 180.0
DIRECTIONS = {None: 1, RingSchedule(-1, -1, "even"): -1}


def make_model() -> nn.Sequential:
    """The same small model in every process: 6 and 3 output rows, so 4 ranks get padded shards."""
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``, with magnitudes over 10**-2 .. 10**2 (order-sensitive sums)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    scale = torch.pow(10.0, torch.randint(-2, 3, (4, 5), generator=gen).to(torch.float32))
    return torch.randn(4, 5, generator=gen) * scale, torch.randn(4, 3, generator=gen)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    optimizer.zero_grad()
    x, y = batch(rank, step)
    loss: torch.Tensor = ((model(x) - y) ** 2).mean()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def sgd(params: Iterator[nn.Parameter] | list[nn.Parameter]) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def fsdp_train(rank: int, world_size: int, schedule: object) -> list[torch.Tensor]:
    """FSDP2 with the ring for reduce-scatter and all-gather; this rank's shard of every parameter."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.set_num_threads(1)
    model = make_model()
    for layer in (model[0], model[2], model):
        fully_shard(layer)
        assert isinstance(layer, FSDPModule)
        layer.set_custom_reduce_scatter(RingReduceScatter(schedule=schedule))  # type: ignore[arg-type]
        layer.set_custom_all_gather(RingAllGather(schedule=schedule))  # type: ignore[arg-type]
    optimizer = sgd(model.parameters())
    for step in range(STEPS):
        train_step(model, optimizer, rank, step)
    return [p.to_local().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


def ring_order(direction: int) -> Callable[[int, int], list[int]]:
    """The reduce-scatter ring's fold of shard ``c`` of ``n``: ranks ``c + d, c + 2d, ..., c``."""
    return lambda c, n: [(c + j * direction) % n for j in range(1, n + 1)]


def rank_order(c: int, n: int) -> list[int]:
    """Another order: ranks ``0, 1, ..., N - 1`` (a test that cannot tell it from the ring's is void)."""
    return list(range(n))


def replay(n: int, order: Callable[[int, int], list[int]]) -> list[torch.Tensor]:
    """One process: every rank's gradient, each shard ``c`` folded over ranks ``order(c, n)``, / N."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_model()
        params = list(model.parameters())
        optimizer = sgd(params)
        for step in range(STEPS):
            grads = []
            for r in range(n):
                model.zero_grad()
                x, y = batch(r, step)
                loss: torch.Tensor = ((model(x) - y) ** 2).mean()
                loss.backward()  # type: ignore[no-untyped-call]
                grads.append([p.grad.clone() for p in params if p.grad is not None])
            for k, p in enumerate(params):
                rows = math.ceil(p.shape[0] / n)
                reduced = torch.empty_like(p)
                for c in range(n):
                    lo, hi = c * rows, min((c + 1) * rows, p.shape[0])
                    ranks = order(c, n)
                    acc = grads[ranks[0]][k][lo:hi].clone()
                    for w in ranks[1:]:
                        acc = acc + grads[w][k][lo:hi]
                    reduced[lo:hi] = acc / n
                p.grad = reduced
            optimizer.step()
        return [p.detach() for p in params]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def rings() -> Iterator[dict[int, ProcessRing]]:
    pool: dict[int, ProcessRing] = {}
    yield pool
    for ring in pool.values():
        ring.close()


def _ring(pool: dict[int, ProcessRing], n: int) -> ProcessRing:
    if n not in pool:
        pool[n] = ProcessRing(n, group_timeout_s=120.0)
    return pool[n]


@pytest.mark.clause("dist-fsdp")
@pytest.mark.parametrize(
    ("n", "schedule"), [(3, None), (4, None), (4, RingSchedule(-1, -1, "even"))], ids=["n3", "n4", "n4-minus"]
)
def test_fsdp2_training_through_the_ring_is_the_replay_bit_for_bit(
    rings: dict[int, ProcessRing], n: int, schedule: object
) -> None:
    """Four SGD steps: every rank's shard of every parameter equals the replay's rows, bit for bit;
    a replay folding in rank order instead gives other bits (so the test pins the order)."""
    per_rank = _ring(rings, n).run(fsdp_train, schedule, timeout_s=CALL_TIMEOUT_S)
    expected = replay(n, ring_order(DIRECTIONS[schedule]))  # type: ignore[index]
    for rank in range(n):
        for k, param in enumerate(expected):
            rows = math.ceil(param.shape[0] / n)
            want = param[rank * rows : (rank + 1) * rows]
            assert same_bits(per_rank[rank][k], want), (rank, k)
    other = replay(n, rank_order)
    full = [torch.cat([per_rank[r][k] for r in range(n)]) for k in range(len(expected))]
    assert any(not same_bits(f, o) for f, o in zip(full, other, strict=True)), "the data cannot tell orders"


def ddp_train(rank: int, world_size: int, _: None) -> list[torch.Tensor]:
    """DDP with ``ring_hook`` (the spec's all-reduce ring, the sum divided by N), same model and data."""
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(make_model())
    model.register_comm_hook(None, ring_hook)
    optimizer = sgd(model.parameters())
    for step in range(STEPS):
        train_step(model, optimizer, rank, step)
    return [p.detach().clone() for p in model.module.parameters()]


def full_params(rank: int, world_size: int, schedule: object) -> list[torch.Tensor]:
    """FSDP2 through the ring, then every parameter gathered whole (gloo's all-gather: a copy)."""
    shards = fsdp_train(rank, world_size, schedule)
    gathered = []
    for shard, param in zip(shards, make_model().parameters(), strict=True):
        rows = math.ceil(param.shape[0] / world_size)
        padded = torch.zeros((rows, *param.shape[1:]))
        padded[: shard.shape[0]] = shard
        out = torch.empty((world_size * rows, *param.shape[1:]))
        dist.all_gather_into_tensor(out, padded)
        gathered.append(out[: param.shape[0]])
    return gathered


@pytest.mark.clause("dist-fsdp")
def test_ddp_with_ring_hook_and_fsdp2_through_the_ring_train_alike_on_two_ranks(
    rings: dict[int, ProcessRing],
) -> None:
    """On two ranks DDP (``ring_hook``: the spec's all-reduce ring over a gradient bucket) and FSDP2
    (the reduce-scatter ring over per-parameter shards) must give every parameter the same bits after
    every step: each gradient element is one addition of the two ranks' values in either ring (IEEE
    addition commutes, so the order the rings disagree on cannot matter with two terms), both divide
    that sum once by 2, and SGD's update is elementwise with exact products.  From three ranks on the
    two rings fold some elements in different orders (the bucket's chunks are not the parameters'
    shards, and the all-reduce ring starts chunk c's fold at rank c, the reduce-scatter ring at c + 1),
    so only each one's own replay is bitwise (test above)."""
    ring = _ring(rings, 2)
    ddp = ring.run(ddp_train, None, timeout_s=CALL_TIMEOUT_S)
    fsdp = ring.run(full_params, None, timeout_s=CALL_TIMEOUT_S)
    for rank in range(2):
        for k, (a, b) in enumerate(zip(ddp[rank], fsdp[rank], strict=True)):
            assert same_bits(a, b), (rank, k)
    assert not all(same_bits(a, b) for a, b in zip(ddp[0], make_model().parameters(), strict=True))
