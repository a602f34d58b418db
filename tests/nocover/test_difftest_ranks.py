"""Per-rank targets on real gloo groups: every rank checked, deadlocks and dead ranks named."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
import torch.distributed as dist

from ring_ref._cli import main
from ring_ref.difftest import Case, Mode, Report, difftest
from ring_ref.difftest._call import Outcome
from ring_ref.difftest._options import Options
from ring_ref.difftest._orders import schedule_order
from ring_ref.difftest._ranks import GlooRanks
from ring_ref.difftest._run import run_difftest
from ring_ref.testing import assert_matches_reference
from tests.common import planted_rank_impls
from tests.common.leftovers import left_behind
from tests.common.paths import ROOT
from tests.common.planted_rank_impls import RankImpl

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))


@pytest.mark.clause("difftest-ranks", "difftest-oracles")
def test_torch_distributed_all_reduce_passes_order_free_and_bound() -> None:
    report = difftest(
        "torch.distributed:all_reduce", ranks="gloo", modes=("order-free", "bound"), examples=8, seed=4
    )
    assert report.verdict == "pass" and report.ranks == "gloo" and report.isolated, report.render()
    assert all(r.examples >= 8 for r in report.modes.values())


@pytest.mark.clause("difftest-ranks", "fold-order")
@pytest.mark.parametrize(
    "target",
    ["ring_ref.distributed:ring_all_reduce_", "tests.common.planted_rank_impls:returns_a_new_tensor"],
)
def test_ring_all_reduce_underscore_passes_every_mode(target: str) -> None:
    report = assert_matches_reference(target, ranks="gloo", examples=10, seed=2, max_workers=4)
    assert set(report.modes) == {"exact", "order-free", "bound"}


@pytest.mark.clause("difftest-ranks", "difftest-diagnoses")
@pytest.mark.parametrize("bug", list(planted_rank_impls.EXPECTED), ids=lambda f: f.__name__)
def test_planted_per_rank_bug_gets_its_code(bug: RankImpl) -> None:
    code = planted_rank_impls.EXPECTED[bug]
    report = difftest(
        bug, ranks="gloo", modes=("order-free", "bound"), examples=20, seed=1, max_workers=3, timeout=2
    )
    assert report.diagnoses == [code], report.render()
    for mode, result in report.modes.items():
        finding, cex = result.finding, result.counterexample
        assert finding is not None and cex is not None and finding.codes == [code], (mode, report.render())
        assert cex.layout == "contiguous"
        if code == "timed-out":
            # Both neighbours block in recv: every rank is named, with its stack there.
            assert finding.ranks == list(range(cex.n)) and cex.n >= 2
            assert f"rank(s) {finding.ranks} of {cex.n} were still inside the call" in finding.explanation
            for rank in finding.ranks:
                assert f"rank {rank}:\n" in finding.stack
            assert finding.stack.count("in receives_first") == cex.n
        if code == "crashed":
            assert (
                finding.ranks == [1]
                and "rank 1: the worker process exited with status 3" in finding.explanation
            )
        if bug is planted_rank_impls.constant_on_last_rank:
            last = cex.n - 1
            assert finding.ranks == [last] and f"rank {last} has " in finding.explanation
            m = finding.mismatch
            assert m is not None and m.actual == m.expected + 1  # the constant the last rank adds
        if code == "double-counted":
            assert "counted more than once" in finding.explanation
        if code == "out-of-bound":  # the stacked twin's words, from the failing rank's one-hot probes
            assert "Contributions missing: with only worker j holding ones" in finding.explanation
            assert re.search(r"so worker\(s\) \[\d\] lost", finding.explanation), finding.explanation
        if bug is planted_rank_impls.gather_drops_last_chunk_on_rank_0:  # each failing rank's counts
            assert finding.ranks == [0] and "per failing rank: rank 0: element" in finding.explanation
            assert re.search(r"\(worker\(s\) \[\d\] lost\)$", finding.explanation), finding.explanation
        if code == "input-modified":
            assert "the input was modified" in finding.explanation


@pytest.mark.clause("difftest-ranks", "difftest-rank-env")
def test_env_reaches_every_gloo_rank() -> None:
    """``env`` (``--env``) with ``ranks="gloo"``: every forked rank has it before it joins the group (the
    target raises where it is missing)."""
    target = "tests.common.planted_rank_impls:ring_if_told"
    common: dict[str, object] = {"ranks": "gloo", "modes": "order-free", "examples": 3, "max_workers": 3}
    told = difftest(target, env={planted_rank_impls.ENV_PROBE: "on"}, seed=0, **common)  # type: ignore[arg-type]
    assert told.verdict == "pass", told.render()
    untold = difftest(target, seed=0, **common)  # type: ignore[arg-type]
    assert untold.diagnoses == ["raised"], untold.render()


@pytest.mark.clause("difftest-ranks", "difftest-report")
def test_cli_ranks_gloo_json_names_the_ranks(capfd: pytest.CaptureFixture[str]) -> None:
    args = ["difftest", "--ranks", "gloo", "tests.common.planted_rank_impls:constant_on_last_rank"]
    args += ["--mode", "order-free", "--examples", "10", "--seed", "3", "--max-workers", "3", "--json"]
    assert main(args) == 1
    doc = json.loads(capfd.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks"] == "gloo" and doc["diagnoses"] == ["ranks-disagree"]
    cex = doc["modes"]["order-free"]["counterexample"]
    assert cex["ranks"] == [cex["n"] - 1] and cex["element"]["rank"] == cex["n"] - 1
    assert doc["replay"].startswith(
        "ring-ref difftest --ranks gloo tests.common.planted_rank_impls:constant_on_last_rank"
    )
    passing = ["difftest", "--ranks", "gloo", "torch.distributed:all_reduce", "--mode", "bound"]
    assert main([*passing, "--examples", "3", "--max-workers", "2"]) == 0
    assert "PASS" in capfd.readouterr().out


def test_a_lambda_cannot_be_a_per_rank_target() -> None:
    with pytest.raises(ValueError, match="must be a module-level function or a TARGET string"):
        difftest(lambda t: None, ranks="gloo")
    with pytest.raises(ValueError, match="ranks must be one of"):
        difftest("torch.distributed:all_reduce", ranks="nccl")  # type: ignore[arg-type]
    assert torch.distributed.is_available()


@pytest.mark.clause("difftest-ranks")
def test_the_buggy_per_rank_example_is_diagnosed_and_its_fix_passes(tmp_path: Path) -> None:
    example = ROOT / "examples" / "buggy_rank_allreduce.py"
    report = difftest(f"{example}:ring_all_reduce", ranks="gloo", examples=10, seed=7, max_workers=3)
    assert report.diagnoses == ["ranks-disagree"], report.render()
    source = example.read_text(encoding="utf-8")
    bug = "    if rank == 0:  # BUG: every rank should copy the result back\n        tensor.copy_(work)"
    assert bug in source
    fixed = tmp_path / "fixed_rank_allreduce.py"
    fixed.write_text(source.replace(bug, "    tensor.copy_(work)"), encoding="utf-8")
    again = difftest(f"{fixed}:ring_all_reduce", ranks="gloo", examples=10, seed=7, max_workers=3)
    assert again.verdict == "pass", again.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-ranks")
@pytest.mark.parametrize("target", ["ring_ref.distributed:ring_all_reduce_", "torch.distributed:all_reduce"])
def test_soak_per_rank_targets_up_to_eight_ranks(target: str) -> None:
    modes: tuple[Mode, ...] = (
        ("exact", "order-free", "bound") if "ring_ref" in target else ("order-free", "bound")
    )
    report = difftest(target, ranks="gloo", modes=modes, examples=150, max_workers=8)
    assert report.verdict == "pass", report.render()


@pytest.mark.clause("difftest-ranks", "difftest-exact-orders")
def test_a_per_rank_ring_that_drops_the_remainder_fails_under_openmpi_ring_blocks() -> None:
    """Issue #29 item 2, per rank: under ``--schedule openmpi-ring`` the ranks get M not divisible by N."""
    blocks, options = schedule_order("openmpi-ring"), Options(ranks="gloo", examples=2, seed=3, max_workers=4)
    dropped = run_difftest(planted_rank_impls.openmpi_ring_dropping_the_remainder, options, blocks)
    correct = run_difftest(planted_rank_impls.openmpi_ring, dataclasses.replace(options, examples=4), blocks)
    for mode, result in dropped.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.m % case.n, (mode, dropped.render())
    assert correct.verdict == "pass", correct.render()


@pytest.mark.clause("difftest-ranks", "difftest-diagnoses")
def test_a_stacked_target_under_ranks_gloo_is_told_to_drop_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #29 item 8, on a real group: difftest's raised explanation and reveal's error both say it."""
    (tmp_path / "stacked.py").write_text("def total(x):\n    return x.sum(1).sum(0)\n", encoding="utf-8")
    target = f"{tmp_path / 'stacked.py'}:total"
    options = ["--mode", "bound", "--examples", "2", "--seed", "1", "--max-workers", "2"]
    assert main(["difftest", "--ranks", "gloo", target, *options]) == 1
    out = capsys.readouterr().out
    assert "raised IndexError: Dimension out of range" in out and "drop --ranks (ranks=None)" in out
    assert main(["reveal", "--ranks", "gloo", target, "-n", "2", "-m", "2"]) == 2
    err = capsys.readouterr().err
    # ranks with the same answer are named together (clause reveal-hints)
    assert "ranks [0, 1] raised IndexError: Dimension out of range" in err and "drop --ranks" in err


def _every_mode_fails_at_three(report: Report) -> None:
    for mode, result in report.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.n == 3, (mode, report.render())


@pytest.mark.clause("difftest-every-n", "difftest-ranks")
def test_a_per_rank_bug_at_one_odd_n_fails_every_mode() -> None:
    """Issue #40 item 1: a ring whose reduce-scatter takes the wrong chunk at ``N = 3`` alone (zeros
    pass) fails every mode under ``--ranks gloo`` at ``--examples 20`` (the 20 seeds: the soak test)."""
    bug = "tests.common.planted_rank_impls:wrong_chunk_at_three"
    # seed 4: before every N got its probes, bound passed this bug at it
    _every_mode_fails_at_three(difftest(bug, ranks="gloo", examples=20, seed=4, max_workers=4))


@pytest.mark.soak
@pytest.mark.clause("difftest-every-n", "difftest-ranks")
@pytest.mark.parametrize("seed", range(20))
def test_soak_a_per_rank_bug_at_one_odd_n_fails_every_mode_at_every_seed(seed: int) -> None:
    bug = "tests.common.planted_rank_impls:wrong_chunk_at_three"
    _every_mode_fails_at_three(difftest(bug, ranks="gloo", examples=20, seed=seed))


# ==========================================================================================================
# The gloo rank launcher (``ring_ref.difftest._ranks``): its groups, its ranks' answers and failures.
#
# Each test runs :class:`GlooRanks` on real gloo groups of forked ranks (about a
# second per group start) with one target, :func:`acts`, whose every rank does
# what its own input value asks (answer, print, raise, die, hang, block in a
# receive, forge a reply), and checks what the guide's per-rank page (``docs/guide/ranks.md``)
# promises for ``--ranks gloo``: every rank answers, in rank order, on a group
# that is really joined (a collective sums across it) on loopback only, with
# collectives waiting twice the time limit plus 30 s; one group per ``N``,
# reused; each rank's output kept under its rank; after a rank raised the others
# get 2 s and are then stopped; a rank that dies is ``crashed``, named with its
# exit status or signal; a group past its limit is ``timed-out``, naming the
# ranks still inside with their stacks; a garbled reply crashes its rank; after
# any of these the group is torn down, and nothing is left running once the
# launcher is closed.
# ==========================================================================================================


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


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
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


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
def test_after_a_rank_raised_the_others_get_two_seconds_then_are_stopped() -> None:
    with launcher(timeout_s=8) as ranks:
        outcome, took = timed_call(ranks, case(RAISES, LATE, HANGS))
        assert outcome.failure is None, outcome.failure
        assert [(a.rank, a.raised) for a in outcome.answers] == [(0, "ValueError: planted"), (1, "")]
        assert "rank(s) [2] were still inside the call" in outcome.note
        assert "after rank(s) [0] raised" in outcome.note
        assert took < 6, took  # well before the 8 s limit
        assert ranks_running() == 0  # torn down


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
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


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
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


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
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


@pytest.mark.clause("difftest-ranks")
@pytest.mark.timeout(90)
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
