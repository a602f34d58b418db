"""Bundled difftest targets: real all-reduce implementations that nobody here wrote.

``gloo_all_reduce`` runs ``torch.distributed.all_reduce`` (``SUM``, gloo backend)
across ``N`` spawned processes on ``127.0.0.1``: rank ``i`` contributes
``worker_tensors[i]`` and rank 0's reduced tensor is returned.  One process
group per ``N`` is spawned on first use (through :mod:`ring_ref._processes._gloo`) and
reused for every later call, so a difftest run pays the spawn cost once per
``N``; :func:`close` (also registered with :mod:`atexit`) shuts them down.

    ring-ref difftest ring_ref.targets:gloo_all_reduce --max-workers 4 --examples 20

It checks rank 0's result only (and raises if another rank's differs).  To
check every rank of a real group, with deadlocks and dead ranks diagnosed,
test the per-rank function itself::

    ring-ref difftest --ranks gloo torch.distributed:all_reduce --max-workers 4

Both take the op by name (``difftest --op``): ``gloo_all_reduce(x, op="max")``
runs ``dist.all_reduce(..., op=ReduceOp.MAX)`` (``prod``: ``PRODUCT``;
``avg``: ``AVG``, which this torch's gloo computes as its sum divided by
``N``), and ``mpi_allreduce(comm, array, op="max")`` passes ``MPI.MAX``
(``MPI.PROD``, ``MPI.MIN``); MPI has no average, so ``op="avg"`` raises
``ValueError`` there (``difftest`` reports ``raised``).

``jax_psum`` is a JAX target (``difftest --framework jax``, extra
``ring-ref[jax]``): ``jax.lax.psum`` under ``jax.shard_map`` over ``N`` CPU
devices of this process, device ``i`` holding ``worker_tensors[i]``
(``op``: ``pmax``, ``pmin``, ``pmean``; JAX has no product collective, so
``op="prod"`` raises ``ValueError``)::

    ring-ref difftest --framework jax ring_ref.targets:jax_psum --max-workers 8

``mpi_allreduce`` is a per-rank target: ``comm.Allreduce(MPI.IN_PLACE, array,
op=MPI.SUM)`` on each rank's own ``numpy`` array, MPI's own all-reduce.  Which
algorithm OpenMPI runs is chosen when ``mpirun`` starts, by the ``--mca``
options that :func:`ring_ref.mpi.openmpi_allreduce_mca` gives (the ring is
algorithm 4).  MPI has no float16 type: float16 arrays are refused by MPI
itself (``MPI_ERR_TYPE``).

``mlx_all_sum`` is a per-rank target for MLX's ring backend (extra
``ring-ref[mlx]``): ``mlx.core.distributed.all_sum`` of this rank's tensor,
the rank joining the ring from the job's environment (``MLX_HOSTFILE`` and
``MLX_RANK``, or the job's ``RANK``: :func:`ring_ref._processes._mlx.join_ring`).
It hands MLX the tensor's own bits in its own dtype (``mlx.core.array`` of a
float64 ``numpy`` array would silently make float32 of it).  ``difftest
--ranks mlx`` starts the ranks on ``127.0.0.1``::

    ring-ref difftest --ranks mlx ring_ref.targets:mlx_all_sum --max-workers 4
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from ring_ref._ops import REDUCE_OP_NAMES, op_name
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._processes._mlx import join_ring
from ring_ref._processes._shared import PerSize

if TYPE_CHECKING:
    import jax
    from mpi4py import MPI

__all__ = [
    "close",
    "gloo_all_reduce",
    "jax_psum",
    "jax_psum_ranks",
    "jax_psum_scatter",
    "mlx_all_sum",
    "mpi_allreduce",
]


CALL_TIMEOUT_S = 60.0
_GROUPS = PerSize(lambda n: SpawnedGroup(n, backend="gloo"))


_MPI_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN"}


def _rank_all_reduce(rank: int, _world_size: int, payload: tuple[torch.Tensor, str]) -> torch.Tensor:
    """On one rank: all-reduce this rank's tensor in place with the named ``ReduceOp`` and return it."""
    worker_tensors, reduce_op = payload
    mine = worker_tensors[rank].clone()
    dist.all_reduce(mine, op=getattr(dist.ReduceOp, reduce_op))
    return mine


def _op_key(op: str, table: Mapping[str, str], where: str) -> str:
    if op not in table:
        raise ValueError(f"{where} has no op {op!r}; choose one of {', '.join(table)}")
    return table[op]


def gloo_all_reduce(worker_tensors: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``torch.distributed.all_reduce`` over ``N = worker_tensors.shape[0]`` gloo processes; rank 0's result.

    ``op`` names the reduction (``sum``, ``prod``, ``max``, ``min``, ``avg``: ``ReduceOp.SUM``,
    ``PRODUCT``, ``MAX``, ``MIN``, ``AVG``).  Also checks that every rank ended with the same bits,
    as an all-reduce must.
    """
    reduce_op = _op_key(op, REDUCE_OP_NAMES, "torch.distributed.ReduceOp")
    n = int(worker_tensors.shape[0])
    group = _GROUPS[n]
    payload = (worker_tensors.detach().contiguous(), reduce_op)
    results = group.run(_rank_all_reduce, payload, timeout_s=CALL_TIMEOUT_S)
    for rank, other in enumerate(results[1:], start=1):
        if not torch.equal(other.view(torch.uint8), results[0].view(torch.uint8)):
            raise RuntimeError(f"gloo ranks disagree: rank {rank}'s result differs from rank 0's")
    return results[0]


def close() -> None:
    """Shut down every process group started by :func:`gloo_all_reduce`."""
    _GROUPS.close()


atexit.register(close)


_JAX_OPS = {"sum": "psum", "avg": "pmean", "max": "pmax", "min": "pmin"}


def jax_psum(worker_tensors: jax.Array, op: str = "sum") -> jax.Array:
    """``jax.lax.psum`` of ``worker_tensors[i]`` on CPU device ``i``, under ``jax.shard_map``; ``(M, ...)``.

    ``op``: ``sum``, ``avg``, ``max``, ``min`` (``psum``, ``pmean``, ``pmax``,
    ``pmin``).  It needs ``N`` CPU devices: difftest and reveal give a JAX
    target's process 64 (:data:`ring_ref.difftest._jax.CPU_DEVICES`); a
    process with fewer gets a ``RuntimeError`` naming the fix.
    """
    import jax  # the optional extra, imported only by a JAX run

    name = _op_key(op, _JAX_OPS, "jax.lax (psum, pmean, pmax, pmin)")
    sharding, collective = _jax_collective(_cpu_devices(int(worker_tensors.shape[0]), "jax_psum"), name)
    return cast("jax.Array", collective(jax.device_put(worker_tensors, sharding)))


def jax_psum_scatter(worker_tensors: jax.Array) -> jax.Array:
    """``jax.lax.psum_scatter`` (``tiled``) of ``worker_tensors[i]`` on CPU device ``i`` under
    ``jax.shard_map``: the reduce-scatter ``(N, M, ...) -> (N, M / N, ...)``, row ``r`` device ``r``'s
    shard (``difftest --framework jax --collective reduce-scatter``).  Needs ``N`` CPU devices, as
    :func:`jax_psum`.
    """
    import jax

    n = int(worker_tensors.shape[0])
    sharding, scatter = _jax_scatter(_cpu_devices(n, "jax_psum_scatter"))
    shards = scatter(jax.device_put(worker_tensors, sharding))
    return cast("jax.Array", shards.reshape(n, -1, *worker_tensors.shape[2:]))


@functools.cache
def _jax_scatter(devices: tuple[Any, ...]) -> tuple[Any, Callable[[Any], Any]]:
    """The sharding of ``(N, M, ...)`` over ``devices``; the jitted ``psum_scatter`` under ``shard_map``."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh(
        (len(devices),), ("w",), devices=devices, axis_types=(jax.sharding.AxisType.Explicit,)
    )
    by_worker = PartitionSpec("w")  # type: ignore[no-untyped-call]
    scatter: Callable[..., Any] = jax.lax.psum_scatter  # untyped in jax 0.10.2
    per_device = jax.shard_map(
        lambda block: scatter(block[0], "w", scatter_dimension=0, tiled=True),
        mesh=mesh,
        in_specs=by_worker,
        out_specs=by_worker,
    )
    return NamedSharding(mesh, by_worker), jax.jit(per_device)


def jax_psum_ranks(x: jax.Array, op: str = "sum") -> jax.Array:
    """``jax.lax.psum`` across the processes of a ``jax.distributed`` group: ``difftest --ranks jax``.

    ``x`` is this process's ``(M, ...)`` input on its one CPU device; the
    inputs of the ``N`` processes, in process order, make one global ``(N, M,
    ...)`` array over the mesh of the ``N`` devices, reduced under
    ``jax.shard_map`` as in :func:`jax_psum` (its collectives run over the
    group's CPU collectives: gloo under difftest).  Returns this process's
    copy of the result.  ``op`` as for :func:`jax_psum`.
    """
    import jax

    name = _op_key(op, _JAX_OPS, "jax.lax (psum, pmean, pmax, pmin)")
    devices = tuple(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))
    if len(jax.local_devices()) != 1:
        raise RuntimeError(
            f"jax_psum_ranks takes one device per process; this one has {len(jax.local_devices())}: "
            'call jax.config.update("jax_num_cpu_devices", 1) before jax is first used'
        )
    sharding, collective = _jax_collective(devices, name)
    own = jax.make_array_from_single_device_arrays((len(devices), *x.shape), sharding, [x[None]])
    return cast("jax.Array", collective(own).addressable_data(0))


def _cpu_devices(n: int, target: str) -> tuple[Any, ...]:
    """The first ``n`` CPU devices of this process; a ``RuntimeError`` naming the fix when it has fewer."""
    import jax

    devices = jax.devices("cpu")
    if len(devices) < n:
        raise RuntimeError(
            f"{target} needs N = {n} CPU devices and this process has {len(devices)}: call "
            f'jax.config.update("jax_num_cpu_devices", {n}) before jax is first used, or let difftest run '
            "the target in its isolated worker"
        )
    return tuple(devices[:n])


@functools.cache
def _jax_collective(devices: tuple[Any, ...], name: str) -> tuple[Any, Callable[[Any], Any]]:
    """The sharding of ``(N, M, ...)`` over ``devices`` (``N`` of them, in that order) and the jitted
    collective ``name`` under ``shard_map`` (one per group of devices and op, so that jax compiles
    once per shape)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    n = len(devices)
    mesh = jax.make_mesh((n,), ("w",), devices=devices, axis_types=(jax.sharding.AxisType.Explicit,))
    by_worker, replicated = PartitionSpec("w"), PartitionSpec()  # type: ignore[no-untyped-call]
    collective = getattr(jax.lax, name)
    per_device = jax.shard_map(
        lambda block: collective(block[0], "w"), mesh=mesh, in_specs=by_worker, out_specs=replicated
    )
    return NamedSharding(mesh, by_worker), jax.jit(per_device)


def mpi_allreduce(comm: MPI.Comm, array: npt.NDArray[Any], op: str = "sum") -> None:
    """``comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)``: MPI's all-reduce of this rank's array.

    ``op`` names the reduction: ``sum``, ``prod``, ``max``, ``min`` (``MPI.SUM``, ``MPI.PROD``,
    ``MPI.MAX``, ``MPI.MIN``); MPI has no average (``avg`` raises ``ValueError``).
    """
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, array, op=getattr(MPI, _op_key(op, _MPI_OPS, "MPI (MPI_Op)")))


_MLX_OPS = {"sum": "all_sum", "max": "all_max", "min": "all_min"}
_MLX_BITS = {2: "uint16", 4: "uint32", 8: "uint64"}
"""The unsigned integer type of each float width, by bytes: a tensor's bits cross to MLX and back as it."""


def mlx_all_sum(tensor: torch.Tensor, op: object = "sum") -> torch.Tensor:
    """``mlx.core.distributed.all_sum`` of this rank's tensor over MLX's ring: this rank's result, new.

    The rank joins the ring the environment names (``MLX_HOSTFILE`` and ``MLX_RANK``, or
    the job's ``RANK``; without ``MLX_HOSTFILE``, a group of one); MLX returns the group
    joined first on every later call.
    The tensor crosses to MLX by its bits, in its own dtype (float16, bfloat16,
    float32, float64), and comes back the same way.  ``op``: ``sum``, ``max``,
    ``min`` (``all_sum``, ``all_max``, ``all_min``), by name or as a
    ``torch.distributed.ReduceOp``; MLX has no product or average collective.
    """
    import mlx.core as mx  # the optional extra ring-ref[mlx], imported by the rank only

    collective = getattr(mx.distributed, _op_key(op_name(op), _MLX_OPS, "mlx.core.distributed"))
    unsigned = _MLX_BITS[tensor.element_size()]
    width = getattr(mx, unsigned)
    bits = tensor.detach().cpu().contiguous().view(getattr(torch, unsigned)).numpy()
    kind = getattr(mx, str(tensor.dtype).removeprefix("torch."))
    reduced = collective(mx.array(bits).view(kind), group=join_ring(), stream=mx.cpu)
    back = np.array(reduced.view(width)).view(unsigned)  # MLX's 64 bits come back as numpy's ulonglong
    return torch.from_numpy(back).view(tensor.dtype).reshape(tensor.shape)
