"""The generic pure-functional ring over immutable tuples.

A state is ``state[i][c]``: chunk slot ``c`` of worker ``i``.  Each round is a
function from the state at the start of the round to a *new* state; every send
reads the old state only, so a value received in a round cannot be forwarded in
the same round (clause ``simultaneous-rounds``).  The functions are generic over
the slot type and the combine operation: the same code runs on tensors, on plain
numbers and on provenance.

>>> state = initial_state([[1, 2], [3, 4]])
>>> state = reduce_scatter_round(state, 0, lambda incoming, own: incoming + own)
>>> state
((1, 6), (4, 4))
>>> all_gather_round(state, 0)
((4, 6), (4, 6))
>>> run_ring(initial_state([[1, 2], [3, 4]]), lambda a, b: a + b)[0]
(4, 6)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ring_ref import invariants
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import (
    ALL_GATHER,
    PHASES,
    REDUCE_SCATTER,
    SPEC,
    ChainSchedule,
    DoublingSchedule,
    Phase,
    RingSchedule,
    Schedule,
    ag_recv_chunk,
    left,
    rounds_per_phase,
    rs_recv_chunk,
)

__all__ = [
    "Combine",
    "Observer",
    "all_gather_round",
    "chain_step",
    "exchange",
    "fold",
    "gather_state",
    "initial_state",
    "never_combine",
    "provenance_state",
    "reduce_scatter_round",
    "run_ring",
    "step",
]


T = TypeVar("T")

Combine = Callable[[T, T], T]
"""``combine(incoming, own)``: what a receiver stores after reduce-scatter receives."""

Observer = Callable[[Phase, int, State[T], State[Provenance]], None]
"""Called after every round with the phase, the round, the new state and its provenance."""


def initial_state(buffers: Sequence[Sequence[T]]) -> State[T]:
    """Freeze ``n`` workers' lists of ``n`` chunks into a state.

    >>> initial_state([[1]])
    ((1,),)
    """
    n = len(buffers)
    if n == 0 or any(len(row) != n for row in buffers):
        raise ValueError(f"a ring state needs n >= 1 workers of n chunks each; got {n} workers")
    return tuple(tuple(row) for row in buffers)


def gather_state(shards: Sequence[T]) -> State[T]:
    """All-gather's starting state for ``n`` shards (clause ``agc-copy``): worker ``i`` holds its shard.

    Every slot of worker ``i`` starts as ``shards[i]``; the ring's invariants,
    checked after every round (:func:`run_ring` with ``phases=(ALL_GATHER,)``),
    confirm that only slot ``owned_chunk(i)`` (``i`` for a ring with ``k = d``)
    is ever sent and that every other slot is overwritten before it is read.

    >>> gather_state(["a", "b"])
    (('a', 'a'), ('b', 'b'))
    """
    return initial_state([[shard] * len(shards) for shard in shards])


def provenance_state(n: int) -> State[Provenance]:
    """The initial provenance: every slot of worker ``i`` holds only ``(i,)``.

    >>> provenance_state(2)
    (((0,), (0,)), ((1,), (1,)))
    """
    return tuple(tuple((i,) for _ in range(n)) for i in range(n))


def fold(incoming: Provenance, own: Provenance) -> Provenance:
    """The provenance combine: contributions in the order they were added.

    >>> fold((2, 3), (0,))
    (2, 3, 0)
    """
    return incoming + own


def exchange(
    state: State[T],
    recv_chunk: Callable[[int], int | None],
    update: Combine[T],
    *,
    schedule: Schedule = SPEC,
) -> State[T]:
    """One simultaneous round: worker ``i`` receives slot ``recv_chunk(i)`` from its left neighbour.

    The new slot is ``update(incoming, own)``; every other slot is kept (all of
    them when ``recv_chunk(i)`` is ``None``: a chain step in which ``i`` idles).  All
    reads are from ``state``, the buffers at the start of the round.  The left
    neighbour is ``schedule``'s (``i - d``; the spec's ``i - 1`` by default).
    """
    n = len(state)
    assert not isinstance(schedule, DoublingSchedule), "recursive doubling runs doubling_step"
    sender = left if schedule is SPEC else schedule.left
    new_rows = []
    for i, row in enumerate(state):
        c = recv_chunk(i)
        if c is None:
            new_rows.append(row)
            continue
        # Slice concatenation: measurably faster than star-unpacking for long rows.
        new_rows.append(row[:c] + (update(state[sender(i, n)][c], row[c]),) + row[c + 1 :])  # noqa: RUF005
    return tuple(new_rows)


def never_combine(incoming: T, own: T) -> T:
    """The combine of a run of all-gather alone, which copies and never combines: raises if called."""
    raise AssertionError("all-gather copies what it receives; it never combines")


def _take_incoming(incoming: T, _own: T) -> T:
    return incoming


def reduce_scatter_round(
    state: State[T], r: int, combine: Combine[T], *, schedule: RingSchedule = SPEC
) -> State[T]:
    """Reduce-scatter round ``r``: worker ``i`` adds what its left neighbour sends.

    Clauses ``rs-send-chunk`` and ``rs-add``: the left neighbour sends chunk
    ``(i - 1 - r) mod n``; worker ``i`` stores ``combine(incoming, own)`` in that
    slot and keeps every other slot.  Another ``schedule`` sends its own chunks
    (clause ``schedule-family``).
    """
    n = len(state)
    recv = rs_recv_chunk if schedule is SPEC else schedule.rs_recv_chunk
    return exchange(state, lambda i: recv(i, r, n), combine, schedule=schedule)


def all_gather_round(state: State[T], r: int, *, schedule: RingSchedule = SPEC) -> State[T]:
    """All-gather round ``r``: worker ``i`` replaces a slot with what its left neighbour sends.

    Clauses ``ag-send-chunk`` and ``ag-copy-not-add``.
    """
    n = len(state)
    recv = ag_recv_chunk if schedule is SPEC else schedule.ag_recv_chunk
    return exchange(state, lambda i: recv(i, r, n), _take_incoming, schedule=schedule)


def chain_step(state: State[T], phase: Phase, t: int, combine: Combine[T], chain: ChainSchedule) -> State[T]:
    """Step ``t`` of the chain's ``phase`` (clause ``chain-steps``).

    In the reduce, worker ``i`` stores ``combine(incoming, own)`` in the segment
    its left neighbour sends (``rs-add``, as a ring does); in the broadcast it
    copies it.  A worker that receives nothing in step ``t`` keeps its buffer.

    >>> from ring_ref.schedule import CHAIN
    >>> chain_step(initial_state([[1, 2], [3, 4]]), "reduce-scatter", 0, lambda a, b: a + b, CHAIN)
    ((1, 2), (4, 4))
    """
    n = len(state)
    update = combine if phase == REDUCE_SCATTER else _take_incoming
    return exchange(state, lambda i: chain.recv_segment(phase, i, t, n), update, schedule=chain)


def doubling_step(
    state: State[T], phase: Phase, t: int, combine: Combine[T], doubling: DoublingSchedule
) -> State[T]:
    """Step ``t`` of recursive doubling's ``phase`` (clause ``doubling-steps``).

    In reduce-scatter a receiving worker stores ``combine(lower, upper)`` in
    every slot, the lower worker's buffer first (its own or what it receives);
    in all-gather (the post-step) it copies every slot.  A worker that receives
    nothing keeps its buffer.  All reads are from ``state``.

    >>> from ring_ref.schedule import RECURSIVE_DOUBLING as RD
    >>> doubling_step(initial_state([[1] * 3, [2] * 3, [4] * 3]), "reduce-scatter", 0, lambda a, b: a + b, RD)
    ((1, 1, 1), (3, 3, 3), (4, 4, 4))
    """
    n = len(state)
    new_rows = []
    for i, row in enumerate(state):
        j = doubling.partner(phase, i, t, n)
        if j is None:
            new_rows.append(row)
        elif phase == ALL_GATHER:
            new_rows.append(state[j])
        else:
            lower, upper = (state[j], row) if j < i else (row, state[j])
            new_rows.append(tuple(combine(a, b) for a, b in zip(lower, upper, strict=True)))
    return tuple(new_rows)


def step(
    state: State[T], phase: Phase, r: int, combine: Combine[T], *, schedule: Schedule = SPEC
) -> State[T]:
    """Round ``r`` of ``phase`` (for the chain and recursive doubling: step ``r``)."""
    if isinstance(schedule, DoublingSchedule):
        return doubling_step(state, phase, r, combine, schedule)
    if isinstance(schedule, ChainSchedule):
        return chain_step(state, phase, r, combine, schedule)
    if phase == REDUCE_SCATTER:
        return reduce_scatter_round(state, r, combine, schedule=schedule)
    return all_gather_round(state, r, schedule=schedule)


def run_ring(
    state: State[T],
    combine: Combine[T],
    observe: Observer[T] | None = None,
    *,
    schedule: Schedule = SPEC,
    phases: Sequence[Phase] = PHASES,
) -> State[T]:
    """Run ``phases`` (both, by default) on ``state`` and return every worker's final buffer.

    The provenance of every slot is carried alongside in lock step and checked
    against the spec's closed forms: in full before the first round and after
    the last, and after every round in between by
    :func:`ring_ref.invariants.check_round`, which is exact given the previous
    round was.  A violation raises
    :class:`ring_ref.invariants.InvariantViolation`.  With one worker no round
    runs (clause ``n1-no-rounds``).  ``schedule`` picks the ring of the family
    (clause ``schedule-family``; the spec's by default), or the chain
    (:class:`~ring_ref.schedule.ChainSchedule`, clauses ``chain-*``), whose rounds
    are its steps; its closed forms are the ones checked.

    ``phases=(REDUCE_SCATTER,)`` runs reduce-scatter alone (clause ``rsc-phase``):
    the same rounds and checks, ending where all-reduce's reduce-scatter ends.
    ``phases=(ALL_GATHER,)`` runs all-gather alone (clause ``agc-copy``) on a
    state whose provenance starts as reduce-scatter's end (each worker's owned
    slot complete; see :func:`gather_state`).  The chain runs both phases only.
    """
    n = len(state)
    if tuple(phases) not in (PHASES, (REDUCE_SCATTER,), (ALL_GATHER,)):
        raise ValueError(
            f"phases must be both phases, reduce-scatter alone or all-gather alone; got {phases}"
        )
    if isinstance(schedule, ChainSchedule | DoublingSchedule) and tuple(phases) != PHASES:
        what = "the chain" if isinstance(schedule, ChainSchedule) else "recursive doubling"
        raise ValueError(f"{what} is not a ring: it runs both phases together; got phases={phases}")
    phase: Phase = REDUCE_SCATTER
    r = -1 if phases[0] == REDUCE_SCATTER else rounds_per_phase(n) - 1
    # all-gather alone starts where reduce-scatter ends: each worker's owned slot complete
    provenance = provenance_state(n) if r == -1 else invariants.expected_state(phase, r, n, schedule=schedule)
    invariants.check(provenance, phase, r, schedule=schedule)
    for phase, r in (round_ for round_ in schedule.all_rounds(n) if round_[0] in phases):
        state = step(state, phase, r, combine, schedule=schedule)
        before, provenance = provenance, step(provenance, phase, r, fold, schedule=schedule)
        invariants.check_round(before, provenance, phase, r, schedule=schedule)
        if observe is not None:
            observe(phase, r, state, provenance)
    invariants.check(provenance, phase, r, schedule=schedule)
    return state
