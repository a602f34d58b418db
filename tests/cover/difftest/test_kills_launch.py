"""The launchers, where mutation testing found them unchecked.

:class:`InProcess` calls the target here (an interrupt stops the tester, any
other exception is an answer); :class:`Isolated` runs it in a worker and
turns what came back into an :class:`Outcome`: the answer read from raw bits,
or ``timed-out`` with the target's stack, or ``crashed`` (a dead worker, a
garbled reply, a worker that cannot be restarted), the call's output trimmed
and the run's output counted; it restarts the worker for the next call.
:class:`OutputLog` keeps the start and the end of what the target wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import Case, TargetError
from ring_ref.difftest._launch import OUTPUT_LIMIT, InProcess, Isolated, OutputLog

# A per-test limit too: a hang (under mutation testing, say) fails its test instead of stalling the run.
pytestmark = [pytest.mark.clause("difftest-isolation"), pytest.mark.timeout(20)]

CASE = Case(n=2, m=2, trailing=(), dtype=torch.float64, layout="contiguous", values=(1.0, 2.0, 3.0, 4.0))
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


def test_in_process_calls_here_and_lets_an_interrupt_stop_the_tester() -> None:
    launcher = InProcess(raises)
    assert (launcher.isolated, launcher.kind, launcher.per_rank) == (False, "in-process", False)
    assert (launcher.output.bytes, launcher.output.text) == (0, "")  # its target's output is not captured
    launcher.start()
    outcome = launcher.call(CASE)
    assert outcome.answer is not None and outcome.answer.raised == "ValueError: no"
    right = InProcess(adds).call(CASE).answer
    assert right is not None and right.result is not None and right.result.values is not None
    assert torch.equal(right.result.values, ring_all_reduce(CASE.tensor()))
    with pytest.raises(KeyboardInterrupt):
        InProcess(interrupts).call(CASE)
    launcher.close()


def test_isolated_answers_from_raw_bits() -> None:
    with isolated("adds") as launcher:
        assert (launcher.isolated, launcher.kind, launcher.per_rank) == (True, "isolated", False)
        outcome = launcher.call(CASE)
        assert outcome.failure is None and outcome.answer is not None, outcome
        assert outcome.answer.rank is None and outcome.answer.result is not None
        assert outcome.answer.result.values is not None
        assert torch.equal(outcome.answer.result.values, ring_all_reduce(CASE.tensor()))
        assert outcome.case is CASE and outcome.output == ""
        worker = launcher.worker.pid
    assert not launcher.worker.running and not Path(f"/proc/{worker}").exists()  # close ended it


def test_an_isolated_interrupt_is_an_answer() -> None:
    with isolated("interrupts") as launcher:
        outcome = launcher.call(CASE)
        assert outcome.failure is None and outcome.answer is not None
        assert outcome.answer.raised == "KeyboardInterrupt"


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


def test_a_crash_has_the_targets_stack() -> None:
    with isolated("segfaults") as launcher:
        outcome = launcher.call(CASE)
        assert outcome.failure is not None and outcome.failure.code == "crashed"
        assert "killed by signal SIGSEGV" in outcome.failure.text
        assert "in segfaults" in outcome.failure.stack


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
        outcome = launcher.call(CASE)
        assert outcome.failure is not None and outcome.answers == ()
        assert outcome.failure.code == "crashed"
        assert outcome.failure.text == f"its reply was garbled ({words}); the worker was killed"
        assert not launcher.worker.running and not Path(f"/proc/{pid}/cmdline").exists()


def test_the_calls_output_is_trimmed_and_the_runs_counted() -> None:
    with isolated("writes_a_lot") as launcher:
        first = launcher.call(CASE)
        assert first.output.startswith("a" * 1000 + "\n... (3000 characters left out) ...\n")
        assert first.output.endswith("\n" + "b" * 1000) and len(first.output) < 2100
        launcher.call(CASE)
        assert launcher.output.bytes == 10000
        assert launcher.output.text.startswith("a" * 2000) and launcher.output.text.endswith("b" * 2000)


def _write(path: Path, source: str) -> Path:
    path.write_text(source, encoding="utf-8")
    return path


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
        crashed = launcher.call(CASE)
        assert crashed.failure is not None and crashed.failure.code == "crashed"
        outcome = launcher.call(CASE)
        assert outcome.failure is not None and outcome.failure.code == "crashed"
        assert outcome.failure.text == (
            f"restarting the worker failed: importing {str(target)!r} failed: RuntimeError: loads only once"
        )
        assert outcome.case is CASE
