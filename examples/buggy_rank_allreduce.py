"""A per-rank ring all-reduce with a classic bug, for ``make demo`` and the README.

Every rank calls ``ring_all_reduce(tensor)`` with its own tensor, as with
``torch.distributed.all_reduce``; the ring itself is right, but only rank 0
copies the sum back into its tensor (the author wrote a *reduce* to rank 0,
thinking of an all-reduce), so the other ranks keep their own input.  Try::

    ring-ref difftest --ranks gloo examples/buggy_rank_allreduce.py:ring_all_reduce --examples 20

The tester runs it on real gloo process groups of 1 to 8 ranks on 127.0.0.1,
checks every rank, and reports ``ranks-disagree``: the ranks that differ from
rank 0, and the first element where they do.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over the ranks of the default group with a ring (buggy: only rank 0 gets the sum)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    work = tensor.clone()
    chunks = list(work.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):  # reduce-scatter, then all-gather
        gather = step >= n - 1
        send = (rank - step + n) % n if gather else (rank - step) % n
        recv = (send - 1) % n
        incoming = torch.empty_like(chunks[recv])
        for request in (dist.isend(chunks[send], right), dist.irecv(incoming, left)):
            assert request is not None  # None only for a rank outside the group
            request.wait()
        if gather:
            chunks[recv].copy_(incoming)
        else:
            chunks[recv] += incoming
    if rank == 0:  # BUG: every rank should copy the result back
        tensor.copy_(work)
