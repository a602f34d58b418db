"""The gloo rank launcher, where mutation testing found it unchecked.

Each test runs :class:`GlooRanks` on real gloo groups of forked ranks (about a
second per group start) with one target, :func:`acts`, whose every rank does
what its own input value asks (answer, print, raise, die, hang, block in a
receive, forge a reply), and checks what the guide's per-rank page (``docs/guide/ranks.md``)
promises for ``--ranks gloo``: every rank answers, in rank order, on a group
that is really joined (a collective sums across it) on loopback only, with
collectives waiting twice the time limit plus 30 s; one group per ``N``,
reused; each rank's output kept under its rank; after a rank raised the others
get 2 s and are then stopped; a rank that dies is ``crashed``, named with its
exit status or signal; a group past its limit is ``timed-out``, naming the
ranks still inside with their stacks; a garbled reply crashes its rank; after
any of these the group is torn down, and nothing is left running once the
launcher is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ring_ref.difftest import Case
from ring_ref.difftest._call import Outcome
from ring_ref.difftest._ranks import GlooRanks
from tests.common.leftovers import left_behind

# A per-test limit too: a hang (under mutation testing, say) fails its test instead of stalling the run.
pytestmark = [pytest.mark.clause("difftest-ranks"), pytest.mark.timeout(90)]

TARGET = f"{__name__}:acts"

# What a rank does, by the value of its one-element input.
QUIET, SUMS, PID, RAISES, LATE, HANGS, EXITS, SEGFAULTS, ABORTS, RECEIVES, FORGES, CHATTY = range(12)
LATE_S = 1.2
"""How long a ``LATE`` rank takes: more than 1 s and less than the 2 s grace after a rank raised or died."""
CHATTY_CHARS = 3000


def _socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    return inodes


def _tcp_sockets() -> list[tuple[str, int, str]]:
    """This process' TCP sockets: (local address, local port, state in hex as /proc/net/tcp writes it)."""
    mine, found = _socket_inodes(), []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] not in mine:
                continue
            raw, port = fields[1].split(":")
            packed = bytes.fromhex(raw)
            # /proc writes each 32-bit word of the address in host (little-endian) order
            words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
            address = ipaddress.ip_address(words)
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            found.append((str(address), int(port, 16), fields[3]))
    return found


def _forge_an_answer_for(rank: int) -> None:
    """Write a well-formed answer frame naming ``rank`` on every pipe this process may write to."""
    head = json.dumps(
        {
            "kind": "answer",
            "rank": rank,
            "type": "NoneType",
            "raised": "",
            "traceback": "",
            "returned_none": False,
        }
    ).encode()
    frame = len(head).to_bytes(8, "big") + bytes(8) + head
    for fd in range(3, 256):
        with contextlib.suppress(OSError):
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if writable and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(fd, frame)


def _hangs() -> None:
    time.sleep(600)


def _segfaults_here() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _aborts_here() -> None:
    os.abort()


def acts(tensor: torch.Tensor) -> torch.Tensor | None:
    """Per rank: what this rank's input value asks (see the constants above)."""
    code, rank, n = int(tensor[0]), dist.get_rank(), dist.get_world_size()
    if code == SUMS:
        dist.all_reduce(tensor)
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))  # type: ignore[union-attr]
        facts = {
            "rank": rank,
            "n": n,
            "backend": dist.get_backend(),
            "pid": os.getpid(),
            "collective_timeout_s": backend.options._timeout.total_seconds(),
            "store_timeout_s": dist.distributed_c10d._get_default_store().timeout.total_seconds(),  # type: ignore[attr-defined]
            "addresses": sorted({address for address, _, _ in _tcp_sockets()}),
        }
        print(json.dumps(facts))
    elif code == PID:
        print(os.getpid())
    elif code == RAISES:
        raise ValueError("planted")
    elif code == LATE:
        time.sleep(LATE_S)
    elif code == HANGS:
        _hangs()
    elif code == EXITS:
        os._exit(3)
    elif code == SEGFAULTS:
        _segfaults_here()
    elif code == ABORTS:
        _aborts_here()
    elif code == RECEIVES:
        dist.recv(tensor, (rank + 1) % n)  # from a peer that never sends
    elif code == FORGES:
        _forge_an_answer_for((rank + 1) % n)
    elif code == CHATTY:
        time.sleep(0.3)  # so that the ranks before it have answered by then
        sys.stdout.write("x" * CHATTY_CHARS)
    return None


def case(*codes: int) -> Case:
    """Rank ``r`` gets the one-element input ``codes[r]``."""
    return Case(len(codes), 1, (), torch.float64, "contiguous", tuple(float(c) for c in codes))


def ranks_running() -> int:
    """How many rank processes are alive (this process' children)."""
    return len(left_behind(grace_s=0))


def listening() -> set[tuple[str, int]]:
    """This process' listening TCP sockets: (address, port)."""
    return {(address, port) for address, port, state in _tcp_sockets() if state == "0A"}  # 0A: LISTEN


@contextlib.contextmanager
def launcher(timeout_s: float, target: str = TARGET) -> Iterator[GlooRanks]:
    ranks = GlooRanks(target, timeout_s)
    try:
        yield ranks
    finally:
        ranks.close()
        assert left_behind() == []


def timed_call(ranks: GlooRanks, c: Case) -> tuple[Outcome, float]:
    started = time.monotonic()
    outcome = ranks.call(c)
    return outcome, time.monotonic() - started


def per_rank_output(output: str, n: int) -> dict[int, str]:
    """The output split at its ``rank r:`` lines (checking that they come in rank order)."""
    blocks: dict[int, str] = {}
    rest = output
    for r in range(n):
        head = f"rank {r}:\n"
        if head in rest:
            before, rest = rest.split(head, 1)
            if blocks:
                blocks[max(blocks)] += before
            else:
                assert before == "", output
            blocks[r] = ""
    if blocks:
        blocks[max(blocks)] += rest
    return blocks


def test_every_rank_answers_on_a_loopback_group_reused_per_n_until_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The tester's own environment naming another interface must not take the ranks off loopback.
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ring-ref-no-such-interface")
    before = listening()
    with launcher(timeout_s=5) as ranks:
        ranks.start()
        assert ranks_running() == 1  # a group of one
        store = listening() - before
        assert store and all(ipaddress.ip_address(a).is_loopback for a, _ in store), store
        first = case(SUMS, SUMS)
        outcome = ranks.call(first)
        assert outcome.case == first and outcome.failure is None and outcome.note == "", outcome
        assert [a.rank for a in outcome.answers] == [0, 1]
        for answer in outcome.answers:
            assert answer.raised == "" and answer.returned_none and answer.result is not None
            assert answer.result.values is not None and answer.result.values.tolist() == [2.0 * SUMS]
        blocks = per_rank_output(outcome.output, 2)
        facts = {r: json.loads(text) for r, text in blocks.items()}
        assert sorted(facts) == [0, 1] and all(blocks[r].endswith("\n") for r in blocks), outcome.output
        assert [(f["rank"], f["n"], f["backend"]) for f in facts.values()] == [(0, 2, "gloo"), (1, 2, "gloo")]
        # as docs/guide/ranks.md says, collectives inside the group wait twice the time limit plus 30 s
        assert all(f["collective_timeout_s"] == f["store_timeout_s"] == 2 * 5 + 30 for f in facts.values())
        assert all(ipaddress.ip_address(a).is_loopback for f in facts.values() for a in f["addresses"]), facts
        assert all(f["addresses"] for f in facts.values())  # gloo's sockets to the peer
        pids = [f["pid"] for f in facts.values()]
        assert ranks_running() == 3  # the group of one and the group of two, at once

        again = ranks.call(case(PID, CHATTY))  # the same group of two
        assert again.failure is None and [a.rank for a in again.answers] == [0, 1]
        assert again.output.startswith(f"rank 0:\n{pids[0]}\nrank 1:\nxxx"), again.output[:100]
        assert again.output.endswith("xxx") and "characters left out" in again.output
        assert len(again.output) < 2100  # start and end kept, as for any call's output
        # the run's log counts all of it (the target's own bytes, without the rank lines)
        assert ranks.output.bytes == len(blocks[0] + blocks[1]) + len(f"{pids[0]}\n") + CHATTY_CHARS
        assert '"collective_timeout_s"' in ranks.output.text and "xxx" in ranks.output.text

        raised = ranks.call(case(RAISES, QUIET))
        assert raised.failure is None and raised.note == ""  # every rank answered
        assert [(a.rank, a.raised) for a in raised.answers] == [(0, "ValueError: planted"), (1, "")]
        assert ranks_running() == 1  # after a rank raised the group of two was torn down
    assert listening() == before  # the stores were released


def test_after_a_rank_raised_the_others_get_two_seconds_then_are_stopped() -> None:
    with launcher(timeout_s=8) as ranks:
        outcome, took = timed_call(ranks, case(RAISES, LATE, HANGS))
        assert outcome.failure is None, outcome.failure
        assert [(a.rank, a.raised) for a in outcome.answers] == [(0, "ValueError: planted"), (1, "")]
        assert "rank(s) [2] were still inside the call" in outcome.note
        assert "after rank(s) [0] raised" in outcome.note
        assert took < 6, took  # well before the 8 s limit
        assert ranks_running() == 0  # torn down


def test_a_rank_that_dies_is_crashed_named_with_its_exit_status_or_signal() -> None:
    with launcher(timeout_s=8) as ranks:
        outcome, took = timed_call(ranks, case(LATE, EXITS, SEGFAULTS, ABORTS, HANGS))
        failure = outcome.failure
        assert failure is not None and failure.code == "crashed" and failure.ranks == (1, 2, 3), outcome
        assert "rank(s) [1, 2, 3] of 5 died during the call" in failure.text
        exited = "the worker process exited with status 3"
        killed = "the worker process was killed by signal"
        assert f"rank 1: {exited}; rank 2: {killed} SIGSEGV" in failure.text
        assert f"; rank 3: {killed} SIGABRT" in failure.text
        assert "rank(s) [4] were stopped" in failure.text
        # each stack under its rank's line (os._exit leaves none)
        assert failure.stack.startswith("rank 2:\n") and "rank 1:" not in failure.stack, failure.stack
        two, three = failure.stack.removeprefix("rank 2:\n").split("rank 3:\n")
        assert "in _segfaults_here" in two and two.endswith("\n") and "in _aborts_here" in three, (
            failure.stack
        )
        assert [(a.rank, a.raised) for a in outcome.answers] == [(0, "")]  # within the grace
        assert took < 6, took
        assert ranks_running() == 0


def test_a_group_past_its_time_limit_is_timed_out_naming_each_rank_still_inside_with_its_stack() -> None:
    with launcher(timeout_s=1) as ranks:
        outcome, took = timed_call(ranks, case(QUIET, RECEIVES, HANGS))
        failure = outcome.failure
        assert failure is not None and failure.code == "timed-out" and failure.ranks == (1, 2), outcome
        assert "no answer within 1 s" in failure.text
        assert "rank(s) [1, 2] of 3 were still inside the call" in failure.text
        assert "rank(s) [0] had answered" in failure.text
        assert [a.rank for a in outcome.answers] == [0]
        assert failure.stack.startswith("rank 1:\n") and "rank 2:\n" in failure.stack, failure.stack
        one, two = failure.stack.removeprefix("rank 1:\n").split("rank 2:\n")
        assert "in recv" in one and "in acts" in one and "in _hangs" not in one, failure.stack
        assert one.endswith("\n"), failure.stack
        assert "in _hangs" in two and "in recv" not in two, failure.stack
        assert took >= 1
        assert ranks_running() == 0

        nobody = ranks.call(case(HANGS, HANGS)).failure
        assert nobody is not None and nobody.code == "timed-out" and nobody.ranks == (0, 1)
        assert nobody.text.endswith("rank(s) [0, 1] of 2 were still inside the call; every rank was stopped")


def test_a_garbled_reply_crashes_its_rank_only() -> None:
    with launcher(timeout_s=5) as ranks:
        outcome = ranks.call(case(FORGES, QUIET))
        failure = outcome.failure
        assert failure is not None and failure.code == "crashed" and failure.ranks == (0,), outcome
        assert "rank(s) [0] of 2" in failure.text and "rank 0: its reply was garbled" in failure.text
        assert "expected an answer from rank 0, got kind 'answer' naming rank 1" in failure.text
        assert "stopped" not in failure.text and failure.text.endswith(")") and failure.stack == ""
        assert [a.rank for a in outcome.answers] == [1]
        assert ranks_running() == 0  # torn down: rank 0's real reply is still in its pipe


def test_a_rank_that_cannot_load_the_target_crashes_the_call_with_the_output_kept(tmp_path: Path) -> None:
    module = tmp_path / "fails_on_rank_1.py"
    module.write_text(
        "import torch.distributed as dist\n"
        "print(f'loading on rank {dist.get_rank()}')\n"
        "if dist.get_rank() == 1:\n"
        "    raise ImportError('planted on rank 1')\n"
        "def fn(tensor):\n"
        "    return None\n",
        encoding="utf-8",
    )
    with launcher(timeout_s=5, target=f"{module}:fn") as ranks:
        c = case(QUIET, QUIET)
        outcome = ranks.call(c)
        failure = outcome.failure
        assert outcome.case == c and failure is not None and failure.code == "crashed", outcome
        assert "ImportError: planted on rank 1" in failure.text
        assert "loading on rank 0" in ranks.output.text and "loading on rank 1" in ranks.output.text
        assert ranks_running() == 0
