"""The schedule's round listing (``sends``) and each chunk's fold start, against the spec's formulas."""

from __future__ import annotations

import pytest

from ring_ref.schedule import (
    ALL_GATHER,
    PHASES,
    PRESETS,
    REDUCE_SCATTER,
    RingSchedule,
    Send,
    send_chunk,
    sends,
)

pytestmark = pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology")

SPEC_SEND = {REDUCE_SCATTER: lambda i, r, n: (i - r) % n, ALL_GATHER: lambda i, r, n: (i + 1 - r) % n}


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_every_send_of_every_round_of_both_phases_is_the_spec_formula(n: int) -> None:
    for phase in PHASES:
        for r in range(n - 1):
            want = tuple(Send(phase, r, i, (i + 1) % n, SPEC_SEND[phase](i, r, n)) for i in range(n))
            assert sends(phase, r, n) == want
            assert [send_chunk(phase, i, r, n) for i in range(n)] == [s.chunk for s in want]


@pytest.mark.clause("schedule-family", "schedule-fold-order")
@pytest.mark.parametrize(
    "ring",
    [
        *(ring for ring in PRESETS.values() if isinstance(ring, RingSchedule)),
        RingSchedule(1, 3, "even"),
        RingSchedule(-1, 2, "blocks"),
    ],
)
def test_each_chunks_fold_starts_at_worker_c_plus_k(ring: RingSchedule) -> None:
    for n in range(1, 8):
        for c in range(n):
            assert ring.fold_start(c, n) == (c + ring.offset) % n == ring.fold_order(c, n)[0]
