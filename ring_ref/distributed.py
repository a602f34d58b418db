"""The spec's ring all-reduce on real processes, over ``torch.distributed`` point-to-point sends.

:func:`ring_all_reduce_` is a deterministic drop-in for
``torch.distributed.all_reduce(tensor)`` (sum) when debugging numerics: every
rank of the group calls it with its own ``(M, ...)`` tensor, and every rank
ends with the same bits, equal to ``ring_ref.ring_all_reduce(torch.stack(...))``
of the ranks' inputs in rank order.  Group rank ``i`` plays worker ``i``; each
round is one ``batch_isend_irecv`` with the ring neighbours, following
:mod:`ring_ref.schedule` exactly (clauses ``rs-send-chunk``, ``ag-send-chunk``),
with reduce-scatter storing ``incoming + slot`` (``rs-add``) and all-gather
copying (``ag-copy-not-add``).  Received chunks land in a separate buffer, so a
value is never forwarded in the round it arrived (``simultaneous-rounds``).

Backends: gloo with CPU tensors, NCCL with CUDA tensors (call
``torch.cuda.set_device`` per rank first, as usual for NCCL).

Bad input is rejected with the same exception on *every* rank, before any
chunk is sent: the ranks first exchange a description of their tensors
(``all_gather_object``) and each applies the same checks to all of them, so no
rank is left waiting for a peer that gave up.  A peer that fails or never calls
makes the others raise ``RuntimeError`` naming the round and the neighbour once
the group's timeout (``init_process_group(timeout=...)``) expires.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ring_ref import schedule
from ring_ref._chunks import chunk_views
from ring_ref._validate import rank_tensor_problem

__all__ = ["ring_all_reduce_"]


@dataclass(frozen=True)
class _Description:
    """What one rank passed, as exchanged before any chunk moves; ``problem`` is its local error."""

    summary: str
    signature: tuple[object, ...]
    problem: tuple[str, str] | None  # (exception kind, message)


def _describe(tensor: object, n: int, backend: str) -> _Description:
    """Check one rank's argument on its own; the verdict is applied on every rank after the exchange."""
    bad = rank_tensor_problem(tensor, n, backend)
    problem = None if bad is None else (bad.kind.__name__, bad.message.rstrip("."))
    if not isinstance(tensor, torch.Tensor):
        name = type(tensor).__name__
        return _Description(name, (name,), problem)
    shape = tuple(tensor.shape)
    summary = f"shape {shape} {tensor.dtype} on {tensor.device.type}"
    return _Description(summary, (shape, str(tensor.dtype), tensor.device.type), problem)


def _verdict(descriptions: list[_Description]) -> Exception | None:
    """The one exception every rank raises for this set of descriptions, or ``None`` if all is well.

    >>> _verdict([_describe(torch.zeros(6), 3, "gloo")] * 3) is None
    True
    >>> bad = _verdict([_describe(torch.zeros(6), 3, "gloo"), _describe([0.0], 3, "gloo")])
    >>> print(bad)  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a torch.Tensor ...; got list.
    """
    prefix = "ring_all_reduce_ rejected the input on every rank"
    failures = [(r, d.problem) for r, d in enumerate(descriptions) if d.problem is not None]
    if failures:
        kind = TypeError if failures[0][1][0] == "TypeError" else ValueError
        lines = "; ".join(f"rank {r}: {problem[1]}" for r, problem in failures)
        return kind(f"{prefix}: {lines}.")
    if len({d.signature for d in descriptions}) > 1:
        listing = "; ".join(f"rank {r}: {d.summary}" for r, d in enumerate(descriptions))
        return ValueError(
            f"{prefix}: the ranks passed different tensors ({listing}). Every rank must pass the "
            "same shape, dtype and device type."
        )
    return None


def ring_all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``tensor`` across the ranks of ``group`` in place with the spec's ring; return ``tensor``.

    Every rank of ``group`` (default: the world) must call it with a tensor of
    the same shape ``(M, ...)``, dtype and device type, ``M`` divisible by the
    group size; chunk ``c`` is rows ``c*M/n ... (c+1)*M/n - 1``.  Afterwards
    every rank's tensor holds the same bits, those of
    ``ring_ref.ring_all_reduce(torch.stack(inputs in group-rank order))``.
    Autograd is bypassed (the data is written through ``tensor.detach()``),
    as with ``torch.distributed.all_reduce``.  Bad input raises the same
    ``TypeError``/``ValueError`` on every rank and leaves every tensor unchanged.
    Ranks named in error messages are ranks within ``group``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_all_reduce_ needs an initialised default process group; call "
            "torch.distributed.init_process_group(...) first (or launch with torchrun)."
        )
    group = group if group is not None else dist.group.WORLD
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the given group; "
            "only the group's ranks may call ring_all_reduce_ with it."
        )
    descriptions: list[_Description | None] = [None] * n
    try:
        dist.all_gather_object(descriptions, _describe(tensor, n, str(dist.get_backend(group))), group=group)
    except RuntimeError as exc:
        raise RuntimeError(
            f"ring_all_reduce_: rank {rank} of {n}: exchanging tensor descriptions before the ring failed "
            f"or timed out; a peer probably raised, exited or did not call ring_all_reduce_. Cause: {exc}"
        ) from exc
    error = _verdict([d for d in descriptions if d is not None])
    if error is not None:
        raise error
    data = tensor.detach()
    chunks = chunk_views(data, n)
    incoming = torch.empty_like(chunks[0], memory_format=torch.contiguous_format)
    for phase, r in schedule.all_rounds(n):
        transfers = schedule.sends(phase, r, n)
        out, inc = transfers[rank], transfers[schedule.left(rank, n)]
        ops = [
            dist.P2POp(dist.isend, chunks[out.chunk].contiguous(), group=group, group_peer=out.dst),
            dist.P2POp(dist.irecv, incoming, group=group, group_peer=inc.src),
        ]
        try:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        except RuntimeError as exc:
            raise RuntimeError(
                f"ring_all_reduce_: rank {rank} of {n}, {phase} round {r}: exchanging chunks with rank "
                f"{out.dst} (send) and rank {inc.src} (receive) failed or timed out; a peer probably "
                f"raised, exited or did not call ring_all_reduce_. Cause: {exc}"
            ) from exc
        slot = chunks[inc.chunk]
        if phase == schedule.REDUCE_SCATTER:
            slot.copy_(torch.add(incoming, slot))
        else:
            slot.copy_(incoming)
    return tensor
