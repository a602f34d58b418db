"""``difftest --ranks mpi``: per-rank ``mpi4py`` targets checked on every rank of real OpenMPI jobs.

To keep ``make verify`` short, the fast tests share two jobs (``N = 1`` and
``N = 2``, each started once: every rank imports torch) through
``MpiRanks(rings=...)``; the deadlock test and the raising rank's run last, as
they kill the ``N = 2`` job.  Every process the jobs started must be gone when the module ends.
Requires OpenMPI and mpi4py (``make test`` installs them); without them these
tests fail, they are not skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pytest
import torch

from ring_ref._cli import main
from ring_ref._processes import _launchers as launchers
from ring_ref._processes._mpi_job import MpiJob, RankFailed, RanksStopped, RanksTimedOut, mpirun_path
from ring_ref.difftest import Mode, _mpi, difftest
from ring_ref.difftest._call import Answer, Garbled, TensorView
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._loading import TargetError
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks, _strides, _view, decode_rank, observe_rank
from ring_ref.difftest._report import ModeResult
from ring_ref.difftest._search import run_mode
from ring_ref.difftest._vocabulary import MODES, Op
from ring_ref.mpi import openmpi_allreduce_mca
from tests.common import planted_hints, planted_mpi
from tests.common.paths import ROOT
from tests.common.processes import Jobs, environ_of

pytestmark = pytest.mark.clause("difftest-ranks")

_DTYPES = MPI_DTYPES


def run(
    jobs: Jobs,
    target: str,
    mode: Mode,
    *,
    examples: int,
    seed: int,
    timeout_s: float = 60.0,
    op: Op | None = None,
    dtypes: tuple[torch.dtype, ...] = _DTYPES,
) -> ModeResult:
    """One mode of the tester on ``target`` over the module's jobs (``N`` up to 2; the jobs stay open)."""
    launcher = MpiRanks(target, timeout_s, rings={ring.world_size: ring for ring in jobs.rings})
    try:
        return run_mode(launcher, mode, examples=examples, seed=seed, max_workers=2, dtypes=dtypes, op=op)
    finally:
        jobs.note()


@pytest.fixture(scope="module")
def jobs() -> Iterator[Jobs]:
    pool = Jobs()
    for n in (1, 2):
        pool.ring(n)
    yield pool
    pool.close()


@pytest.mark.clause("difftest-oracles", "fold-order")
def test_ring_all_reduce_underscore_passes_every_mode(jobs: Jobs) -> None:
    for mode in MODES:
        result = run(jobs, "ring_ref.mpi:ring_all_reduce_", mode, examples=4, seed=3)
        assert result.verdict == "pass", (mode, result.finding)
        assert result.examples >= 4


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "mode"),
    [("gather_adds", "order-free"), ("chunk_off_by_one", "bound"), ("gather_drops_last_chunk", "exact")],
)
def test_planted_mpi_bug_gets_its_code(jobs: Jobs, bug: str, mode: Mode) -> None:
    result = run(jobs, f"tests.common.planted_mpi:{bug}", mode, examples=10, seed=1)
    finding, cex = result.finding, result.counterexample
    assert result.verdict == "fail" and finding is not None and cex is not None
    assert finding.codes == [planted_mpi.EXPECTED[bug]], finding.explanation
    assert cex.n == 2 and finding.ranks, finding.explanation
    if bug == "gather_adds":
        assert "counted more than once" in finding.explanation
    if bug == "gather_drops_last_chunk":  # the stacked twin's code and counts
        assert "Contributions missing: with only worker j holding ones" in finding.explanation
        assert re.search(r"is worker 0: \d, worker 1: \d, so worker\(s\) \[\d\] lost", finding.explanation)


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", ["prod", "max", "min"])
def test_mpi_allreduce_passes_order_free_and_bound_per_op(jobs: Jobs, op: Op) -> None:
    # MPI has no float16 type: MPI_Allreduce refuses it, so float32 and float64 only.
    for mode in ("order-free", "bound"):
        result = run(
            jobs, "ring_ref.targets:mpi_allreduce", mode, examples=6, seed=2, op=op, dtypes=_DTYPES[1:]
        )
        assert result.verdict == "pass", (op, mode, result.finding)


@pytest.mark.clause("difftest-ops")
def test_mpi_has_no_average_and_says_so(jobs: Jobs) -> None:
    result = run(
        jobs, "ring_ref.targets:mpi_allreduce", "bound", examples=1, seed=0, op="avg", dtypes=_DTYPES[1:]
    )
    assert result.finding is not None and result.finding.codes == ["raised"], result.finding
    assert "MPI (MPI_Op) has no op 'avg'" in result.finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_send_send_deadlock_is_timed_out_with_every_ranks_stack(jobs: Jobs) -> None:
    result = run(
        jobs, "tests.common.planted_mpi:send_send_deadlock", "order-free", examples=5, seed=1, timeout_s=3
    )
    finding, cex = result.finding, result.counterexample
    assert finding is not None and cex is not None and finding.codes == ["timed-out"], finding
    assert cex.n == 2 and finding.ranks == [0, 1], finding.explanation
    for rank in (0, 1):
        assert f"rank {rank}:\n" in finding.stack
    assert finding.stack.count("in _exchange") == 2, finding.stack


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.timeout(60)  # far below the 120 s limit per call: the grace, not the time limit, ends it
def test_a_rank_that_raises_while_the_others_wait_is_raised_after_the_grace(jobs: Jobs) -> None:
    result = run(
        jobs, "tests.common.planted_mpi:rank_1_raises", "order-free", examples=5, seed=1, timeout_s=120
    )
    finding, cex = result.finding, result.counterexample
    assert finding is not None and cex is not None and finding.codes == ["raised"], finding
    assert cex.n == 2
    assert finding.explanation.startswith("raised: rank(s) [1]: raised RuntimeError: planted: rank 1 gives")
    assert "rank(s) [0] were still inside the call 2 s after rank(s) [1] raised" in finding.explanation
    assert "rank 1 raised:\nTraceback" in finding.stack and "in rank_1_raises" in finding.stack
    assert "rank 0:\n" in finding.stack  # where the stopped rank was waiting


def test_cli_refuses_mca_without_mpi_bad_mca_and_bfloat16(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["difftest", "ring_ref.mpi:ring_all_reduce_", "--examples", "1"]
    assert main([*base, "--ranks", "gloo", "--mca", "btl=self"]) == 2
    assert (
        "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi)"
        in capsys.readouterr().err
    )
    assert main([*base, "--ranks", "mpi", "--mca", "btl"]) == 2
    assert "--mca takes KEY=VALUE" in capsys.readouterr().err
    assert main([*base, "--ranks", "mpi", "--dtypes", "bfloat16"]) == 2
    assert "numpy has no bfloat16" in capsys.readouterr().err
    with pytest.raises(ValueError, match="numpy has no bfloat16"):
        difftest("ring_ref.mpi:ring_all_reduce_", ranks="mpi", dtypes=[torch.bfloat16])


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
def test_soak_openmpi_default_allreduce_passes_order_free_and_bound() -> None:
    report = difftest(
        "ring_ref.targets:mpi_allreduce", ranks="mpi", dtypes=_DTYPES[1:], examples=60, seed=5, max_workers=4
    )
    assert report.modes["order-free"].verdict == "pass", report.render()
    assert report.modes["bound"].verdict == "pass", report.render()
    # Its default is not the spec's ring order (recursive doubling and other trees for N >= 3).
    assert report.diagnoses == ["not-ring-order"], report.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles", "fold-order")
def test_soak_openmpi_ring_algorithm_passes_exact() -> None:
    report = difftest(
        "ring_ref.targets:mpi_allreduce",
        ranks="mpi",
        mca=openmpi_allreduce_mca("ring"),
        dtypes=_DTYPES[1:],
        examples=60,
        seed=6,
        max_workers=4,
    )
    assert report.verdict == "pass", report.render()
    assert "--mca coll_tuned_allreduce_algorithm=4" in report.replay


@pytest.mark.clause("difftest-raised-at")
def test_raised_on_mpi_ranks_names_the_target_s_line(jobs: Jobs) -> None:
    line, source = planted_hints.marked_line("mpi")
    result = run(jobs, f"{planted_hints.FILE}:mpi_raises", "bound", examples=2, seed=1)
    assert result.finding is not None and result.finding.codes == ["raised"]
    frame = result.to_json(1)["counterexample"].get("raised_at")
    assert frame == {"file": planted_hints.FILE, "line": line, "source": source}
    assert f" at {planted_hints.FILE}:{line}: {source}" in result.finding.explanation


# ==========================================================================================================
# ``--ranks mpi``: the MPI job launcher (``ring_ref.difftest._mpi``), its decoding and its failures.
#
# Most of it is checked in pytest's own process: :func:`observe_rank` on a fake
# communicator (it only asks for the rank), the decoding of each rank's reply
# field by field (every malformed field refused with its rank and what is
# wrong, never taken for an answer), and :class:`MpiRanks`
# over a fake job that runs :func:`observe_rank` for each rank in this process or
# fails as a real job fails (``timed-out`` with each unfinished rank's stack,
# ``crashed`` naming the dead rank, a garbled reply, ``mpirun`` not starting, a
# target the ranks cannot load).  One real ``mpirun`` job of one rank checks
# what only a job shows: the ``--mca`` options reach the ranks, and a hung rank
# is ``timed-out`` with its stack after the launcher's timeout.  The targets
# are defined here and loaded by name.
# ==========================================================================================================


Array = npt.NDArray[Any]
HERE = __name__
_P = TypeVar("_P")
_R = TypeVar("_R")


# Targets, loaded by name (in this process through the fake job, in the ranks of the real one).


def doubles_in_place(comm: Any, array: Array) -> None:
    """Doubles its own array and returns ``None`` (the in-place convention)."""
    array *= 2


def returns_argument(comm: Any, array: Array) -> Array:
    """Adds one to its array and returns it."""
    array += 1
    return array


def returns_new(comm: Any, array: Array) -> Array:
    """A fresh array, three times the input; the argument untouched."""
    return array * 3


def returns_view(comm: Any, array: Array) -> Array:
    """A reversed view of its argument (shares its memory)."""
    return array[::-1]


def returns_as(comm: Any, array: Array, op: str) -> Array:
    """A fresh array of dtype ``op`` (the op's name is used here to name a dtype)."""
    return np.arange(array.size).astype(op)


def returns_list(comm: Any, array: Array) -> list[float]:
    """Not an array."""
    return [float(v) for v in array]


def raises(comm: Any, array: Array) -> None:
    """Writes 7 into its array, then raises."""
    array[...] = 7
    raise ValueError(f"broken on rank {comm.Get_rank()}")


def exits(comm: Any, array: Array) -> None:
    """``SystemExit`` is an answer like any other exception."""
    raise SystemExit(4)


def shows_keywords(comm: Any, array: Array, **kwargs: str) -> None:
    """Raises with its rank and the keyword arguments it was given."""
    raise LookupError(f"rank {comm.Get_rank()}: {kwargs!r}")


def in_the_job(comm: Any, array: Array) -> None:
    """For the real job: 0 reports the ``--mca`` option ``coll_tuned_use_dynamic_rules`` as the ranks see it;
    1 hangs."""
    if array.flat[0] == 1:
        time.sleep(60)
    array[...] = float(os.environ.get("OMPI_MCA_coll_tuned_use_dynamic_rules", "-1"))  # noqa: SIM112  (OpenMPI's name)


class FakeComm:
    """What :func:`observe_rank` asks of a communicator."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size


class FakeRing(MpiJob):
    """A job that is never started: each run calls ``fn`` for every rank here, or fails as told."""

    made: ClassVar[list[FakeRing]] = []
    """Every one made, in order."""

    def __init__(
        self,
        n: int,
        *,
        mca: dict[str, str] | None = None,
        fails: BaseException | None = None,
        replies: list[object] | None = None,
        env: dict[str, str] | None = None,
        mpiexec: str | None = None,
    ) -> None:
        super().__init__(n, mca=mca, env=env, mpiexec=mpiexec)
        FakeRing.made.append(self)
        self.fails, self.replies = fails, replies
        self.runs: list[tuple[float, bool]] = []
        self.gave_up: Callable[[Any], bool] | None = None
        self.closed = 0

    def run(
        self,
        fn: Callable[[Any, _P], _R],
        payload: _P,
        *,
        timeout_s: float = 60.0,
        trusted: bool = True,
        gave_up: Callable[[_R], bool] | None = None,
    ) -> list[_R]:
        self.runs.append((timeout_s, trusted))
        self.gave_up = gave_up
        time.sleep(0.02)
        if self.fails is not None:
            raise self.fails
        if self.replies is not None:
            return cast("list[_R]", self.replies)
        return [fn(FakeComm(r, self.world_size), payload) for r in range(self.world_size)]

    def close(self) -> None:
        self.closed += 1


def _plain(a: Array) -> tuple[str, tuple[int, ...], bytes]:
    return str(a.dtype), a.shape, a.tobytes(order="C")


def _observe(target: str, inputs: list[Array], rank: int = 0, op: str | None = None) -> dict[str, Any]:
    payload = (f"{HERE}:{target}", str(inputs[0].dtype), inputs[0].shape, [a.tobytes() for a in inputs], op)
    return observe_rank(FakeComm(rank, len(inputs)), payload)


TWO = [np.array([[1.5, -2.0]], dtype=np.float32), np.array([[3.0, 0.25]], dtype=np.float32)]


# observe_rank: what the target did, as plain data.


@pytest.mark.timeout(60)
def test_each_rank_works_on_a_writeable_copy_of_its_own_input_in_place() -> None:
    got = _observe("doubles_in_place", TWO, rank=1)
    doubled = _plain(TWO[1] * 2)
    assert got == {
        "rank": 1,
        "raised": "",
        "traceback": "",
        "argument": doubled,
        "returned": "none",
        "result": doubled,
        "shares_memory": False,
    }
    assert TWO[1].tolist() == [[3.0, 0.25]]


@pytest.mark.timeout(60)
def test_a_returned_argument_is_the_result() -> None:
    got = _observe("returns_argument", TWO, rank=0)
    plus_one = _plain(TWO[0] + 1)
    assert (got["returned"], got["result"], got["argument"], got["shares_memory"]) == (
        "argument",
        plus_one,
        plus_one,
        False,
    )


@pytest.mark.timeout(60)
def test_a_new_array_is_the_result_and_the_argument_is_what_was_left() -> None:
    got = _observe("returns_new", TWO, rank=1)
    assert (got["returned"], got["result"], got["argument"], got["shares_memory"]) == (
        "ndarray",
        _plain(TWO[1] * 3),
        _plain(TWO[1]),
        False,
    )
    view = _observe("returns_view", [np.array([1.0, 2.0, 3.0])])
    assert (view["returned"], view["result"], view["shares_memory"]) == (
        "ndarray",
        _plain(np.array([3.0, 2.0, 1.0])),
        True,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["bool", "int16", "uint8", "float16", "complex64"])
def test_arrays_of_every_numeric_kind_come_back_as_bits(dtype: str) -> None:
    got = _observe("returns_as", [np.zeros(3)], op=dtype)
    assert got["returned"] == "ndarray"
    assert got["result"] == (dtype, (3,), np.array([0, 1, 2]).astype(dtype).tobytes())


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("target", "op", "returned"),
    [("returns_as", "U3", "ndarray"), ("returns_as", "O", "ndarray"), ("returns_list", None, "list")],
)
def test_anything_else_is_named_by_its_type_without_a_result(
    target: str, op: str | None, returned: str
) -> None:
    got = _observe(target, [np.ones(2)], op=op)
    assert (got["returned"], got["result"], got["shares_memory"], got["raised"]) == (
        returned,
        None,
        False,
        "",
    )
    assert got["argument"] == _plain(np.ones(2))


@pytest.mark.timeout(60)
def test_an_exception_is_the_answer_with_its_traceback_and_the_argument_as_it_was_left() -> None:
    got = _observe("raises", TWO, rank=1)
    assert got["raised"] == "ValueError: broken on rank 1"
    assert got["traceback"].startswith("Traceback (most recent call last)")
    assert got["traceback"].splitlines()[1].startswith('  File "')
    assert "in raises" in got["traceback"] and got["traceback"].rstrip().endswith("broken on rank 1")
    assert (got["returned"], got["result"], got["rank"]) == ("none", None, 1)
    assert got["argument"] == _plain(np.full((1, 2), 7, dtype=np.float32))
    assert _observe("exits", TWO)["raised"] == "SystemExit: 4"


@pytest.mark.timeout(60)
def test_the_op_is_passed_by_name_only_when_there_is_one() -> None:
    assert _observe("shows_keywords", TWO, 1, op="max")["raised"] == "LookupError: rank 1: {'op': 'max'}"
    assert _observe("shows_keywords", TWO, 1)["raised"] == "LookupError: rank 1: {}"


@pytest.mark.timeout(60)
def test_a_target_that_cannot_be_loaded_is_the_loaders_words() -> None:
    got = observe_rank(FakeComm(0, 1), (f"{HERE}:no_such_function", "float64", (1,), [bytes(8)], None))
    assert list(got) == ["load_error"]
    assert "no_such_function" in got["load_error"]


def _counting_target(where: Path, value: float) -> str:
    """A target file that logs each import of it and writes ``value`` plus its number of calls."""
    where.write_text(
        f"with open({str(where) + '.imports'!r}, 'a') as log:\n    log.write('x')\n"
        f"calls = []\n\ndef fn(comm, array):\n    calls.append(1)\n    array[...] = {value} + len(calls)\n"
    )
    return f"{where}:fn"


@pytest.mark.timeout(60)
def test_a_target_is_imported_once_per_rank_and_keeps_its_module_state(tmp_path: Path) -> None:
    # Fresh files: the targets loaded by earlier tests stay loaded in this process.
    first, second = _counting_target(tmp_path / "first.py", 10), _counting_target(tmp_path / "second.py", 20)
    results = [
        observe_rank(FakeComm(0, 1), (name, "float64", (1,), [bytes(8)], None))["result"]
        for name in (first, first, second, first, second)
    ]
    assert results == [_plain(np.array([v])) for v in (11.0, 12.0, 21.0, 13.0, 22.0)]
    assert [(tmp_path / f"{f}.py.imports").read_text() for f in ("first", "second")] == ["x", "x"]


# The tester's decoding of each reply.


def _reply(**fields: object) -> dict[str, object]:
    ok = ("float32", (2,), np.array([1.0, 2.0], dtype=np.float32).tobytes())
    return {
        "rank": 0,
        "returned": "ndarray",
        "result": ok,
        "argument": ok,
        "shares_memory": True,
        "raised": "",
        "traceback": "",
    } | fields


@pytest.mark.timeout(60)
def test_a_well_formed_reply_becomes_the_ranks_answer() -> None:
    reply = _reply(raised="E: x", traceback="tb", result=("bool", (0,), b""), argument=("int8", (), b"\x05"))
    shared = TensorView((), (), "numpy.int8", "cpu", (0, 1))
    assert decode_rank(reply, 3) == Answer("ndarray", None, shared, "E: x", "tb", 3, False)
    bare = decode_rank({"returned": "none", "result": None, "argument": ("uint16", (1, 2), bytes(4))}, 0)
    in_place = TensorView((1, 2), (2, 1), "numpy.uint16", "cpu", (0, 1))
    assert bare == Answer("NoneType", None, in_place, "", "", 0, True)
    assert decode_rank(_reply(returned=None, shares_memory=0), 1).type_name == "None"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"argument": None}, "rank 2: a malformed array in its answer"),
        ({"argument": ["float32", (2,), bytes(8)]}, "rank 2: a malformed array"),
        ({"result": ("float32", (2,))}, "rank 2: a malformed array"),
        ({"argument": ("float32", (2,), bytes(8), 0)}, "rank 2: a malformed array"),
        ({"argument": (None, (2,), bytes(8))}, "rank 2: dtype None"),
        ({"argument": (b"float32", (2,), bytes(8))}, "rank 2: dtype b'float32'"),
        ({"result": ("nonsense", (2,), bytes(8))}, "rank 2: dtype 'nonsense'"),
        ({"result": ("(2,-3)f4", (2,), bytes(8))}, "rank 2: dtype '(2,-3)f4'"),
        ({"argument": ("U2", (2,), bytes(16))}, "rank 2: dtype 'U2'"),
        ({"argument": ("object", (2,), bytes(16))}, "rank 2: dtype 'object'"),
        ({"argument": ("float32", [2], bytes(8))}, "rank 2: shape [2]"),
        ({"argument": ("float32", (-2,), bytes(8))}, "rank 2: shape (-2,)"),
        ({"result": ("float32", (2.0,), bytes(8))}, "rank 2: shape (2.0,)"),
        ({"argument": ("float32", (2, "1"), bytes(8))}, "rank 2: shape (2, '1')"),
        ({"argument": ("float32", (2,), bytes(4))}, "rank 2: 4 bytes for (2,)"),
        ({"result": ("float32", (2,), bytes(12))}, "rank 2: 12 bytes for (2,)"),
        ({"argument": ("float32", (2,), "8 bytes!")}, "rank 2: ? bytes for (2,)"),
        ({"argument": ("float32", (), bytes(8))}, "rank 2: 8 bytes for ()"),
    ],
)
def test_a_malformed_field_is_refused_with_the_rank_and_what_is_wrong(
    fields: dict[str, object], words: str
) -> None:
    with pytest.raises(Garbled, match="^" + re.escape(words)):
        decode_rank(_reply(**fields), 2)


@pytest.mark.timeout(60)
def test_a_reply_that_is_not_a_dict_is_refused() -> None:
    with pytest.raises(Garbled, match=r"^rank 1 sent a list, not an answer$"):
        decode_rank([("float32", (2,), bytes(8))], 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 0, 3), (0,), (4, 1, 2)])
def test_strides_are_contiguous_ones(shape: tuple[int, ...]) -> None:
    assert _strides(shape) == torch.empty(shape).stride()


def _overlap(a: TensorView | None, b: TensorView | None) -> bool:
    assert a is not None and b is not None
    if a.storage is None or b.storage is None:
        return False
    return a.storage[0] < b.storage[1] and b.storage[0] < a.storage[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_a_tester_dtype_comes_with_its_bits(dtype: torch.dtype) -> None:
    x = torch.tensor([[1.0, -0.0, 3.5], [-7.25, 0.5, 2.0]], dtype=dtype)
    view = _view(_plain(x.numpy()), False)
    assert (view.shape, view.stride, view.dtype, view.device, view.storage) == (
        (2, 3),
        (3, 1),
        str(dtype),
        "cpu",
        None,
    )
    assert view.values is not None and torch.equal(view.values, x)
    assert torch.equal(view.values.view(torch.uint8), x.view(torch.uint8))
    empty = _view((str(x.numpy().dtype), (0, 2), b""), True)
    assert empty.values is not None and empty.values.shape == (0, 2) and empty.values.dtype == dtype
    assert empty.storage is not None


@pytest.mark.timeout(60)
def test_another_dtype_is_named_without_bits() -> None:
    view = _view(("int32", (2, 2), bytes(16)), False)
    assert (view.shape, view.stride, view.dtype, view.device, view.storage, view.bits) == (
        (2, 2),
        (2, 1),
        "numpy.int32",
        "cpu",
        None,
        None,
    )
    assert _view(("uint8", (1,), b"\x01"), True).storage is not None


X = np.array([1.0, 2.0], dtype=np.float32)
Y = np.array([4.0, 5.0], dtype=np.float32)


def _decoded(rank: int, returned: str, result: Array | None, argument: Array, **fields: object) -> Answer:
    reply = {"returned": returned, "result": None if result is None else _plain(result), **fields}
    return decode_rank(reply | {"argument": _plain(argument)}, rank)


@pytest.mark.timeout(60)
def test_in_place_answers_share_the_arguments_memory() -> None:
    none = _decoded(1, "none", Y, Y)
    assert (none.type_name, none.rank, none.returned_none, none.raised, none.traceback) == (
        "NoneType",
        1,
        True,
        "",
        "",
    )
    assert none.result is not None and none.result.values is not None
    assert none.result.values.tolist() == [4.0, 5.0] and _overlap(none.result, none.argument)
    same = _decoded(0, "argument", Y, Y)
    assert (same.type_name, same.returned_none) == ("ndarray", False) and _overlap(same.result, same.argument)
    view = _decoded(2, "ndarray", Y[::-1].copy(), Y, shares_memory=True)
    assert (view.type_name, view.rank) == ("ndarray", 2) and _overlap(view.result, view.argument)


@pytest.mark.timeout(60)
def test_a_new_array_does_not_share_and_a_raise_has_no_result() -> None:
    new = _decoded(0, "ndarray", Y, X)
    assert not _overlap(new.result, new.argument)
    assert new.argument is not None and new.argument.values is not None
    assert new.argument.values.tolist() == [1.0, 2.0] and not new.returned_none
    failed = _decoded(0, "none", X, Y, raised="E: x", traceback="tb")
    assert (failed.result, failed.raised, failed.traceback, failed.returned_none) == (
        None,
        "E: x",
        "tb",
        False,
    )
    assert failed.argument is not None and failed.argument.values is not None
    assert failed.argument.values.tolist() == [4.0, 5.0]
    other = _decoded(0, "list", None, X)
    assert (other.type_name, other.result, other.returned_none) == ("list", None, False)


@pytest.mark.timeout(60)
def test_the_answer_holds_the_bits_of_the_result_and_of_the_argument() -> None:
    values = np.array([[1.0, -0.0, 2.5]], dtype=np.float16)
    got = _decoded(0, "ndarray", values * 2, values)
    assert got.result is not None and got.result.values is not None
    assert got.argument is not None and got.argument.values is not None
    assert got.result.values.dtype == torch.float16 and got.result.values.shape == (1, 3)
    assert got.result.values.numpy().tobytes() == (values * 2).tobytes()
    assert got.argument.values.numpy().tobytes() == values.tobytes()


# MpiRanks over a fake job.

CASE = Case(2, 2, (2,), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 8.0, 16.0))


@pytest.mark.timeout(60)
def test_the_launcher_gives_each_rank_its_rows_and_answers_per_rank() -> None:
    ring = FakeRing(2)
    launcher = MpiRanks(f"{HERE}:doubles_in_place", 2.5, rings={2: ring})
    got = launcher.call(CASE)
    assert got.failure is None and got.case == CASE and len(got.answers) == 2
    for rank, answer in enumerate(got.answers):
        assert answer.rank == rank and answer.returned_none and answer.result is not None
        assert torch.equal(cast("torch.Tensor", answer.result.values), CASE.rank_tensor(rank) * 2)
    assert ring.runs == [(2.5, False)]
    launcher.close()
    assert ring.closed == 1


@pytest.mark.timeout(60)
def test_a_new_array_is_each_ranks_result_and_the_job_serves_the_next_call() -> None:
    ring = FakeRing(2)
    launcher = MpiRanks(f"{HERE}:returns_new", 4.5, rings={2: ring})
    got = launcher.call(CASE)
    assert got.failure is None and [a.rank for a in got.answers] == [0, 1]
    for rank, answer in enumerate(got.answers):
        assert answer.result is not None and answer.argument is not None and not answer.returned_none
        assert torch.equal(cast("torch.Tensor", answer.result.values), CASE.rank_tensor(rank) * 3)
        assert torch.equal(cast("torch.Tensor", answer.argument.values), CASE.rank_tensor(rank))
        assert not _overlap(answer.result, answer.argument)
    # Plain data only, under the target's timeout; the same job serves the next call.
    assert ring.runs == [(4.5, False)]
    launcher.call(Case(2, 1, (), torch.float64, "contiguous", (1.0, 2.0), op="max"))
    assert len(ring.runs) == 2


@pytest.mark.timeout(60)
def test_the_launcher_passes_the_cases_op() -> None:
    launcher = MpiRanks(f"{HERE}:shows_keywords", 1.0, rings={2: FakeRing(2)})
    with_op = launcher.call(Case(2, 1, (), torch.float64, "contiguous", (1.0, 2.0), op="max"))
    assert [a.raised for a in with_op.answers] == [f"LookupError: rank {r}: {{'op': 'max'}}" for r in (0, 1)]
    without = launcher.call(Case(2, 1, (), torch.float64, "contiguous", (1.0, 2.0)))
    assert [a.raised for a in without.answers] == [f"LookupError: rank {r}: {{}}" for r in (0, 1)]


@pytest.mark.timeout(60)
def test_the_launcher_takes_mca_as_a_copy() -> None:
    mca = {"btl": "self"}
    launcher = MpiRanks("m:f", 1.0, mca)
    mca["btl"] = "tcp"
    assert launcher.mca == {"btl": "self"}
    assert (launcher.target, launcher.timeout_s) == ("m:f", 1.0)
    assert (launcher.output.text, launcher.output.bytes) == ("", 0)  # the ranks' output stays in mpirun's log
    assert MpiRanks("m:f", 1.0).mca == {}


@pytest.mark.timeout(60)
def test_the_launcher_refuses_dtypes_numpy_lacks() -> None:
    bf16 = Case(1, 1, (), torch.bfloat16, "contiguous", (1.0,))
    with pytest.raises(ValueError, match=r"--ranks mpi takes \['torch.float16', .*got torch.bfloat16"):
        MpiRanks("m:f", 1.0, rings={1: FakeRing(1)}).call(bf16)


@pytest.mark.timeout(60)
def test_start_loads_the_target_in_one_rank() -> None:
    ring = FakeRing(1)
    MpiRanks(f"{HERE}:doubles_in_place", 1.0, rings={1: ring}).start()
    assert len(ring.runs) == 1
    with pytest.raises(TargetError, match="no_such_function"):
        MpiRanks(f"{HERE}:no_such_function", 1.0, rings={1: FakeRing(1)}).start()


@pytest.mark.timeout(60)
def test_ranks_that_cannot_start_or_load_are_crashed() -> None:
    down = MpiRanks("m:f", 1.0, rings={2: FakeRing(2, fails=RuntimeError("mpirun exited"))})
    got = down.call(CASE)
    assert got.failure is not None and got.answers == () and got.case == CASE
    assert got.failure.code == "crashed"
    assert got.failure.text == "starting the ranks failed: starting 2 MPI rank(s) failed: mpirun exited"
    unloadable = MpiRanks(f"{HERE}:no_such_function", 1.0, rings={2: FakeRing(2)}).call(CASE)
    assert unloadable.failure is not None and unloadable.failure.code == "crashed" and unloadable.case == CASE
    assert unloadable.failure.text.startswith("starting the ranks failed: ")
    assert "no_such_function" in unloadable.failure.text
    one_rank = FakeRing(2, replies=[_reply(), {"load_error": "rank 1 cannot import it"}])
    got = MpiRanks("m:f", 1.0, rings={2: one_rank}).call(CASE)
    assert got.failure is not None and got.answers == ()
    assert got.failure.text == "starting the ranks failed: rank 1 cannot import it"


@pytest.mark.timeout(60)
def test_a_timed_out_call_carries_each_unfinished_ranks_stack_in_rank_order() -> None:
    hung = RanksTimedOut(2, 1.0, "running observe_rank", [1, 0], {1: "in Send", 0: "in Recv"})
    got = MpiRanks("m:f", 1.0, rings={2: FakeRing(2, fails=hung)}).call(CASE)
    assert got.failure is not None and got.answers == () and got.case == CASE
    assert (got.failure.code, got.failure.text, got.failure.ranks) == ("timed-out", str(hung), (1, 0))
    assert got.failure.stack == "rank 0:\nin Recv\nrank 1:\nin Send\n"


@pytest.mark.timeout(60)
def test_ranks_stopped_after_a_rank_raised_leave_its_answer_a_note_and_the_stacks() -> None:
    # Rank 1 raised; rank 0 was still inside the call after the grace (issue 29, item 7).
    raised = _reply(rank=1, raised="RuntimeError: gave up", traceback="Traceback: in rank_1\n", result=None)
    stopped = RanksStopped(2, {1: raised}, [1], [0], {0: "in Recv"})
    ring = FakeRing(2, fails=stopped)
    got = MpiRanks("m:f", 120.0, rings={2: ring}).call(CASE)
    assert got.failure is None and [(a.rank, a.raised) for a in got.answers] == [(1, "RuntimeError: gave up")]
    assert got.note.startswith("rank(s) [0] were still inside the call 2 s after rank(s) [1] raised")
    assert got.stack == "rank 1 raised:\nTraceback: in rank_1\n\nrank 0:\nin Recv\n"
    assert ring.gave_up is not None and ring.gave_up(raised) and not ring.gave_up(_reply())
    garbled = FakeRing(2, fails=RanksStopped(2, {1: 5}, [1], [0], {}))
    broken = MpiRanks("m:f", 120.0, rings={2: garbled}).call(CASE)
    assert broken.failure is not None and broken.failure.code == "crashed"


@pytest.mark.timeout(60)
def test_a_dead_rank_is_crashed() -> None:
    dead = RankFailed(2, died={1: "exited with code 3"}, stacks={0: "in Recv"})
    got = MpiRanks("m:f", 1.0, rings={2: FakeRing(2, fails=dead)}).call(CASE)
    assert got.failure is not None and got.answers == ()
    assert (got.failure.code, got.failure.text, got.failure.ranks) == ("crashed", str(dead), (1,))
    assert got.failure.stack == "rank 0:\nin Recv\n"


@pytest.mark.timeout(60)
def test_a_garbled_reply_is_crashed_and_the_job_stopped() -> None:
    ring = FakeRing(2, replies=[_reply(), 5])
    got = MpiRanks("m:f", 1.0, rings={2: ring}).call(CASE)
    assert got.failure is not None and got.answers == ()
    assert (got.failure.code, got.failure.text, got.failure.stack, got.failure.ranks) == (
        "crashed",
        "a garbled answer: rank 1 sent a int, not an answer",
        "",
        (),
    )
    assert ring.closed == 1


@pytest.mark.timeout(60)
def test_one_job_per_n_is_made_on_first_use_with_the_mca_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_mpi, "MpiJob", FakeRing)
    monkeypatch.setattr(FakeRing, "made", [])
    launcher = MpiRanks(f"{HERE}:returns_list", 1.0, {"btl": "self"}, env={"E": "1"}, mpiexec="/v/mpiexec")
    sizes = []
    for n in (1, 2, 1, 2, 3):
        got = launcher.call(Case(n, 1, (), torch.float64, "contiguous", (0.0,) * n))
        assert got.failure is None
        sizes.append(len(got.answers))
    assert sizes == [1, 2, 1, 2, 3]
    assert [(ring.world_size, ring.mca, len(ring.runs)) for ring in FakeRing.made] == [
        (1, {"btl": "self"}, 2),
        (2, {"btl": "self"}, 2),
        (3, {"btl": "self"}, 1),
    ]
    assert all((ring.env, ring.mpiexec) == ({"E": "1"}, "/v/mpiexec") for ring in FakeRing.made)
    launcher.close()
    assert [ring.closed for ring in FakeRing.made] == [1, 1, 1]


@pytest.mark.timeout(60)
def test_close_stops_every_job_once() -> None:
    rings = {1: FakeRing(1), 3: FakeRing(3)}
    launcher = MpiRanks("m:f", 1.0, rings=rings)
    launcher.close()
    launcher.close()
    assert [r.closed for r in rings.values()] == [1, 1]


# One real job.


@pytest.fixture(scope="module")
def job() -> Iterator[MpiRanks]:
    mpirun_path()  # fail (not skip) with what to install when OpenMPI or mpi4py is missing
    launcher = MpiRanks(f"{HERE}:in_the_job", 2.0, {"coll_tuned_use_dynamic_rules": "1"})
    yield launcher
    launcher.close()


@pytest.mark.timeout(60)
def test_a_real_job_starts_with_the_mca_options_and_a_hung_rank_is_timed_out(job: MpiRanks) -> None:
    job.start()
    got = job.call(Case(1, 1, (2,), torch.float64, "contiguous", (0.0, 5.0)))
    assert got.failure is None and len(got.answers) == 1
    result = got.answers[0].result
    assert result is not None and result.values is not None and result.values.tolist() == [[1.0, 1.0]]
    started = time.monotonic()
    hung = job.call(Case(1, 1, (), torch.float64, "contiguous", (1.0,)))
    assert hung.failure is not None and hung.failure.code == "timed-out", hung
    assert hung.failure.ranks == (0,) and "rank 0:\n" in hung.failure.stack
    assert "in_the_job" in hung.failure.stack
    assert 2.0 <= time.monotonic() - started < 30


# --- The launcher of the MPI mpi4py uses (clause difftest-mpi-launcher) and the ranks' environment ---


def _fake_launcher(tmp_path: Path, version: str, run: str) -> str:
    """A launcher that answers ``--version`` with ``version`` and otherwise runs the shell line ``run``."""
    path = tmp_path / "mpiexec"
    answer = f'if [ "$1" = --version ]; then printf "%s\\n" "{version}"; exit 0; fi'
    path.write_text(f"#!/bin/sh\n{answer}\n{run}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.clause("difftest-mpi-launcher")
@pytest.mark.timeout(120)
def test_a_launcher_of_another_mpi_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """MPICH's hydra named for mpi4py's OpenMPI (or the other way round): refused, naming both, not run."""
    library = launchers.library_version(sys.executable)
    other = "MPICH Version: 5.0.2" if library[0] != "MPICH" else "mpiexec (OpenRTE) 4.1.4"
    fake = _fake_launcher(tmp_path, other, f"touch {tmp_path}/ran")
    with pytest.raises(TargetError) as refused:
        MpiRanks("ring_ref.targets:mpi_allreduce", 10.0, mpiexec=fake).start()
    said = str(refused.value)
    assert said.count("starting 1 MPI rank(s) failed") == 1
    assert f"mpi4py uses {library[0]} {library[1]}" in said and f"{fake} (" in said, said
    assert not (tmp_path / "ran").exists()


@pytest.mark.clause("difftest-mpi-launcher")
@pytest.mark.timeout(120)
def test_a_launcher_that_exits_is_named_once_with_the_way_out(tmp_path: Path) -> None:
    """A launcher of the right MPI that cannot start the ranks: one message, naming it, its command line and
    its output, and pointing to ``--ranks mpi-job`` (the prefix was doubled)."""
    library = launchers.library_version(sys.executable)[2]
    fake = _fake_launcher(tmp_path, library, "echo 'no such option'; exit 3")
    with pytest.raises(TargetError) as failed:
        MpiRanks("ring_ref.targets:mpi_allreduce", 10.0, mpiexec=fake).start()
    said = str(failed.value)
    assert said.count("starting 1 MPI rank(s)") == 1, said
    assert said.startswith("starting 1 MPI rank(s) failed: the launcher exited (0 connected"), said
    assert f"--ranks mpi assumed {fake} (" in said and f"and ran: {fake} -n 1 " in said
    assert "mpiexec -n N ring-ref difftest --ranks mpi-job TARGET" in said and "no such option" in said


@pytest.mark.clause("difftest-rank-env")
@pytest.mark.timeout(120)
def test_env_reaches_every_rank() -> None:
    """``--env NAME=VALUE``: every rank's environment holds it (by name, through the launcher)."""
    jobs = Jobs()
    try:
        job = jobs.ring(2, env={"RING_REF_PROBE_A": "1", "RING_REF_PROBE_B": "two words"})
        assert job.run(environ_of, ["RING_REF_PROBE_A", "RING_REF_PROBE_B"]) == [["1", "two words"]] * 2
        assert "two words" not in job.command()
    finally:
        jobs.close()


def _pypi_mpi(name: str) -> Path:
    """The interpreter of ``.venv-NAME``: MPI ``name`` and its mpi4py from PyPI, created by
    ``tools/ensure_pypi_mpi.sh NAME`` (for MPICH, ``make test`` runs it first)."""
    python = ROOT / f".venv-{name}" / "bin" / "python"
    if not python.exists():
        script = str(ROOT / "tools" / "ensure_pypi_mpi.sh")
        done = subprocess.run(["bash", script, name], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.fail(f"tools/ensure_pypi_mpi.sh {name} failed:\n{done.stdout}{done.stderr}")
    return python


def _difftest_and_ring(name: str, *ring: str) -> None:
    """From ``.venv-NAME``, not activated (Debian's OpenMPI ``mpirun`` first on ``PATH``): ``--ranks mpi``
    starts the library's ranks with its own launcher and passes order-free, and ``--env ring`` picks its
    ring, which reveal classifies as a ring at ``N = 4``, ``M = 8``."""
    cli = [str(_pypi_mpi(name)), "-m", "ring_ref"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    target = "ring_ref.targets:mpi_allreduce"
    difftest_argv = [*cli, "difftest", "--ranks", "mpi", target, "--mode", "order-free", "--max-workers", "3"]
    difftest_argv += ["--examples", "5", "--seed", "1"]
    done = subprocess.run(difftest_argv, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0 and "PASS" in done.stdout, (done.stdout, done.stderr[-3000:])
    reveal = [*cli, "reveal", "--ranks", "mpi", target, "-n", "4", "-m", "8"]
    reveal += [item for variable in ring for item in ("--env", variable)]
    done = subprocess.run(reveal, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert "classification: ring (" in done.stdout, done.stdout  # the defaults are trees or folds


@pytest.mark.clause("difftest-mpi-launcher", "difftest-rank-env")
@pytest.mark.timeout(600)
def test_mpich_from_its_own_virtualenv_not_activated() -> None:
    """The issue's case: MPICH from PyPI, its virtualenv not activated, ran into Debian's ``mpirun``
    (``unsupported PMI version PMIx``); now MPICH's ``mpiexec`` starts it, and its ring is chosen by name."""
    _difftest_and_ring("mpich", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring")


@pytest.mark.clause("difftest-mpi-launcher")
@pytest.mark.timeout(600)
def test_a_rank_that_dies_under_mpich_is_named() -> None:
    """MPICH's ``mpiexec`` prints nothing when a rank exits with a status and kills the others: rank 1's
    ``os._exit(3)`` was reported as every rank dead; hydra's exit codes name rank 1 alone."""
    cli = [str(_pypi_mpi("mpich")), "-m", "ring_ref", "difftest", "--ranks", "mpi"]
    argv = [*cli, "tests.common.planted_mpi:exits_mid_call", "--mode", "order-free", "--max-workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv += ["--examples", "3", "--seed", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    assert "rank(s) [1] failed; the job was killed." in done.stdout, done.stdout
    assert "rank 1 of 2 died: exited with code 3" in done.stdout, done.stdout


@pytest.mark.soak
@pytest.mark.clause("difftest-mpi-launcher", "difftest-rank-env")
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("name", "ring"),
    [
        ("impi-rt", ("I_MPI_ADJUST_ALLREDUCE=8",)),
        ("openmpi", ("OMPI_MCA_coll_tuned_use_dynamic_rules=1", "OMPI_MCA_coll_tuned_allreduce_algorithm=4")),
    ],
    ids=["intel", "openmpi5"],
)
def test_soak_intel_mpi_and_openmpi_5_from_their_own_virtualenvs(name: str, ring: tuple[str, ...]) -> None:
    """Intel MPI (ring id 8: a ring of the family at M = 8) and OpenMPI 5 (its ring, algorithm 4), PyPI's."""
    _difftest_and_ring(name, *ring)
