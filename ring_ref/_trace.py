"""Round-by-round records of the reference ring: a plain-text table and a JSON trace.

>>> records = trace(2)
>>> [(rec.phase, rec.round) for rec in records]
[('start', -1), ('reduce-scatter', 0), ('all-gather', 0)]
>>> records[1].provenance
(((0,), (1, 0)), ((0, 1), (1,)))
>>> doc = trace_json(records, 4)
>>> doc["traffic"]["elementsPerWorkerTotal"]
4

The JSON document follows ``spec/trace.schema.json`` (see "Traces" in
``README.md``): every round's sends, with ``add`` or ``copy`` and the number of
elements moved, every slot's provenance afterwards, the finished chunks, and a
traffic summary (clause ``traffic``).
"""

from __future__ import annotations

from typing import Any, Final, Literal, NamedTuple

from ring_ref._chunks import chunk_bounds
from ring_ref._validate import check_ring_size
from ring_ref.core import fold, provenance_state, run_ring
from ring_ref.invariants import Provenance, State, finished_chunks, is_complete
from ring_ref.schedule import REDUCE_SCATTER, SPEC, Phase, RingSchedule, Send, rounds_per_phase, sends

TRACE_FORMAT = "ring-ref-trace"
TRACE_VERSION = 1

Stage = Phase | Literal["start"]


class RoundRecord(NamedTuple):
    """The sends of one round and every slot's provenance after it (``start``: before round 0)."""

    phase: Stage
    round: int
    sends: tuple[Send, ...]
    provenance: State[Provenance]


def trace(n: int, schedule: RingSchedule = SPEC) -> tuple[RoundRecord, ...]:
    """Run the reference core for ``n`` workers and record every round (of ``schedule``'s ring)."""
    start = provenance_state(n)
    records = [RoundRecord("start", -1, (), start)]
    send_list = sends if schedule is SPEC else schedule.sends

    def observe(phase: Phase, r: int, _state: State[Provenance], prov: State[Provenance]) -> None:
        records.append(RoundRecord(phase, r, send_list(phase, r, n), prov))

    run_ring(start, fold, observe, schedule=schedule)
    return tuple(records)


def slot_label(p: Provenance, n: int) -> str:
    """``"2+3+0"`` for a partial sum; a trailing ``*`` marks a finished chunk.

    >>> slot_label((1, 2, 0), 3), slot_label((1,), 3)
    ('1+2+0*', '1')
    """
    return "+".join(map(str, p)) + ("*" if is_complete(p, n) else "")


def render_table(records: tuple[RoundRecord, ...]) -> str:
    """A readable walkthrough: each round's sends, then every worker's slots."""
    n = len(records[0].provenance)
    width = max(len(slot_label(p, n)) for rec in records for row in rec.provenance for p in row)

    def label(i: int) -> str:
        return f"  worker {i}:  "

    lines = []
    for rec in records:
        if rec.phase == "start":
            lines.append("start: every slot holds only its own worker's value")
        else:
            op = "adds into" if rec.phase == "reduce-scatter" else "copies into"
            moves = ", ".join(f"{s.src}->{s.dst} chunk {s.chunk}" for s in rec.sends)
            lines.append(f"{rec.phase} round {rec.round} (receiver {op} the slot): {moves}")
        header = " " * len(label(n - 1)) + " ".join(f"chunk {c}".ljust(width) for c in range(n))
        lines.append(header.rstrip())
        for i, row in enumerate(rec.provenance):
            cells = " ".join(slot_label(p, n).ljust(max(width, 7)) for p in row)
            lines.append(f"{label(i).ljust(len(label(n - 1)))}{cells}".rstrip())
        lines.append("")
    lines.append("a+b+c = contributions of workers a, b, c added in that order;  * = finished chunk")
    return "\n".join(lines)


def operation(phase: Phase) -> Literal["add", "copy"]:
    """What a receiver does with a chunk in ``phase``: ``add`` (reduce-scatter) or ``copy`` (all-gather).

    >>> operation("reduce-scatter"), operation("all-gather")
    ('add', 'copy')
    """
    return "add" if phase == REDUCE_SCATTER else "copy"


MAX_WORKERS: Final[dict[str, int]] = {"table": 16, "svg": 8, "json": 64}
"""The largest ``N`` each trace format shows readably: a trace holds ``O(N^3)`` provenance entries.

At ``N = 16`` a table line is about 700 characters and an SVG is 29,000 pixels
wide; at ``N = 64`` the SVG would be 112 MB.
"""


def check_size(n: int, m: int, fmt: str, schedule: RingSchedule = SPEC) -> None:
    """Raise ``ValueError`` for a ring the trace cannot hold (``bad-input``) or show readably in ``fmt``.

    ``M`` must be a multiple of ``N`` only for the ``even`` layout (clause ``schedule-layouts``).
    """
    check_ring_size(n, m, divisible=schedule.layout == "even")
    limit = MAX_WORKERS[fmt]
    if n > limit:
        larger = [f"--format {f} (N <= {k})" for f, k in MAX_WORKERS.items() if k > limit]
        raise ValueError(
            f"N = {n} workers is too many to show readably as {fmt}: at most {limit}, since a trace grows "
            f"as N^3. Use a smaller -n{' or ' + ', '.join(larger) if larger else ''}."
        )


def trace_json(records: tuple[RoundRecord, ...], m: int, schedule: RingSchedule = SPEC) -> dict[str, Any]:
    """The JSON trace (schema ``spec/trace.schema.json``) of ``records`` for ``M = m`` one-element rows.

    ``S = m`` elements per worker, so each send moves one chunk of ``S / N`` elements.  For another
    ``schedule`` (clause ``schedule-family``) the document also names the ring and, for a layout
    other than ``even``, each chunk's size (``gloo`` cut as for 4-byte elements); ``chunkElements``
    and ``elementsPerWorkerPerRound`` are then the largest chunk.
    """
    n = len(records[0].provenance)
    check_ring_size(n, m, divisible=schedule.layout == "even")
    sizes = [hi - lo for lo, hi in chunk_bounds(schedule.layout, n, m, itemsize=4)]
    chunk = max(sizes)
    rounds = []
    for rec in records:
        finished = finished_chunks(rec.provenance)
        rounds.append(
            {
                "phase": rec.phase,
                "round": rec.round,
                "sends": [
                    {
                        "src": s.src,
                        "dst": s.dst,
                        "chunk": s.chunk,
                        "op": operation(s.phase),
                        "elements": sizes[s.chunk],
                    }
                    for s in rec.sends
                ],
                "workers": [
                    {
                        "worker": i,
                        "slots": [{"chunk": c, "contributions": list(p)} for c, p in enumerate(row)],
                        "finishedChunks": sorted(finished[i]),
                    }
                    for i, row in enumerate(rec.provenance)
                ],
            }
        )
    sent = [0] * n
    for rec in records:
        for s in rec.sends:
            sent[s.src] += sizes[s.chunk]
    extra: dict[str, Any] = {}
    if schedule != SPEC:
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
            "rounds": sum(1 for rec in records if rec.phase != "start"),
            "roundsPerPhase": rounds_per_phase(n),
            "elementsPerWorkerPerRound": chunk,
            "elementsSentByWorker": sent,
            "elementsPerWorkerTotal": max(sent),
            "elementsTotal": sum(sent),
        },
    }
