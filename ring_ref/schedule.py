"""The ring schedule as pure index math: no tensors, no buffers.

Every function here is a closed form from ``spec/ring_all_reduce.md``; the
clause each one implements is named in its docstring.  Workers and chunks are
numbered ``0 .. n-1``; rounds of each phase are numbered ``0 .. n-2``.

>>> [rs_send_chunk(i, 0, 4) for i in range(4)]
[0, 1, 2, 3]
>>> [ag_send_chunk(i, 0, 4) for i in range(4)]
[1, 2, 3, 0]
>>> for s in sends(REDUCE_SCATTER, 1, 3):
...     print(s)
Send(phase='reduce-scatter', round=1, src=0, dst=1, chunk=2)
Send(phase='reduce-scatter', round=1, src=1, dst=2, chunk=0)
Send(phase='reduce-scatter', round=1, src=2, dst=0, chunk=1)
"""

from __future__ import annotations

from typing import Final, Literal, NamedTuple

__all__ = [
    "ALL_GATHER",
    "PHASES",
    "REDUCE_SCATTER",
    "Phase",
    "Send",
    "ag_recv_chunk",
    "ag_send_chunk",
    "all_rounds",
    "elements_sent_per_worker",
    "left",
    "owned_chunk",
    "right",
    "rounds_per_phase",
    "rs_recv_chunk",
    "rs_send_chunk",
    "send_chunk",
    "sends",
]


Phase = Literal["reduce-scatter", "all-gather"]
REDUCE_SCATTER: Final = "reduce-scatter"
ALL_GATHER: Final = "all-gather"
PHASES: Final[tuple[Phase, Phase]] = (REDUCE_SCATTER, ALL_GATHER)


class Send(NamedTuple):
    """One transfer: in ``round`` of ``phase``, ``src`` sends slot ``chunk`` to ``dst``."""

    phase: Phase
    round: int
    src: int
    dst: int
    chunk: int


def right(i: int, n: int) -> int:
    """The worker that ``i`` sends to (clause ``ring-topology``).

    >>> right(3, 4)
    0
    """
    return (i + 1) % n


def left(i: int, n: int) -> int:
    """The worker that ``i`` receives from (clause ``ring-topology``).

    >>> left(0, 4)
    3
    """
    return (i - 1) % n


def rounds_per_phase(n: int) -> int:
    """``n - 1`` rounds in each phase; none at all when ``n == 1`` (``n1-no-rounds``).

    >>> rounds_per_phase(1), rounds_per_phase(5)
    (0, 4)
    """
    return n - 1


def rs_send_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in reduce-scatter round ``r`` (``rs-send-chunk``)."""
    return (i - r) % n


def rs_recv_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` receives (and adds into) in reduce-scatter round ``r``."""
    return rs_send_chunk(left(i, n), r, n)


def ag_send_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in all-gather round ``r`` (``ag-send-chunk``)."""
    return (i + 1 - r) % n


def ag_recv_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` receives (and copies into) in all-gather round ``r``."""
    return ag_send_chunk(left(i, n), r, n)


def send_chunk(phase: Phase, i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in round ``r`` of ``phase``."""
    if phase == REDUCE_SCATTER:
        return rs_send_chunk(i, r, n)
    return ag_send_chunk(i, r, n)


def owned_chunk(i: int, n: int) -> int:
    """The chunk worker ``i`` holds complete after reduce-scatter (``rs-owned-chunk``).

    >>> [owned_chunk(i, 4) for i in range(4)]
    [1, 2, 3, 0]
    """
    return (i + 1) % n


def sends(phase: Phase, r: int, n: int) -> tuple[Send, ...]:
    """All ``n`` transfers of round ``r`` of ``phase``, ordered by sender."""
    return tuple(Send(phase, r, i, right(i, n), send_chunk(phase, i, r, n)) for i in range(n))


def all_rounds(n: int) -> tuple[tuple[Phase, int], ...]:
    """Every ``(phase, round)`` pair in execution order: ``2 (n - 1)`` of them.

    >>> all_rounds(3)
    (('reduce-scatter', 0), ('reduce-scatter', 1), ('all-gather', 0), ('all-gather', 1))
    """
    return tuple((phase, r) for phase in PHASES for r in range(rounds_per_phase(n)))


def elements_sent_per_worker(n: int, s: int) -> int:
    """Elements one worker transmits over the whole run: ``2 (n-1) s / n`` (``traffic``).

    ``s`` is the number of elements each worker holds; it must be a multiple of ``n``.

    >>> elements_sent_per_worker(2, 2)
    2
    """
    return 2 * rounds_per_phase(n) * (s // n)
