"""Round-by-round records of the reference ring: a plain-text table and a JSON trace.

>>> records = trace(2)
>>> [(rec.phase, rec.round) for rec in records]
[('start', -1), ('reduce-scatter', 0), ('all-gather', 0)]
>>> records[1].provenance
(((0,), (1, 0)), ((0, 1), (1,)))
>>> doc = trace_json(records, 4)
>>> doc["traffic"]["elementsPerWorkerTotal"]
4

Every op of ``spec/operations.md`` runs the same rounds; only what the reduce-scatter
receiver stores changes, so a record's provenance is the same for every op and
the op (``records[k].op``) decides how it is written.  ``avg`` adds in the
rounds and then takes one more step, ``divide``, that sends nothing:

>>> [(rec.phase, rec.round) for rec in trace(2, op="avg")]
[('start', -1), ('reduce-scatter', 0), ('all-gather', 0), ('divide', 0)]

The JSON document follows ``spec/trace.schema.json`` (see
``docs/guide/traces.md``): every round's sends, with the receiver's operation (``add``,
``multiply``, ``max``, ``min`` or ``copy``) and the number of elements moved,
every slot's provenance afterwards, the finished chunks, and a traffic summary
(clause ``traffic``).  It names the op only when it is not ``sum``, so a sum
trace reads as it always has (clause ``op-trace``).
"""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple

from ring_ref._chunks import chunk_bounds
from ring_ref._ops import Op, op_name
from ring_ref._validate import check_collective_size, check_ring_size
from ring_ref.core import fold, never_combine, provenance_state, run_ring
from ring_ref.invariants import Provenance, State, expected_state, finished_chunks, is_complete
from ring_ref.schedule import (
    COLLECTIVES,
    PHASES,
    REDUCE_SCATTER,
    SPEC,
    ChainSchedule,
    Collective,
    CollectiveName,
    DoublingSchedule,
    Phase,
    Schedule,
    Send,
    reduce_scatter_ring,
    rounds_per_phase,
    sends,
)

TRACE_FORMAT = "ring-ref-trace"
TRACE_VERSION = 1
DIVIDE: Final = "divide"

Stage = Phase | Literal["start", "divide"]
Operation = Literal["add", "multiply", "max", "min", "copy"]


class RoundRecord(NamedTuple):
    """The sends of one round and every slot's provenance after it (``start``: before round 0).

    ``op`` is the reduction op of the whole trace; for ``avg`` the last record
    is the ``divide`` step (no sends), after which every slot holds its sum divided by ``N``.
    """

    phase: Stage
    round: int
    sends: tuple[Send, ...]
    provenance: State[Provenance]
    op: Op = "sum"


def trace(
    n: int,
    schedule: Schedule = SPEC,
    op: str = "sum",
    *,
    collective: Collective | CollectiveName = Collective.ALL_REDUCE,
) -> tuple[RoundRecord, ...]:
    """Run the reference core for ``n`` workers and record every round (of ``schedule``'s ring; the
    chain's steps, clause ``chain-trace``).

    ``op`` is one of ``sum``, ``prod``, ``max``, ``min``, ``avg`` (``ValueError`` otherwise).
    ``collective`` ``"reduce-scatter"`` or ``"all-gather"`` records that phase alone (clause
    ``collective-trace``), on a ring whose offset equals its direction
    (:func:`ring_ref.schedule.reduce_scatter_ring`); all-gather's ``start`` is the state
    reduce-scatter ends in, and it takes no op.

    >>> from ring_ref.schedule import RingSchedule
    >>> [(rec.phase, rec.round) for rec in trace(3, RingSchedule(1, 1), collective="all-gather")]
    [('start', -1), ('all-gather', 0), ('all-gather', 1)]
    """
    the_op = op_name(op)
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}.")
    the = Collective(collective)
    start = provenance_state(n)
    if the.alone:
        schedule = reduce_scatter_ring(schedule, n)
    if the.gathers:
        if the_op != "sum":
            raise ValueError(f"all-gather copies and takes no op; got op={the_op!r}. Leave --op out.")
        start = expected_state(REDUCE_SCATTER, rounds_per_phase(n) - 1, n, schedule=schedule)
    records = [RoundRecord("start", -1, (), start, the_op)]
    send_list = sends if schedule is SPEC else schedule.sends

    def observe(phase: Phase, r: int, _state: State[Provenance], prov: State[Provenance]) -> None:
        records.append(RoundRecord(phase, r, send_list(phase, r, n), prov, the_op))

    combine = never_combine if the.gathers else fold
    run_ring(start, combine, observe, schedule=schedule, phases=the.phases)
    if the_op == "avg":
        records.append(RoundRecord(DIVIDE, 0, (), records[-1].provenance, the_op))
    return tuple(records)


_JOIN: Final[dict[str, str]] = {"sum": "+", "avg": "+", "prod": "x"}


def slot_label(p: Provenance, n: int, op: Op = "sum", *, divided: bool = False) -> str:
    """``"2+3+0"`` for a partial sum; a trailing ``*`` marks a finished chunk.

    With another op: ``"2x3x0"`` (``prod``), ``"max(2,3,0)"``, ``"min(2,3,0)"``,
    always in fold order; ``divided`` (the ``divide`` step of ``avg``) writes the
    sum over ``N``.

    >>> slot_label((1, 2, 0), 3), slot_label((1,), 3)
    ('1+2+0*', '1')
    >>> slot_label((1, 2), 3, "prod"), slot_label((1, 2, 0), 3, "max")
    ('1x2', 'max(1,2,0)*')
    >>> slot_label((1, 2, 0), 3, "avg", divided=True)
    '(1+2+0)/3*'
    """
    if op in ("max", "min") and len(p) > 1:
        body = f"{op}({','.join(map(str, p))})"
    else:
        body = _JOIN.get(op, "+").join(map(str, p))
    if divided:
        body = f"({body})/{n}"
    return body + ("*" if is_complete(p, n) else "")


_ACTION: Final[dict[str, str]] = {
    "sum": "adds into the slot",
    "avg": "adds into the slot",
    "prod": "multiplies into the slot",
    "max": "keeps own if own > incoming, else incoming",
    "min": "keeps own if own < incoming, else incoming",
}

_LEGEND: Final[dict[str, str]] = {
    "sum": "a+b+c = contributions of workers a, b, c added in that order",
    "avg": "a+b+c = contributions of workers a, b, c added in that order; (a+b+c)/N = that sum divided "
    "by N, rounded once",
    "prod": "axbxc = contributions of workers a, b, c multiplied in that order",
    "max": "max(a,b,c) = the first maximum of workers a, b, c's values in that order (of -0 and +0, "
    "the one met first)",
    "min": "min(a,b,c) = the first minimum of workers a, b, c's values in that order (of -0 and +0, "
    "the one met first)",
}


def _headline(rec: RoundRecord, n: int) -> str:
    if rec.phase == "start" and rec.provenance != provenance_state(n):
        return (
            "start (all-gather alone): each worker holds its shard, finished, in its own slot; "
            "the other slots show what reduce-scatter leaves there and are overwritten before they are read"
        )
    if rec.phase == "start":
        return "start: every slot holds only its own worker's value"
    if rec.phase == DIVIDE:
        return (
            f"divide (op avg): every worker divides every slot by N = {n}, rounded once to the dtype; "
            "nothing is sent"
        )
    action = _ACTION[rec.op] if rec.phase == REDUCE_SCATTER else "copies into the slot"
    moves = ", ".join(f"{s.src}->{s.dst} chunk {s.chunk}" for s in rec.sends)
    return f"{rec.phase} round {rec.round} (receiver {action}): {moves}"


def render_table(records: tuple[RoundRecord, ...]) -> str:
    """A readable walkthrough: each round's sends, then every worker's slots (in the records' op)."""
    n = len(records[0].provenance)
    op = records[0].op

    def text(rec: RoundRecord, p: Provenance) -> str:
        return slot_label(p, n, op, divided=rec.phase == DIVIDE)

    width = max(len(text(rec, p)) for rec in records for row in rec.provenance for p in row)

    def label(i: int) -> str:
        return f"  worker {i}:  "

    lines = [] if op == "sum" else [f"op: {op} (spec section 9, clause op-{op})", ""]
    for rec in records:
        lines.append(_headline(rec, n))
        header = " " * len(label(n - 1)) + " ".join(f"chunk {c}".ljust(width) for c in range(n))
        lines.append(header.rstrip())
        for i, row in enumerate(rec.provenance):
            cells = " ".join(text(rec, p).ljust(max(width, 7)) for p in row)
            lines.append(f"{label(i).ljust(len(label(n - 1)))}{cells}".rstrip())
        lines.append("")
    lines.append(f"{_LEGEND[op]};  * = finished chunk")
    return "\n".join(lines)


_RS_OPERATION: Final[dict[str, Operation]] = {
    "sum": "add",
    "avg": "add",
    "prod": "multiply",
    "max": "max",
    "min": "min",
}


def operation(phase: Phase, op: Op = "sum") -> Operation:
    """What a receiver does with a chunk in ``phase``: combine it by ``op`` (reduce-scatter) or ``copy``.

    >>> operation("reduce-scatter"), operation("all-gather")
    ('add', 'copy')
    >>> operation("reduce-scatter", "prod"), operation("all-gather", "max")
    ('multiply', 'copy')
    """
    return _RS_OPERATION[op] if phase == REDUCE_SCATTER else "copy"


MAX_WORKERS: Final[dict[str, int]] = {"table": 16, "svg": 8, "json": 64}
"""The largest ``N`` each trace format shows readably: a trace holds ``O(N^3)`` provenance entries.

At ``N = 16`` a table line is about 700 characters and an SVG is 29,000 pixels
wide; at ``N = 64`` the SVG would be 112 MB.
"""


def check_trace_size(
    n: int,
    m: int,
    fmt: str,
    schedule: Schedule = SPEC,
    *,
    collective: Collective | CollectiveName = Collective.ALL_REDUCE,
) -> None:
    """Raise ``ValueError`` for a ring the trace cannot hold (``bad-input``) or show readably in ``fmt``.

    ``M`` must be a multiple of ``N`` only for the ``even`` layout (clause ``schedule-layouts``);
    for reduce-scatter and all-gather (``M`` rows of the whole buffer) always, and the layout must
    cut equal chunks (clause ``rsc-bad-input``).
    """
    if n < 1 or m < 1:
        flag, value = ("-n", n) if n < 1 else ("-m", m)
        raise ValueError(
            f"{flag} {value}: a trace needs at least one worker and one row; give {flag} 1 or more."
        )
    if Collective(collective).alone:
        check_collective_size(n, m, schedule)
    else:
        check_ring_size(n, m, divisible=schedule.layout == "even")
    limit = MAX_WORKERS[fmt]
    if n > limit:
        larger = [f"--format {f} (N <= {k})" for f, k in MAX_WORKERS.items() if k > limit]
        raise ValueError(
            f"N = {n} workers is too many to show readably as {fmt}: at most {limit}, since a trace grows "
            f"as N^3. Use a smaller -n{' or ' + ', '.join(larger) if larger else ''}."
        )


def _round_json(rec: RoundRecord, sizes: list[int], n: int) -> dict[str, Any]:
    finished = finished_chunks(rec.provenance)
    doc: dict[str, Any] = {
        "phase": rec.phase,
        "round": rec.round,
        "sends": [
            {
                "src": s.src,
                "dst": s.dst,
                "chunk": s.chunk,
                "op": operation(s.phase, rec.op),
                "elements": sizes[s.chunk],
            }
            for s in rec.sends
        ],
    }
    if rec.phase == DIVIDE:
        doc["divisor"] = n
    doc["workers"] = [
        {
            "worker": i,
            "slots": [{"chunk": c, "contributions": list(p)} for c, p in enumerate(row)],
            "finishedChunks": sorted(finished[i]),
        }
        for i, row in enumerate(rec.provenance)
    ]
    return doc


def trace_json(
    records: tuple[RoundRecord, ...],
    m: int,
    schedule: Schedule = SPEC,
    *,
    collective: Collective | CollectiveName = Collective.ALL_REDUCE,
) -> dict[str, Any]:
    """The JSON trace (schema ``spec/trace.schema.json``) of ``records`` for ``M = m`` one-element rows.

    ``S = m`` elements per worker, so each send moves one chunk of ``S / N`` elements.  For another
    ``schedule`` (clause ``schedule-family``) the document also names the ring and, for a layout
    other than ``even``, each chunk's size (``gloo`` cut as for 4-byte elements); ``chunkElements``
    and ``elementsPerWorkerPerRound`` are then the largest chunk.  For an op other than ``sum``
    (clause ``op-trace``) it names the op; ``avg``'s ``divide`` step carries ``divisor`` = ``N``
    and is not counted as a round of traffic.  A reduce-scatter or all-gather trace (``collective``,
    clause ``collective-trace``) names its collective.  The chain (clause ``chain-trace``) is named as
    ``{"kind": "chain", "layout": ...}``, and its rounds are its steps.
    """
    n = len(records[0].provenance)
    op = records[0].op
    if Collective(collective).alone:
        check_collective_size(n, m, schedule)
    else:
        check_ring_size(n, m, divisible=schedule.layout == "even")
    sizes = [hi - lo for lo, hi in chunk_bounds(schedule.layout, n, m, itemsize=4)]
    chunk = max(sizes)
    rounds = [_round_json(rec, sizes, n) for rec in records]
    sent = [0] * n
    for rec in records:
        for s in rec.sends:
            sent[s.src] += sizes[s.chunk]
    extra: dict[str, Any] = {}
    if Collective(collective).alone:
        extra["collective"] = str(collective)
    if op != "sum":
        extra["op"] = op
    if isinstance(schedule, ChainSchedule):
        extra["schedule"] = {"kind": "chain", "layout": schedule.layout}
    elif isinstance(schedule, DoublingSchedule):
        extra["schedule"] = {"kind": "recursive-doubling", "layout": schedule.layout}
    elif schedule != SPEC:
        ring = schedule.normalized(n)
        extra["schedule"] = {"direction": ring.direction, "offset": ring.offset, "layout": ring.layout}
    if schedule.layout != "even":
        extra["chunkSizes"] = sizes
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "n": n,
        "m": m,
        "elementsPerWorker": m,
        "chunkElements": chunk,
        **extra,
        "rounds": rounds,
        "traffic": {
            "rounds": sum(1 for rec in records if rec.phase in PHASES),
            "roundsPerPhase": (
                schedule.steps_per_phase(n)
                if isinstance(schedule, ChainSchedule)
                else sum(1 for phase, _ in schedule.all_rounds(n) if phase == REDUCE_SCATTER)
                if isinstance(schedule, DoublingSchedule)
                else rounds_per_phase(n)
            ),
            "elementsPerWorkerPerRound": chunk,
            "elementsSentByWorker": sent,
            "elementsPerWorkerTotal": max(sent),
            "elementsTotal": sum(sent),
        },
    }
