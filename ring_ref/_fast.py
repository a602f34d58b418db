"""The fast engine: the spec's additions, without the spec's bookkeeping.

It performs exactly the additions the reference core (:mod:`ring_ref.core`)
performs, with the same operands in the same order and dtype, so its result is
bitwise identical (clause ``fold-order``); only the bookkeeping differs.  The
other reductions (clauses ``op-*``) run the same plan with their own combine
in place of the addition (``incoming * own``; ``own`` if ``own > incoming``
else ``incoming`` for ``max``, ``<`` for ``min``, as :mod:`ring_ref._ops`
defines them), and ``avg`` divides the sum once by ``N`` with
:func:`ring_ref._ops.finish_torch` (``finish_numpy``), as the reference does:

* **A plan, compiled from the schedule.**  :func:`plan` evaluates every send of
  :mod:`ring_ref.schedule` once per ``N`` (cached) -- the schedule's closed
  forms are called on numpy index arrays, a block of rounds at a time -- and
  records, for each reduce-scatter round, which worker's original chunk ``c``
  is added to the running partial sum of chunk ``c``, and the same as one
  :class:`Cycle` of workers that every chunk's fold follows from its own first
  worker.  It checks the facts the engine relies on: each chunk's partial sum
  travels as one value from worker to worker, every addition adds a
  contribution the partial does not yet hold, and all-gather only forwards
  completed chunks and delivers every one of them to worker 0 -- in bulk, with
  closed forms per chunk, for a schedule of the ring's shape, and send by send
  otherwise.  A schedule that broke these raises
  :class:`ring_ref.invariants.InvariantViolation`, naming the first bad send,
  instead of running.
* **One running partial per chunk.**  Worker ``i``'s slot ``c`` is only ever
  read as the sender's partial sum, so the engine keeps one result-sized
  buffer and never materialises the other ``N^2 - N`` slots.
* **All-gather moves bytes the result does not need.**  It copies completed
  chunks between workers and never changes a value; the plan proves it hands
  worker 0 every completed chunk, so the engine returns each completed chunk
  once, in place.
* **float32 and float64 on the CPU: one compiled pass** (:mod:`ring_ref._kernel`).
  Every element's fold runs in machine code over cache-sized tiles, the input
  read once, on up to ``torch.get_num_threads()`` threads; each op's kernel is
  compiled on its first use.  This covers every
  layout whose ``(M, ...)`` part is one stride apart per element (contiguous,
  sliced, transposed, expanded workers, negative numpy strides).
* **Everything else: a few batched array operations per round.**  float16,
  bfloat16, other devices (CUDA), layouts the kernel cannot address and
  unaligned data run the same plan as ``torch.add`` (or ``numpy.add``) calls: a round's additions over
  a run of consecutive chunks are one call on a strided *view* of the input
  (the own operands ``x[c + off, c]`` lie on one diagonal of the ``(worker,
  chunk)`` grid), tile by tile on the CPU so the partial sums stay in cache.

Finiteness (clause ``bad-input``) is checked on the result rather than the
input where that proves anything, for torch and numpy inputs alike: an
addition or a multiplication with a NaN or infinite operand never yields a
finite value, so a finite sum or product proves a finite input.  The kernel
checks each finished tile while it is in cache; the batched path checks each
tile with one reduction (a sum, or the maximum and minimum for float16,
bfloat16 and numpy).  ``max`` and ``min`` drop a NaN (and ``max`` a ``-inf``)
met as the own operand, so for them the kernel checks every input element as
it reads it, and the batched path reduces the whole input once.  Only a
result not proven finite -- or, rarely, a finite one whose sum overflows --
pays for the exact input scan (:mod:`ring_ref._validate`) that tells bad input
from a sum or product that overflowed to ``±inf`` (or a product ``inf * 0``),
which is the correctly rounded result (clause ``input-finite``).

Autograd is supported for ``sum`` and ``avg`` (``prod``, ``max`` and ``min`` on
a tensor that needs a graph or a tangent are refused with a ``ValueError``
pointing to the reference engine, which differentiates them; under
``torch.func.vmap`` alone they run), and so are ``torch.func``
transforms (``grad``, ``vmap``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian``): for a tensor that
records a graph, carries a tangent or is a ``torch.func`` wrapper, the
computation runs inside a :class:`torch.autograd.Function` (elsewhere it
skips the Function's per-call cost) whose backward passes the output gradient to
every worker unchanged -- what the reference's chain of additions gives, bit
for bit -- whose forward-mode derivative is the same ring over the tangents,
and whose ``vmap`` rule treats the batch as one more trailing dimension.  The
result never is a view, so in-place operations on it work.

>>> import torch
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), op="max")
tensor([3., 4.])
>>> plan(2).rounds
((Add(start=0, stop=1, own=1, incoming=0), Add(start=1, stop=2, own=-1, incoming=0)),)
"""

from __future__ import annotations

import array
import itertools
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from types import ModuleType
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.autograd import forward_ad

from ring_ref import _validate, schedule
from ring_ref._chunks import chunk_bounds
from ring_ref._ops import Op, finish_numpy, finish_torch, numpy_combine_out, torch_combine_out
from ring_ref.invariants import InvariantViolation
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, ChainSchedule, Layout, RingSchedule, Schedule

TILE_BYTES = 2 << 20
"""Bytes of partial sums per CPU tile on the batched path with torch operations (see ``make bench``)."""

NUMPY_TILE_BYTES = 256 << 10
"""The same with numpy operations, whose lower per-call cost makes smaller tiles pay."""

KERNEL_DTYPES: Final = (torch.float32, torch.float64)
"""The dtypes the compiled kernel adds natively; float16 and bfloat16 take the batched path."""

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
    ``p, p + 1, ...``.  Both are int64, as :mod:`ring_ref._kernel` reads them.
    """

    order: Array
    entries: Array


class Plan(NamedTuple):
    """The reduce-scatter additions of each round, and the same additions as one :class:`Cycle`."""

    rounds: Rounds
    cycle: Cycle


# --- the plan ------------------------------------------------------------------------------------

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
    enter = position[first]
    shift = enter - np.arange(n)
    bounds = [0, *(np.flatnonzero(shift[1:] != shift[:-1]) + 1).tolist(), n]
    entries = [(lo, hi, int(enter[lo])) for lo, hi in itertools.pairwise(bounds)]
    return Cycle(order, np.array(entries, dtype=np.int64))


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
def chain_order(n: int, chain: ChainSchedule) -> tuple[int, ...]:
    """The one fold order every segment of ``chain`` follows, checked by simulating every step.

    Step by step, from the chain's own sends: a segment's partial sum travels as
    one value from worker to worker, is sent once per step at most, and every
    addition adds a contribution it does not hold yet; after the reduce every
    segment holds all ``n`` contributions in one and the same order (the
    engine folds every element alike); the broadcast forwards only completed
    segments and hands worker 0 every one of them.  A chain that broke these
    raises :class:`ring_ref.invariants.InvariantViolation`.  The result is cached.

    >>> chain_order(4, ChainSchedule())
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


# --- the batched path ----------------------------------------------------------------------------

A = TypeVar("A", torch.Tensor, npt.NDArray[Any])


def _run(
    rounds: Sequence[Sequence[Add]],
    acc: A,
    *,
    diagonal: Callable[[int, int, int], A],
    combine: Callable[[A, A, A], object],
    all_finite: Callable[[A], bool] | None,
    tile: tuple[int, int],
) -> bool:
    """Execute ``rounds`` into ``acc`` (``(N, M/N, ...)``) one tile at a time.

    A tile is ``tile = (chunks, rows)``: that many consecutive chunks, that many
    rows of each; every round runs on a tile before the next tile starts.
    ``diagonal(offset, start, stop)`` is the view of ``x[c + offset, c]`` for chunks
    ``start .. stop - 1``; ``combine(incoming, own, out)`` writes ``incoming ∘ own``
    into ``out``.  Each finished tile is checked with ``all_finite`` (unless it is
    ``None``) while it is still in cache; the return value says whether every
    element of the result is finite (``True`` when nothing was checked).
    """
    n, k = acc.shape[0], acc.shape[1]
    block, tile_rows = tile
    finite = True
    for c0 in range(0, n, block):
        c1 = min(n, c0 + block)
        bound = [
            [
                (
                    acc[lo:hi],
                    None if a.incoming is None else diagonal(a.incoming, lo, hi),
                    diagonal(a.own, lo, hi),
                )
                for a in adds
                for lo, hi in [(max(a.start, c0), min(a.stop, c1))]
                if lo < hi
            ]
            for adds in rounds
        ]
        whole = tile_rows >= k
        for r0 in range(0, k, tile_rows):
            rows = slice(r0, min(k, r0 + tile_rows))
            for batch in bound:
                for out, incoming, own in batch:
                    part = out if whole else out[:, rows]
                    first = part if incoming is None else incoming if whole else incoming[:, rows]
                    combine(first, own if whole else own[:, rows], part)
            if all_finite is not None:
                finite = finite and all_finite(acc[c0:c1] if whole else acc[c0:c1, rows])
    return finite


def _tile(n: int, k: int, row_bytes: int, budget: int | None) -> tuple[int, int]:
    """``(chunks, rows)`` per tile: about ``budget`` bytes of partial sums (``None``: everything at once).

    Small chunks are batched, as many whole chunks as fit; a chunk larger than
    the budget is a block of its own, cut into row ranges.
    """
    if budget is None:
        return n, k
    chunks = budget // (k * row_bytes)
    if chunks >= 1:
        return chunks, k
    return 1, max(1, budget // row_bytes)


def _torch_all_finite(block: torch.Tensor) -> bool:
    """True when every element of ``block`` is finite, in reduction passes that build no mask.

    A NaN or infinite element makes the sum NaN or infinite.  The sum may also
    overflow for finite elements: a false alarm that only costs the caller the
    exact check.  float16 and bfloat16 take the maximum and minimum instead
    (NaN propagates through both): their ``sum`` would first copy a strided
    block to float32.
    """
    if block.dtype in (torch.float16, torch.bfloat16):
        return math.isfinite(float(block.amax())) and math.isfinite(float(block.amin()))
    return math.isfinite(float(block.sum()))


def _numpy_all_finite(block: npt.NDArray[Any]) -> bool:
    """True when every element of ``block`` is finite: its maximum and minimum are (NaN propagates)."""
    return bool(np.isfinite(block.max())) and bool(np.isfinite(block.min()))


def _result_proves_finite(op: Op) -> bool:
    """Whether a finite result proves a finite input: for a sum or a product (a NaN or infinite operand
    makes either non-finite), not for ``max`` and ``min``, which may drop a NaN or an infinity."""
    return op not in ("max", "min")


# --- the compiled path ---------------------------------------------------------------------------

_kernel_module: ModuleType | None = None


def _kernel() -> ModuleType:
    """:mod:`ring_ref._kernel`, imported on first use (it imports llvmlite, LLVM itself)."""
    global _kernel_module  # noqa: PLW0603 - a lazily imported module
    if _kernel_module is None:
        from ring_ref import _kernel as module

        _kernel_module = module
    return _kernel_module


def element_stride(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The one stride that steps through a worker's ``(M, ...)`` elements in order, or ``None``.

    ``shape`` and ``strides`` are the whole ``(N, M, ...)`` input's.  Size-1
    dimensions do not count; any stride (zero, negative) is fine as long as each
    dimension steps over exactly the one inside it.

    >>> element_stride((4, 8, 3), (24, 3, 1)), element_stride((4, 8, 3), (24, 1, 8))
    (1, None)
    """
    dims = [(size, stride) for size, stride in zip(shape[1:], strides[1:], strict=True) if size != 1]
    if not dims:
        return 1
    inner = expected = dims[-1][1]
    for size, stride in reversed(dims):
        if stride != expected:
            return None
        expected = stride * size
    return inner


def _fold(x2d: Array, out: Array, cycle: Cycle, op: Op) -> bool:
    """The compiled fold of ``x2d`` (``(N, M ...)`` flattened to two axes) into ``out`` (flat).

    ``avg`` folds the sum (the caller divides).  Returns whether the input is proven finite.
    """
    n = x2d.shape[0]
    return bool(
        _kernel().fold_chunks(
            x2d,
            out,
            cycle.order,
            cycle.entries,
            chunk_size=out.size // n,
            threads=torch.get_num_threads(),
            op="sum" if op == "avg" else op,
        )
    )


def _chain_fold(x2d: Array, out: Array, order: tuple[int, ...], op: Op) -> bool:
    """The chain's fold (``order`` for every element) of ``x2d`` (``(N, L)``) into ``out`` (flat), compiled.

    Every element folds alike, so the first ``N K`` elements (``K = L // N``) go
    through :func:`_fold` as ``N`` chunks of ``K`` that all enter the cycle
    ``order`` at its start, and the last ``L mod N`` through one batched
    combine per worker.  Returns whether the input is proven finite.
    """
    n, length = x2d.shape
    split = length - length % n
    entries = np.array([[c, c + 1, 0] for c in range(n)], dtype=np.int64)  # every chunk enters at order[0]
    cycle = Cycle(np.array(order, dtype=np.int64), entries)
    finite = _fold(x2d[:, :split], out[:split], cycle, op) if split else True
    if split == length:
        return finite
    rest = out[split:]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        _chain_batched(x2d[:, split:], rest, order, numpy_combine_out(op))
    return finite and _numpy_all_finite(rest if _result_proves_finite(op) else x2d[:, split:])


def _chain_batched(x: A, out: A, order: tuple[int, ...], combine: Callable[[A, A, A], object]) -> None:
    """The chain's fold of the workers of ``x`` into ``out``: one combine over the whole buffer per worker,
    ``out = x[order[0]] ∘ x[order[1]]``, then ``out = out ∘ x[w]`` for the rest of ``order`` (``N >= 2``)."""
    combine(x[order[0]], x[order[1]], out)
    for w in order[2:]:
        combine(out, x[w], out)


def _uneven_torch(x: torch.Tensor, ring: RingSchedule, op: Op) -> tuple[torch.Tensor, bool]:
    """Unequal chunks (layouts ``blocks``, ``gloo``) run as even ones: each padded to the longest.

    Worker ``i``'s elements (row-major) are cut at the layout's bounds and chunk
    ``c`` is copied to columns ``c K .. c K + size - 1`` of an ``(N, N K)`` buffer,
    ``K`` the longest chunk, zeros elsewhere; the even path folds every column
    of chunk ``c`` in chunk ``c``'s order, so each real element gets exactly its
    own chunk's combines, and the padding is dropped.
    """
    n = x.shape[0]
    flat = x.detach().reshape(n, -1)
    k, at = _padded_columns(ring.layout, n, flat.shape[1], x.element_size())
    columns = torch.from_numpy(at)
    padded = flat.new_zeros((n, n * k))
    padded[:, columns] = flat
    out, finite = _torch_forward(padded, ring._replace(layout="even"), op)
    return out[columns].reshape(x.shape[1:]), finite


@lru_cache(maxsize=16)
def _padded_columns(layout: Layout, n: int, m: int, itemsize: int) -> tuple[int, npt.NDArray[np.int64]]:
    """:func:`_uneven_torch`'s padding: the longest chunk ``K`` and, per element ``j`` (in chunk
    ``c`` at ``lo``), its column ``c K + j - lo`` of the padded buffer (one gather instead of a copy
    per chunk)."""
    bounds = np.array(chunk_bounds(layout, n, m, itemsize=itemsize), dtype=np.int64).reshape(n, 2)
    sizes = bounds[:, 1] - bounds[:, 0]
    k = max(1, int(sizes.max()))
    chunk = np.repeat(np.arange(n, dtype=np.int64), sizes)
    columns = chunk * k + np.arange(m, dtype=np.int64) - np.repeat(bounds[:, 0], sizes)
    return k, columns


def _torch_forward(x: torch.Tensor, ring: Schedule = SPEC, op: Op = "sum") -> tuple[torch.Tensor, bool]:
    """The ring's fold for a tensor that passed ``check_torch_structure``, and whether the input is
    proven finite (``avg``: the sum, not yet divided).

    The result is a tensor of its own, never a view (autograd allows in-place
    operations on it).
    """
    if not isinstance(ring, ChainSchedule) and ring.layout != "even":
        return _uneven_torch(x, ring, op)
    n, m = x.shape[0], x.shape[1]
    k = m // n
    trailing = tuple(x.shape[2:])
    x = x.detach()
    result = x.new_empty((m, *trailing))
    if n == 1:
        result.copy_(x[0])
        return result, _torch_all_finite(result)
    inner = 1 if x.is_contiguous() else element_stride(x.shape, x.stride())
    if x.is_cpu and x.dtype in KERNEL_DTYPES and inner is not None:
        flat = x.as_strided((n, m * math.prod(trailing)), (x.stride(0), inner)).numpy()
        flat.flags.writeable = False
        if flat.flags.aligned:
            out = result.numpy().reshape(-1)
            if isinstance(ring, ChainSchedule):
                return result, _chain_fold(flat, out, chain_order(n, ring), op)
            return result, _fold(flat, out, plan(n, ring).cycle, op)
    if isinstance(ring, ChainSchedule):
        _chain_batched(x, result, chain_order(n, ring), torch_combine_out(op))
        on_result = _result_proves_finite(op)
        return result, _torch_all_finite(result if on_result else x)
    s_worker, s_row, *s_trailing = x.stride()
    base = x.storage_offset()

    def diagonal(offset: int, start: int, stop: int) -> torch.Tensor:
        return x.as_strided(
            (stop - start, k, *trailing),
            (s_worker + k * s_row, s_row, *s_trailing),
            base + (start + offset) * s_worker + start * k * s_row,
        )

    tile = _tile(n, k, math.prod(trailing) * x.element_size(), TILE_BYTES if x.is_cpu else None)
    acc = result.view(n, k, *trailing)
    on_result = _result_proves_finite(op)
    finite = _run(
        plan(n, ring).rounds,
        acc,
        diagonal=diagonal,
        combine=torch_combine_out(op),
        all_finite=_torch_all_finite if on_result else None,
        tile=tile,
    )
    return result, finite if on_result else _torch_all_finite(x)


class _RingSum(torch.autograd.Function):
    """Autograd for the fast engine's sum: every worker's gradient is the output gradient, unchanged.

    ``apply(x, check, ring)``: ``check`` says whether a result that is not all
    finite needs the input scan (``bad-input``); tangents are not inputs and
    are not checked; ``ring`` is the ring of the schedule family to run.
    """

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        x, check, ring = args
        result, finite = _torch_forward(x, ring)
        if check and not finite:
            _validate.torch_finite(x)
        return result

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.workers = inputs[0].shape[0]
        ctx.ring = inputs[2]

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        (grad,) = grad_outputs
        return grad.unsqueeze(0).expand(ctx.workers, *grad.shape), None, None

    @staticmethod
    def jvp(ctx: Any, *grad_inputs: Any) -> Any:
        # The same ring over the tangents; through apply, so a torch.func tangent is unwrapped first.
        tangent = grad_inputs[0]
        return _ring_sum(tangent, False, ctx.ring)

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        # Elements are reduced independently: the batch is one more trailing dimension.
        x, check, ring = args
        if in_dims[0] is None:
            return _ring_sum(x, check, ring), None
        return _ring_sum(x.movedim(in_dims[0], -1), check, ring), -1


_ring_sum: Callable[[torch.Tensor, bool, Schedule], torch.Tensor] = _RingSum.apply
"""``_RingSum.apply`` with its type stated (torch leaves it untyped)."""


_unpack_dual: Callable[[torch.Tensor], Any] = forward_ad.unpack_dual
"""``forward_ad.unpack_dual`` with its type stated (torch leaves it untyped)."""


def _differentiable(x: torch.Tensor) -> bool:
    """Whether ``x`` needs :class:`_RingSum`: it records a graph, carries a tangent, or is a ``torch.func``
    wrapper (``grad``, ``vmap``, ``jvp``), whose values only the Function's unwrapped inputs expose."""
    return (
        (x.requires_grad and torch.is_grad_enabled())
        or is_functorch_wrapped_tensor(x)
        or _unpack_dual(x).tangent is not None
    )


DIFFERENTIABLE_OPS: Final[tuple[Op, ...]] = ("sum", "avg")
"""The ops the fast engine differentiates: a sum passes the output gradient to every worker unchanged
(``avg`` then divides it by ``N``, as the reference does).  ``prod``, ``max`` and ``min`` on a tensor that
records a graph or carries a tangent are refused (use the reference engine); under ``torch.func.vmap``
alone they run (:class:`_RingOp`)."""


def not_differentiable(op: Op) -> ValueError:
    """The error for ``op`` on a tensor the fast engine would have to differentiate."""
    return ValueError(
        f"engine='fast' differentiates op='sum' and op='avg' only; op={op!r} on a tensor that requires "
        "grad (or carries a forward-mode tangent, or is the input of torch.func.grad, jvp, jacrev, ...) "
        "runs on engine='reference' (the default), which records the ring's graph for every op; or "
        "detach the input, or call under torch.no_grad()."
    )


class _RingOp(torch.autograd.Function):
    """``prod``, ``max`` and ``min`` on a ``torch.func`` wrapper: ``vmap`` works (the batch is one more
    trailing dimension), derivatives are refused with :func:`not_differentiable`.

    ``apply(x, check, ring, op)`` as :class:`_RingSum`'s, with the op.
    """

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        x, check, ring, op = args
        result, finite = _torch_forward(x, ring, op)
        if check and not finite:
            _validate.torch_finite(x)
        return result

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.op = inputs[3]

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise not_differentiable(ctx.op)

    @staticmethod
    def jvp(ctx: Any, *grad_inputs: Any) -> Any:
        raise not_differentiable(ctx.op)

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        x, check, ring, op = args
        if in_dims[0] is None:
            return _ring_op(x, check, ring, op), None
        return _ring_op(x.movedim(in_dims[0], -1), check, ring, op), -1


_ring_op: Callable[[torch.Tensor, bool, Schedule, Op], torch.Tensor] = _RingOp.apply
"""``_RingOp.apply`` with its type stated."""


def ring_all_reduce_torch(x: torch.Tensor, ring: Schedule = SPEC, op: Op = "sum") -> torch.Tensor:
    """The fast engine on a ``torch.Tensor`` of shape ``(N, M, ...)``; returns ``(M, ...)``.

    ``ring``: a ring of the schedule family (clause ``schedule-fold-order``), the spec's by default;
    ``op``: the reduction (clauses ``op-*``), ``sum`` by default.
    """
    _validate.check_torch_structure(x, divisible=ring.layout == "even")
    n = x.shape[0]
    if _differentiable(x):  # the Functions check finiteness inside, on the unwrapped input
        if op in DIFFERENTIABLE_OPS:
            return finish_torch(op, _ring_sum(x, True, ring), n)
        if x.requires_grad and torch.is_grad_enabled():
            raise not_differentiable(op)
        # vmap works; a forward-mode tangent (torch.func.jvp, jacfwd, a dual tensor, batched or not)
        # reaches the Function's jvp rule, which refuses it
        return _ring_op(x, True, ring, op)
    result, finite = _torch_forward(x, ring, op)
    if not finite:
        _validate.torch_finite(x)
    return finish_torch(op, result, n)


def ring_all_reduce_numpy(x: npt.NDArray[Any], ring: Schedule = SPEC, op: Op = "sum") -> npt.NDArray[Any]:
    """The fast engine on a ``numpy.ndarray`` of shape ``(N, M, ...)``; returns ``(M, ...)``."""
    _validate.check_numpy_structure(x, divisible=ring.layout == "even")
    x = _validate.plain_array(x)
    result, finite = _numpy_forward(x, ring, op)
    if not finite:
        _validate.numpy_finite(x)
    return finish_numpy(op, result, x.shape[0])


def _uneven_numpy(x: npt.NDArray[Any], ring: RingSchedule, op: Op) -> tuple[npt.NDArray[Any], bool]:
    """:func:`_uneven_torch` for numpy arrays."""
    n = x.shape[0]
    flat = x.reshape(n, -1)
    k, columns = _padded_columns(ring.layout, n, flat.shape[1], x.itemsize)
    padded = np.zeros((n, n * k), dtype=x.dtype)
    padded[:, columns] = flat
    out, finite = _numpy_forward(padded, ring._replace(layout="even"), op)
    return out[columns].reshape(x.shape[1:]), finite


def _numpy_forward(
    x: npt.NDArray[Any], ring: Schedule = SPEC, op: Op = "sum"
) -> tuple[npt.NDArray[Any], bool]:
    """The ring's fold for an array that passed ``check_numpy_structure``, and whether the input is
    proven finite."""
    if not isinstance(ring, ChainSchedule) and ring.layout != "even":
        return _uneven_numpy(x, ring, op)
    n, m = x.shape[0], x.shape[1]
    k = m // n
    trailing = x.shape[2:]
    result: npt.NDArray[Any] = np.empty((m, *trailing), dtype=x.dtype)
    if n == 1:
        result[...] = x[0]
        return result, _numpy_all_finite(result)
    strides = [s // x.itemsize for s in x.strides] if all(s % x.itemsize == 0 for s in x.strides) else None
    inner = None if strides is None else element_stride(x.shape, strides)
    if x.dtype.isnative and x.dtype in (np.float32, np.float64) and inner is not None and x.flags.aligned:
        flat = np.lib.stride_tricks.as_strided(
            x, (n, x[0].size), (x.strides[0], inner * x.itemsize), writeable=False
        )
        if isinstance(ring, ChainSchedule):
            return result, _chain_fold(flat, result.reshape(-1), chain_order(n, ring), op)
        return result, _fold(flat, result.reshape(-1), plan(n, ring).cycle, op)
    if isinstance(ring, ChainSchedule):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            _chain_batched(x, result, chain_order(n, ring), numpy_combine_out(op))
        return result, _numpy_all_finite(result if _result_proves_finite(op) else x)
    s_worker, s_row, *s_trailing = x.strides

    def diagonal(offset: int, start: int, stop: int) -> npt.NDArray[Any]:
        return np.lib.stride_tricks.as_strided(
            x[start + offset, start * k :],
            (stop - start, k, *trailing),
            (s_worker + k * s_row, s_row, *s_trailing),
            writeable=False,
        )

    tile = _tile(n, k, math.prod(trailing) * x.itemsize, NUMPY_TILE_BYTES)
    acc = result.reshape(n, k, *trailing)
    on_result = _result_proves_finite(op)
    # Overflow to +-inf (and underflow) is the correctly rounded result (clause input-finite), not an
    # error; an invalid operation (inf - inf, 0 * inf) only happens on non-finite input, which is
    # rejected below, or on a product that overflowed, whose NaN is the result.
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        finite = _run(
            plan(n, ring).rounds,
            acc,
            diagonal=diagonal,
            combine=numpy_combine_out(op),
            all_finite=_numpy_all_finite if on_result else None,
            tile=tile,
        )
    return result, finite if on_result else _numpy_all_finite(x)


def ring_reduce_scatter_torch(x: torch.Tensor, ring: RingSchedule, op: Op = "sum") -> torch.Tensor:
    """Reduce-scatter on the fast engine: ``(N, M, ...)`` to ``(N, M / N, ...)`` (clause ``rs-ag-theorem``).

    For a ring with ``k = d`` rank ``r``'s shard is chunk ``r``'s fold, which is
    also chunk ``r`` of that ring's all-reduce (proved in ``make prove``); the
    plan computes every chunk's fold once, so the shards are the all-reduce's
    result cut into its ``N`` chunks.  ``ring``'s layout cuts equal chunks
    (:func:`ring_ref._validate.collective_input`), which are the even layout's.
    """
    n = x.shape[0]
    result = ring_all_reduce_torch(x, ring._replace(layout="even"), op)
    return result.reshape(n, x.shape[1] // n, *x.shape[2:])


def ring_reduce_scatter_numpy(x: npt.NDArray[Any], ring: RingSchedule, op: Op = "sum") -> npt.NDArray[Any]:
    """:func:`ring_reduce_scatter_torch` for numpy arrays."""
    n = x.shape[0]
    result = ring_all_reduce_numpy(x, ring._replace(layout="even"), op)
    return result.reshape(n, x.shape[1] // n, *x.shape[2:])


def ring_all_gather_torch(shards: torch.Tensor) -> torch.Tensor:
    """All-gather on the fast engine: one copy of the ``(N, S, ...)`` shards as ``(N S, ...)`` (``agc-copy``).

    Every ring with ``k = d`` delivers rank ``r``'s shard, unchanged, to slot
    ``r`` of every rank (proved in ``make prove``), so the gathered buffer is
    the shards in rank order whatever the ring; ``clone`` keeps every bit and
    the autograd graph.
    """
    gathered = shards.clone(memory_format=torch.contiguous_format)
    return gathered.reshape(shards.shape[0] * shards.shape[1], *shards.shape[2:])


def ring_all_gather_numpy(shards: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """:func:`ring_all_gather_torch` for numpy arrays (a C-ordered copy, never a view of the input)."""
    gathered = np.array(_validate.plain_array(shards), order="C", copy=True)
    return gathered.reshape(shards.shape[0] * shards.shape[1], *shards.shape[2:])
