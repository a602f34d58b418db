"""A per-rank target ``TARGET(comm, array)`` on every rank of an MPI job: the MPI half of ``--ranks mpi``.

:class:`MpiTarget` keeps one :class:`~ring_ref._mpi_launch.MpiRing` per ``N``
(started on first use, restarted after a failure) and :meth:`MpiTarget.call`
runs the target once on every rank: rank ``i`` gets its own fresh, contiguous,
writeable ``numpy`` array holding ``inputs[i]``, and a duplicate of the job's
``COMM_WORLD`` (and, when an op is asked for, ``op=`` its name:
``fn(comm, array, op="max")``).  A rank's *result* is the array the target returns, or, when it
returns ``None``, the array itself after the call (in place, like
``comm.Allreduce(MPI.IN_PLACE, ...)``).

The target is imported by name in the ranks only (never in the tester), and
each rank answers with plain data (:func:`observe`: bits, shapes, dtype names,
strings), which the tester reads without building any object the ranks chose
(``MpiRing.run(trusted=False)``).  How the call failed, if it did, is a
:class:`RanksFailure`: ``timed-out`` (with each unfinished rank's Python stack,
and what the finished ranks said) or ``crashed`` (the rank whose process died).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from ring_ref._mpi_launch import MpiRing, RankFailed, RanksTimedOut
from ring_ref.difftest._loading import TargetError, load_target

__all__ = ["MpiTarget", "RankAnswer", "RanksCall", "RanksFailure", "observe"]

_LOADED: dict[str, Any] = {}
"""Targets already imported in this rank, by name."""
_NUMERIC_KINDS: Final = "biufc"
"""Arrays of these dtype kinds (bool, integers, floats, complex) travel back as bits; others do not."""


@dataclass(frozen=True)
class RankAnswer:
    """What the target did on one rank.

    ``returned`` is ``"none"``, ``"argument"`` (the array it was given),
    ``"ndarray"`` (another array) or the type name of anything else;
    ``result`` is ``(dtype, shape, bits)`` of the rank's result (``None`` when
    it returned something that is not an array); ``argument`` the same for the
    array it was given, after the call; ``shares_memory`` whether a returned
    array other than the argument overlaps it; ``raised`` and ``traceback``
    describe an exception.
    """

    rank: int
    returned: str
    result: tuple[str, tuple[int, ...], bytes] | None
    argument: tuple[str, tuple[int, ...], bytes]
    shares_memory: bool = False
    raised: str = ""
    traceback: str = ""

    def result_array(self) -> npt.NDArray[Any] | None:
        """The result rebuilt as an array (``None`` if there is none)."""
        return None if self.result is None else _array(*self.result)

    def argument_array(self) -> npt.NDArray[Any]:
        """The argument after the call, rebuilt."""
        return _array(*self.argument)


@dataclass(frozen=True)
class RanksFailure:
    """A call that did not answer on every rank: which ranks, why, and where they were."""

    code: Literal["timed-out", "crashed"]
    text: str
    ranks: list[int]
    stacks: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RanksCall:
    """One call of the target on every rank: the answers, or the failure; and how long it took."""

    answers: list[RankAnswer] | None
    failure: RanksFailure | None
    seconds: float


def _array(dtype: str, shape: tuple[int, ...], bits: bytes) -> npt.NDArray[Any]:
    return np.frombuffer(bits, dtype=np.dtype(dtype)).reshape(shape).copy()


def _plain(array: npt.NDArray[Any]) -> tuple[str, tuple[int, ...], bytes]:
    return array.dtype.name, tuple(int(d) for d in array.shape), np.ascontiguousarray(array).tobytes()


def observe(comm: Any, payload: tuple[str, str, tuple[int, ...], list[bytes], str | None]) -> dict[str, Any]:
    """On one rank: call the target on this rank's input and describe what it did, as plain data.

    ``payload``: the target's name, the dtype and shape, every rank's input bytes, and the op's
    name (``None``: call without ``op=``).
    """
    name, dtype, shape, inputs, op = payload
    rank = comm.Get_rank()
    try:
        fn = _LOADED[name] if name in _LOADED else _LOADED.setdefault(name, load_target(name))
    except TargetError as exc:
        return {"load_error": str(exc)}
    array = np.frombuffer(inputs[rank], dtype=np.dtype(dtype)).reshape(shape).copy()
    raised, text, returned = "", "", None
    try:
        returned = fn(comm, array) if op is None else fn(comm, array, op=op)
    except BaseException as exc:  # a target's SystemExit or KeyboardInterrupt is its answer too
        raised = f"{type(exc).__name__}: {exc}"
        text = "".join(traceback.format_exception(exc))
    answer: dict[str, Any] = {"rank": rank, "raised": raised, "traceback": text, "argument": _plain(array)}
    if returned is None:
        answer.update(returned="none", result=None if raised else _plain(array), shares_memory=False)
    elif returned is array:
        answer.update(returned="argument", result=_plain(array), shares_memory=False)
    elif isinstance(returned, np.ndarray) and returned.dtype.kind in _NUMERIC_KINDS:
        shares = bool(np.shares_memory(returned, array))
        answer.update(returned="ndarray", result=_plain(returned), shares_memory=shares)
    else:
        answer.update(returned=type(returned).__name__, result=None, shares_memory=False)
    return answer


def _answer(reply: object, rank: int) -> RankAnswer:
    """A rank's reply checked field by field (plain data, but sent by the target's process)."""
    if not isinstance(reply, dict):
        raise ValueError(f"rank {rank} sent a {type(reply).__name__}, not an answer")

    def view(value: object) -> tuple[str, tuple[int, ...], bytes]:
        if not (isinstance(value, tuple) and len(value) == 3):
            raise ValueError(f"rank {rank}: a malformed array in its answer")
        dtype, shape, bits = value
        try:
            numeric = isinstance(dtype, str) and np.dtype(dtype).kind in _NUMERIC_KINDS
        except TypeError:
            numeric = False
        if not numeric:
            raise ValueError(f"rank {rank}: dtype {dtype!r}")
        if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError(f"rank {rank}: shape {shape!r}")
        if not isinstance(bits, bytes) or len(bits) != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            raise ValueError(
                f"rank {rank}: {len(bits) if isinstance(bits, bytes) else '?'} bytes for {shape}"
            )
        return dtype, shape, bits

    result = reply.get("result")
    return RankAnswer(
        rank=rank,
        returned=str(reply.get("returned")),
        result=None if result is None else view(result),
        argument=view(reply.get("argument")),
        shares_memory=bool(reply.get("shares_memory")),
        raised=str(reply.get("raised", "")),
        traceback=str(reply.get("traceback", "")),
    )


class MpiTarget:
    """``target`` (``module:function`` or ``file.py:function``) called on every rank of an MPI job.

    ``mca`` is passed to every job it starts; ``rings`` hands it jobs already
    made, by ``N`` (it closes them in :meth:`close` like its own).
    """

    def __init__(
        self,
        target: str,
        timeout_s: float,
        *,
        mca: Mapping[str, str] | None = None,
        rings: Mapping[int, MpiRing] | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.mca = dict(mca or {})
        self._rings: dict[int, MpiRing] = dict(rings or {})

    def call(self, inputs: Sequence[npt.NDArray[Any]], op: str | None = None) -> RanksCall:
        """Run the target once on ``len(inputs)`` ranks, rank ``i`` on ``inputs[i]`` (with ``op=op``
        unless ``op`` is ``None``).

        :class:`ring_ref.difftest._loading.TargetError` if the ranks cannot load it.
        """
        n = len(inputs)
        ring = self._rings.get(n) or self._rings.setdefault(n, MpiRing(n, mca=self.mca))
        first = np.asarray(inputs[0])
        payload = (
            self.target,
            first.dtype.name,
            tuple(first.shape),
            [np.ascontiguousarray(x).tobytes() for x in inputs],
            op,
        )
        start = time.monotonic()
        try:
            replies = ring.run(observe, payload, timeout_s=self.timeout_s, trusted=False)
        except RanksTimedOut as exc:
            return RanksCall(
                None, RanksFailure("timed-out", str(exc), exc.pending, exc.stacks), time.monotonic() - start
            )
        except RankFailed as exc:
            code: Literal["timed-out", "crashed"] = "crashed"
            return RanksCall(
                None, RanksFailure(code, str(exc), exc.ranks, exc.stacks), time.monotonic() - start
            )
        seconds = time.monotonic() - start
        errors = [r["load_error"] for r in replies if isinstance(r, dict) and "load_error" in r]
        if errors:
            raise TargetError(errors[0])
        try:
            return RanksCall([_answer(reply, rank) for rank, reply in enumerate(replies)], None, seconds)
        except ValueError as exc:
            ring.close()
            return RanksCall(None, RanksFailure("crashed", f"a garbled answer: {exc}", []), seconds)

    def close(self) -> None:
        """Stop every job this target started."""
        while self._rings:
            self._rings.popitem()[1].close()
