"""The SPIN model for rings of the schedule family (``-DDIR``, ``-DOFF``; spec/schedules.md).

The model's transfers depend on the direction and the offset only (the chunk
layout does not change which chunk moves when).  For rings other than the
spec's, SPIN's exhaustive search must find no error, and the transfers of
random simulations must be exactly those of
:class:`ring_ref.schedule.RingSchedule` -- and not those of the spec's ring,
so the comparison can fail.  Requires ``spin`` and a C compiler.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from ring_ref.schedule import PHASES, RingSchedule, Send, all_rounds
from tools.model_check import Config, simulate, verify

RINGS = [RingSchedule(-1, -1, "gloo"), RingSchedule(1, 2, "even"), RingSchedule(-1, 1, "blocks")]
EVENT = re.compile(r"(SEND|RECV) phase=([01]) round=(\d+) (?:src=(\d+)|dst=(\d+) src=(\d+)) chunk=(\d+)")


def _transfers(output: str) -> tuple[dict[int, list[tuple[str, int, int]]], set[Send]]:
    """Per worker the chunks it sent in order, and every received transfer as a ``Send``."""
    sent: dict[int, list[tuple[str, int, int]]] = {}
    received = set()
    for kind, phase, rnd, src, dst, link, chunk in EVENT.findall(output):
        ph = PHASES[int(phase)]
        if kind == "SEND":
            sent.setdefault(int(src), []).append((ph, int(rnd), int(chunk)))
        else:
            received.add(Send(ph, int(rnd), int(link), int(dst), int(chunk)))
    return sent, received


def _problems(output: str, ring: RingSchedule, n: int) -> list[str]:
    sent, received = _transfers(output)
    rounds = all_rounds(n)
    problems = [
        f"worker {w} sent {sent.get(w)}"
        for w in range(n)
        if sent.get(w) != [(ph, r, ring.send_chunk(ph, w, r, n)) for ph, r in rounds]
    ]
    if received != {s for ph, r in rounds for s in ring.sends(ph, r, n)}:
        problems.append("the received transfers are not the schedule's")
    return problems


def _simulate(ring: RingSchedule, n: int, seed: int, cap: int = 1, flags: Sequence[str] = ()) -> str:
    returncode, output = simulate(Config(n, cap, tuple(flags), ring.direction, ring.offset), seed)
    assert returncode == 0 and "Error" not in output and f"{n} processes created" in output, output
    return output


@pytest.mark.clause("schedule-async-model")
@pytest.mark.parametrize("n", [3, 4, 5])
@pytest.mark.parametrize("ring", RINGS[:2], ids=["gloo", "d+1k2"])
def test_the_model_of_other_rings_verifies_exhaustively(n: int, ring: RingSchedule) -> None:
    verdict = verify(Config(n, 1, (), ring.direction, ring.offset))
    assert verdict.verified, verdict.output
    assert verdict.states_stored > 0


@pytest.mark.clause("schedule-async-model")
def test_rendezvous_alternate_verifies_for_gloo() -> None:
    verdict = verify(Config(4, 0, ("ALTERNATE",), -1, -1))
    assert verdict.verified, verdict.output


@pytest.mark.clause("schedule-async-model")
@pytest.mark.parametrize("n", [3, 4, 6])
@pytest.mark.parametrize("ring", RINGS, ids=["gloo", "d+1k2", "d-1k1"])
def test_simulated_transfers_follow_the_ring(n: int, ring: RingSchedule) -> None:
    for seed in (1, 2):
        output = _simulate(ring, n, seed, cap=2)
        assert _problems(output, ring, n) == [], output
        # ... and not the spec's ring: the check can fail
        assert _problems(output, RingSchedule(), n) != []


@pytest.mark.clause("schedule-async-model")
def test_a_planted_fault_is_still_caught_on_another_ring() -> None:
    verdict = verify(Config(3, 1, ("FAULT_AG_ADD",), -1, -1))
    assert verdict.errors > 0 and verdict.violation is not None
    assert "assertion violated ((slot[got]&bits)==0)" in verdict.violation


def test_config_refuses_rings_the_model_cannot_take() -> None:
    with pytest.raises(ValueError, match="direction 1 or -1"):
        Config(4, direction=2)
    with pytest.raises(ValueError, match=r"\|offset\| < N = 4"):
        Config(4, offset=4)
    assert Config(4, direction=-1, offset=-1).defines() == ["-DN=4", "-DCAP=1", "-DDIR=-1", "-DOFF=-1"]
    assert Config(4).defines() == ["-DN=4", "-DCAP=1"]
