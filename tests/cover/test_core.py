"""The core's guards and its per-round check (``ring_ref.core``), by behaviour.

``initial_state`` must refuse empty and ragged buffers with a message that says
what a ring state needs; ``run_ring`` must report a faulty round *at that
round*, before the observer sees it, not only at the end of the run.
"""

from __future__ import annotations

from typing import Any

import pytest

from ring_ref import core
from ring_ref.core import initial_state, run_ring
from ring_ref.invariants import InvariantViolation, Provenance, State
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Phase, all_rounds
from tests.common import faults

pytestmark = pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance")


@pytest.mark.parametrize(
    "buffers",
    [[], [[1, 2], [3]], [[1], [2]], [[1, 2, 3], [4, 5, 6]], [[1, 2], [3, 4], [5, 6]]],
    ids=["empty", "ragged", "too-few-chunks", "too-many-chunks", "more-workers-than-chunks"],
)
def test_initial_state_refuses_what_is_not_n_workers_of_n_chunks(buffers: list[list[int]]) -> None:
    with pytest.raises(ValueError, match=r"needs n >= 1 workers of n chunks each; got \d+ workers"):
        initial_state(buffers)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_initial_state_accepts_n_workers_of_n_chunks_and_copies_them(n: int) -> None:
    rows = [[10 * i + c for c in range(n)] for i in range(n)]
    state = initial_state(rows)
    assert state == tuple(tuple(row) for row in rows)
    rows[0][0] = -1
    assert state[0][0] == 0


def _sum(a: int, b: int) -> int:
    return a + b


FAULTY_ROUNDS: list[tuple[int, Phase, int, Any]] = [
    (4, REDUCE_SCATTER, 1, faults.wrong_chunk_reduce_scatter),
    (4, REDUCE_SCATTER, 0, faults.forwarding_reduce_scatter),
    (5, ALL_GATHER, 2, faults.adding_all_gather),
    (3, ALL_GATHER, 0, faults.adding_all_gather),
]


@pytest.mark.parametrize(("n", "phase", "bad_round", "fault"), FAULTY_ROUNDS)
def test_run_ring_reports_a_faulty_round_at_that_round(
    n: int, phase: Phase, bad_round: int, fault: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = core.step

    def step_with_one_bad_round(state: State[Any], ph: Phase, r: int, combine: Any, **kw: Any) -> State[Any]:
        if (ph, r) == (phase, bad_round):
            return fault(state, r, combine)  # type: ignore[no-any-return]
        return real_step(state, ph, r, combine, **kw)

    monkeypatch.setattr(core, "step", step_with_one_bad_round)
    seen: list[tuple[Phase, int]] = []

    def observe(ph: Phase, r: int, _state: State[int], _prov: State[Provenance]) -> None:
        seen.append((ph, r))

    buffers = initial_state([[i * n + c for c in range(n)] for i in range(n)])
    with pytest.raises(InvariantViolation, match=rf"^after {phase} round {bad_round}: worker \d+ slot \d+"):
        run_ring(buffers, _sum, observe)
    rounds = list(all_rounds(n))
    assert seen == rounds[: rounds.index((phase, bad_round))]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_run_ring_observes_every_round_in_order_when_nothing_is_wrong(n: int) -> None:
    seen: list[tuple[Phase, int]] = []
    rows = [[i * n + c for c in range(n)] for i in range(n)]
    out = run_ring(initial_state(rows), _sum, lambda ph, r, _s, _p: seen.append((ph, r)))
    assert seen == list(all_rounds(n))
    sums = tuple(sum(rows[i][c] for i in range(n)) for c in range(n))
    assert out == (sums,) * n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_run_ring_shows_the_observer_each_rounds_values_and_their_provenance(n: int) -> None:
    """Every slot the observer sees is the sum of exactly the contributions its provenance names."""
    rows = [[2 ** (i * n + c) for c in range(n)] for i in range(n)]  # distinct bits: sums are unambiguous
    seen = []

    def observe(ph: Phase, r: int, state: State[int], prov: State[Provenance]) -> None:
        seen.append((ph, r))
        for i in range(n):
            for c in range(n):
                assert state[i][c] == sum(rows[w][c] for w in prov[i][c]), (ph, r, i, c)
        # The provenance is the spec's closed form (inv-rs-provenance / inv-ag-provenance).
        d = [[(i - c) % n for c in range(n)] for i in range(n)]
        if ph == REDUCE_SCATTER:
            assert all(
                prov[i][c] == (tuple((c + k) % n for k in range(d[i][c] + 1)) if d[i][c] <= r + 1 else (i,))
                for i in range(n)
                for c in range(n)
            )

    run_ring(initial_state(rows), _sum, observe)
    assert len(seen) == 2 * (n - 1)
