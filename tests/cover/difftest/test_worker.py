"""The isolated worker process (``ring_ref.difftest._worker``).

Each test forks a :class:`Worker` from pytest's own process (milliseconds:
torch is already imported) on a target defined here and loaded by name, and
checks what the guide's *Isolation* section (``docs/guide/difftest.md``) promises: the raw bits come
back and the parent reads them, any ``BaseException`` is an answer, output
is captured at the file-descriptor level and kept off the tester's own
streams, a call past its deadline is ``timed-out`` with the target's stack, a
dead worker is ``crashed`` with how it ended, a garbled reply is refused,
loading errors are the worker's words, and the target's threads, children and
descriptors never outlive the worker or reach into the tester.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._processes._shared import die_with_parent
from ring_ref.difftest import Case, TargetError, _worker
from ring_ref.difftest._call import Garbled, decode
from ring_ref.difftest._worker import (
    MAX_HEADER,
    MAX_PAYLOAD,
    Died,
    Reply,
    Stuck,
    Worker,
    exit_description,
    frame,
    target_frames,
    trim,
    unframe,
)
from tests.common.processes import gone

# A per-test limit too: a hang (under mutation testing, say) fails its test instead of stalling the run.
pytestmark = [pytest.mark.clause("difftest-isolation"), pytest.mark.timeout(20)]

CASE = Case(
    n=2, m=2, trailing=(2,), dtype=torch.float32, layout="strided", values=tuple(float(v) for v in range(8))
)
WAIT_S = 10.0  # a generous deadline for calls that should answer at once
HERE = __name__


# Targets, loaded by name in the worker.


def adds(x: torch.Tensor) -> torch.Tensor:
    """Correct."""
    return ring_all_reduce(x)


def interrupts(x: torch.Tensor) -> torch.Tensor:
    """Raises ``KeyboardInterrupt``: an answer like any other exception."""
    raise KeyboardInterrupt("from the target")


def talks(x: torch.Tensor) -> torch.Tensor:
    """Writes through every layer, none of it flushed or ending a line: fd 1, fd 2, print, C stdio."""
    os.write(1, b"<fd 1>")
    os.write(2, b"<fd 2>")
    print("<print>", end="")
    print("<stderr>", end="", file=sys.stderr)
    ctypes.CDLL(None).printf(b"<printf>")
    os.write(1, b"<\xff>")
    return ring_all_reduce(x)


def interleaves(x: torch.Tensor) -> torch.Tensor:
    """Lines of print and raw writes, alternating, on both descriptors."""
    print("first")
    os.write(1, b"second\n")
    print("third", file=sys.stderr)
    os.write(2, b"fourth\n")
    return ring_all_reduce(x)


def prints_a_lone_surrogate(x: torch.Tensor) -> torch.Tensor:
    """Text that is not valid UTF-8, on both streams."""
    print("out \ud800")
    print("err \udfff", file=sys.stderr)
    return ring_all_reduce(x)


class _Unflushable:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise OSError("cannot flush")


def breaks_stdout(x: torch.Tensor) -> torch.Tensor:
    """Leaves sys.stdout and sys.stderr as objects whose flush raises."""
    sys.stdout = sys.stderr = _Unflushable()
    return ring_all_reduce(x)


def reads_stdin(x: torch.Tensor) -> torch.Tensor:
    """Reads standard input, which must be at its end at once."""
    print(repr(sys.stdin.read()), repr(os.read(0, 16)), end="")
    return ring_all_reduce(x)


def writes_a_lot(x: torch.Tensor) -> torch.Tensor:
    """Writes 1.5 MiB on the first call, one short line on later ones."""
    os.write(1, b"x" * (3 << 19) if not os.environ.get("RING_REF_WROTE") else b"short\n")
    os.environ["RING_REF_WROTE"] = "1"
    return ring_all_reduce(x)


def sleeps(x: torch.Tensor) -> torch.Tensor:
    """Never answers (in a helper, so that its frame shows in the stack), nor does its second thread."""
    threading.Thread(target=_nap_in_a_thread, daemon=True).start()
    _nap_in_the_target()
    return x


def _nap_in_the_target() -> None:
    while True:
        time.sleep(60)


def _nap_in_a_thread() -> None:
    while True:
        time.sleep(60)


def dumps_itself_then_sleeps(x: torch.Tensor) -> torch.Tensor:
    """Has the worker write its stack once (SIGUSR1) before it hangs."""
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.2)
    _nap_in_the_target()
    return x


def reports_threads(x: torch.Tensor) -> torch.Tensor:
    """Prints torch's intra-op thread count."""
    print(torch.get_num_threads(), end="")
    return ring_all_reduce(x)


def patches_the_reply_path(x: torch.Tensor) -> torch.Tensor:
    """Breaks json.dumps and os.write for everyone in its process, then answers."""

    def broken(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError("patched")

    json.dumps = broken
    os.write = broken
    return ring_all_reduce(x)


def writes_an_empty_frame(x: torch.Tensor) -> torch.Tensor:
    """A frame with an empty header (not JSON), and nothing after it."""
    _write_everywhere(bytes(16))
    _nap_in_the_target()
    return x


def writes_two_frames_at_once(x: torch.Tensor) -> torch.Tensor:
    """Two small frames in one write (so the parent reads them together), then answers."""
    _write_everywhere(_frame(b'{"kind": "one"}') + _frame(b'{"kind": "two"}', b"2"))
    return ring_all_reduce(x)


def writes_the_largest_frame(x: torch.Tensor) -> torch.Tensor:
    """A frame exactly as large as the parent accepts (header and payload), then answers."""
    pad = b" " * (_worker.MAX_HEADER - len(b'{"kind": "big"}'))
    _write_everywhere(_frame(b'{"kind": "big"}' + pad, b"\0" * _worker.MAX_PAYLOAD))
    return ring_all_reduce(x)


def segfaults_beside_a_thread(x: torch.Tensor) -> torch.Tensor:
    """Reads address 0 while a second thread naps: a fatal signal's stack shows both threads."""
    threading.Thread(target=_nap_in_a_thread, daemon=True).start()
    time.sleep(0.05)
    ctypes.string_at(0)
    return x


def printf_fully_buffered(x: torch.Tensor) -> torch.Tensor:
    """Writes through a C stdio stream of its own on descriptor 1 (fully buffered: a file), unflushed."""
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    stream = libc.fdopen(os.dup(1), b"w")
    libc.fputs(b"<buffered printf>", ctypes.c_void_p(stream))
    return ring_all_reduce(x)


def closes_its_streams(x: torch.Tensor) -> torch.Tensor:
    """Closes sys.stdout and sys.stderr, then writes to descriptors 1 and 2 (still open: not its to close)."""
    sys.stdout.close()
    sys.stderr.close()
    os.write(1, b"<fd 1 after close>")
    os.write(2, b"<fd 2 after close>")
    return ring_all_reduce(x)


def writes_to_stderr(x: torch.Tensor) -> torch.Tensor:
    """Writes through sys.stderr's own write method."""
    sys.stderr.write("<stderr.write>")
    return ring_all_reduce(x)


def lists_its_descriptors(x: torch.Tensor) -> torch.Tensor:
    """Writes what each of its open descriptors points at, one per line."""
    for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            os.write(1, f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}\n".encode())
    return ring_all_reduce(x)


def exits_5(x: torch.Tensor) -> torch.Tensor:
    """Ends the worker with status 5."""
    os._exit(5)


def segfaults_here(x: torch.Tensor) -> torch.Tensor:
    """Reads address 0."""
    ctypes.string_at(0)
    return x


def kills_itself(x: torch.Tensor) -> torch.Tensor:
    """SIGKILL to its own process."""
    os.kill(os.getpid(), signal.SIGKILL)
    return x


def _write_everywhere(data: bytes) -> None:
    for fd in range(3, 256):
        with contextlib.suppress(OSError):
            os.write(fd, data)


def _frame(head: bytes, payload: bytes = b"") -> bytes:
    return len(head).to_bytes(8, "big") + len(payload).to_bytes(8, "big") + head + payload


def writes_a_huge_length(x: torch.Tensor) -> torch.Tensor:
    """A frame header claiming more than any reply can be."""
    _write_everywhere(b"\xff" * 16)
    return x


def writes_a_huge_header_length(x: torch.Tensor) -> torch.Tensor:
    """A frame header claiming a header of 1 TiB and no payload."""
    _write_everywhere((1 << 40).to_bytes(8, "big") + bytes(8))
    return x


def writes_a_huge_payload_length(x: torch.Tensor) -> torch.Tensor:
    """A frame header claiming an empty header and a payload of 1 TiB."""
    _write_everywhere(bytes(8) + (1 << 40).to_bytes(8, "big"))
    return x


def writes_a_non_json_header(x: torch.Tensor) -> torch.Tensor:
    """A frame whose header is not JSON."""
    _write_everywhere(_frame(b"{ not json"))
    return x


def writes_a_json_list(x: torch.Tensor) -> torch.Tensor:
    """A frame whose header is JSON but not an object."""
    _write_everywhere(_frame(b"[1, 2]"))
    return x


def garbles_once_then_talks(x: torch.Tensor) -> torch.Tensor:
    """Writes half a frame over its reply pipe, unless RING_REF_TEST_QUIET is set; then just talks."""
    if os.environ.get("RING_REF_TEST_QUIET"):
        os.write(1, b"<talking>")
        return ring_all_reduce(x)
    os.write(1, b"<garbling>")
    _write_everywhere(b"\xff" * 16)
    return x


def scribbles_on_its_files_and_exits(x: torch.Tensor) -> torch.Tensor:
    """Writes bytes that are not UTF-8 into every open file above descriptor 2 (not its pipes), then ends."""
    for fd in range(3, 256):
        with contextlib.suppress(OSError):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                os.write(fd, b"\xff\xfe")
    os._exit(3)


def truncates_its_output(x: torch.Tensor) -> torch.Tensor:
    """Writes on its first call; empties its own output file on later ones."""
    if os.environ.get("RING_REF_WROTE"):
        os.ftruncate(1, 0)
    else:
        os.write(1, b"abc")
        os.environ["RING_REF_WROTE"] = "1"
    return ring_all_reduce(x)


def exits_soon_after(x: torch.Tensor) -> torch.Tensor:
    """Answers, but leaves a thread that ends the worker (status 9) a moment later."""
    threading.Timer(0.05, os._exit, (9,)).start()
    return ring_all_reduce(x)


def exits_leaving_a_child_on_the_pipe(x: torch.Tensor) -> torch.Tensor:
    """Forks a child that keeps every descriptor open (the reply pipe too), then ends with status 6."""
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
    os._exit(6)


def closes_the_reply_pipe(x: torch.Tensor) -> torch.Tensor:
    """Closes every descriptor above 2, then keeps the worker alive."""
    os.closerange(3, 256)
    time.sleep(300)
    return x


def leaves_a_child(x: torch.Tensor) -> torch.Tensor:
    """Starts a child process and a non-daemon thread that never end; prints the child's pid."""
    threading.Thread(target=time.sleep, args=(300,), daemon=False).start()
    print(subprocess.Popen(["sleep", "300"]).pid, end="")
    return ring_all_reduce(x)


def starts_multiprocessing_helpers(x: torch.Tensor) -> torch.Tensor:
    """Starts a forkserver (and with it a resource tracker) of its own, as a process-group target does."""
    multiprocessing.set_forkserver_preload([])
    multiprocessing.forkserver.ensure_running()
    return ring_all_reduce(x)


# Helpers of the tests.


@contextlib.contextmanager
def started(
    target: str, *, rank: int | None = None, setup: Callable[[], None] | None = None
) -> Iterator[Worker]:
    worker = Worker(target if ":" in target else f"{HERE}:{target}", rank=rank, setup=setup)
    try:
        worker.start(WAIT_S)
        yield worker
    finally:
        worker.close()


def call(worker: Worker, timeout_s: float = WAIT_S) -> Reply | Died | Stuck:
    assert worker.send(CASE)
    return worker.receive(time.monotonic() + timeout_s)


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)
    gone(pid, within_s=10.0)


# The tests.


def test_the_answer_is_the_targets_raw_bits_and_the_worker_serves_again() -> None:
    expected = ring_all_reduce(CASE.tensor())
    with started("ring_ref:ring_all_reduce") as worker:
        pid = worker.pid
        assert worker.running and pid != os.getpid()
        for _ in range(2):
            got = call(worker)
            assert isinstance(got, Reply) and got.head["kind"] == "answer", got
            answer = decode(got.head, got.payload)
            assert answer.result is not None and answer.result.values is not None
            assert torch.equal(answer.result.values, expected)
            assert answer.argument is not None and answer.argument.stride == CASE.tensor().stride()
        assert worker.pid == pid  # one worker for every call
    assert not worker.running and not Path(f"/proc/{pid}").exists()


def test_any_base_exception_is_an_answer_and_the_worker_lives_on() -> None:
    with started("interrupts") as worker:
        for _ in range(2):
            got = call(worker)
            assert isinstance(got, Reply), got
            assert decode(got.head, got.payload).raised == "KeyboardInterrupt: from the target"
        assert worker.running


def test_output_is_captured_at_the_descriptor_level_and_kept_off_the_testers(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with started("talks") as worker:
        assert worker.read_output() == ""
        assert isinstance(call(worker), Reply)
        first = worker.read_output()
        for piece in ("<fd 1>", "<fd 2>", "<print>", "<stderr>", "<printf>", "<\ufffd>"):
            assert first.count(piece) == 1, first
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == first  # the second call's output, and only that
        assert worker.read_output() == ""
        assert worker.output_bytes == 2 * len(first.encode()) - 4  # the byte 0xff read as U+FFFD, 3 bytes
    assert capfd.readouterr() == ("", "")  # nothing reached the tester's own descriptors 1 and 2
    assert worker.read_output() == ""  # closed: no output left to read


@pytest.mark.parametrize(
    ("target", "output"),
    [
        ("interleaves", "first\nsecond\nthird\nfourth\n"),  # in the order it was written
        ("prints_a_lone_surrogate", "out \\ud800\nerr \\udfff\n"),  # not UTF-8: escaped, not raised
        ("printf_fully_buffered", "<buffered printf>"),  # C stdio flushed before each reply
        ("closes_its_streams", "<fd 1 after close><fd 2 after close>"),  # fds 1 and 2 outlive sys.stdout/err
        ("writes_to_stderr", "<stderr.write>"),  # sys.stderr is a stream of the capture file
    ],
)
def test_a_targets_output_is_captured_whole(target: str, output: str) -> None:
    with started(target) as worker:
        got = call(worker)
        assert isinstance(got, Reply) and decode(got.head, got.payload).raised == "", got
        assert worker.read_output() == output


def test_a_target_that_breaks_its_streams_still_answers() -> None:
    with started("breaks_stdout") as worker:
        for _ in range(2):
            got = call(worker)
            assert isinstance(got, Reply) and decode(got.head, got.payload).raised == "", got


def test_standard_input_is_at_its_end() -> None:
    """Not the tester's standard input, which here holds data."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"the tester's input")
    os.close(write_end)
    saved = os.dup(0)
    try:
        os.dup2(read_end, 0)
        with started("reads_stdin") as worker:
            os.dup2(saved, 0)
            assert isinstance(call(worker, timeout_s=10.0), Reply)
            assert worker.read_output() == "'' b''"
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)


def test_a_chatty_target_does_not_fill_the_disk() -> None:
    with started("writes_a_lot") as worker:
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == "x" * (3 << 19)  # all of it, once
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == "short\n"
        assert os.stat(f"/proc/{worker.pid}/fd/1").st_size < 1 << 20  # the capture file was emptied
        assert worker.output_bytes == (3 << 19) + len("short\n")


def test_a_call_past_its_deadline_is_stuck_with_the_targets_stack() -> None:
    with started("sleeps") as worker:
        pid = worker.pid
        started_at = time.monotonic()
        got = call(worker, timeout_s=0.3)
        assert time.monotonic() - started_at >= 0.3
        assert isinstance(got, Stuck), got
        assert got.stack.startswith(("Current thread 0x", "Thread 0x")), got.stack
        assert "in _nap_in_the_target" in got.stack and "in sleeps" in got.stack, got.stack
        assert "in _nap_in_a_thread" in got.stack  # every thread
        assert __file__ in got.stack
        assert f"ring_ref{os.sep}difftest{os.sep}" not in got.stack  # the tester's own frames are cut
        assert not worker.running
        assert gone(pid)  # killed and reaped before the answer


@pytest.mark.parametrize(
    ("target", "words", "frame"),
    [
        ("exits_5", "the worker process exited with status 5", ""),
        (
            "segfaults_here",
            "the worker process was killed by signal SIGSEGV (Segmentation fault)",
            "in segfaults_here",
        ),
        ("kills_itself", "the worker process was killed by signal SIGKILL (Killed)", ""),
    ],
)
def test_a_dead_worker_says_how_it_ended(target: str, words: str, frame: str) -> None:
    with started(target) as worker:
        got = call(worker)
        assert isinstance(got, Died), got
        assert got.text == words
        assert frame in got.stack
        assert not worker.running


def test_the_stack_is_the_one_at_the_deadline() -> None:
    with started("dumps_itself_then_sleeps") as worker:
        got = call(worker, timeout_s=0.6)
        assert isinstance(got, Stuck), got
        assert got.stack.count("Current thread 0x") == 1 and "in _nap_in_the_target" in got.stack, got.stack


def test_torch_runs_on_one_thread_in_the_worker() -> None:
    with started("reports_threads") as worker:
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == "1"


def test_a_target_that_patches_the_reply_path_still_answers() -> None:
    with started("patches_the_reply_path") as worker:
        got = call(worker)
        assert isinstance(got, Reply), got
        answer = decode(got.head, got.payload)
        assert answer.result is not None and answer.result.values is not None
        assert torch.equal(answer.result.values, ring_all_reduce(CASE.tensor()))


def test_the_largest_frame_is_accepted_and_the_next_one_read_after_it() -> None:
    with started("writes_the_largest_frame") as worker:
        got = call(worker)
        assert isinstance(got, Reply) and got.head["kind"] == "big", got
        assert len(got.payload) == _worker.MAX_PAYLOAD
        answer = worker.receive(time.monotonic() + WAIT_S)
        assert isinstance(answer, Reply) and answer.head["kind"] == "answer", answer


def test_frames_read_together_are_taken_one_by_one() -> None:
    with started("writes_two_frames_at_once") as worker:
        first = call(worker)
        assert isinstance(first, Reply) and first.head == {"kind": "one"} and first.payload == b"", first
        second = worker.receive(time.monotonic() + WAIT_S)
        assert isinstance(second, Reply) and second.head == {"kind": "two"} and second.payload == b"2", second
        third = worker.receive(time.monotonic() + WAIT_S)
        assert isinstance(third, Reply) and third.head["kind"] == "answer", third


def test_trim_keeps_what_fits_and_halves_the_rest() -> None:
    assert trim("abcd", 4) == "abcd"
    assert trim("abcde", 4) == "ab\n... (1 characters left out) ...\nde"
    assert trim("abcdef", 5) == "ab\n... (2 characters left out) ...\nef"
    assert trim("x" * 2000) == "x" * 2000 and "(1 characters left out)" in trim("x" * 2001)


def test_target_frames_cuts_each_threads_tester_frames_only() -> None:
    tester = f"{_worker._TESTER_DIR}{os.sep}"
    dump = [
        "Thread 0x2 (most recent call first):",
        '  File "/u/a.py", line 1 in g',
        f'  File "{tester}_call.py", line 5 in observe',
        '  File "/u/after.py", line 9 in main',
        "",
        "Current thread 0x1 (most recent call first):",
        f'  File "{_worker._TESTER_DIR}_elsewhere{os.sep}t.py", line 3 in f',
        f'  File "{tester}_worker.py", line 7 in _child',
    ]
    assert target_frames("\n".join(dump)) == "\n".join([*dump[:2], *dump[4:7]]) + "\n"
    assert target_frames("") == ""


def test_exit_description_names_unknown_signals_by_number() -> None:
    assert exit_description(0) == "exited with status 0"
    assert exit_description(signal.SIGTERM) == "was killed by signal SIGTERM (Terminated)"
    realtime = signal.SIGRTMIN + 2
    assert exit_description(realtime) == f"was killed by signal {realtime} ({signal.strsignal(realtime)})"


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("writes_a_huge_length", f"a frame of {2**64 - 1} + {2**64 - 1} bytes"),
        ("writes_a_huge_header_length", f"a frame of {1 << 40} + 0 bytes"),
        ("writes_a_huge_payload_length", f"a frame of 0 + {1 << 40} bytes"),
        ("writes_a_non_json_header", "the header is not JSON"),
        ("writes_an_empty_frame", "the header is not JSON"),
        ("writes_a_json_list", "the header is not a JSON object"),
    ],
)
def test_a_garbled_reply_kills_the_worker(target: str, words: str) -> None:
    with started(target) as worker:
        pid = worker.pid
        got = call(worker)
        assert isinstance(got, Died), got
        assert got.text.startswith(f"its reply was garbled ({words}") and got.text.endswith(
            "the worker was killed"
        )
        assert not worker.running and gone(pid)


def test_a_restarted_worker_starts_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = Worker(f"{HERE}:garbles_once_then_talks")
    try:
        worker.start(WAIT_S)
        first = worker.pid
        got = call(worker)
        assert isinstance(got, Died) and "garbled" in got.text, got  # leaves bytes unread
        assert worker.read_output() == "<garbling>"
        monkeypatch.setenv("RING_REF_TEST_QUIET", "1")  # the next worker inherits it
        worker.start(WAIT_S)
        again = call(worker)
        assert isinstance(again, Reply), again
        assert worker.read_output() == "<talking>"  # the new worker's output, from its start
        second = worker.pid
        worker.start(WAIT_S)  # starting again replaces the running worker
        assert gone(first) and gone(second)
        assert isinstance(call(worker), Reply)
    finally:
        worker.close()


def test_a_closed_worker_leaves_no_descriptor_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = sorted(os.listdir("/proc/self/fd"))
    for target in ("adds", "exits_5"):
        with started(target) as worker:
            call(worker)
            assert not os.listdir(tmp_path)  # its files have no names
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_debugger_in_the_tester_does_not_follow_into_the_worker() -> None:
    tester = os.getpid()

    def tracer(frame: FrameType, event: str, arg: object) -> None:
        if os.getpid() != tester and frame.f_code.co_name == "adds":
            os.write(1, b"<traced>")

    with started("adds") as worker:
        pass
    sys.settrace(tracer)
    sys.setprofile(tracer)
    try:
        worker.start(WAIT_S)
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    try:
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == ""
    finally:
        worker.close()


def test_a_dead_workers_stack_file_is_read_even_if_it_is_not_text() -> None:
    with started("scribbles_on_its_files_and_exits") as worker:
        got = call(worker)
        assert isinstance(got, Died) and got.text == "the worker process exited with status 3", got
        assert "\ufffd" in got.stack


def test_a_target_that_empties_its_own_output_file_leaves_reading_working() -> None:
    with started("truncates_its_output") as worker:
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == "abc"
        assert isinstance(call(worker), Reply)
        assert worker.read_output() == ""


def test_a_tester_whose_streams_cannot_flush_still_starts_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _Unflushable())
    monkeypatch.setattr(sys, "stderr", _Unflushable())
    with started("adds") as worker:
        assert isinstance(call(worker), Reply)


def test_a_worker_that_died_between_calls_refuses_the_next_one() -> None:
    with started("exits_soon_after") as worker:
        assert isinstance(call(worker), Reply)
        assert _wait_until(lambda: _is_a_zombie_with_no_threads(worker.pid))
        assert not worker.send(CASE)  # nobody reads the request pipe
        got = worker.receive(time.monotonic() + WAIT_S)
        assert isinstance(got, Died) and got.text == "the worker process exited with status 9", got


def _is_a_zombie_with_no_threads(pid: int) -> bool:
    """The process has exited and every thread has let go of its descriptors.

    Its main thread turns into a zombie as soon as it exits, while the thread
    that called ``os._exit`` may still hold the shared descriptor table; a
    thread leaves ``/proc/PID/task`` only after dropping it.
    """
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    return state == "Z" and os.listdir(f"/proc/{pid}/task") == [str(pid)]


def _wait_until(condition: Callable[[], bool], within_s: float = 10.0) -> bool:
    give_up = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "polling"])
def test_a_dead_worker_is_noticed_while_its_child_holds_the_pipe(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not pidfd:  # a kernel without pidfd_open: the parent polls
        monkeypatch.delattr(os, "pidfd_open")
    with started("exits_leaving_a_child_on_the_pipe") as worker:
        started_at = time.monotonic()
        got = call(worker)
        assert isinstance(got, Died) and got.text == "the worker process exited with status 6", got
        assert time.monotonic() - started_at < WAIT_S / 2  # not at the deadline


def test_a_worker_reaped_by_someone_else_is_reported_ended() -> None:
    with started("exits_5") as worker:
        assert worker.send(CASE)
        os.waitpid(worker.pid, 0)  # as a SIGCHLD handler of the tester's might
        got = worker.receive(time.monotonic() + WAIT_S)
        assert isinstance(got, Died) and got.text == "the worker process ended", got
        assert not worker.running


@pytest.mark.parametrize("target", ["adds", "exits_5", "sleeps"])
def test_without_pidfd_answers_deaths_and_deadlines_are_seen(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel without ``pidfd_open`` the parent polls instead."""
    monkeypatch.delattr(os, "pidfd_open")
    with started(target) as worker:
        started_at = time.monotonic()
        got = call(worker, timeout_s=0.3 if target == "sleeps" else WAIT_S)
        assert isinstance(got, {"adds": Reply, "exits_5": Died, "sleeps": Stuck}[target]), got
        assert time.monotonic() - started_at < WAIT_S / 2


def test_a_target_that_closes_the_reply_pipe_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker, "EXIT_WAIT_S", 0.2)  # how long the parent waits for it to end, here
    with started("closes_the_reply_pipe") as worker:
        pid = worker.pid
        got = call(worker)
        assert isinstance(got, Died), got
        assert (
            got.text == "the worker closed its reply pipe (the target closed a descriptor it does not own?)"
        )
        assert not worker.running and gone(pid)


def test_the_targets_children_end_with_the_worker() -> None:
    with started("leaves_a_child") as worker:
        assert os.getpgid(worker.pid) == worker.pid != os.getpgid(0)  # a process group of its own
        assert isinstance(call(worker), Reply)
        child = int(worker.read_output())
        try:
            assert Path(f"/proc/{child}").exists()
            worker.kill()
            assert gone(child, within_s=10.0)
        finally:
            _kill_group(child)


def test_the_worker_holds_no_descriptor_of_the_tester() -> None:
    read_end, write_end = os.pipe()
    try:
        with started("adds") as worker:
            os.close(write_end)
            write_end = -1
            # Nobody else holds the write end, so the read end is at its end at once.
            assert select.select([read_end], [], [], 10.0)[0] == [read_end]
            assert os.read(read_end, 1) == b""
            assert isinstance(call(worker), Reply)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_the_worker_dies_with_the_tester() -> None:
    """A worker busy in the target when the tester dies is killed by the kernel (it has no reader left)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - the tester that dies
        status = 1
        try:
            os.close(read_end)
            worker = Worker(f"{HERE}:sleeps")
            worker.start(WAIT_S)
            worker.send(CASE)
            os.write(write_end, str(worker.pid).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    pid = int(os.read(read_end, 64) or b"0")
    os.close(read_end)
    try:
        assert os.waitpid(middle, 0)[1] == 0
        assert pid and gone(pid, within_s=10.0)
    finally:
        _kill_group(pid)


def _forget_inherited_helpers() -> None:
    """Forget a forkserver and resource tracker inherited through fork, so that new ones start."""
    server = multiprocessing.forkserver._forkserver
    for name in ("_forkserver_pid", "_forkserver_address", "_forkserver_alive_fd"):
        setattr(server, name, None)
    tracker = multiprocessing.resource_tracker._resource_tracker
    for name in ("_pid", "_fd"):
        setattr(tracker, name, None)


def test_a_target_can_start_multiprocessing_helpers_of_its_own() -> None:
    """Even when the tester has a forkserver and a resource tracker, whose descriptors the worker lacks."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - a tester with helpers of its own
        status = 1
        try:
            os.close(read_end)
            # Helpers the test session started earlier are the session's, not this tester's children.
            _forget_inherited_helpers()
            multiprocessing.set_forkserver_preload([])
            multiprocessing.forkserver.ensure_running()
            with started("starts_multiprocessing_helpers") as worker:
                got = call(worker)
                raised = decode(got.head, got.payload).raised if isinstance(got, Reply) else repr(got)
            helpers = [
                multiprocessing.forkserver._forkserver._forkserver_pid,  # type: ignore[attr-defined]
                multiprocessing.resource_tracker._resource_tracker._pid,  # type: ignore[attr-defined]
            ]
            os.write(write_end, json.dumps({"raised": raised, "helpers": helpers}).encode())
            status = 0
        except BaseException:
            os.write(write_end, json.dumps({"error": traceback.format_exc()}).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        report = json.loads(f.read() or b"{}")
    assert os.waitpid(middle, 0)[1] == 0, report.get("error")
    for helper in report.get("helpers", []):
        assert gone(helper, within_s=10.0)  # they end with the tester that started them
    assert report["raised"] == ""


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("raise RuntimeError('boom')\n", "importing '{target}' failed: RuntimeError: boom"),
        ("raise KeyboardInterrupt\n", "importing '{target}:f' failed: KeyboardInterrupt: "),
        (
            "import os\nos._exit(3)\n",
            "loading '{target}:f' ended the worker process: the worker process exited with status 3",
        ),
    ],
    ids=["raises", "interrupts", "exits"],
)
def test_a_target_that_cannot_be_loaded_says_why(source: str, words: str, tmp_path: Path) -> None:
    target = tmp_path / "bad_target.py"
    target.write_text(source, encoding="utf-8")
    worker = Worker(f"{target}:f")
    with pytest.raises(TargetError) as caught:
        worker.start(WAIT_S)
    assert str(caught.value) == words.format(target=target)
    assert not worker.running
    worker.close()


def test_a_target_that_is_not_there_says_so_in_load_targets_words() -> None:
    worker = Worker(f"{HERE}:no_such_function")
    with pytest.raises(TargetError) as caught:
        worker.start(WAIT_S)
    assert str(caught.value) == f"{HERE!r} has no attribute 'no_such_function'"
    worker.close()


def test_a_target_that_loads_too_slowly_is_stopped_with_its_stack(tmp_path: Path) -> None:
    target = tmp_path / "slow_target.py"
    target.write_text(
        "import time\n\ndef f(x):\n    return x\n\nwhile True:\n    time.sleep(60)\n", encoding="utf-8"
    )
    worker = Worker(f"{target}:f")
    with pytest.raises(TargetError) as caught:
        worker.start(1.0)  # long enough for a busy machine to reach the loop before the deadline
    message = str(caught.value)
    assert message.startswith(
        f"loading '{target}:f' did not finish in time (--timeout); it was stopped in:\n"
    )
    assert f'File "{target}", line 7 in <module>' in message
    assert not worker.running
    worker.close()


def test_a_false_ready_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "false_ready.py"
    head = json.dumps({"kind": "hello"}).encode()
    target.write_text(
        "import contextlib, os\n"
        "for fd in range(3, 256):\n"
        "    with contextlib.suppress(OSError):\n"
        f"        os.write(fd, {_frame(head)!r})\n"
        "def f(x):\n    return x\n",
        encoding="utf-8",
    )
    worker = Worker(f"{target}:f")
    with pytest.raises(TargetError) as caught:
        worker.start(WAIT_S)
    assert (
        str(caught.value)
        == f"loading '{target}:f' ended the worker process: the worker replied {{'kind': 'hello'}}"
    )
    worker.close()


def test_setup_runs_before_the_target_is_loaded(tmp_path: Path) -> None:
    flag = tmp_path / "set-up"
    target = tmp_path / "needs_setup.py"
    target.write_text(
        f"import pathlib\nassert pathlib.Path({str(flag)!r}).exists()\ndef f(x):\n    return x\n"
    )
    with started(f"{target}:f", setup=flag.touch, rank=1) as worker:
        assert worker.rank == 1
        got = call(worker)
        assert isinstance(got, Reply) and got.head["rank"] == 1


def test_a_setup_that_fails_is_the_testers_error() -> None:
    def fails() -> None:
        raise OSError("no group")

    worker = Worker(f"{HERE}:adds", setup=fails)
    with pytest.raises(RuntimeError) as caught:
        worker.start(WAIT_S)
    text = str(caught.value)
    assert text.startswith("a worker could not be set up:\nTraceback") and "OSError: no group" in text
    assert not worker.running
    worker.close()


def test_a_fatal_signal_dumps_every_threads_stack() -> None:
    with started("segfaults_beside_a_thread") as worker:
        got = call(worker)
        assert isinstance(got, Died) and "SIGSEGV" in got.text, got
        assert "in segfaults_beside_a_thread" in got.stack and "in _nap_in_a_thread" in got.stack, got.stack


def test_the_worker_holds_no_descriptor_of_the_testers_at_three() -> None:
    """Descriptor 3, the lowest a tester's own file can have, is closed in the worker too.

    The tester is a child forked here, whose descriptor 3 is a file of its own:
    pytest's descriptor 3 stays as it is (under pytest-xdist it may be the
    channel to the controller).
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the tester
        status = 1
        try:
            os.close(read)
            with tempfile.NamedTemporaryFile(prefix="ring-ref-testers-own-") as own:
                os.dup2(own.fileno(), 3)
                with started("lists_its_descriptors") as worker:
                    if isinstance(call(worker), Reply):
                        os.write(write, worker.read_output().encode())
                        status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        listing = pipe.read().decode().splitlines()
    assert os.waitpid(pid, 0)[1] == 0
    assert listing[:1] == ["0 /dev/null"], listing  # the listing is there
    assert not [line for line in listing if "ring-ref-testers-own-" in line], listing


def test_pidfd_open_failing_leaves_the_worker_watched_by_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3

    monkeypatch.setattr(os, "pidfd_open", refuse)
    with started("exits_5") as worker:
        got = call(worker)
        assert isinstance(got, Died) and got.text == "the worker process exited with status 5", got


def test_a_worker_whose_parent_is_already_gone_leaves_at_once_with_status_0() -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the worker-to-be
        try:
            die_with_parent(signal.SIGKILL, os.getppid() + 1_000_000)  # not its parent: "the parent has died"
        finally:
            os._exit(7)  # reached only if it did not leave
    assert os.waitpid(pid, 0)[1] == 0


def _lengths(head: int, payload: int) -> bytes:
    return head.to_bytes(8, "big") + payload.to_bytes(8, "big")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "a frame of 0 bytes"),
        (b"\0" * 15, "a frame of 15 bytes"),
        (frame({"kind": "ready"}, b"xy") + b"!", "a frame of 36 bytes announcing 17 + 2"),  # one byte more
        (frame({"kind": "ready"}, b"xy")[:-1], "a frame of 34 bytes announcing 17 + 2"),  # one byte less
        # a payload length whose top byte is set: over the limit, whatever the bytes after it say
        (_lengths(2, 1 << 56) + b"{}", f"a frame of 18 bytes announcing 2 + {1 << 56}"),
    ],
)
def test_a_garbled_frame_is_named_by_its_length_and_what_it_announced(data: bytes, words: str) -> None:
    with pytest.raises(Garbled) as raised:
        unframe(data)
    assert str(raised.value) == words


def test_a_frame_of_lengths_alone_is_read_as_an_empty_header() -> None:
    with pytest.raises(Garbled, match=r"^the header is not JSON"):  # 16 bytes: a frame, its header empty
        unframe(_lengths(0, 0))


def test_a_frame_may_announce_exactly_the_largest_header_and_payload() -> None:
    head = b"{}" + b" " * (MAX_HEADER - 2)  # JSON with trailing blanks: exactly MAX_HEADER bytes
    assert unframe(_lengths(MAX_HEADER, 0) + head) == Reply({}, b"")
    assert unframe(_lengths(2, MAX_PAYLOAD) + b"{}" + bytes(MAX_PAYLOAD)).payload == bytes(MAX_PAYLOAD)
    with pytest.raises(Garbled) as raised:  # one byte over the header's limit, the length right
        unframe(_lengths(MAX_HEADER + 1, 0) + head + b" ")
    assert str(raised.value) == f"a frame of {MAX_HEADER + 17} bytes announcing {MAX_HEADER + 1} + 0"
