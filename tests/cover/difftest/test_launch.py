"""Launchers and the raw answers they carry: what runs isolated, and how the tester reads what came back."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import Case, TargetError, difftest
from ring_ref.difftest._call import Garbled, aliases, decode, input_problem, observe
from ring_ref.difftest._diagnosis import Finding
from ring_ref.difftest._launch import OUTPUT_LIMIT, InProcess, Isolated, OutputLog
from ring_ref.difftest._report import ModeResult, Report
from tests.common import planted_impls
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
CASE = Case(2, 2, (2,), torch.float32, "strided", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))


@pytest.mark.clause("difftest-isolation")
def test_importable_targets_run_isolated_and_lambdas_in_process() -> None:
    named = difftest(planted_impls.in_place_ring, modes=("exact",), examples=2, seed=1)
    by_string = difftest("tests.common.planted_impls:in_place_ring", modes=("exact",), examples=2, seed=1)
    lam = difftest(lambda x: ring_all_reduce(x.clone()), modes=("exact",), examples=2, seed=1)
    forced = difftest(planted_impls.in_place_ring, modes=("exact",), examples=2, seed=1, isolate=False)
    assert (named.isolated, by_string.isolated, lam.isolated, forced.isolated) == (True, True, False, False)
    assert named.to_json()["timeout_s"] == 60 and lam.to_json()["timeout_s"] is None
    assert "(isolated: the target ran in a worker process, at most 60 s per call)" in named.render()
    assert "(not isolated:" in lam.render()
    assert forced.replay.endswith(" --in-process")
    assert named.modes == by_string.modes == forced.modes
    with pytest.raises(ValueError, match="cannot be isolated: the worker imports the target by name"):
        difftest(lambda x: x.sum(0), isolate=True)


@pytest.mark.clause("difftest-isolation")
def test_a_function_whose_name_now_means_something_else_runs_in_process() -> None:
    def in_place_ring(x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x)

    in_place_ring.__module__, in_place_ring.__qualname__ = "tests.common.planted_impls", "in_place_ring"
    assert not difftest(in_place_ring, modes=("exact",), examples=1, seed=1).isolated


@pytest.mark.clause("difftest-isolation")
def test_the_answer_is_read_from_raw_bits() -> None:
    head, payload = observe(planted_impls.mutates_input, CASE)
    answer = decode(json.loads(json.dumps(head)), payload)
    assert answer.result is not None and answer.argument is not None
    assert answer.result.values is not None
    assert torch.equal(answer.result.values, ring_all_reduce(CASE.tensor()))
    assert answer.argument.stride == CASE.tensor().stride() != (4, 2, 1)  # the layout arrived exactly
    assert answer.argument.values is not None
    assert not torch.equal(answer.argument.values, CASE.tensor())  # mutates_input changed it


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda h: h.update(type=3), "type is not a string"),
        (lambda h: h["result"].update(shape="(2, 2)"), "result.shape is not a list of integers"),
        (lambda h: h["result"].update(bits=10**9), "result.bits is not a byte count within the payload"),
        (lambda h: h["result"].update(dtype="torch.int8"), "result has bits but is not a CPU tensor"),
        (lambda h: h["result"].update(shape=[3, 2]), "bytes of bits for shape"),
        (lambda h: h["argument"].update(storage=[1]), "argument.storage is not a start and an end"),
        (lambda h: h.pop("argument"), "unexplained payload bytes"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.clause("difftest-isolation")
def test_a_garbled_answer_is_refused(change: Any, words: str) -> None:
    head, payload = observe(ring_all_reduce, CASE)
    change(head)
    with pytest.raises(Garbled, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode(head, payload)


def test_output_log_keeps_the_start_and_the_end() -> None:
    log = OutputLog()
    for k in range(1000):
        log.add(f"line {k}\n")
    assert log.bytes == sum(len(f"line {k}\n") for k in range(1000))
    assert log.text.startswith("line 0\nline 1\n") and log.text.endswith("line 998\nline 999\n")
    assert "characters left out" in log.text and len(log.text) < 2 * OUTPUT_LIMIT + 100
    short = OutputLog()
    short.add("hello\n")
    assert short.text == "hello\n"


@pytest.mark.clause("difftest-report")
def test_report_shows_stack_and_output_of_the_counterexample() -> None:
    finding = Finding(
        ["timed-out"], "no answer within 1 s (--timeout); the worker was killed", stack="S1\nS2\n"
    )
    result = ModeResult("bound", "fail", 1, 0, finding, CASE, output="said hello\n")
    report = Report("t:f", 1, "replay", {"bound": result}, isolated=True, timeout_s=1.0, output_bytes=11)
    text = report.render()
    assert "      S1\n      S2\n" in text and "      said hello" in text
    assert "The target wrote 11 byte(s)" in text
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    cex = doc["modes"]["bound"]["counterexample"]
    assert (cex["stack"], cex["output"]) == ("S1\nS2\n", "said hello\n")


def _in_place(t: torch.Tensor) -> None:
    t.mul_(2)


def _returns_self(t: torch.Tensor) -> torch.Tensor:
    return t.mul_(2)


def _new_but_scribbles(t: torch.Tensor) -> torch.Tensor:
    out = t * 2
    t.zero_()
    return out


@pytest.mark.clause("difftest-ranks")
@pytest.mark.parametrize(
    ("fn", "modified"), [(_in_place, False), (_returns_self, False), (_new_but_scribbles, True)]
)
def test_a_rank_working_in_place_may_change_its_argument(fn: Any, modified: bool) -> None:
    rank_case = Case(2, 2, (2,), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))
    answer = decode(*observe(fn, rank_case, 1))
    assert answer.rank == 1 and answer.argument is not None and answer.result is not None
    assert answer.argument.shape == (2, 2) and answer.argument.stride == (2, 1)
    doubled = 2 * rank_case.rank_tensor(1)
    assert answer.result.values is not None and torch.equal(answer.result.values, doubled)
    problem = input_problem(answer, rank_case)
    assert bool(problem) == modified, problem
    assert not aliases(answer)  # aliasing is a stacked target's bug; a rank may return its argument


# ==========================================================================================================
# The launchers (``InProcess``, ``Isolated``) and the output log, call by call.
#
# :class:`InProcess` calls the target here (an interrupt stops the tester, any
# other exception is an answer); :class:`Isolated` runs it in a worker and
# turns what came back into an :class:`Outcome`: the answer read from raw bits,
# or ``timed-out`` with the target's stack, or ``crashed`` (a dead worker, a
# garbled reply, a worker that cannot be restarted), the call's output trimmed
# and the run's output counted; it restarts the worker for the next call.
# :class:`OutputLog` keeps the start and the end of what the target wrote.
# ==========================================================================================================


CASE_F64 = Case(n=2, m=2, trailing=(), dtype=torch.float64, layout="contiguous", values=(1.0, 2.0, 3.0, 4.0))
HERE = __name__
WAIT_S = 10.0  # a generous deadline for calls that should answer at once


# Targets, loaded by name in the worker.


def adds(x: torch.Tensor) -> torch.Tensor:
    """Correct."""
    return ring_all_reduce(x)


def raises(x: torch.Tensor) -> torch.Tensor:
    """Raises an ordinary exception."""
    raise ValueError("no")


def interrupts(x: torch.Tensor) -> torch.Tensor:
    """Raises ``KeyboardInterrupt``."""
    raise KeyboardInterrupt


def exits_on_n_2(x: torch.Tensor) -> torch.Tensor:
    """Ends its worker (status 4) on N = 2, answers otherwise."""
    if x.shape[0] == 2:
        os._exit(4)
    return ring_all_reduce(x)


def sleeps_on_n_2(x: torch.Tensor) -> torch.Tensor:
    """Hangs on N = 2, answers otherwise."""
    while x.shape[0] == 2:
        time.sleep(60)
    return ring_all_reduce(x)


def segfaults(x: torch.Tensor) -> torch.Tensor:
    """Reads address 0."""
    ctypes.string_at(0)
    return x


def writes_a_lot(x: torch.Tensor) -> torch.Tensor:
    """Writes 5000 characters, then answers."""
    os.write(1, b"a" * 2500 + b"b" * 2500)
    return ring_all_reduce(x)


def _fake(head: dict[str, object]) -> None:
    raw = json.dumps(head).encode()
    frame = len(raw).to_bytes(8, "big") + bytes(8) + raw
    for fd in range(3, 256):
        with contextlib.suppress(OSError):
            os.write(fd, frame)


def fakes_a_ready(x: torch.Tensor) -> torch.Tensor:
    """Writes a well-formed frame that is not an answer over its reply pipe."""
    _fake({"kind": "ready"})
    return ring_all_reduce(x)


def fakes_a_rank_answer(x: torch.Tensor) -> torch.Tensor:
    """Writes an answer of a rank, which a stacked call never gets."""
    _fake(
        {"kind": "answer", "rank": 0, "type": "Tensor", "raised": "", "traceback": "", "returned_none": False}
    )
    return ring_all_reduce(x)


def fakes_a_malformed_answer(x: torch.Tensor) -> torch.Tensor:
    """Writes an answer that :func:`decode` refuses."""
    _fake({"kind": "answer"})
    return ring_all_reduce(x)


# Helpers of the tests.


@contextlib.contextmanager
def isolated(target: str, timeout_s: float = WAIT_S) -> Iterator[Isolated]:
    launcher = Isolated(target if ":" in target else f"{HERE}:{target}", timeout_s)
    try:
        launcher.start()
        yield launcher
    finally:
        launcher.close()


def _case(n: int) -> Case:
    return Case(
        n=n,
        m=2,
        trailing=(),
        dtype=torch.float64,
        layout="contiguous",
        values=tuple(float(v) for v in range(2 * n)),
    )


# The tests.


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_the_output_log_counts_bytes_and_keeps_the_start_and_the_end() -> None:
    log = OutputLog()
    log.add("é\udcff")
    assert log.bytes == 3  # UTF-8 bytes, a lone surrogate as one replacement byte
    exact = OutputLog()
    exact.add("a" * OUTPUT_LIMIT)
    exact.add("b" * OUTPUT_LIMIT)
    assert exact.text == "a" * OUTPUT_LIMIT + "b" * OUTPUT_LIMIT  # nothing left out, no marker
    over = OutputLog()
    over.add("a" * (OUTPUT_LIMIT - 1))
    over.add("bc")  # fills the start across two calls
    over.add("d" * OUTPUT_LIMIT + "e")
    assert over.text == (
        "a" * (OUTPUT_LIMIT - 1)
        + "b"
        + "\n... (2 characters left out) ...\n"
        + "d" * (OUTPUT_LIMIT - 1)
        + "e"
    )
    assert over.bytes == 2 * OUTPUT_LIMIT + 2


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_in_process_calls_here_and_lets_an_interrupt_stop_the_tester() -> None:
    launcher = InProcess(raises)
    assert (launcher.isolated, launcher.kind, launcher.per_rank) == (False, "in-process", False)
    assert (launcher.output.bytes, launcher.output.text) == (0, "")  # its target's output is not captured
    launcher.start()
    outcome = launcher.call(CASE_F64)
    assert outcome.answer is not None and outcome.answer.raised == "ValueError: no"
    right = InProcess(adds).call(CASE_F64).answer
    assert right is not None and right.result is not None and right.result.values is not None
    assert torch.equal(right.result.values, ring_all_reduce(CASE_F64.tensor()))
    with pytest.raises(KeyboardInterrupt):
        InProcess(interrupts).call(CASE_F64)
    launcher.close()


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_isolated_answers_from_raw_bits() -> None:
    with isolated("adds") as launcher:
        assert (launcher.isolated, launcher.kind, launcher.per_rank) == (True, "isolated", False)
        outcome = launcher.call(CASE_F64)
        assert outcome.failure is None and outcome.answer is not None, outcome
        assert outcome.answer.rank is None and outcome.answer.result is not None
        assert outcome.answer.result.values is not None
        assert torch.equal(outcome.answer.result.values, ring_all_reduce(CASE_F64.tensor()))
        assert outcome.case is CASE_F64 and outcome.output == ""
        worker = launcher.worker.pid
    assert not launcher.worker.running and not Path(f"/proc/{worker}").exists()  # close ended it


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_an_isolated_interrupt_is_an_answer() -> None:
    with isolated("interrupts") as launcher:
        outcome = launcher.call(CASE_F64)
        assert outcome.failure is None and outcome.answer is not None
        assert outcome.answer.raised == "KeyboardInterrupt"


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_a_timed_out_call_has_the_stack_and_the_next_call_a_new_worker() -> None:
    with isolated("sleeps_on_n_2", timeout_s=0.3) as launcher:
        first = launcher.worker.pid
        outcome = launcher.call(_case(2))
        assert outcome.failure is not None and outcome.answers == ()
        assert outcome.failure.code == "timed-out"
        assert outcome.failure.text == "no answer within 0.3 s (--timeout); the worker was killed"
        assert "in sleeps_on_n_2" in outcome.failure.stack
        assert outcome.answer is None
        again = launcher.call(_case(1))
        assert again.failure is None and again.answer is not None
        assert launcher.worker.pid != first


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_a_crash_is_reported_and_the_next_call_restarts_the_worker() -> None:
    with isolated("exits_on_n_2") as launcher:
        outcome = launcher.call(_case(2))
        assert outcome.failure is not None
        assert (outcome.failure.code, outcome.failure.text) == (
            "crashed",
            "the worker process exited with status 4",
        )
        again = launcher.call(_case(3))
        assert again.failure is None and again.answer is not None


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_a_crash_has_the_targets_stack() -> None:
    with isolated("segfaults") as launcher:
        outcome = launcher.call(CASE_F64)
        assert outcome.failure is not None and outcome.failure.code == "crashed"
        assert "killed by signal SIGSEGV" in outcome.failure.text
        assert "in segfaults" in outcome.failure.stack


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("fakes_a_ready", "expected an answer, got 'ready'"),
        ("fakes_a_rank_answer", "expected an answer, got 'answer'"),
        ("fakes_a_malformed_answer", "returned_none is not a boolean"),
    ],
)
def test_a_reply_that_is_no_answer_is_a_crash_and_kills_the_worker(target: str, words: str) -> None:
    with isolated(target) as launcher:
        pid = launcher.worker.pid
        outcome = launcher.call(CASE_F64)
        assert outcome.failure is not None and outcome.answers == ()
        assert outcome.failure.code == "crashed"
        assert outcome.failure.text == f"its reply was garbled ({words}); the worker was killed"
        assert not launcher.worker.running and not Path(f"/proc/{pid}/cmdline").exists()


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_the_calls_output_is_trimmed_and_the_runs_counted() -> None:
    with isolated("writes_a_lot") as launcher:
        first = launcher.call(CASE_F64)
        assert first.output.startswith("a" * 1000 + "\n... (3000 characters left out) ...\n")
        assert first.output.endswith("\n" + "b" * 1000) and len(first.output) < 2100
        launcher.call(CASE_F64)
        assert launcher.output.bytes == 10000
        assert launcher.output.text.startswith("a" * 2000) and launcher.output.text.endswith("b" * 2000)


def _write(path: Path, source: str) -> Path:
    path.write_text(source, encoding="utf-8")
    return path


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_what_loading_prints_is_kept_and_a_load_error_raised(tmp_path: Path) -> None:
    loud = _write(tmp_path / "loud.py", "print('loading loud')\ndef f(x):\n    return x\n")
    with isolated(f"{loud}:f") as launcher:
        assert launcher.output.text == "loading loud\n"
    broken = _write(tmp_path / "broken.py", "print('about to fail')\nraise RuntimeError('no')\n")
    launcher = Isolated(f"{broken}:f", WAIT_S)
    with pytest.raises(TargetError, match="RuntimeError: no"):
        launcher.start()
    assert launcher.output.text == "about to fail\n"
    launcher.close()


@pytest.mark.clause("difftest-isolation")
@pytest.mark.timeout(20)
def test_a_worker_that_cannot_be_restarted_is_a_crash(tmp_path: Path) -> None:
    marker = tmp_path / "called"
    source = (
        "import os, pathlib\n"
        f"MARKER = pathlib.Path({str(marker)!r})\n"
        "if MARKER.exists():\n"
        "    raise RuntimeError('loads only once')\n"
        "def f(x):\n"
        "    MARKER.touch()\n"
        "    os._exit(1)\n"
    )
    target = _write(tmp_path / "once.py", source)
    with isolated(f"{target}:f") as launcher:
        crashed = launcher.call(CASE_F64)
        assert crashed.failure is not None and crashed.failure.code == "crashed"
        outcome = launcher.call(CASE_F64)
        assert outcome.failure is not None and outcome.failure.code == "crashed"
        assert outcome.failure.text == (
            f"restarting the worker failed: importing {str(target)!r} failed: RuntimeError: loads only once"
        )
        assert outcome.case is CASE_F64
