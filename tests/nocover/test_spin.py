"""SPIN model checking of the asynchronous ring (``spec/ring_all_reduce.pml``).

The model runs each worker on its own, over FIFO links, with no round barrier
(clause ``async-ring-model``).  These tests show that SPIN's exhaustive search
finds no error in the deadlock-free configurations, that it *does* report the
rendezvous deadlock and each planted fault with a replayable trail, and that
the sends the model performs in random simulations are exactly those of
``ring_ref.schedule``.  Each test fails if SPIN stops finding what it must
find: they assert on pan's error count and on its counterexample, not only on
an exit status.

Requires ``spin`` and a C compiler (``.ci/run`` installs spin).
"""

from __future__ import annotations

import doctest
import functools
import re
import subprocess
from collections.abc import Sequence
from typing import NamedTuple

import pytest

from ring_ref import schedule
from tools import model_check
from tools.model_check import MODEL, Config, Verdict, simulate
from tools.model_check import verify as verify_uncached

verify = functools.cache(verify_uncached)
"""Each configuration is searched once per session; several tests read the same verdict."""

SPEC = MODEL.parent / "async_and_proofs.md"  # the spec document of the asynchronous model

# pan's text for each property's assertion, as the model writes them.
DISJOINT_JOIN = "assertion violated ((slot[got]&bits)==0)"
CHUNK_INDEX = "assertion violated (got=="
PROVENANCE_ASSERTIONS = (
    DISJOINT_JOIN,
    "assertion violated ((c==",  # only the owned chunk is complete after reduce-scatter
    "assertion violated ((slot[c]==",  # every chunk is complete at the end
)

SEEDS = (1, 2, 3, 4)

FAULT_NS = (2, 3, 4)
"""Each failing search costs a verifier build; the faults and the deadlock do not depend on N
(see the spec's arguments), and make model-check covers the correct model up to N = 8."""


def model_line(fragment: str) -> int:
    """The 1-based line of the model that contains ``fragment`` (exactly one)."""
    lines = [k for k, text in enumerate(MODEL.read_text().splitlines(), 1) if fragment in text]
    assert len(lines) == 1, f"{fragment!r} is on lines {lines} of {MODEL.name}"
    return lines[0]


def assert_verified(verdict: Verdict) -> None:
    """Zero errors in a complete, exhaustive search, and no counterexample."""
    assert verdict.complete, f"the search did not cover every state:\n{verdict.output}"
    assert verdict.errors == 0, f"{verdict.violation}\n{verdict.replay}"
    assert verdict.replay is None
    assert verdict.states_stored > 0


def assert_caught(verdict: Verdict, violation: str | tuple[str, ...]) -> str:
    """pan reports exactly one error, starting with ``violation``; the trail replays it (returned)."""
    assert verdict.errors == 1, f"SPIN did not find the error:\n{verdict.output}"
    assert verdict.violation is not None
    assert verdict.violation.startswith(violation), verdict.violation
    assert verdict.replay is not None, "pan wrote no counterexample trail"
    assert "trail ends after" in verdict.replay, verdict.replay
    return verdict.replay


# --- parsing the model's printed sends and receives --------------------------------------------------


class Event(NamedTuple):
    """One printed transfer: a worker's send, or a worker's receive from its left link."""

    kind: str
    phase: schedule.Phase
    round: int
    worker: int
    peer: int | None
    """For a receive: the link (sending worker) it read from."""
    chunk: int


EVENT = re.compile(
    r"(SEND|RECV) phase=([01]) round=(\d+) (?:src=(\d+)|dst=(\d+) src=(\d+)) chunk=(\d+)",
)


def parse_events(output: str) -> list[Event]:
    """Every SEND/RECV line, in the order the simulation executed them."""
    events = []
    for m in EVENT.finditer(output):
        kind, phase, rnd, src, dst, link, chunk = m.groups()
        # The model numbers its phases as spec order: 0 = reduce-scatter, 1 = all-gather.
        ph = schedule.PHASES[int(phase)]
        if kind == "SEND":
            events.append(Event(kind, ph, int(rnd), int(src), None, int(chunk)))
        else:
            events.append(Event(kind, ph, int(rnd), int(dst), int(link), int(chunk)))
    return events


def schedule_problems(events: Sequence[Event], n: int) -> list[str]:
    """How the printed transfers differ from ``ring_ref.schedule`` (empty when they match).

    Each worker must send, in order, exactly the chunks of
    :func:`ring_ref.schedule.sends` for every round of :func:`ring_ref.schedule.all_rounds`,
    and receive each from its left neighbour; the received transfers, as
    ``Send`` records, must be the schedule's set of transfers.
    """
    problems = []
    rounds = schedule.all_rounds(n)
    for w in range(n):
        sent = [(e.phase, e.round, e.chunk) for e in events if e.kind == "SEND" and e.worker == w]
        want_sent = [(ph, r, schedule.send_chunk(ph, w, r, n)) for ph, r in rounds]
        if sent != want_sent:
            problems.append(f"worker {w} sent {sent}, the schedule says {want_sent}")
        got = [(e.phase, e.round, e.peer, e.chunk) for e in events if e.kind == "RECV" and e.worker == w]
        src = schedule.left(w, n)
        want_got = [(ph, r, src, schedule.send_chunk(ph, src, r, n)) for ph, r in rounds]
        if got != want_got:
            problems.append(f"worker {w} received {got}, the schedule says {want_got}")
    transfers = {
        schedule.Send(e.phase, e.round, e.peer, e.worker, e.chunk)
        for e in events
        if e.kind == "RECV" and e.peer is not None
    }
    want = {send for ph, r in rounds for send in schedule.sends(ph, r, n)}
    if transfers != want:
        problems.append(f"transfers {sorted(transfers ^ want)} are in one of model and schedule only")
    return problems


def lock_step(events: Sequence[Event], n: int) -> bool:
    """Whether no worker sent for a later round before every worker sent for the earlier one."""
    order = {key: k for k, key in enumerate(schedule.all_rounds(n))}
    sends = [order[(e.phase, e.round)] for e in events if e.kind == "SEND"]
    return sends == sorted(sends)


# --- (1) the correct model verifies ------------------------------------------------------------------


@pytest.mark.clause("async-ring-model", "rs-add", "rs-owned-chunk", "ag-copy-not-add", "ag-complete")
@pytest.mark.parametrize("n", range(2, 6))
@pytest.mark.parametrize(("cap", "flags"), [(1, ()), (0, ("ALTERNATE",))], ids=["1-slot", "alternate"])
def test_model_verifies_exhaustively(n: int, cap: int, flags: tuple[str, ...]) -> None:
    assert_verified(verify(Config(n, cap, flags)))


@pytest.mark.clause("buffered-links")
@pytest.mark.parametrize("n", [3, 4])
def test_deeper_links_also_verify(n: int) -> None:
    assert_verified(verify(Config(n, cap=3)))


@pytest.mark.clause("model-check-bound")
def test_spec_states_the_measured_state_counts() -> None:
    """The spec's table of states stored matches what this SPIN measures (N = 2 .. 5).

    State counts depend on pan's partial-order reduction, so the table names the
    Spin version it was measured with.  Debian's and Ubuntu's ``spin`` package
    (what ``.ci/run`` installs) is that version; any other SPIN fails here, with
    the fix, rather than leaving the spec's numbers unchecked behind a skip.
    """
    version = subprocess.run(["spin", "-V"], capture_output=True, text=True, check=True).stdout
    section = SPEC.read_text(encoding="utf-8").split("### `model-check-bound`", 1)[1].split("\n### ", 1)[0]
    measured_with = re.search(r"measured with Spin ([\d.]+)", section)
    assert measured_with is not None, "the model-check-bound clause names no Spin version"
    assert f"Spin Version {measured_with.group(1)} " in version, (
        f"the spec's state counts were measured with Spin {measured_with.group(1)}, this is "
        f"{version.strip()}: install that version (apt-get install spin) or re-measure with "
        "`python tools/model_check.py --max-n 9` and update clause model-check-bound (table and version)"
    )
    table = {
        int(n): (int(a.replace(",", "")), int(b.replace(",", "")))
        for n, a, b in re.findall(r"^\| (\d+) \| ([\d,]+) \| ([\d,]+) \|", section, re.MULTILINE)
    }
    assert set(table) >= set(range(2, 9)), f"the table covers N = {sorted(table)}"
    for n in range(2, 6):
        buffered = verify(Config(n, cap=1)).states_stored
        alternate = verify(Config(n, cap=0, flags=("ALTERNATE",))).states_stored
        assert table[n] == (buffered, alternate), f"N = {n}"


# --- (2) rendezvous links, everyone sending first: deadlock ------------------------------------------


@pytest.mark.clause("buffered-links")
@pytest.mark.parametrize("n", FAULT_NS)
def test_rendezvous_links_deadlock_when_everyone_sends_first(n: int) -> None:
    verdict = verify(Config(n, cap=0))
    replay = assert_caught(verdict, "invalid end state")
    # The trail stops with every worker blocked at the same point of its scheduled send (spin
    # reports a statement of an inline by a line of the inline), before anything was transferred.
    send_lines = range(model_line("inline send_scheduled()"), model_line("link[_pid] ! SEND_CHUNK") + 1)
    blocked = re.findall(rf"proc\s+(\d+) \(Worker:\d+\) {re.escape(MODEL.name)}:(\d+)", replay)
    assert sorted(int(pid) for pid, _ in blocked) == list(range(n)), replay
    assert len({line for _, line in blocked}) == 1, replay
    assert int(blocked[0][1]) in send_lines, replay
    assert parse_events(replay) == []


# --- (3) planted faults are caught with a counterexample trail ---------------------------------------


@pytest.mark.clause("ag-copy-not-add", "async-ring-model")
@pytest.mark.parametrize("n", FAULT_NS)
def test_all_gather_that_adds_is_caught(n: int) -> None:
    verdict = verify(Config(n, flags=("FAULT_AG_ADD",)))
    replay = assert_caught(verdict, DISJOINT_JOIN)
    assert "Error: assertion violated" in replay
    # The join that double-counts is an all-gather receive: the last one the trail shows.
    receives = [e for e in parse_events(replay) if e.kind == "RECV"]
    assert receives, replay
    assert receives[-1].phase == schedule.ALL_GATHER, replay


@pytest.mark.clause("simultaneous-rounds", "async-ring-model")
@pytest.mark.parametrize("n", FAULT_NS)
def test_forwarding_the_slot_just_received_is_caught(n: int) -> None:
    verdict = verify(Config(n, flags=("FAULT_FORWARD",)))
    replay = assert_caught(verdict, CHUNK_INDEX)
    # In the trail, worker 0's first send is the slot it had just received in that round.
    first = next(e for e in parse_events(replay) if e.kind == "SEND" and e.worker == 0)
    assert (
        first.chunk == schedule.rs_recv_chunk(0, first.round, n) != schedule.rs_send_chunk(0, first.round, n)
    )


@pytest.mark.clause("simultaneous-rounds", "inv-finished-chunks")
@pytest.mark.parametrize("n", FAULT_NS)
def test_forwarding_is_caught_by_provenance_alone(n: int) -> None:
    """Without the chunk-index assertion, a provenance assertion still fails."""
    verdict = verify(Config(n, flags=("FAULT_FORWARD", "UNCHECKED_INDEX")))
    assert_caught(verdict, PROVENANCE_ASSERTIONS)


# --- (4) random simulations follow ring_ref.schedule -------------------------------------------------


@pytest.mark.clause("async-ring-model", "ring-topology", "rs-send-chunk", "ag-send-chunk", "round-count")
@pytest.mark.parametrize("n", range(2, 8))
@pytest.mark.parametrize(
    ("cap", "flags"), [(1, ()), (0, ("ALTERNATE",)), (2, ())], ids=["1-slot", "alternate", "2-slot"]
)
def test_simulated_transfers_follow_the_python_schedule(n: int, cap: int, flags: tuple[str, ...]) -> None:
    runs = []
    for seed in SEEDS:
        returncode, output = simulate(Config(n, cap, flags), seed)
        assert returncode == 0, output
        assert f"{n} processes created" in output, output
        assert "Error" not in output, output
        assert "timeout" not in output, output
        events = parse_events(output)
        assert len(events) == 2 * n * len(schedule.all_rounds(n)), output
        assert schedule_problems(events, n) == [], output
        runs.append(events)
    if n >= 4 and cap > 0:
        # No barrier: over buffered links some simulation lets a worker run a round ahead of another.
        assert not all(lock_step(events, n) for events in runs)


@pytest.mark.clause("async-ring-model")
@pytest.mark.parametrize("n", [3, 5])
def test_schedule_check_rejects_the_forwarding_fault(n: int) -> None:
    """The parser is not vacuous: the faulty model's simulated sends are rejected."""
    for seed in SEEDS:
        returncode, output = simulate(Config(n, flags=("FAULT_FORWARD",)), seed)
        assert returncode != 0, output
        assert "assertion violated" in output, output
        problems = schedule_problems(parse_events(output), n)
        assert any(p.startswith("worker 0 sent") for p in problems), problems


def test_model_check_doctests() -> None:
    """``tools/`` is outside pytest's doctest paths, so its examples run here."""
    result = doctest.testmod(model_check)
    assert result.attempted > 0
    assert result.failed == 0
