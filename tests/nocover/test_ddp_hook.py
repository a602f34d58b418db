"""``ring_ref.distributed.ring_hook`` inside a real ``DistributedDataParallel`` model on gloo processes.

Each rank trains the same small MLP for a few optimizer steps with the hook
registered, recording (from inside a wrapper around the hook) every bucket DDP
hands over: its step, its flat gradient buffer and which parameters it holds.
The parent then checks two things against oracles that do not use the hook:

* **bitwise**: a single-process replay that zero-pads each recorded bucket to a
  multiple of the world size (the spec's ring; rings of the ``blocks`` and
  ``gloo`` layouts take the bucket as it is), sums the ranks' buckets with
  ``ring_ref.ring_all_reduce`` (the simulation, on the hook's ring), divides by the world size,
  unpacks the buckets into gradients and applies the same optimizer ends with
  exactly the parameters every rank holds;
* **to rounding**: single-process large-batch training (the mean loss over
  all ranks' examples at once) ends with parameters equal within float32
  rounding.
"""

import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export
from torch.nn.parallel import DistributedDataParallel

from ring_ref import ring_all_reduce
from ring_ref._processes._gloo import ProcessRing
from ring_ref.distributed import RingHookState, ring_hook
from ring_ref.schedule import PRESETS
from tests.common.oracles import fold, same_bits

STEPS = 3
LOCAL_BATCH = 4
BUCKET_CAP_MB = 100 / 2**20  # 100 bytes: the 70 parameters split into buckets of 28 and 42 elements
CALL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Config:
    """One training run: the optimizer, DDP's bucket-view option and the local microbatch sizes."""

    n: int
    optimizer: str
    bucket_view: bool
    microbatches: tuple[int, ...]
    state: str  # how the hook gets its group: "none" (the world), "group" or "RingHookState"
    schedule: str = "spec"  # the ring, given to RingHookState


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)
    )


def make_optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(params, lr=0.05)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def local_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s examples at ``step``: seeded, so the parent can rebuild the global batch."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(LOCAL_BATCH, 5, generator=gen), torch.randn(LOCAL_BATCH, 1, generator=gen)


@dataclass(frozen=True)
class Bucket:
    """One bucket as the hook received it on one rank."""

    step: int
    index: int
    buffer: torch.Tensor
    params: tuple[int, ...]


_GROUPS: dict[int, dist.ProcessGroup] = {}


def first_ranks(n: int) -> dist.ProcessGroup:
    """The cached group of ranks ``0 .. n-1``; every rank asks for the same ones in the same order."""
    if n not in _GROUPS:
        group = dist.new_group(list(range(n)))
        assert group is not None
        _GROUPS[n] = group
    return _GROUPS[n]


def train_with_hook(
    rank: int, world_size: int, config: Config
) -> tuple[list[Bucket], list[torch.Tensor]] | None:
    """Train with DDP and the ring hook on ranks ``0 .. n-1``; the buckets the hook saw, the parameters."""
    group = first_ranks(config.n) if config.n < world_size else None
    if rank >= config.n:
        return None
    model = make_model()
    ddp = DistributedDataParallel(
        model, process_group=group, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=config.bucket_view
    )
    position = {id(p): i for i, p in enumerate(model.parameters())}
    seen: list[Bucket] = []
    step = 0

    def recording_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        flat = torch.cat([g.reshape(-1) for g in bucket.gradients()])
        assert torch.equal(flat, buffer), "the bucket buffer is its gradients, flattened in order"
        params = tuple(position[id(p)] for p in bucket.parameters())
        seen.append(Bucket(step, bucket.index(), buffer.clone(), params))
        return ring_hook(state, bucket)

    state: object = {
        "none": None,
        "group": group,
        "RingHookState": RingHookState(
            group, timeout=datetime.timedelta(seconds=60), schedule=config.schedule
        ),
    }[config.state]
    ddp.register_comm_hook(state, recording_hook)
    optimizer = make_optimizer(config.optimizer, ddp.parameters())
    for step in range(STEPS):
        optimizer.zero_grad()
        inputs, targets = local_batch(step, rank)
        start = 0
        for k, size in enumerate(config.microbatches):
            mb = slice(start, start + size)
            start += size
            last = k == len(config.microbatches) - 1
            with contextlib.nullcontext() if last else ddp.no_sync():  # accumulate; reduce on the last
                # Each microbatch's loss is its share of the local mean: its examples' sum / local batch.
                loss = ((ddp(inputs[mb]) - targets[mb]) ** 2).sum() / LOCAL_BATCH
                loss.backward()
        optimizer.step()
    return seen, [p.detach().clone() for p in model.parameters()]


def padded(buffer: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([buffer, buffer.new_zeros((-buffer.numel()) % n)])


def replay(per_rank: list[list[Bucket]], config: Config) -> tuple[list[torch.Tensor], int]:
    """The oracle: sum each bucket with the simulation, unpack, step; also count order-sensitive sums."""
    n = len(per_rank)
    model = make_model()
    params = list(model.parameters())
    optimizer = make_optimizer(config.optimizer, params)
    order_sensitive = 0
    for step in range(STEPS):
        buckets = [[b for b in seen if b.step == step] for seen in per_rank]
        assert len({len(bs) for bs in buckets}) == 1, "every rank hands over the same number of buckets"
        optimizer.zero_grad()
        for same in zip(*buckets, strict=True):
            assert len({(b.index, b.params) for b in same}) == 1, "every rank has the same bucket layout"
            length = same[0].buffer.numel()
            if PRESETS[config.schedule].layout == "even":
                stacked = torch.stack([padded(b.buffer, n) for b in same])
            else:
                stacked = torch.stack([b.buffer for b in same])
            total = ring_all_reduce(stacked, schedule=config.schedule)
            order_sensitive += not same_bits(total, fold(list(stacked)))
            mean = total[:length] / n
            offset = 0
            for i in same[0].params:
                size = params[i].numel()
                params[i].grad = mean[offset : offset + size].view_as(params[i]).clone()
                offset += size
            assert offset == length
        optimizer.step()
    return [p.detach() for p in params], order_sensitive


def large_batch(n: int, config: Config) -> list[torch.Tensor]:
    """Single-process training on the global batch (every rank's examples), mean squared error."""
    model = make_model()
    optimizer = make_optimizer(config.optimizer, model.parameters())
    for step in range(STEPS):
        optimizer.zero_grad()
        batches = [local_batch(step, r) for r in range(n)]
        inputs, targets = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        (((model(inputs) - targets) ** 2).sum() / (n * LOCAL_BATCH)).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


@pytest.fixture(scope="module")
def ring() -> Iterator[ProcessRing]:
    """Four ranks; the smaller worlds are the sub-groups of their first ranks."""
    processes = ProcessRing(4, group_timeout_s=CALL_TIMEOUT_S)
    try:
        yield processes
    finally:
        processes.close()


CONFIGS = [
    Config(2, "adam", bucket_view=False, microbatches=(4,), state="group"),
    Config(3, "sgd", bucket_view=True, microbatches=(1, 3), state="RingHookState"),
    Config(4, "adam", bucket_view=True, microbatches=(3, 1), state="none"),
    Config(3, "adam", bucket_view=False, microbatches=(4,), state="RingHookState", schedule="gloo"),
    Config(4, "sgd", bucket_view=True, microbatches=(2, 2), state="RingHookState", schedule="openmpi-ring"),
]


@pytest.mark.clause("fold-order", "sum-not-mean")
@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=[
        "n2-adam-group",
        "n3-sgd-view-no_sync-state",
        "n4-adam-view-no_sync-world",
        "n3-adam-gloo-schedule-unpadded",
        "n4-sgd-view-no_sync-openmpi-ring-unpadded",
    ],
)
def test_ddp_with_the_ring_hook_matches_the_simulation_bit_for_bit(ring: ProcessRing, config: Config) -> None:
    n = config.n
    results = [r for r in ring.run(train_with_hook, config, timeout_s=CALL_TIMEOUT_S) if r is not None]
    assert len(results) == n
    per_rank = [seen for seen, _ in results]
    lengths = {b.buffer.numel() for b in per_rank[0]}
    assert len({b.index for b in per_rank[0] if b.step == STEPS - 1}) >= 2, "several buckets per step"
    if n > 2:
        assert any(length % n for length in lengths), "some bucket length must not be a multiple of N"
        assert any(length % n == 0 for length in lengths), "and some must be"
    expected, order_sensitive = replay(per_rank, config)
    if n > 2:
        assert order_sensitive > 0, "the inputs must make the ring's order visible in the bits"
    for rank, (_, params) in enumerate(results):
        for i, (got, want) in enumerate(zip(params, expected, strict=True)):
            assert same_bits(got, want), f"rank {rank}, parameter {i}: DDP with the hook != the replay"
    for got, want in zip(results[0][1], large_batch(n, config), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
