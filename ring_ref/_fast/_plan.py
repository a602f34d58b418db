"""The fast engine's plan: the schedule's sends compiled once per ``N`` and checked.

:func:`plan` evaluates every send of :mod:`ring_ref.schedule` once per ``N``
(cached) -- the schedule's closed forms are called on numpy index arrays, a
block of rounds at a time -- and records, for each reduce-scatter round, which
worker's original chunk ``c`` is added to the running partial sum of chunk
``c`` (:class:`Add`), and the same as one :class:`Cycle` of workers that every
chunk's fold follows from its own first worker.  It checks the facts the
engine relies on: each chunk's partial sum travels as one value from worker to
worker, every addition adds a contribution the partial does not yet hold, and
all-gather only forwards completed chunks and delivers every one of them to
worker 0 -- in bulk, with closed forms per chunk, for a schedule of the ring's
shape, and send by send otherwise.  A schedule that broke these raises
:class:`ring_ref.invariants.InvariantViolation`, naming the first bad send,
instead of running.  :func:`chain_fold_order` does the same for the chain
(:class:`ring_ref.schedule.ChainSchedule`), whose segments all fold in one order.

The plan is all the engine needs of the schedule: all-gather only copies
completed chunks, so the engine returns each completed chunk once, in place
(:mod:`ring_ref._fast._run` runs the plan).

>>> plan(2).rounds
((Add(start=0, stop=1, own=1, incoming=0), Add(start=1, stop=2, own=-1, incoming=0)),)
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from ring_ref import schedule
from ring_ref.invariants import InvariantViolation
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, ChainSchedule, RingSchedule

_NONE: Final = np.iinfo(np.int64).min
"""``incoming`` of a chunk that already holds a partial sum, in the plan's index arrays."""

Array = npt.NDArray[Any]


class Sends(Protocol):
    """Where the plan reads the sends: :mod:`ring_ref.schedule` itself, or a :class:`RingSchedule`."""

    def right(self, i: Any, n: int) -> Any: ...

    def send_chunk(self, phase: schedule.Phase, i: Any, r: Any, n: int) -> Any: ...


class Add(NamedTuple):
    """One batched reduce-scatter addition over the chunks ``start .. stop - 1``.

    For each such chunk ``c`` the partial sum becomes ``incoming + x[c + own, c]``
    (worker ``c + own``'s original chunk ``c``), where ``incoming`` is the running
    partial sum of chunk ``c``, or, in the chunk's first addition, worker
    ``c + incoming``'s original chunk ``c``.  Offsets are plain integers: the
    workers are ``c + own`` and ``c + incoming`` exactly, with no wrap-around.
    """

    start: int
    stop: int
    own: int
    incoming: int | None


Rounds = tuple[tuple[Add, ...], ...]
"""The batched additions of each reduce-scatter round, in round order."""


class Cycle(NamedTuple):
    """Every chunk's worker order as one cycle of the workers, entered at a position per chunk.

    Chunk ``c`` entering at position ``p`` is the fold over the workers
    ``order[p], order[p + 1], ..., order[n - 1], order[0], ..., order[p - 1]``.
    ``entries[q] = (start, stop, p)``: the chunks ``start .. stop - 1`` enter at
    ``p, p + 1, ...``; where ``stop < start``, the mirror image: the chunks
    ``start, start - 1, ..., stop + 1`` enter at ``p, p + 1, ...`` (a ring run
    the other way, whose chunk ``c + 1`` enters one position *before* chunk ``c``).
    Both are int64, as :mod:`ring_ref._fast._kernel` reads them.
    """

    order: Array
    entries: Array


class Plan(NamedTuple):
    """The reduce-scatter additions of each round, and the same additions as one :class:`Cycle`."""

    rounds: Rounds
    cycle: Cycle


_WORKERS: Final = object()
"""Stands for every worker index in an :func:`_evaluate` call."""

_ROUND: Final = object()
"""Stands for every round index of the block in an :func:`_evaluate` call."""

BLOCK_ENTRIES: Final = 1 << 20
"""Sends evaluated at once while compiling a plan: rounds come in blocks of about this many sends."""


def _evaluate(
    function: Callable[..., int], *args: Any, n: int, rounds: range = range(1)
) -> npt.NDArray[np.int64]:
    """A function of :mod:`ring_ref.schedule` at every worker of every round in ``rounds`` at once.

    Returns int64 of shape ``(len(rounds), n)``: row ``j`` for round
    ``rounds[j]``, column ``i`` for worker ``i``.  The schedule is written as
    integer closed forms, which numpy evaluates on index arrays exactly as
    Python does on each integer (``%`` and ``//`` round the same way).  The
    result is compared with plain calls at a few points; a function that does
    not take arrays, or gives them other values, is called once per point.
    """
    call: Callable[..., Any] = function
    shape = (len(rounds), n)
    grid = {id(_WORKERS): np.arange(n, dtype=np.int64)[None, :]}
    grid[id(_ROUND)] = np.arange(rounds.start, rounds.stop, dtype=np.int64)[:, None]

    def at(r: int, i: int) -> int:
        return int(call(*({id(_WORKERS): i, id(_ROUND): r}.get(id(a), a) for a in args)))

    table: npt.NDArray[np.int64] | None = None
    try:
        with np.errstate(all="raise"):
            got = np.asarray(call(*(grid.get(id(a), a) for a in args)))
        if got.dtype.kind in "iu":
            table = np.broadcast_to(got, shape).astype(np.int64, copy=False)
    except (TypeError, ValueError, ArithmeticError):
        table = None
    probes = {(j, i) for j in (0, len(rounds) // 2, len(rounds) - 1) for i in (0, n // 3, n // 2, n - 1)}
    if table is not None and all(int(table[j, i]) == at(rounds[j], i) for j, i in probes):
        return table
    values = (at(r, i) for r in rounds for i in range(n))
    return np.fromiter(values, dtype=np.int64, count=shape[0] * n).reshape(shape)


def _blocks(count: int, n: int) -> list[range]:
    """``range(count)`` cut into consecutive blocks of about :data:`BLOCK_ENTRIES` ``/ n`` rounds."""
    size = max(1, BLOCK_ENTRIES // max(n, 1))
    return [range(r, min(count, r + size)) for r in range(0, count, size)]


def _in_range(values: npt.NDArray[np.int64], n: int) -> bool:
    return bool(((values >= 0) & (values < n)).all())


def _out_of_range(values: npt.NDArray[np.int64], n: int, what: str) -> InvariantViolation | None:
    bad = (values < 0) | (values >= n)
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return InvariantViolation(f"{what}: worker {i} gets {int(values[i])}, not one of 0 .. {n - 1}")


def _inverse(table: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64] | None:
    """Row by row, the inverse permutation of ``table`` (values ``0 .. n-1``); ``None`` if a row is none."""
    rows = table.shape[0]
    inverse = np.full(table.shape, -1, dtype=np.int64)
    at = (table + np.arange(0, rows * n, n, dtype=np.int64)[:, None]).ravel()
    inverse.ravel()[at] = np.tile(np.arange(n, dtype=np.int64), rows)
    return None if (inverse < 0).any() else inverse


def _is_one_cycle(dst: npt.NDArray[np.int64], n: int) -> bool:
    """Whether following ``dst`` from worker 0 visits every worker before returning to 0."""
    w, seen = 0, 0
    for _ in range(n):
        w, seen = int(dst[w]), seen + 1
        if w == 0:
            break
    return seen == n and w == 0


def _group_rows(own: npt.NDArray[np.int64], incoming: npt.NDArray[np.int64]) -> list[tuple[Add, ...]]:
    """Each row's runs of consecutive chunks with the same operand offsets, as :class:`Add` records."""
    rows, n = own.shape
    change = np.zeros((rows, n + 1), dtype=bool)
    change[:, 0] = change[:, n] = True
    change[:, 1:n] = (own[:, 1:] != own[:, :-1]) | (incoming[:, 1:] != incoming[:, :-1])
    at_row, at_chunk = np.nonzero(change)
    firsts = np.searchsorted(at_row, np.arange(rows + 1)).tolist()
    starts = at_chunk < n  # every bound but a row's end starts a run
    owns = own[at_row[starts], at_chunk[starts]].tolist()
    incomings = [None if v == _NONE else v for v in incoming[at_row[starts], at_chunk[starts]].tolist()]
    bounds = at_chunk.tolist()
    result = []
    for j in range(rows):
        first, last = firsts[j], firsts[j + 1]
        runs = range(first - j, last - j - 1)  # this row's runs among owns and incomings
        result.append(
            tuple(
                Add(lo, hi, owns[q], incomings[q])
                for q, (lo, hi) in zip(runs, itertools.pairwise(bounds[first:last]), strict=True)
            )
        )
    return result


def _reduce_scatter_in_bulk(
    n: int, ring: Sends = schedule
) -> tuple[Rounds, npt.NDArray[np.int64], Cycle] | None:
    """The reduce-scatter plan when the schedule has the ring's usual shape, checked in bulk; else ``None``.

    The shape: ``right`` visits all ``n`` workers in one cycle, there are
    ``n - 1`` rounds, every round sends each chunk exactly once, and each
    chunk is sent by the worker its previous round delivered it to.  Then
    every check of :func:`_reduce_scatter_walk` holds, in closed form per
    chunk: a chunk's partial travels as one value, and its contributors are
    its first sender and the next ``n - 1`` workers along the cycle, all
    distinct and all ``n`` of them: the order is a :class:`Cycle`.  Anything
    else is left to the walk.
    """
    count = schedule.rounds_per_phase(n)
    if n == 1:
        entries = np.array([[0, 1, 0]], dtype=np.int64)
        return ((), np.zeros(1, dtype=np.int64), Cycle(entries[0, 2:], entries)) if count == 0 else None
    dst = _evaluate(ring.right, _WORKERS, n, n=n)[0]
    if count != n - 1 or not _in_range(dst, n) or not _is_one_cycle(dst, n):
        return None
    chunks = np.arange(n, dtype=np.int64)
    rounds: list[tuple[Add, ...]] = []
    holder: npt.NDArray[np.int64] | None = None  # who holds each chunk's partial sum
    first = chunks  # each chunk's first worker
    for block in _blocks(count, n):
        sent = _evaluate(ring.send_chunk, schedule.REDUCE_SCATTER, _WORKERS, _ROUND, n, n=n, rounds=block)
        sender = _inverse(sent, n) if _in_range(sent, n) else None
        if sender is None:
            return None
        received = dst[sender]  # received[j, c]: the worker that adds into chunk c in round block[j]
        if (holder is not None and (sender[0] != holder).any()) or (sender[1:] != received[:-1]).any():
            return None
        incoming = np.full(sent.shape, _NONE, dtype=np.int64)
        if holder is None:
            incoming[0] = sender[0] - chunks
            first = sender[0]
        rounds.extend(_group_rows(received - chunks, incoming))
        holder = received[-1]
    assert holder is not None
    return tuple(rounds), holder, _cycle(dst, first)


def _cycle(dst: npt.NDArray[np.int64], first: npt.NDArray[np.int64]) -> Cycle:
    """The :class:`Cycle` of ``dst`` (one cycle through all workers) entered at each chunk's ``first``."""
    n = len(dst)
    order = np.empty(n, dtype=np.int64)
    w = 0
    for p in range(n):
        order[p] = w
        w = int(dst[w])
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    entries = _runs(position[first].tolist())
    return Cycle(order, np.array(entries, dtype=np.int64))


def _runs(enter: list[int]) -> list[tuple[int, int, int]]:
    """The chunks' entry positions ``enter`` as :class:`Cycle` entries: from chunk 0 on, each run of chunks
    as long as their entries step by one, up (``(lo, hi, enter[lo])``) or down (a ring run the other
    way: its mirror ``(hi - 1, lo - 1, enter[hi - 1])``, the last chunk entering first).

    >>> _runs([0, 1, 2]), _runs([1, 0, 3, 2]), _runs([5, 0])
    ([(0, 3, 0)], [(1, -1, 0), (3, 1, 2)], [(0, 1, 5), (1, 2, 0)])
    """
    runs = []
    lo = 0
    while lo < len(enter):
        hi = lo + 1
        d = enter[hi] - enter[lo] if hi < len(enter) and abs(enter[hi] - enter[lo]) == 1 else 1
        while hi < len(enter) and enter[hi] - enter[hi - 1] == d:
            hi += 1
        runs.append((lo, hi, enter[lo]) if d > 0 else (hi - 1, lo - 1, enter[hi - 1]))
        lo = hi
    return runs


def _rs_fault(
    r: int, src: int, c: int, n: int, problem: str, *, ring: Sends = schedule
) -> InvariantViolation:
    dst = ring.right(src, n)
    return InvariantViolation(
        f"reduce-scatter round {r}: worker {src} sends chunk {c} to worker {dst}, {problem}"
    )


def _repeats(chunk: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.bool_]:
    """For each sender, whether an earlier sender of the same round sends the same chunk."""
    repeated = np.zeros(n, dtype=bool)
    if int(np.bincount(chunk, minlength=n).max()) > 1:
        order = np.argsort(chunk, kind="stable")
        repeated[order[1:]] = chunk[order[1:]] == chunk[order[:-1]]
    return repeated


def _reduce_scatter_walk(n: int, ring: Sends = schedule) -> tuple[Rounds, npt.NDArray[np.int64]]:
    """The reduce-scatter plan for any schedule, or the first fault, by simulating every send.

    Round by round, all senders of a round at once, it tracks the worker
    holding each chunk's partial sum and the contributions the partial holds
    (``n^2`` flags); a fault is reported at the first round and sender where
    it happens, as a sequential walk over the sends would find it.
    """
    workers = np.arange(n, dtype=np.int64)
    dst = _evaluate(ring.right, _WORKERS, n, n=n)[0]
    fault = _out_of_range(dst, n, "right(i)")
    if fault:
        raise fault
    holder = np.full(n, -1, dtype=np.int64)  # the worker holding chunk c's partial sum, -1: none yet
    folded = np.zeros((n, n), dtype=bool)  # folded[c, w]: chunk c's partial holds worker w's contribution
    rounds: list[tuple[Add, ...]] = []
    for block in _blocks(schedule.rounds_per_phase(n), n):
        table = _evaluate(ring.send_chunk, schedule.REDUCE_SCATTER, _WORKERS, _ROUND, n, n=n, rounds=block)
        for r, chunk in zip(block, table, strict=True):
            fault = _out_of_range(chunk, n, f"reduce-scatter round {r}: the chunk sent")
            if fault:
                raise fault
            at = holder[chunk]
            fresh = at < 0
            in_flight = _repeats(chunk, n)
            stale = ~fresh & (at != workers)
            refolds = folded[chunk, dst] | (fresh & (dst == workers))
            faulty = in_flight | stale | refolds
            if faulty.any():
                src = int(np.argmax(faulty))
                if in_flight[src]:
                    problem = "but that chunk is already in flight this round"
                elif stale[src]:
                    problem = f"but its partial sum is at worker {int(at[src])}"
                else:
                    problem = "whose partial sum already holds the receiver's contribution"
                raise _rs_fault(r, src, int(chunk[src]), n, problem, ring=ring)
            folded[chunk[fresh], workers[fresh]] = True
            folded[chunk, dst] = True
            holder[chunk] = dst
            own = np.empty(n, dtype=np.int64)
            incoming = np.empty(n, dtype=np.int64)
            own[chunk] = dst - chunk  # no repeats: the n senders send every chunk exactly once
            incoming[chunk] = np.where(fresh, workers - chunk, _NONE)
            rounds.extend(_group_rows(own[None], incoming[None]))
    if n > 1:
        incomplete = (holder < 0) | (folded.sum(axis=1) != n)
        if incomplete.any():
            c = int(np.argmax(incomplete))
            raise InvariantViolation(f"after reduce-scatter chunk {c} is not complete at any worker")
    return tuple(rounds), np.where(holder < 0, 0, holder)


def _all_gather_in_bulk(n: int, owners: npt.NDArray[np.int64], ring: Sends = schedule) -> bool:
    """Whether all-gather has the ring's usual shape, checked in bulk (else :func:`_all_gather_walk` decides).

    The shape: each worker owns one completed chunk, ``right`` is a permutation,
    every worker first sends the chunk it owns and then, each round, the chunk
    it received the round before, and worker 0 ends up with every chunk.  Then
    only completed chunks move.
    """
    count = schedule.rounds_per_phase(n)
    if n == 1:
        return count == 0
    dst = _evaluate(ring.right, _WORKERS, n, n=n)[0]
    owned = _inverse(owners[None], n)
    left = _inverse(dst[None], n) if _in_range(dst, n) else None
    if owned is None or left is None:
        return False
    last = owned[0]  # last[i]: the chunk worker i holds newest, completed
    at_0 = [owned[0, 0]]
    for block in _blocks(count, n):
        sent = _evaluate(ring.send_chunk, schedule.ALL_GATHER, _WORKERS, _ROUND, n, n=n, rounds=block)
        if (sent[0] != last).any() or (sent[1:] != sent[:-1][:, left[0]]).any():
            return False
        last = sent[-1][left[0]]
        at_0.extend(sent[:, left[0, 0]].tolist())
    return len(set(at_0)) == n


def _all_gather_walk(n: int, owners: npt.NDArray[np.int64], ring: Sends = schedule) -> None:
    """Simulate every all-gather send: only completed chunks move, and worker 0 ends with all of them."""
    workers = np.arange(n, dtype=np.int64)
    dst = _evaluate(ring.right, _WORKERS, n, n=n)[0]
    complete = np.zeros((n, n), dtype=bool)  # complete[w, c]: worker w holds completed chunk c
    complete[owners, workers] = True
    for block in _blocks(schedule.rounds_per_phase(n), n):
        table = _evaluate(ring.send_chunk, schedule.ALL_GATHER, _WORKERS, _ROUND, n, n=n, rounds=block)
        for r, chunk in zip(block, table, strict=True):
            fault = _out_of_range(chunk, n, f"all-gather round {r}: the chunk sent")
            if fault:
                raise fault
            incomplete = ~complete[workers, chunk]
            if incomplete.any():
                src = int(np.argmax(incomplete))
                raise InvariantViolation(
                    f"all-gather round {r}: worker {src} forwards incomplete chunk {int(chunk[src])}"
                )
            complete[dst, chunk] = True
    missing = np.flatnonzero(~complete[0]).tolist()
    if missing:
        raise InvariantViolation(f"after all-gather worker 0 lacks completed chunks {missing}")


@lru_cache(maxsize=16)
def plan(n: int, ring: RingSchedule = SPEC) -> Plan:
    """The reduce-scatter additions of the ring for ``n`` workers, checked against the whole schedule.

    ``ring`` is a ring of the schedule family (its direction and offset; the
    layout does not change the plan): the spec's, from the functions of
    :mod:`ring_ref.schedule` themselves, by default.

    A schedule of the ring's usual shape is checked in bulk, with closed forms
    per chunk (:func:`_reduce_scatter_in_bulk`, :func:`_all_gather_in_bulk`);
    any other is simulated send by send, which words the first fault found.
    (Every reduce-scatter the simulation accepts has that shape: ``n - 1``
    rounds of distinct contributions along ``right`` reach all ``n`` workers
    from every starting worker only if ``right`` is one cycle.)  Either costs
    ``O(n^2)`` work in numpy operations over blocks of about a million sends:
    about a second at ``n = 4096`` here.  The result is cached.

    >>> [len(adds) for adds in plan(4).rounds]
    [2, 2, 2]
    """
    sends: Sends = schedule if (ring.direction, ring.offset % n) == (1, 0) else ring
    bulk = _reduce_scatter_in_bulk(n, sends)
    if bulk is None:
        # raises, naming the first fault: every schedule the walk accepts is ring-shaped
        _reduce_scatter_walk(n, sends)
        raise InvariantViolation(f"the reduce-scatter schedule for N = {n} does not move chunks in one cycle")
    rounds, owners, cycle = bulk
    if not _all_gather_in_bulk(n, owners, sends):
        _all_gather_walk(n, owners, sends)
    return Plan(rounds, cycle)


@lru_cache(maxsize=16)
def chain_fold_order(n: int, chain: ChainSchedule) -> tuple[int, ...]:
    """The one fold order every segment of ``chain`` follows, checked by simulating every step.

    Step by step, from the chain's own sends: a segment's partial sum travels as
    one value from worker to worker, is sent once per step at most, and every
    addition adds a contribution it does not hold yet; after the reduce every
    segment holds all ``n`` contributions in one and the same order (the
    engine folds every element alike); the broadcast forwards only completed
    segments and hands worker 0 every one of them.  A chain that broke these
    raises :class:`ring_ref.invariants.InvariantViolation`.  The result is cached.

    >>> chain_fold_order(4, ChainSchedule())
    (0, 1, 2, 3)
    """
    holder = [-1] * n  # who holds segment c's partial sum; -1: not yet sent
    # The contributions of segment c's partial in order, and as an n x n table of flags (compact:
    # at n = 4096, sets and lists of Python ints took gigabytes and made every collection slow).
    folded = [array.array("i") for _ in range(n)]
    held = bytearray(n * n)
    for t in range(chain.steps_per_phase(n)):
        sends = chain.sends(REDUCE_SCATTER, t, n)
        if len({send.chunk for send in sends}) != len(sends):
            raise InvariantViolation(f"chain reduce step {t}: a segment is sent twice")
        for send in sends:
            c = send.chunk
            if holder[c] >= 0 and holder[c] != send.src:
                raise InvariantViolation(
                    f"chain reduce step {t}: worker {send.src} sends segment {c}, "
                    f"but its partial sum is at worker {holder[c]}"
                )
            if held[c * n + send.dst] or send.dst == send.src:
                raise InvariantViolation(
                    f"chain reduce step {t}: worker {send.dst} adds into segment {c} twice"
                )
        for send in sends:
            c = send.chunk
            if not folded[c]:
                folded[c].append(send.src)
                held[c * n + send.src] = 1
            folded[c].append(send.dst)
            held[c * n + send.dst] = 1
            holder[c] = send.dst
    orders = {f.tobytes() for f in folded} if n > 1 else {array.array("i", [0]).tobytes()}
    order = tuple(array.array("i", next(iter(orders))))
    if len(orders) != 1 or sorted(order) != list(range(n)):
        shown = sorted(tuple(array.array("i", f)) for f in orders)
        raise InvariantViolation(f"after the chain reduce the segments fold as {shown}, not in one order")
    _check_chain_broadcast(n, chain, order[-1])
    return order


def _check_chain_broadcast(n: int, chain: ChainSchedule, holder: int) -> None:
    """The chain's broadcast forwards only completed segments (all at ``holder``) and hands worker 0 all."""
    complete = bytearray(n * n)  # complete[c * n + w]: worker w holds segment c complete
    for c in range(n):
        complete[c * n + holder] = 1
    for t in range(chain.steps_per_phase(n)):
        sends = chain.sends(ALL_GATHER, t, n)
        for send in sends:
            if not complete[send.chunk * n + send.src]:
                raise InvariantViolation(
                    f"chain broadcast step {t}: worker {send.src} forwards incomplete segment {send.chunk}"
                )
        for send in sends:
            complete[send.chunk * n + send.dst] = 1
    missing = [c for c in range(n) if not complete[c * n]]
    if missing:
        raise InvariantViolation(f"after the chain broadcast worker 0 lacks segments {missing}")
