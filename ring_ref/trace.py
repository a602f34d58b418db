"""Round-by-round records of the reference ring, and a plain-text rendering.

>>> records = trace(2)
>>> [(rec.phase, rec.round) for rec in records]
[('start', -1), ('reduce-scatter', 0), ('all-gather', 0)]
>>> records[1].provenance
(((0,), (1, 0)), ((0, 1), (1,)))
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from ring_ref.core import fold, provenance_state, run_ring
from ring_ref.invariants import Provenance, State, is_complete
from ring_ref.schedule import Phase, Send, sends

Stage = Phase | Literal["start"]


class RoundRecord(NamedTuple):
    """The sends of one round and every slot's provenance after it (``start``: before round 0)."""

    phase: Stage
    round: int
    sends: tuple[Send, ...]
    provenance: State[Provenance]


def trace(n: int) -> tuple[RoundRecord, ...]:
    """Run the reference core for ``n`` workers and record every round."""
    start = provenance_state(n)
    records = [RoundRecord("start", -1, (), start)]

    def observe(phase: Phase, r: int, _state: State[Provenance], prov: State[Provenance]) -> None:
        records.append(RoundRecord(phase, r, sends(phase, r, n), prov))

    run_ring(start, fold, observe)
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
    lines = []
    for rec in records:
        if rec.phase == "start":
            lines.append("start: every slot holds only its own worker's value")
        else:
            op = "adds into" if rec.phase == "reduce-scatter" else "copies into"
            moves = ", ".join(f"{s.src}->{s.dst} chunk {s.chunk}" for s in rec.sends)
            lines.append(f"{rec.phase} round {rec.round} (receiver {op} the slot): {moves}")
        header = "            " + " ".join(f"chunk {c}".ljust(width) for c in range(n))
        lines.append(header.rstrip())
        for i, row in enumerate(rec.provenance):
            cells = " ".join(slot_label(p, n).ljust(max(width, 7)) for p in row)
            lines.append(f"  worker {i}:  {cells}".rstrip())
        lines.append("")
    lines.append("a+b+c = contributions of workers a, b, c added in that order;  * = finished chunk")
    return "\n".join(lines)
