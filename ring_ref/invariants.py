"""The spec's invariants as named, pure, closed-form predicates.

The ring is run on *provenance* as well as on values: a slot's provenance is the
tuple of worker ids whose contributions it holds, in the order they were folded
in (``(2, 3, 0)`` means ``(x_2 + x_3) + x_0``).  A sequence is stricter than a
multiset: it also pins the association order, which is what fixes the bits of a
floating-point result (clause ``fold-order``).

Closed forms (``spec/ring_all_reduce.md``; every ring's: ``spec/schedules.md``), with ``d = (i - c) mod n``:

* ``inv-rs-provenance``: after reduce-scatter round ``r`` (``r = -1`` is the
  initial state), slot ``c`` of worker ``i`` holds the arc ``c, c+1, ..., i``
  when ``d <= r + 1``, and only ``(i,)`` otherwise.
* ``inv-ag-provenance``: after all-gather round ``r``, worker ``i`` holds the
  complete chunk ``c`` (the arc of all ``n`` workers starting at ``c``) when
  ``(i + 1 - c) mod n <= r + 1``, and its reduce-scatter result otherwise.
* ``inv-finished-chunks``: the set of chunks worker ``i`` has finished is exactly
  the set those closed forms mark complete.

Every predicate takes the schedule as a keyword, ``schedule=SPEC`` by default
(clause ``schedule-invariants``): for a ring of direction ``d`` and offset ``k``
let ``t = ((i - c - k) d) mod n`` be worker ``i``'s position along chunk ``c``'s
fold.  After reduce-scatter round ``r`` slot ``c`` of worker ``i`` holds the
first ``t + 1`` workers of the fold ``c + k, c + k + d, ...`` when
``t <= r + 1`` and only ``(i,)`` otherwise; after all-gather round ``r`` it holds
the whole fold when ``(t + 1) mod n <= r + 1``.  For the spec's ring
(``d = 1, k = 0``) these are the closed forms above.

The chain (:class:`~ring_ref.schedule.ChainSchedule`, clause ``chain-invariants``)
is not a ring and has closed forms of its own, per step ``t`` of each phase:
:func:`chain_expected` and :func:`chain_finished`.  Nor is recursive doubling
(:class:`~ring_ref.schedule.DoublingSchedule`, clause ``doubling-invariants``): every
slot of a worker holds the same contributions, :func:`doubling_expected`.

From one round to the next the closed form changes in exactly one slot per
worker (:func:`changed_slot`), so :func:`check_round` can confirm a round in
``O(n)`` closed-form evaluations and ``O(n^2)`` C-level tuple comparisons, given
that the state before it was confirmed; :func:`check` confirms a whole state
from scratch.

>>> arc(3, 3, 4)
(3, 0, 1)
>>> rs_expected(4, 0, 2, 1)
(1, 2)
>>> rs_expected(4, 0, 3, 1)
(3,)
>>> ag_expected(4, 0, 0, 0)
(0, 1, 2, 3)
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, TypeVar

from ring_ref.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    SPEC,
    ChainSchedule,
    DoublingSchedule,
    Phase,
    RingSchedule,
    Schedule,
    rounds_per_phase,
)

__all__ = [
    "InvariantViolation",
    "Provenance",
    "State",
    "Violation",
    "ag_expected",
    "arc",
    "chain_expected",
    "chain_finished",
    "changed_slot",
    "check",
    "check_round",
    "doubling_expected",
    "expected_finished",
    "expected_state",
    "expected_state_before",
    "finished_chunks",
    "first_violation",
    "holds_ag_invariant",
    "holds_finished_chunks",
    "holds_rs_invariant",
    "is_complete",
    "rs_expected",
]


T = TypeVar("T")

State = tuple[tuple[T, ...], ...]
"""Worker-major buffers: ``state[i][c]`` is chunk slot ``c`` of worker ``i``."""

Provenance = tuple[int, ...]
"""Worker ids whose contributions a slot holds, in fold order."""


class InvariantViolation(AssertionError):
    """A ring state broke one of the spec's invariants."""


class Violation(NamedTuple):
    """The first slot whose provenance differs from the closed form."""

    worker: int
    slot: int
    expected: Provenance
    actual: Provenance


@lru_cache(maxsize=64)
def _doubled_ring(n: int) -> Provenance:
    return tuple(range(n)) * 2


@lru_cache(maxsize=64)
def _doubled_reversed_ring(n: int) -> Provenance:
    return tuple(range(n - 1, -1, -1)) * 2


def arc(start: int, length: int, n: int, direction: int = 1) -> Provenance:
    """Workers ``start, start + d, ...`` (mod ``n``), ``length`` of them (``0 <= length <= n``).

    >>> arc(1, 3, 4, -1)
    (1, 0, 3)
    """
    if direction == 1:
        return _doubled_ring(n)[start % n : start % n + length]
    first = n - 1 - start % n
    return _doubled_reversed_ring(n)[first : first + length]


def is_complete(p: Provenance, n: int) -> bool:
    """True when ``p`` holds every worker's contribution exactly once.

    >>> is_complete((2, 0, 1), 3), is_complete((0, 1, 1), 3)
    (True, False)
    """
    return len(p) == n and frozenset(p) == _all_workers(n)


@lru_cache(maxsize=64)
def _all_workers(n: int) -> frozenset[int]:
    return frozenset(range(n))


def rs_expected(n: int, r: int, i: int, c: int, *, schedule: RingSchedule = SPEC) -> Provenance:
    """Closed form of slot ``c`` of worker ``i`` after reduce-scatter round ``r``.

    >>> from ring_ref.schedule import GLOO
    >>> rs_expected(4, 1, 1, 0, schedule=GLOO)
    (3, 2, 1)
    """
    if schedule is SPEC:
        d = (i - c) % n
        return arc(c, d + 1, n) if d <= r + 1 else (i,)
    t = schedule.position(i, c, n)
    return arc(c + schedule.offset, t + 1, n, schedule.direction) if t <= r + 1 else (i,)


def ag_expected(n: int, r: int, i: int, c: int, *, schedule: RingSchedule = SPEC) -> Provenance:
    """Closed form of slot ``c`` of worker ``i`` after all-gather round ``r``."""
    if (schedule.position(i, c, n) + 1) % n <= r + 1:
        return arc(c + schedule.offset, n, n, schedule.direction)
    return rs_expected(n, rounds_per_phase(n) - 1, i, c, schedule=schedule)


def chain_expected(phase: Phase, t: int, n: int, i: int, c: int) -> Provenance:
    """The chain's closed form of segment ``c`` of worker ``i`` after step ``t`` of ``phase``.

    Clause ``chain-invariants``.

    After reduce step ``t`` (``t = -1``: the start) worker ``i`` holds the prefix
    ``(0, 1, ..., i)`` once segment ``c`` has reached it (``i = 0``, or
    ``c + i - 1 <= t``), else only ``(i,)``.  After broadcast step ``t`` worker
    ``i``, at position ``p = (i + 1) mod n``, holds the whole fold ``(0, ..., n - 1)``
    once ``p = 0`` or ``c + p - 1 <= t``, else its prefix ``(0, ..., i)``.

    >>> [chain_expected("reduce-scatter", 1, 3, i, 0) for i in range(3)]
    [(0,), (0, 1), (0, 1, 2)]
    >>> [chain_expected("all-gather", 0, 3, i, 1) for i in range(3)]
    [(0,), (0, 1), (0, 1, 2)]
    """
    if phase == REDUCE_SCATTER:
        return _doubled_ring(n)[: i + 1] if i == 0 or c + i - 1 <= t else (i,)
    p = (i + 1) % n
    return _doubled_ring(n)[: n if p == 0 or c + p - 1 <= t else i + 1]


def chain_finished(phase: Phase, t: int, n: int) -> tuple[frozenset[int], ...]:
    """The segments each worker holds complete after step ``t`` of ``phase`` (``chain-invariants``).

    In the reduce only worker ``n - 1`` finishes segments, ``c`` once
    ``c + n - 2 <= t`` (with ``n = 1``, worker 0 from the start); in the broadcast
    worker ``i`` at position ``p = (i + 1) mod n`` has every ``c`` with ``p = 0``
    or ``c + p - 1 <= t``.

    >>> chain_finished("reduce-scatter", 2, 3)
    (frozenset(), frozenset(), frozenset({0, 1}))
    """
    if phase == REDUCE_SCATTER:
        return tuple(frozenset(c for c in range(n) if i == n - 1 and c + i - 1 <= t) for i in range(n))
    return tuple(
        frozenset(c for c in range(n) if (i + 1) % n == 0 or c + (i + 1) % n - 1 <= t) for i in range(n)
    )


def doubling_expected(phase: Phase, t: int, n: int, i: int, doubling: DoublingSchedule) -> Provenance:
    """Recursive doubling's closed form of every slot of worker ``i`` after step ``t`` of ``phase``.

    Clause ``doubling-invariants``.  After the post-step (all-gather), and after
    the last doubling step for every worker taking part, the whole ``(0, ..., n -
    1)``.  After reduce-scatter step ``t`` (``t = -1``: the start) worker ``i``
    with new rank ``v`` that has done ``s`` doubling steps holds, in rank order,
    the workers of the new ranks that agree with ``v`` above bit ``s``
    (new rank ``w`` is workers ``2 w, 2 w + 1`` for ``w < rem``, else ``w + rem``);
    before the pre-step, and an even worker below ``2 rem`` throughout, ``(i,)``.

    >>> from ring_ref.schedule import RECURSIVE_DOUBLING as RD
    >>> [doubling_expected("reduce-scatter", 0, 3, i, RD) for i in range(3)]
    [(0,), (0, 1), (2,)]
    >>> [doubling_expected("reduce-scatter", 0, 4, i, RD) for i in range(4)]
    [(0, 1), (0, 1), (2, 3), (2, 3)]
    """
    if phase == ALL_GATHER:
        return tuple(range(n))
    _, rem = doubling.powers(n)
    v = doubling.new_rank(i, n)
    if v is None or (rem and t < 0):
        return (i,)
    s = doubling.doubling_step(t, n) if t >= 0 else 0
    block = [w for w in range(doubling.powers(n)[0]) if w >> s == v >> s]
    return tuple(worker for w in block for worker in ((2 * w, 2 * w + 1) if w < rem else (w + rem,)))


def expected_state(phase: Phase, r: int, n: int, *, schedule: Schedule = SPEC) -> State[Provenance]:
    """The whole provenance state after round ``r`` of ``phase`` (reduce-scatter ``r = -1``: start)."""
    if isinstance(schedule, DoublingSchedule):
        return tuple((doubling_expected(phase, r, n, i, schedule),) * n for i in range(n))
    if isinstance(schedule, ChainSchedule):
        return tuple(tuple(chain_expected(phase, r, n, i, c) for c in range(n)) for i in range(n))
    slot = rs_expected if phase == REDUCE_SCATTER else ag_expected
    return tuple(tuple(slot(n, r, i, c, schedule=schedule) for c in range(n)) for i in range(n))


def expected_state_before(phase: Phase, r: int, n: int, *, schedule: Schedule = SPEC) -> State[Provenance]:
    """The whole provenance state just before round ``r`` of ``phase``: after round ``r - 1``, and
    before all-gather's first round the reduce-scatter's end state.

    >>> expected_state_before(ALL_GATHER, 0, 2) == expected_state(REDUCE_SCATTER, 0, 2)
    True
    """
    if phase == ALL_GATHER and r == 0:
        last = sum(1 for p, _ in schedule.all_rounds(n) if p == REDUCE_SCATTER)
        return expected_state(REDUCE_SCATTER, last - 1, n, schedule=schedule)
    return expected_state(phase, r - 1, n, schedule=schedule)


def first_violation(
    state: State[Provenance], phase: Phase, r: int, *, schedule: Schedule = SPEC
) -> Violation | None:
    """The first ``(worker, slot)`` whose provenance breaks the closed form, or ``None``."""
    n = len(state)
    expected = expected_state(phase, r, n, schedule=schedule)
    if state == expected:
        return None
    if len(state) != n or any(len(row) != n for row in state):
        raise ValueError(f"a ring state must be {n} workers x {n} slots")
    for i, (got_row, want_row) in enumerate(zip(state, expected, strict=True)):
        for c, (got, want) in enumerate(zip(got_row, want_row, strict=True)):
            if got != want:
                return Violation(i, c, want, got)
    raise AssertionError("unreachable: states differ but no slot does")


def holds_rs_invariant(state: State[Provenance], r: int, *, schedule: Schedule = SPEC) -> bool:
    """``inv-rs-provenance``: ``state`` is exactly the closed form after reduce-scatter round ``r``."""
    return first_violation(state, REDUCE_SCATTER, r, schedule=schedule) is None


def holds_ag_invariant(state: State[Provenance], r: int, *, schedule: Schedule = SPEC) -> bool:
    """``inv-ag-provenance``: ``state`` is exactly the closed form after all-gather round ``r``."""
    return first_violation(state, ALL_GATHER, r, schedule=schedule) is None


def finished_chunks(state: State[Provenance]) -> tuple[frozenset[int], ...]:
    """For each worker, the chunk slots it holds complete.

    >>> finished_chunks((((0,), (1, 0)), ((0, 1), (1,))))
    (frozenset({1}), frozenset({0}))
    """
    n = len(state)
    return tuple(frozenset(c for c, p in enumerate(row) if is_complete(p, n)) for row in state)


def expected_finished(
    phase: Phase, r: int, n: int, *, schedule: Schedule = SPEC
) -> tuple[frozenset[int], ...]:
    """``inv-finished-chunks`` in closed form.

    After reduce-scatter round ``r`` worker ``i`` has finished chunk ``(i + 1) mod n``
    once ``r = n - 2`` and nothing before; after all-gather round ``r`` it has
    finished every ``c`` with ``(i + 1 - c) mod n <= r + 1``.  With ``n = 1`` the
    single chunk is finished from the start (``r = -1 = n - 2``).  For another
    schedule ``(i + 1 - c)`` reads ``t + 1``, with ``t`` worker ``i``'s position along
    chunk ``c``'s fold.
    """
    if isinstance(schedule, ChainSchedule):
        return chain_finished(phase, r, n)
    if isinstance(schedule, DoublingSchedule):
        whole = tuple(range(n))
        done = (doubling_expected(phase, r, n, i, schedule) == whole for i in range(n))
        return tuple(frozenset(range(n)) if full else frozenset() for full in done)
    reach = r + 1 if phase == ALL_GATHER else (0 if r == n - 2 else -1)
    return tuple(
        frozenset(c for c in range(n) if (schedule.position(i, c, n) + 1) % n <= reach) for i in range(n)
    )


def holds_finished_chunks(
    state: State[Provenance], phase: Phase, r: int, *, schedule: Schedule = SPEC
) -> bool:
    """``inv-finished-chunks``: workers have finished exactly the chunks the closed form says."""
    return finished_chunks(state) == expected_finished(phase, r, len(state), schedule=schedule)


def check(state: State[Provenance], phase: Phase, r: int, *, schedule: Schedule = SPEC) -> None:
    """Raise :class:`InvariantViolation` naming the first broken slot, if any."""
    violation = first_violation(state, phase, r, schedule=schedule)
    who = "the spec" if schedule == SPEC else f"the schedule ({schedule.describe()})"
    if violation is not None:
        raise InvariantViolation(
            f"after {phase} round {r}: worker {violation.worker} slot {violation.slot} holds "
            f"contributions {violation.actual}, {who} requires {violation.expected}"
        )
    if not holds_finished_chunks(state, phase, r, schedule=schedule):
        raise InvariantViolation(
            f"after {phase} round {r}: finished chunks {finished_chunks(state)} differ from "
            f"{expected_finished(phase, r, len(state), schedule=schedule)}"
        )


def changed_slot(phase: Phase, r: int, i: int, n: int, *, schedule: RingSchedule = SPEC) -> int:
    """The one slot of worker ``i`` whose closed form changes in round ``r`` of ``phase``.

    Reduce-scatter: the slot with ``(i - c) mod n = r + 1``; all-gather: the slot
    with ``(i + 1 - c) mod n = r + 1``.  (They are the slots the schedule delivers
    to worker ``i``; ``tests/cover/test_invariants.py`` and the CrossHair contract
    ``changed_slot_is_the_only_change`` check this against the closed forms.)

    For another schedule it is the slot :meth:`~ring_ref.schedule.RingSchedule.recv_chunk`
    delivers.

    >>> [changed_slot("reduce-scatter", 0, i, 4) for i in range(4)]
    [3, 0, 1, 2]
    """
    if schedule is not SPEC:
        return schedule.recv_chunk(phase, i, r, n)
    return (i - r - 1) % n if phase == REDUCE_SCATTER else (i - r) % n


def _chain_step_holds(
    before: State[Provenance], after: State[Provenance], phase: Phase, t: int, chain: ChainSchedule
) -> bool:
    """Whether chain step ``t`` changed only the segments it delivers, each to its closed form."""
    n = len(after)
    for i, (row, old) in enumerate(zip(after, before, strict=True)):
        c = chain.recv_segment(phase, i, t, n)
        if c is None:
            if row != old:
                return False
        elif (
            len(row) != n
            or row[:c] != old[:c]
            or row[c + 1 :] != old[c + 1 :]
            or row[c] != chain_expected(phase, t, n, i, c)
        ):
            return False
    return True


def check_round(
    before: State[Provenance],
    after: State[Provenance],
    phase: Phase,
    r: int,
    *,
    schedule: Schedule = SPEC,
) -> None:
    """Raise :class:`InvariantViolation` unless ``after`` is the closed form after round ``r``.

    ``before`` must be the confirmed closed form of the previous round (for
    all-gather round 0: the end of reduce-scatter).  Then it suffices that each
    worker's :func:`changed_slot` holds its closed form and every other slot is
    unchanged.  When that shortcut fails, the full :func:`check` decides and
    names the first broken slot.  In a chain step a worker that receives
    nothing must keep every slot (:meth:`~ring_ref.schedule.ChainSchedule.recv_segment`).
    """
    n = len(after)
    if isinstance(schedule, DoublingSchedule):  # every slot of a receiving worker changes
        check(after, phase, r, schedule=schedule)
        return
    if isinstance(schedule, ChainSchedule):
        if not _chain_step_holds(before, after, phase, r, schedule):
            check(after, phase, r, schedule=schedule)
        return
    expected = rs_expected if phase == REDUCE_SCATTER else ag_expected
    for i, (row, old) in enumerate(zip(after, before, strict=True)):
        c = changed_slot(phase, r, i, n, schedule=schedule)
        if (
            len(row) != n
            or row[:c] != old[:c]
            or row[c + 1 :] != old[c + 1 :]
            or row[c] != expected(n, r, i, c, schedule=schedule)
        ):
            check(after, phase, r, schedule=schedule)
            return
