"""Per-rank all-reduce targets for ``--ranks gloo``: planted bugs, as per-rank code gets them wrong.

Each is ``fn(tensor)``, called on every rank of a gloo group with that rank's
own ``(M, ...)`` tensor, reducing it in place (returning ``None``) like
``torch.distributed.all_reduce``.  The buggy ones share one plain ring written
here from the textbook description (not from ``ring_ref``), with
non-blocking point-to-point sends, and each changes one thing.  ``EXPECTED``
maps each to the one code the tester must give it.  The ``--schedule
openmpi-ring`` pair runs ``ring_ref.distributed``'s ring on OpenMPI's blocks
(any ``M``), one of them dropping the remainder rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from ring_ref.distributed import ring_all_reduce_

__all__ = ["EXPECTED"]


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int) -> None:
    """Send ``send`` to the right neighbour while receiving ``recv`` from the left one."""
    for request in (dist.isend(send.contiguous(), right), dist.irecv(recv, left)):
        assert request is not None  # None only for a rank outside the group
        request.wait()


def _ring(
    tensor: torch.Tensor,
    *,
    gather_adds: bool = False,
    loses_on: Callable[[int], bool] = lambda rank: False,
    sends_ahead: int = 0,
) -> None:
    """Reduce-scatter, then all-gather, over the default group, on ``tensor``'s row chunks.

    ``loses_on(rank)``: that rank's all-gather drops the chunk it receives last (the slot keeps its
    partial sum, which lacks a worker); ``sends_ahead``: the reduce-scatter sends the chunk that many
    slots ahead of the right one (the receiver adds it into the wrong chunk).
    """
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(tensor.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):  # reduce-scatter: add what the left neighbour sends
        send, recv = (rank - step + sends_ahead) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv])
        _exchange(chunks[send], incoming, right, left)
        chunks[recv] += incoming
    for step in range(n - 1):  # all-gather: copy the finished chunk
        send, recv = (rank + 1 - step) % n, (rank - step) % n
        incoming = torch.empty_like(chunks[recv])
        _exchange(chunks[send], incoming, right, left)
        if gather_adds:
            chunks[recv] += incoming  # BUG: should copy
        elif not (step == n - 2 and loses_on(rank)):  # BUG (loses_on): the last chunk not stored
            chunks[recv].copy_(incoming)


def plain_ring(tensor: torch.Tensor) -> None:
    """Correct: the textbook ring, in place."""
    _ring(tensor)


def returns_a_new_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Correct: leaves its argument alone and returns the reduced copy."""
    out = tensor.clone()
    _ring(out)
    return out


def constant_on_last_rank(tensor: torch.Tensor) -> None:
    """Bug: the last rank adds 1 to its result, so the ranks end with different bits."""
    _ring(tensor)
    if dist.get_world_size() > 1 and dist.get_rank() == dist.get_world_size() - 1:
        tensor += 1


def receives_first(tensor: torch.Tensor) -> None:
    """Bug: every rank receives from its left neighbour before sending, with blocking calls: deadlock."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    incoming = torch.empty_like(tensor)
    dist.recv(incoming, (rank - 1) % n)
    dist.send(tensor, (rank + 1) % n)
    tensor += incoming


def exits_mid_call(tensor: torch.Tensor) -> None:
    """Bug: rank 1 ends its process in the middle of the all-reduce."""
    if dist.get_rank() == 1:
        os._exit(3)
    _ring(tensor)


def rank_1_raises(tensor: torch.Tensor) -> None:
    """Bug: rank 1 raises before it sends, while rank 0 waits in ``recv`` for it: ``raised`` (rank 1)."""
    if dist.get_world_size() == 1:
        return
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 gave up")
    if dist.get_rank() == 0:
        dist.recv(torch.empty_like(tensor), 1)


def gather_adds(tensor: torch.Tensor) -> None:
    """Bug: the all-gather adds the received chunk instead of copying it."""
    _ring(tensor, gather_adds=True)


def gather_drops_last_chunk(tensor: torch.Tensor) -> None:
    """Bug: every rank's all-gather drops the last chunk it receives, so that chunk keeps its partial
    sum, which lacks a worker: ``out-of-bound`` naming the lost worker, as for the same ring stacked, even
    where the counterexample's zeros make some rank right (its own probes show it losing one too)."""
    _ring(tensor, loses_on=lambda rank: True)


def gather_drops_last_chunk_on_rank_0(tensor: torch.Tensor) -> None:
    """Bug: only rank 0's all-gather drops the last chunk it receives; the other ranks count every worker
    once: ``ranks-disagree``, with rank 0's probe counts (a worker lost)."""
    _ring(tensor, loses_on=lambda rank: rank == 0)


def wrong_chunk_at_three(tensor: torch.Tensor) -> None:
    """Bug at ``N = 3`` only: the reduce-scatter sends the chunk after the right one (clause
    ``difftest-every-n``: every mode must find it, at every seed; zeros, the search's favourite input,
    pass)."""
    _ring(tensor, sends_ahead=1 if dist.get_world_size() == 3 else 0)


def averages(tensor: torch.Tensor) -> None:
    """Bug: divides by the group size at the end (a mean, as for gradients, not the sum)."""
    _ring(tensor)
    tensor /= dist.get_world_size()


def scribbles_on_its_argument(tensor: torch.Tensor) -> torch.Tensor:
    """Bug: returns a new tensor, and leaves its argument zeroed (a per-rank ``input-modified``)."""
    out = tensor.clone()
    _ring(out)
    tensor.zero_()
    return out


def sums_whatever_the_op(tensor: torch.Tensor, op: object) -> None:
    """Bug (difftest --op): passes SUM to the collective whatever ReduceOp it was given."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def max_ring_keeping_the_last_zero(tensor: torch.Tensor, op: object) -> None:
    """The textbook ring with a max that keeps its own value on ties, not the received one: a correct max
    by value whose zeros differ from the ring's where -0 and +0 tie (signed-zero under exact only)."""
    _ring_op(tensor, lambda incoming, own: torch.where(own >= incoming, own, incoming))


def _ring_op(tensor: torch.Tensor, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """The textbook ring with ``chunk = combine(incoming, chunk)`` in reduce-scatter."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return
    chunks = list(tensor.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        send, recv = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv])
        _exchange(chunks[send], incoming, right, left)
        chunks[recv].copy_(combine(incoming, chunks[recv]))
    for step in range(n - 1):
        send, recv = (rank + 1 - step) % n, (rank - step) % n
        incoming = torch.empty_like(chunks[recv])
        _exchange(chunks[send], incoming, right, left)
        chunks[recv].copy_(incoming)


ENV_PROBE = "RING_REF_ENV_PROBE"
"""The variable :func:`ring_if_told` needs (``--env RING_REF_ENV_PROBE=on``)."""


def ring_if_told(tensor: torch.Tensor) -> None:
    """Correct where the rank's environment holds ``RING_REF_ENV_PROBE=on`` (``--env``), else it raises."""
    if os.environ.get(ENV_PROBE) != "on":
        raise RuntimeError(f"{ENV_PROBE} is {os.environ.get(ENV_PROBE)!r} in rank {dist.get_rank()}")
    _ring(tensor)


def openmpi_ring(tensor: torch.Tensor) -> None:
    """Correct under ``--schedule openmpi-ring``: ``ring_ref``'s distributed ring on OpenMPI's blocks."""
    ring_all_reduce_(tensor, schedule="openmpi-ring")


def openmpi_ring_dropping_the_remainder(tensor: torch.Tensor) -> None:
    """Bug under ``--schedule openmpi-ring``: the last ``M mod N`` rows end zero on every rank."""
    ring_all_reduce_(tensor, schedule="openmpi-ring")
    m = tensor.shape[0]
    tensor[m - m % dist.get_world_size() :] = 0


RankImpl = Callable[..., object]

EXPECTED: dict[RankImpl, str] = {
    constant_on_last_rank: "ranks-disagree",
    receives_first: "timed-out",
    exits_mid_call: "crashed",
    rank_1_raises: "raised",
    gather_adds: "double-counted",
    gather_drops_last_chunk: "out-of-bound",
    gather_drops_last_chunk_on_rank_0: "ranks-disagree",
    averages: "mean-not-sum",
    scribbles_on_its_argument: "input-modified",
}
"""Each planted per-rank bug and the one code its failing modes must report."""

OP_EXPECTED: dict[RankImpl, tuple[str, dict[str, str | None]]] = {
    sums_whatever_the_op: ("max", {"exact": "sum-not-op", "order-free": "sum-not-op", "bound": "sum-not-op"}),
    max_ring_keeping_the_last_zero: ("max", {"exact": "signed-zero", "order-free": None, "bound": None}),
}
"""Per-rank op targets (``fn(tensor, op=ReduceOp)``): the op asked and each mode's code (``None``: pass)."""


# --collective reduce-scatter / all-gather: TARGET(output, input), as torch.distributed's own.


def reduce_scatter_next_chunk(output: torch.Tensor, input: torch.Tensor) -> None:
    """Bug: rank r keeps chunk r + 1 of gloo's all-reduce (``wrong-shard``)."""
    total = input.clone()
    dist.all_reduce(total)
    n, rank = dist.get_world_size(), dist.get_rank()
    output.copy_(total.chunk(n)[(rank + 1) % n])


def all_gather_adds_zero(output: torch.Tensor, input: torch.Tensor) -> None:
    """Bug: the gathered values go through an addition of zero: -0 ends +0 (``gather-changed-bits``)."""
    dist.all_gather_into_tensor(output, input)
    output += 0.0


def all_gather_reversed(output: torch.Tensor, input: torch.Tensor) -> None:
    """Bug: rank r's shard lands in slot N - 1 - r (``gather-misplaced``)."""
    n = dist.get_world_size()
    gathered = torch.empty_like(output)
    dist.all_gather_into_tensor(gathered, input)
    output.copy_(gathered.reshape(n, *input.shape).flip(0).reshape(output.shape))


COLLECTIVE_EXPECTED: dict[RankImpl, tuple[str, str]] = {
    reduce_scatter_next_chunk: ("reduce-scatter", "wrong-shard"),
    all_gather_adds_zero: ("all-gather", "gather-changed-bits"),
    all_gather_reversed: ("all-gather", "gather-misplaced"),
}
"""Per-rank reduce-scatter / all-gather bugs (``TARGET(output, input)``): the collective and the code."""
