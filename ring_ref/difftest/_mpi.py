"""``--ranks mpi``: a per-rank launcher whose ranks are an MPI job, ``TARGET(comm, array)`` on each.

:class:`MpiRanks` is a :class:`~ring_ref.difftest._launch.Launcher` with
``per_rank`` set, like :class:`~ring_ref.difftest._ranks.GlooRanks`, so every
check of a per-rank target applies unchanged.  It keeps one
:class:`~ring_ref._processes._mpi_job.MpiJob` per ``N`` (started on first
use, restarted after a failure) and runs each case once on every rank: rank
``r`` gets its own fresh, contiguous, writeable ``numpy`` array holding
``case.rank_tensor(r)`` (the same bits) and a duplicate of the job's
``COMM_WORLD``; with an op (``case.op``) the call is
``TARGET(comm, array, op=NAME)``.  A rank's *result* is the array the target
returns, or, when it returns ``None``, the array itself after the call (in
place, like ``comm.Allreduce(MPI.IN_PLACE, ...)``).  A reduce-scatter or an
all-gather (``case.collective``) is ``TARGET(comm, sendbuf, recvbuf)``, as
``comm.Reduce_scatter_block`` and ``comm.Allgather`` take them; ``recvbuf``
after the call is the result when it returns ``None``.

The target is imported by name in the ranks only (never in the tester), and
each rank answers with plain data (:func:`observe_rank`: bits, shapes, dtype
names, strings), which the tester reads without building any object the
ranks chose (``MpiJob.run(trusted=False)``) and decodes once, field by field,
into the same :class:`~ring_ref.difftest._call.Answer` the gloo ranks give
(:func:`decode_rank`); or the call is a
:class:`~ring_ref.difftest._call.Failure`: ``timed-out`` with each unfinished
rank's Python stack, ``crashed`` with the dead rank.  When a rank's target
raised while others are still inside the call (waiting for it), those get
:data:`~ring_ref._processes._shared.FAILURE_GRACE_S` (as under gloo), then the
job is killed and the outcome holds the answers that came, noting the
stopped ranks, with the raised ranks' tracebacks and the stopped ranks' stacks.

``numpy`` has no bfloat16, so this launcher takes float16, float32 and
float64 cases only (:data:`MPI_DTYPES`); a target that cannot reduce float16
(``comm.Allreduce``: MPI has no such type) is reported as ``raised``.
"""

from __future__ import annotations

import base64
import traceback
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import INT_OF_SIZE
from ring_ref._processes._mpi_job import MpiJob, RankFailed, RanksStopped, RanksTimedOut, StartFailed
from ring_ref._processes._shared import FAILURE_GRACE_S, PerSize
from ring_ref.difftest._call import (
    Answer,
    Failure,
    Garbled,
    Outcome,
    TensorView,
    decode_raised_at,
    raised_at,
    stopped_note,
)
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._launch import Launcher, OutputLog
from ring_ref.difftest._loading import TargetError, load_target

__all__ = ["MPI_DTYPES", "MpiRanks", "decode_rank", "observe_rank", "plain_json", "plain_unjson"]

MPI_DTYPES: Final = (torch.float16, torch.float32, torch.float64)
"""The dtypes a case may have under ``--ranks mpi`` (``numpy`` has no bfloat16)."""
_BY_NUMPY_NAME: Final = {str(d).removeprefix("torch."): d for d in MPI_DTYPES}
_WHOLE: Final = (0, 1)
"""A stand-in storage range: two views given it overlap (``_call._shares`` compares ranges)."""
_LOADED: dict[str, Any] = {}
"""Targets already imported in this rank, by name."""
_NUMERIC_KINDS: Final = "biufc"
"""Arrays of these dtype kinds (bool, integers, floats, complex) travel back as bits; others do not."""

_ARRAYS: Final = ("result", "argument")
"""The keys of :func:`observe_rank`'s answer that hold a :data:`Plain` array."""

Plain = tuple[str, tuple[int, ...], bytes]
"""An array as plain data: its dtype's ``numpy`` name, its shape, its bits (C order)."""


def _plain(array: npt.NDArray[Any]) -> Plain:
    return array.dtype.name, tuple(int(d) for d in array.shape), np.ascontiguousarray(array).tobytes()


def observe_rank(
    comm: Any,
    payload: tuple[str, str, tuple[int, ...], list[bytes], str | None]
    | tuple[str, str, tuple[int, ...], list[bytes], str | None, tuple[int, ...] | None],
) -> dict[str, Any]:
    """On one rank: call the target on this rank's input and describe what it did, as plain data.

    ``payload``: the target's name, the dtype and shape, every rank's input bytes, the op's
    name (``None``: call without ``op=``), and optionally the output's shape (``None`` or left
    out for an all-reduce; a reduce-scatter or an all-gather is ``TARGET(comm, sendbuf,
    recvbuf)``, ``recvbuf`` a fresh array of that shape filled with NaN, the result when the call
    returns ``None``).  The answer: ``returned`` is ``"none"``,
    ``"argument"`` (the array it was given), ``"ndarray"`` (another array) or the type name
    of anything else; ``result`` the rank's result as :data:`Plain` (``None`` when it returned
    something that is not an array); ``argument`` the array it was given, after the call;
    ``shares_memory`` whether a returned array other than the argument overlaps it; ``raised``
    and ``traceback`` describe an exception, ``raised_at`` where in the target's code it was raised
    (``[file, line, source]``, :func:`~ring_ref.difftest._call.raised_at`; absent when unknown).
    ``{"load_error": ...}`` when the target cannot be loaded.
    """
    name, dtype, shape, inputs, op = payload[:5]
    output_shape = payload[5] if len(payload) == 6 else None
    rank = comm.Get_rank()
    try:
        fn = _LOADED[name] if name in _LOADED else _LOADED.setdefault(name, load_target(name))
    except TargetError as exc:
        return {"load_error": str(exc)}
    array = np.frombuffer(inputs[rank], dtype=np.dtype(dtype)).reshape(shape).copy()
    raised, text, returned, where = "", "", None, None
    out = None if output_shape is None else np.full(output_shape, np.nan, dtype=np.dtype(dtype))
    args = (comm, array) if out is None else (comm, array, out)
    try:
        returned = fn(*args) if op is None else fn(*args, op=op)
    except BaseException as exc:  # a target's SystemExit or KeyboardInterrupt is its answer too
        raised = f"{type(exc).__name__}: {exc}"
        text = "".join(traceback.format_exception(exc))
        where = raised_at(exc, fn)
    answer: dict[str, Any] = {"rank": rank, "raised": raised, "traceback": text, "argument": _plain(array)}
    if where is not None:
        answer["raised_at"] = [where.file, where.line, where.source]
    if returned is None:
        written = array if out is None else out
        answer.update(returned="none", result=None if raised else _plain(written), shares_memory=False)
    elif returned is array:
        answer.update(returned="argument", result=_plain(array), shares_memory=False)
    elif isinstance(returned, np.ndarray) and returned.dtype.kind in _NUMERIC_KINDS:
        shares = bool(np.shares_memory(returned, array))
        answer.update(returned="ndarray", result=_plain(returned), shares_memory=shares)
    else:
        answer.update(returned=type(returned).__name__, result=None, shares_memory=False)
    return answer


def plain_json(answer: dict[str, Any]) -> dict[str, Any]:
    """:func:`observe_rank`'s answer as JSON values: each :data:`Plain` array's bits in base64.

    >>> plain_unjson(plain_json({"rank": 1, "result": ("float32", (1,), b"\\0\\0\\0\\0")}))
    {'rank': 1, 'result': ('float32', (1,), b'\\x00\\x00\\x00\\x00')}
    """
    return {
        k: [v[0], list(v[1]), base64.b64encode(v[2]).decode()] if k in _ARRAYS and v is not None else v
        for k, v in answer.items()
    }


def plain_unjson(answer: object) -> object:
    """:func:`plain_json`'s inverse, for :func:`decode_rank` (which checks every field); garbled input
    comes back as garbled as it came (``decode_rank`` says so)."""
    if not isinstance(answer, dict):
        return answer
    out = dict(answer)
    for key in _ARRAYS:
        value = out.get(key)
        if (
            isinstance(value, list)
            and len(value) == 3
            and isinstance(value[1], list)
            and isinstance(value[2], str)
        ):
            try:
                out[key] = (value[0], tuple(value[1]), base64.b64decode(value[2], validate=True))
            except (TypeError, ValueError):
                out[key] = None if key == "result" else value
    return out


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous strides (the ranks send every array's bits densely)."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _checked(value: object, rank: int) -> Plain:
    """An array in a rank's reply, checked: a numeric dtype, a shape, exactly its bytes."""
    if not (isinstance(value, tuple) and len(value) == 3):
        raise Garbled(f"rank {rank}: a malformed array in its answer")
    dtype, shape, bits = value
    try:
        numeric = isinstance(dtype, str) and np.dtype(dtype).kind in _NUMERIC_KINDS
    except (TypeError, ValueError):  # not a dtype's name
        numeric = False
    if not numeric:
        raise Garbled(f"rank {rank}: dtype {dtype!r}")
    if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise Garbled(f"rank {rank}: shape {shape!r}")
    if not isinstance(bits, bytes) or len(bits) != int(np.prod(shape)) * np.dtype(dtype).itemsize:
        raise Garbled(f"rank {rank}: {len(bits) if isinstance(bits, bytes) else '?'} bytes for {shape}")
    return dtype, shape, bits


def _view(plain: Plain, shares: bool) -> TensorView:
    """A rank's array as the checks read a tensor: ``torch.<dtype>`` and bits for the tester's dtypes."""
    name, shape, bits = plain
    dtype = _BY_NUMPY_NAME.get(name)
    storage = _WHOLE if shares else None
    if dtype is None:
        return TensorView(shape, _strides(shape), f"numpy.{name}", "cpu", storage)
    ints = INT_OF_SIZE[dtype.itemsize]
    flat = torch.frombuffer(bytearray(bits), dtype=ints) if bits else torch.empty(0, dtype=ints)
    return TensorView(shape, _strides(shape), str(dtype), "cpu", storage, flat.reshape(shape))


def decode_rank(reply: object, rank: int) -> Answer:
    """Rank ``rank``'s reply from :func:`observe_rank`, checked field by field (plain data, but sent by
    the target's process), as the :class:`Answer` the gloo ranks would have given; :class:`Garbled`
    if it is malformed."""
    if not isinstance(reply, dict):
        raise Garbled(f"rank {rank} sent a {type(reply).__name__}, not an answer")
    raw_result = reply.get("result")
    result = None if raw_result is None else _checked(raw_result, rank)
    argument = _checked(reply.get("argument"), rank)
    returned = str(reply.get("returned"))
    raised = str(reply.get("raised", ""))
    in_place = returned in ("none", "argument") or bool(reply.get("shares_memory"))
    return Answer(
        {"none": "NoneType", "argument": "ndarray"}.get(returned, returned),
        None if raised or result is None else _view(result, in_place),
        _view(argument, in_place),
        raised,
        str(reply.get("traceback", "")),
        rank,
        returned == "none" and not raised,
        decode_raised_at(reply.get("raised_at")),
    )


def _stacks(stacks: Mapping[int, str]) -> str:
    return "".join(f"rank {r}:\n{stacks[r]}\n" for r in sorted(stacks))


def _raised(reply: object) -> bool:
    """Whether a rank's reply says its target raised (the others may be waiting for it in vain)."""
    return isinstance(reply, dict) and bool(reply.get("raised"))


def _stopped(case: Case, exc: RanksStopped) -> Outcome:
    """The outcome of a call whose ranks ``exc.stopped`` were killed after ranks ``exc.gave_up`` raised."""
    try:
        answers = tuple(decode_rank(exc.replies[r], r) for r in sorted(exc.replies))
    except Garbled as garbled:
        return Outcome(case, failure=Failure("crashed", f"a garbled answer: {garbled}"))
    raised = "".join(f"rank {a.rank} raised:\n{a.traceback}\n" for a in answers if a.raised)
    return Outcome(
        case,
        answers,
        note=stopped_note(exc.stopped, exc.gave_up, FAILURE_GRACE_S),
        stack=raised + _stacks(exc.stacks),
    )


class MpiRanks(Launcher):
    """``TARGET(comm, array)`` on every rank of an ``mpirun`` job of ``N`` ranks (see the module docstring).

    The jobs are started by the launcher of the MPI ``mpi4py`` uses (``mpiexec``:
    that launcher's path; ``None`` finds it, :mod:`ring_ref._processes._launchers`).
    ``mca`` is passed to OpenMPI's ``mpirun`` as ``--mca KEY VALUE`` (e.g.
    ``{"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": "4"}``
    for OpenMPI's ring all-reduce); ``env`` is set in every rank's environment (e.g.
    ``{"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}`` under MPICH); ``rings`` hands
    it jobs already started, by ``N`` (it closes them in :meth:`close` like its own).
    """

    isolated = True
    per_rank = True
    kind = "mpi"

    def __init__(
        self,
        target: str,
        timeout_s: float,
        mca: Mapping[str, str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        mpiexec: str | None = None,
        rings: Mapping[int, MpiJob] | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.mca = dict(mca or {})
        self.env = dict(env or {})
        self.mpiexec = mpiexec
        self.output = OutputLog()
        self._rings = PerSize(lambda n: MpiJob(n, mca=self.mca, env=self.env, mpiexec=self.mpiexec), rings)

    def start(self) -> None:
        """Start a job of one rank and load the target in it (:class:`TargetError` if it cannot)."""
        self._call(Case(1, 1, (), torch.float64, "contiguous", (0.0,)))

    def call(self, case: Case) -> Outcome:
        """Run the target on every rank of the job for ``case.n``; one answer per rank, or the failure."""
        try:
            return self._call(case)
        except TargetError as exc:
            return Outcome(case, failure=Failure("crashed", f"starting the ranks failed: {exc}"))

    def _call(self, case: Case) -> Outcome:
        if case.dtype not in MPI_DTYPES:
            raise ValueError(f"--ranks mpi takes {[str(d) for d in MPI_DTYPES]} only; got {case.dtype}")
        n = case.n
        ring = self._rings[n]
        inputs = [case.rank_tensor(r).numpy() for r in range(n)]
        payload = (
            self.target,
            inputs[0].dtype.name,
            tuple(inputs[0].shape),
            [x.tobytes() for x in inputs],
            case.op,
            case.result_shape(0) if case.collective.alone else None,
        )
        try:
            replies = ring.run(
                observe_rank, payload, timeout_s=self.timeout_s, trusted=False, gave_up=_raised
            )
        except RanksStopped as exc:
            return _stopped(case, exc)
        except RanksTimedOut as exc:
            return Outcome(
                case, failure=Failure("timed-out", str(exc), _stacks(exc.stacks), tuple(exc.pending))
            )
        except RankFailed as exc:
            return Outcome(case, failure=Failure("crashed", str(exc), _stacks(exc.stacks), tuple(exc.ranks)))
        except StartFailed as exc:  # its message says it all: the launcher assumed, its output
            raise TargetError(str(exc)) from exc
        except RuntimeError as exc:  # the launcher could not start the ranks (or is missing)
            raise TargetError(f"starting {n} MPI rank(s) failed: {exc}") from exc
        errors = [r["load_error"] for r in replies if isinstance(r, dict) and "load_error" in r]
        if errors:
            raise TargetError(errors[0])
        try:
            return Outcome(case, tuple(decode_rank(reply, rank) for rank, reply in enumerate(replies)))
        except Garbled as exc:
            ring.close()
            return Outcome(case, failure=Failure("crashed", f"a garbled answer: {exc}"))

    def close(self) -> None:
        """Stop every job."""
        self._rings.close()
