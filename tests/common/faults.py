"""Planted faults: wrong variants of the core's round functions, for showing that checks bite.

Each has the signature of a round, ``(state, r, combine) -> state``; and a rank that fails mid-ring
(:func:`failing_add`).
"""

from __future__ import annotations

import contextlib
from typing import Any
from unittest import mock

from ring_ref.core import Combine, exchange
from ring_ref.invariants import State
from ring_ref.schedule import ag_recv_chunk, left, rs_recv_chunk


def adding_all_gather(state: State[Any], r: int, combine: Combine[Any]) -> State[Any]:
    """Fault: all-gather adds the received chunk instead of copying it."""
    n = len(state)
    return exchange(state, lambda i: ag_recv_chunk(i, r, n), combine)


def wrong_chunk_reduce_scatter(state: State[Any], r: int, combine: Combine[Any]) -> State[Any]:
    """Fault: the receiver adds into chunk (i - r) instead of (i - 1 - r)."""
    n = len(state)
    return exchange(state, lambda i: (rs_recv_chunk(i, r, n) + 1) % n, combine)


def forwarding_reduce_scatter(state: State[Any], r: int, combine: Combine[Any]) -> State[Any]:
    """Fault: workers run in order 0..n-1 and pass on the chunk they have just received this round.

    (Updating in place in that order with the *right* chunks would be harmless:
    the slot a worker adds into in round ``r`` is the one it sends in ``r + 1``.)
    """
    n = len(state)
    rows = [list(row) for row in state]
    for i in range(n):
        sender = left(i, n)
        c = rs_recv_chunk(sender if sender < i else i, r, n)
        rows[i][c] = combine(rows[sender][c], rows[i][c])
    return tuple(tuple(row) for row in rows)


def failing_add(at: int, rank: int) -> contextlib.AbstractContextManager[object]:
    """``torch.add`` patched to raise ``OSError`` at its ``at``-th call on this rank (a peer that
    fails mid-ring, at its ``at``-th reduce-scatter addition)."""
    import torch

    calls = 0
    real = torch.add

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == at:
            raise OSError(f"planted failure on rank {rank}")
        return real(*args, **kwargs)

    return mock.patch.object(torch, "add", failing)
