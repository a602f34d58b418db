"""The schedule's round listing (``sends``) for both phases, against the spec's formulas."""

from __future__ import annotations

import pytest

from ring_ref.schedule import ALL_GATHER, PHASES, REDUCE_SCATTER, Send, send_chunk, sends

pytestmark = pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology")

SPEC_SEND = {REDUCE_SCATTER: lambda i, r, n: (i - r) % n, ALL_GATHER: lambda i, r, n: (i + 1 - r) % n}


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_every_send_of_every_round_of_both_phases_is_the_spec_formula(n: int) -> None:
    for phase in PHASES:
        for r in range(n - 1):
            want = tuple(Send(phase, r, i, (i + 1) % n, SPEC_SEND[phase](i, r, n)) for i in range(n))
            assert sends(phase, r, n) == want
            assert [send_chunk(phase, i, r, n) for i in range(n)] == [s.chunk for s in want]
