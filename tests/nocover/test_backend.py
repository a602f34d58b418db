"""The ``torch.distributed`` backend ``"ring_ref"`` on real gloo ranks: every collective of a group.

Each rank of a gloo world makes ``ring_ref`` groups (``new_group(backend="ring_ref",
pg_options=RingRefOptions(order))``) and calls every collective on seeded inputs that the parent
rebuilds.  The reductions must give the stacked reference's bits on every rank
(``ring_all_reduce(torch.stack(...))`` of the flat, zero-padded tensors, ``ring_reduce_scatter``;
for the chain also the left fold over the ranks, written here); the collectives that move data
must give the bits of the same call on the world's own gloo group.  One case of each runs in the
normal suite, the other world sizes and orders under ``soak``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import _coalescing_manager

from ring_ref import ring_all_reduce, ring_reduce_scatter
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref.distributed import RingAllGather, RingReduceScatter, RingRefOptions
from ring_ref.schedule import PRESETS, RingSchedule
from tests.common.backend_groups import ring_ref_group
from tests.common.oracles import REDUCE_OPS, fold, same_bits
from tests.common.paths import EXAMPLES, ROOT

ORDERS = tuple(PRESETS)
SHAPE = (5, 3)  # 15 elements: no world size of 2 to 4 divides it, so the spec's rings pad
SHARD = 4
TIMEOUT_S = 120.0


def inputs(n: int, seed: int, shape: tuple[int, ...] = SHAPE) -> torch.Tensor:
    """Every rank's input, stacked: the parent and each rank build the same."""
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


def reductions(rank: int, n: int, order: str) -> dict[str, Any]:
    """On each rank: every reduction of the ``order`` group on this rank's rows of :func:`inputs`."""
    group = ring_ref_group(order)
    out: dict[str, Any] = {"backend": dist.get_backend(group)}
    for name, op in REDUCE_OPS.items():
        mine = inputs(n, 1)[rank].clone()
        dist.all_reduce(mine, op=op, group=group)
        out[f"all_reduce {name}"] = mine
    mine = inputs(n, 1)[rank].t()  # non-contiguous: reduced in a copy, written back
    work = dist.all_reduce(mine, group=group, async_op=True)
    assert work is not None
    work.wait()
    out["all_reduce async, transposed"] = mine.t().clone()
    rows = inputs(n, 2, (n * SHARD,))[rank]
    shard = torch.empty(SHARD)
    dist.reduce_scatter_tensor(shard, rows, group=group)
    out["reduce_scatter_tensor"] = shard
    avg = torch.empty(SHARD)
    dist.reduce_scatter_tensor(avg, rows, op=dist.ReduceOp.AVG, group=group)
    out["reduce_scatter_tensor avg"] = avg
    listed = torch.empty(SHARD)
    dist.reduce_scatter(listed, list(rows.chunk(n)), group=group)
    out["reduce_scatter"] = listed
    root = inputs(n, 1)[rank].clone()
    dist.reduce(root, dst=n - 1, group=group)
    out["reduce"] = root
    out["functional all_reduce"] = funcol.all_reduce(inputs(n, 1)[rank], "sum", group).wait()
    out["functional reduce_scatter_tensor"] = funcol.reduce_scatter_tensor(rows, "sum", 0, group).wait()
    return out


def padded_flat(x: torch.Tensor, order: str) -> torch.Tensor:
    """The ranks' tensors as the backend reduces them: flat, zero-padded to a multiple of ``N`` where
    the order's ring cuts equal chunks (spec clause ``backend-flat``)."""
    n = x.shape[0]
    flat = x.reshape(n, -1)
    if PRESETS[order].layout == "even":
        flat = torch.nn.functional.pad(flat, (0, (-flat.shape[1]) % n))
    return flat


def all_reduce_reference(x: torch.Tensor, order: str, op: str = "sum") -> torch.Tensor:
    """The stacked reference: ``ring_all_reduce`` of the padded flat tensors, cut back to one rank's shape."""
    return ring_all_reduce(padded_flat(x, order), schedule=order, op=op)[: x[0].numel()].view(x.shape[1:])


def reduce_scatter_reference(x: torch.Tensor, order: str, op: str = "sum") -> torch.Tensor:
    """``(N, S)``: rank ``r``'s shard; the chain and recursive doubling (no rings) give chunk ``r`` of
    their all-reduce."""
    n = x.shape[0]
    if not isinstance(PRESETS[order], RingSchedule):
        return ring_all_reduce(x, schedule=order, op=op).view(n, -1)
    return ring_reduce_scatter(x, schedule=order, op=op)


def check_reductions(n: int, order: str, got: list[dict[str, Any]]) -> None:
    x, rows = inputs(n, 1), inputs(n, 2, (n * SHARD,))
    shards = reduce_scatter_reference(rows, order)
    for rank, mine in enumerate(got):
        assert mine["backend"] == "ring_ref"
        for name in REDUCE_OPS:
            assert same_bits(mine[f"all_reduce {name}"], all_reduce_reference(x, order, name)), (rank, name)
        transposed = all_reduce_reference(x.transpose(1, 2), order).t()
        assert same_bits(mine["all_reduce async, transposed"], transposed), rank
        assert same_bits(mine["reduce_scatter_tensor"], shards[rank]), rank
        assert same_bits(
            mine["reduce_scatter_tensor avg"], reduce_scatter_reference(rows, order, "avg")[rank]
        )
        assert same_bits(mine["reduce_scatter"], shards[rank]), rank
        want_root = all_reduce_reference(x, order) if rank == n - 1 else x[rank]
        assert same_bits(mine["reduce"], want_root), rank
        assert same_bits(mine["functional all_reduce"], all_reduce_reference(x, order)), rank
        assert same_bits(mine["functional reduce_scatter_tensor"], shards[rank]), rank
    if order == "chain":  # the chain is the left fold over the ranks, whatever the size
        assert same_bits(got[0]["all_reduce sum"], fold(list(x)))


def movements(rank: int, n: int, order: str) -> dict[str, list[torch.Tensor]]:
    """On each rank: every data-moving collective on the ``order`` group and on the gloo world."""
    out: dict[str, list[torch.Tensor]] = {}
    for label, group in (("ring_ref", ring_ref_group(order)), ("gloo", None)):
        mine = inputs(n, 3)[rank].clone()
        gathered = [torch.empty(SHAPE) for _ in range(n)]
        dist.all_gather(gathered, mine, group=group)
        into = torch.empty(n * SHAPE[0], SHAPE[1])
        dist.all_gather_into_tensor(into, mine, group=group)
        sent = mine.clone()
        dist.broadcast(sent, src=1, group=group)
        swapped = torch.empty(n * 2)
        dist.all_to_all_single(swapped, inputs(n, 4, (n * 2,))[rank], group=group)
        received = torch.zeros(SHAPE)
        if rank == 0:
            dist.send(mine, dst=n - 1, group=group)
        elif rank == n - 1:
            dist.recv(received, src=0, group=group)
        pieces = [torch.empty(2) for _ in range(n)]
        dist.all_to_all(pieces, list(inputs(n, 5, (n, 2))[rank]), group=group)
        # the last rank is the root: not rank 0, which the options' default would name
        collected = [torch.empty(SHAPE) for _ in range(n)] if rank == n - 1 else None
        dist.gather(mine, collected, dst=n - 1, group=group)
        scattered = torch.empty(2)
        pieces_sent = list(inputs(n, 6, (n, 2))[0]) if rank == n - 1 else None
        dist.scatter(scattered, pieces_sent, src=n - 1, group=group)
        dist.barrier(group=group)
        out[label] = [*gathered, into, sent, swapped, received, *pieces, *(collected or []), scattered]
    return out


@pytest.mark.clause("backend-fsdp")  # the functional collectives too
def test_every_reduction_matches_the_stacked_reference(world: SpawnedGroup) -> None:
    check_reductions(3, "spec", world.run(reductions, "spec", timeout_s=TIMEOUT_S))


def test_every_data_collective_gives_gloos_bits(world: SpawnedGroup) -> None:
    for rank, mine in enumerate(world.run(movements, "spec", timeout_s=TIMEOUT_S)):
        for k, (ours, gloos) in enumerate(zip(mine["ring_ref"], mine["gloo"], strict=True)):
            assert same_bits(ours, gloos), (rank, k)


def make_group_asking(rank: int, _n: int, asked: list[str]) -> str:
    """On each rank: make a ``ring_ref`` group asking for ``asked[rank]``; the error's text."""
    try:
        dist.new_group(backend="ring_ref", pg_options=RingRefOptions(order=asked[rank]))
    except ValueError as exc:
        return str(exc)
    return "made"


@pytest.mark.clause("backend-order")
def test_differing_orders_are_refused_on_every_rank_when_the_group_is_made(world: SpawnedGroup) -> None:
    refused = world.run(make_group_asking, ["spec", "spec", "chain"], timeout_s=TIMEOUT_S)
    assert len(set(refused)) == 1 and "rank 2: 'chain'" in refused[0], refused
    assert world.run(make_group_asking, ["chain"] * 3, timeout_s=TIMEOUT_S) == ["made"] * 3


def corners(rank: int, n: int, order: str) -> dict[str, Any]:
    """On each rank: the coalesced reductions, a receive from any rank, the group's repr, and what
    every rank hears when one rank passes a longer tensor or a reduce-scatter the wrong sizes."""
    group = ring_ref_group(order)
    out: dict[str, Any] = {"repr": repr(group)}
    first, second = inputs(n, 7, (5,))[rank].clone(), inputs(n, 8, (2, 3))[rank].clone()
    dist.all_reduce_coalesced([first, second], group=group)
    out["all_reduce_coalesced"] = [first, second]
    shards = [torch.empty(2), torch.empty(3)]
    with _coalescing_manager(group=group):
        dist.reduce_scatter_tensor(shards[0], inputs(n, 9, (2 * n,))[rank], group=group)
        dist.reduce_scatter_tensor(shards[1], inputs(n, 10, (3 * n,))[rank], group=group)
    out["reduce_scatter_tensor coalesced"] = shards
    if rank in (0, n - 1):
        received = torch.zeros(2)
        if rank == 0:
            dist.send(inputs(n, 11, (2,))[0], dst=n - 1, group=group)
        else:
            out["recv from any rank"] = (dist.recv(received, group=group), received)
    calls: tuple[tuple[str, Callable[[], object]], ...] = (
        ("longer on the last rank", lambda: dist.all_reduce(torch.ones(4 + (rank == n - 1)), group=group)),
        (
            "float64 on the last rank",
            lambda: dist.all_reduce(
                torch.ones(4, dtype=torch.float64 if rank == n - 1 else torch.float32), group=group
            ),
        ),
        (
            "a short reduce-scatter input",
            lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(5), group=group),
        ),
        (
            "a reduce_scatter list one short",
            lambda: dist.reduce_scatter(torch.empty(2), [torch.ones(2)] * (n - 1), group=group),
        ),
    )
    for label, call in calls:
        try:
            call()
            out[label] = "no error"
        except ValueError as exc:
            out[label] = str(exc)
    return out


@pytest.mark.clause("backend-order")
@pytest.mark.parametrize("order", ["spec", "chain"])
def test_coalesced_calls_any_source_receives_and_bad_sizes_on_every_rank(
    world: SpawnedGroup, order: str
) -> None:
    got = world.run(corners, order, timeout_s=TIMEOUT_S)
    n = len(got)
    x, y = inputs(n, 7, (5,)), inputs(n, 8, (2, 3))
    rs_small, rs_large = (
        reduce_scatter_reference(inputs(n, 9, (2 * n,)), order),
        reduce_scatter_reference(inputs(n, 10, (3 * n,)), order),
    )
    for rank, mine in enumerate(got):
        assert mine["repr"] == f"RingRefProcessGroup(rank={rank}, size={n}, order={order!r})"
        ours = mine["all_reduce_coalesced"]
        assert same_bits(ours[0], all_reduce_reference(x, order)) and same_bits(
            ours[1], all_reduce_reference(y, order)
        )
        shards = mine["reduce_scatter_tensor coalesced"]
        assert same_bits(shards[0], rs_small[rank]) and same_bits(shards[1], rs_large[rank]), rank
        longer = mine["longer on the last rank"]
        if order == "spec":  # an order that pads words the count itself
            assert longer == (
                "ring_ref backend: an all-reduce needs the same number of elements on every rank of the "
                "group; got rank 0: 4; rank 1: 4; rank 2: 5. Pass tensors of the same shape on every rank."
            )
        else:
            assert longer.startswith(
                "ring_all_reduce_ rejected the input on every rank: the ranks passed different"
            )
            assert "rank 2: shape (5,)" in longer, longer
        wider = mine["float64 on the last rank"]  # the same length: the ring's own refusal, padded or not
        assert wider.startswith(
            "ring_all_reduce_ rejected the input on every rank: the ranks passed different"
        )
        assert "rank 2: shape (4,) torch.float64 on cpu" in wider, wider
        short = mine["a short reduce-scatter input"]
        if order == "chain":  # no ring: the all-reduce runs, then the sizes are checked
            assert short == (
                "ring_ref backend: reduce-scatter needs an input of 3 times the output's 2 elements; got 5."
            )
        else:
            assert short.startswith("ring_reduce_scatter_ rejected the input on every rank: rank 0: reduce-")
            assert "M = 5 is not divisible by N = 3" in short, short
        assert mine["a reduce_scatter list one short"] == (
            "ring_ref backend: reduce_scatter needs 3 input tensors of the output's 2 elements each; "
            "got [2, 2]."
        )
    received = got[-1]["recv from any rank"]
    assert received[0] == 0 and same_bits(received[1], inputs(n, 11, (2,))[0])
    assert "recv from any rank" not in got[0]


def on_a_subgroup(rank: int, n: int, orders: tuple[str, ...]) -> dict[str, Any] | None:
    """On each rank: ``ring_ref`` groups of ranks 0 and ``n - 1`` only (the ranks between stay out, as
    ``new_group`` lets them), their all-reduce and reduce-scatter."""
    groups = {o: dist.new_group([0, n - 1], backend="ring_ref", pg_options=RingRefOptions(o)) for o in orders}
    if rank not in (0, n - 1):
        return None
    out: dict[str, Any] = {}
    member = 0 if rank == 0 else 1
    for order, group in groups.items():
        mine = inputs(2, 12)[member].clone()
        dist.all_reduce(mine, group=group)
        half = torch.empty(SHARD)
        dist.reduce_scatter_tensor(half, inputs(2, 13, (2 * SHARD,))[member], group=group)
        out[order] = (mine, half)
    return out


@pytest.mark.clause("backend-reductions")
def test_a_group_of_some_ranks_reduces_over_its_own_ranks_only(world: SpawnedGroup) -> None:
    """A ring over the world instead (a group not passed on) would wait for rank 1, which never calls."""
    orders = ("spec", "chain")  # a ring's reduce-scatter, and the chain's all-reduce cut into shards
    got = world.run(on_a_subgroup, orders, timeout_s=TIMEOUT_S)
    assert got[1] is None
    for member, rank in enumerate((0, 2)):
        mine = got[rank]
        assert mine is not None
        for order in orders:
            total, half = mine[order]
            assert same_bits(total, all_reduce_reference(inputs(2, 12), order)), (rank, order)
            assert same_bits(half, reduce_scatter_reference(inputs(2, 13, (2 * SHARD,)), order)[member])


@pytest.fixture(scope="module")
def world() -> Iterator[SpawnedGroup]:
    # spawned, not forked from a forkserver: the ranks import the package afresh from this process's
    # path and environment, so that a mutation run's ranks run the mutant under test
    with SpawnedGroup(3, start_method="spawn") as group:
        yield group


pytestmark = pytest.mark.clause("backend-reductions", "backend-flat", "backend-movement")


@pytest.mark.soak
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("order", ORDERS)
def test_every_reduction_of_every_order_and_size(n: int, order: str) -> None:
    with SpawnedGroup(n) as group:
        check_reductions(n, order, group.run(reductions, order, timeout_s=TIMEOUT_S))


# --- DistributedDataParallel with no hook ------------------------------------------------------


def ddp_buckets(
    rank: int, n: int, config: tuple[str, float, bool, bool]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """On each rank: DDP (no hook) over the ``order`` group for 2 steps (the second with a ``no_sync``
    microbatch first); every all-reduce the group ran, as ``(input, output)``."""
    order, bucket_cap_mb, bucket_view, accumulate = config
    group = ring_ref_group(order)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    cls: Any = type(group)
    inner = cls.allreduce

    def recording(self: Any, tensors: list[torch.Tensor], opts: Any) -> Any:
        before = [t.detach().clone() for t in tensors]
        work = inner(self, tensors, opts)
        calls.extend(zip(before, [t.detach().clone() for t in tensors], strict=True))
        return work

    cls.allreduce = recording
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(9, 13), torch.nn.Tanh(), torch.nn.Linear(13, 3))
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=bucket_view
        )
        calls.clear()  # DDP's start (the parameter check) is not a gradient
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(2):
            optimizer.zero_grad()
            x = inputs(n, 10 * step + rank, (4, 9))[0]
            if accumulate and step:
                with ddp.no_sync():
                    ddp(x).square().mean().backward()
            ddp(x).square().mean().backward()
            optimizer.step()
    finally:
        cls.allreduce = inner
    return calls


@pytest.mark.clause("backend-ddp")
@pytest.mark.parametrize(
    "config",
    [
        ("spec", 100 / 2**20, False, True),
        pytest.param(("gloo", 100 / 2**20, True, False), marks=pytest.mark.soak),
        pytest.param(("chain", 25.0, False, True), marks=pytest.mark.soak),
    ],
)
def test_ddp_without_a_hook_reduces_each_bucket_in_the_groups_order(
    world: SpawnedGroup, config: tuple[str, float, bool, bool]
) -> None:
    per_rank = world.run(ddp_buckets, config, timeout_s=TIMEOUT_S)
    order = config[0]
    assert len({len(calls) for calls in per_rank}) == 1 and per_rank[0], [len(c) for c in per_rank]
    assert len(per_rank[0]) > 2 or config[1] > 1, "small buckets: several per step"
    for k in range(len(per_rank[0])):
        stacked = torch.stack([calls[k][0] for calls in per_rank])
        want = all_reduce_reference(stacked, order)
        for rank, calls in enumerate(per_rank):
            assert same_bits(calls[k][1], want), (k, rank)


def torchrun(n: int, script: Path, args: list[str], order: str, timeout: float) -> str:
    """``script ARGS`` under ``torchrun`` on ``n`` ranks with ``RING_REF_ORDER=order``; its output, once it
    has exited with 0 (killed with its ranks after ``timeout`` seconds)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
    launcher = subprocess.Popen(
        [*command, str(script), *args],
        cwd=ROOT,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "RING_REF_ORDER": order, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a timeout can take the ranks down with it
    )
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 0, stdout + stderr
    return stdout


def run_faults_script(mode: str, order: str, out: Path) -> None:
    """``tests/common/backend_faults.py MODE OUT`` under ``torchrun`` on 3 ranks; it must exit with 0."""
    torchrun(3, ROOT / "tests" / "common" / "backend_faults.py", [mode, str(out)], order, TIMEOUT_S)


@pytest.mark.clause("backend-fsdp")
def test_a_new_group_of_a_ring_ref_world_is_a_ring_ref_group(tmp_path: Path) -> None:
    run_faults_script("subgroup", "chain", tmp_path)
    for rank in (0, 1):
        outcome = (tmp_path / f"rank{rank}.txt").read_text().split("\n", 1)[1]
        assert outcome == "ok ring_ref ring_ref [3.0, 3.0, 3.0, 3.0]", outcome


def destroy_a_group(_rank: int, _n: int, _payload: None) -> tuple[list[str], list[str], float]:
    """On each rank: make a ``"ring_ref"`` group and destroy it; the names of the groups torch knows
    before and after, and a sum on the world afterwards."""
    from torch.distributed import distributed_c10d

    def names() -> list[str]:
        return sorted(str(name) for name in distributed_c10d._world.pg_names.values())

    group = dist.new_group(backend="ring_ref")
    before = names()
    dist.destroy_process_group(group)
    total = torch.ones(1)
    dist.all_reduce(total)
    return before, names(), float(total)


@pytest.mark.clause("backend-fsdp")
def test_destroying_a_group_releases_its_inner_gloo_group(world: SpawnedGroup) -> None:
    for before, after, total in world.run(destroy_a_group, None, timeout_s=TIMEOUT_S):
        made = set(before) - set(after)
        assert len(made) == 2 and any(name.endswith("/ring_ref_gloo") for name in made), (before, after)
        assert total == 3.0


def bucket_experiment(backend: str, order: str) -> str:
    """``examples/bucket_order.py`` under ``torchrun`` on 4 ranks, as the guide runs it; its output."""
    return torchrun(4, EXAMPLES / "bucket_order.py", ["--backend", backend], order, 4 * TIMEOUT_S)


@pytest.mark.clause("backend-ddp")
def test_the_chain_trains_the_same_bits_at_every_bucket_size_under_torchrun() -> None:
    out = bucket_experiment("ring_ref", "chain")
    assert "bucket_cap_mb 0.05 vs 25: 0\n" in out, out
    assert "every rank holds the same bits: yes" in out, out
    assert "both runs equal the one-process left-fold replay: yes" in out, out


@pytest.mark.soak
@pytest.mark.clause("backend-ddp")
@pytest.mark.parametrize(("backend", "order"), [("gloo", ""), ("ring_ref", "spec")])
def test_gloo_and_the_spec_ring_change_bits_with_the_bucket_size(backend: str, order: str) -> None:
    out = bucket_experiment(backend, order)
    differing = int(re.findall(r"0\.05 vs 25: ([\d,]+)", out)[0].replace(",", ""))
    assert differing > 0 and "every rank holds the same bits: yes" in out, out


# --- FSDP2 with no custom comms ----------------------------------------------------------------


def fsdp_twice(rank: int, n: int, order: str) -> tuple[list[list[torch.Tensor]], list[str]]:
    """On each rank: FSDP2 trained on the ``order`` group with torch's own comms, then on the gloo world
    with :class:`RingReduceScatter` and :class:`RingAllGather` of the same order; this rank's shards,
    and the collectives the ``order`` group ran."""
    from torch.distributed.device_mesh import DeviceMesh  # FSDP takes a second to import
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.set_num_threads(1)
    shards = []
    ran: list[str] = []
    cls = type(ring_ref_group(order))
    originals = {name: getattr(cls, name) for name in ("reduce_scatter_single", "all_gather_single")}

    def recorder(name: str) -> Any:
        def record(self: Any, *args: Any) -> Any:
            ran.append(name)
            return originals[name](self, *args)

        return record

    for name in originals:
        setattr(cls, name, recorder(name))
    for backend in ("ring_ref", "gloo"):
        group = ring_ref_group(order) if backend == "ring_ref" else dist.group.WORLD
        assert group is not None
        mesh = DeviceMesh.from_group(group, "cpu")
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
            assert isinstance(layer, FSDPModule)
            if backend == "gloo":
                layer.set_custom_reduce_scatter(RingReduceScatter(schedule=order))
                layer.set_custom_all_gather(RingAllGather(schedule=order))
        optimizer = torch.optim.SGD(model.parameters(), lr=2.0**-3, momentum=0.5)
        for step in range(3):
            optimizer.zero_grad()
            x = inputs(n, 100 * step + rank, (4, 5))[0] * 10.0 ** torch.arange(-2, 3)  # order-sensitive sums
            model(x).square().mean().backward()
            optimizer.step()
        shards.append([p.to_local().detach().clone() for p in model.parameters()])  # type: ignore[attr-defined]
        if backend == "ring_ref":
            for name, original in originals.items():
                setattr(cls, name, original)
    return shards, ran


@pytest.mark.clause("backend-fsdp")
@pytest.mark.parametrize("order", ["spec", pytest.param("openmpi-ring", marks=pytest.mark.soak)])
def test_fsdp2_without_custom_comms_trains_as_the_rings_custom_comms(world: SpawnedGroup, order: str) -> None:
    for rank, ((ours, custom), ran) in enumerate(world.run(fsdp_twice, order, timeout_s=TIMEOUT_S)):
        assert ran.count("reduce_scatter_single") >= 3 and "all_gather_single" in ran, ran
        for k, (a, b) in enumerate(zip(ours, custom, strict=True)):
            assert same_bits(a, b), (rank, k)


@pytest.mark.soak
@pytest.mark.clause("backend-fsdp")
@pytest.mark.parametrize("order", ["spec", "chain"])
def test_fsdp2_under_torchrun_trains_to_the_one_process_replay_of_the_order(order: str) -> None:
    """``examples/fsdp_order.py`` on 4 ranks, as the guide runs it: FSDP2 with no custom comms on
    ``init_process_group("ring_ref")``; every rank's weights equal the script's replay, which folds
    each rank's gradients in one process as FSDP2 lays them out (no backend code)."""
    out = torchrun(4, EXAMPLES / "fsdp_order.py", [], order, 4 * TIMEOUT_S)
    assert "every rank holds the same bits: yes" in out, out
    assert "equal to the one-process replay of the order: yes" in out, out


# --- faults --------------------------------------------------------------------------------------

FAULTS = {  # what every rank but the faulty one must say (rank 1, for the first three, says the same)
    "shape": "ValueError: ring_ref backend: an all-reduce needs the same number of elements on every rank "
    "of the group; got rank 0: 4; rank 1: 5; rank 2: 4.",
    "op": "ValueError: ring_all_reduce_ rejected the input on every rank: the ranks passed different "
    "tensors, ops or schedules",
    "nan": "ValueError: ring_all_reduce_ rejected the input on every rank: rank 1: inputs must be finite",
    "dead": "RuntimeError: ",
    "hang": "RuntimeError: ",
}


@pytest.mark.clause("backend-faults")
@pytest.mark.parametrize(
    ("mode", "order"),
    [
        ("shape", "spec"),
        *[pytest.param(m, "spec", marks=pytest.mark.soak) for m in ("op", "nan", "dead", "hang")],
        *[pytest.param(m, "chain", marks=pytest.mark.soak) for m in ("shape", "dead", "hang")],
    ],
)
def test_a_fault_on_one_rank_is_a_clear_error_on_every_rank_within_the_timeout(
    mode: str, order: str, tmp_path: Path
) -> None:
    """``tests/common/backend_faults.py`` under ``torchrun`` on 3 ranks, rank 1 at fault; the others
    (and rank 1, where it calls) end with the error within the group's 5 s timeout, and no process stays."""
    run_faults_script(mode, order, tmp_path)
    ranks = (0, 1, 2) if mode in ("shape", "op", "nan") else (0, 2)
    outcomes = {r: (tmp_path / f"rank{r}.txt").read_text().split("\n", 1) for r in ranks}
    for rank, (seconds, outcome) in outcomes.items():
        assert float(seconds) < 5.0 + 2.0, (rank, seconds)
        # the chain does not pad: the ring's own check sees the lengths differ
        assert outcome.startswith(FAULTS["op" if (mode, order) == ("shape", "chain") else mode]), (
            rank,
            outcome,
        )
        if mode in ("dead", "hang"):
            assert "failed or timed out; a peer probably raised, exited or did not call" in outcome
    if mode in ("shape", "op", "nan"):
        assert len({outcome for _, outcome in outcomes.values()}) == 1, outcomes
