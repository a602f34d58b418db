"""``--ranks mpi``: a per-rank launcher whose ranks are an MPI job, ``TARGET(comm, array)`` on each.

:class:`MpiRanks` is a :class:`~ring_ref.difftest._launch.Launcher` with
``per_rank`` set, like :class:`~ring_ref.difftest._ranks.GlooRanks`, so every
check of a per-rank target applies unchanged.  It hands each case to an
:class:`~ring_ref.difftest._mpi.MpiTarget` (one ``mpirun`` per ``N``, started
on first use, restarted after a failure): rank ``r`` gets
``case.rank_tensor(r)`` as a ``numpy`` array (the same bits), and what each
rank did comes back as the same :class:`~ring_ref.difftest._call.Answer` the
gloo ranks give (the result's bits, the argument after the call, whether the
result shares the argument's memory, the exception), or as a
:class:`~ring_ref.difftest._call.Failure` (``timed-out`` with each unfinished
rank's stack, ``crashed`` with the dead rank).

With an op (``case.op``) each rank is called ``TARGET(comm, array, op=NAME)``.
``numpy`` has no bfloat16, so this launcher takes float16, float32 and
float64 cases only (:data:`MPI_DTYPES`); a target that cannot reduce float16
(``comm.Allreduce``: MPI has no such type) is reported as ``raised``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import torch

from ring_ref._dtypes import INT_OF_SIZE
from ring_ref._mpi_launch import MpiRing
from ring_ref.difftest._call import Answer, Failure, Outcome, TensorView
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._launch import Launcher, OutputLog
from ring_ref.difftest._loading import TargetError
from ring_ref.difftest._mpi import MpiTarget, RankAnswer

__all__ = ["MPI_DTYPES", "MpiRanks"]

MPI_DTYPES: Final = (torch.float16, torch.float32, torch.float64)
"""The dtypes a case may have under ``--ranks mpi`` (``numpy`` has no bfloat16)."""
_BY_NUMPY_NAME: Final = {str(d).removeprefix("torch."): d for d in MPI_DTYPES}
_WHOLE: Final = (0, 1)
"""A stand-in storage range: two views given it overlap (``_call._shares`` compares ranges)."""


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous strides (the ranks send every array's bits densely)."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _view(plain: tuple[str, tuple[int, ...], bytes], shares: bool) -> TensorView:
    """A rank's array as the checks read a tensor: ``torch.<dtype>`` and bits for the tester's dtypes."""
    name, shape, bits = plain
    dtype = _BY_NUMPY_NAME.get(name)
    storage = _WHOLE if shares else None
    if dtype is None:
        return TensorView(shape, _strides(shape), f"numpy.{name}", "cpu", storage)
    ints = INT_OF_SIZE[dtype.itemsize]
    flat = torch.frombuffer(bytearray(bits), dtype=ints) if bits else torch.empty(0, dtype=ints)
    return TensorView(shape, _strides(shape), str(dtype), "cpu", storage, flat.reshape(shape))


def _answer(got: RankAnswer) -> Answer:
    """One rank's :class:`RankAnswer` as the :class:`Answer` the gloo ranks would have given."""
    in_place = got.returned in ("none", "argument") or got.shares_memory
    result = None if got.raised or got.result is None else _view(got.result, in_place)
    type_name = {"none": "NoneType", "argument": "ndarray"}.get(got.returned, got.returned)
    return Answer(
        type_name,
        result,
        _view(got.argument, in_place),
        got.raised,
        got.traceback,
        got.rank,
        got.returned == "none" and not got.raised,
    )


class MpiRanks(Launcher):
    """``TARGET(comm, array)`` on every rank of an ``mpirun`` job of ``N`` ranks (see the module docstring).

    ``mca`` is passed to ``mpirun`` as ``--mca KEY VALUE`` (e.g.
    ``{"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": "4"}``
    for OpenMPI's ring all-reduce); ``rings`` hands it jobs already started, by
    ``N`` (as :class:`~ring_ref.difftest._mpi.MpiTarget` takes them: closed by :meth:`close`).
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
        rings: Mapping[int, MpiRing] | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.mca = dict(mca or {})
        self.output = OutputLog()
        self._mpi = MpiTarget(target, timeout_s, mca=self.mca, rings=rings)

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
        inputs = [case.rank_tensor(r).numpy() for r in range(case.n)]
        try:
            got = self._mpi.call(inputs, case.op)
        except RuntimeError as exc:  # mpirun could not start the ranks (or is missing)
            raise TargetError(f"starting {case.n} MPI rank(s) failed: {exc}") from exc
        if got.failure is not None:
            f = got.failure
            stack = "".join(f"rank {r}:\n{f.stacks[r]}\n" for r in sorted(f.stacks))
            return Outcome(case, failure=Failure(f.code, f.text, stack, tuple(f.ranks)))
        assert got.answers is not None
        return Outcome(case, tuple(_answer(a) for a in got.answers))

    def close(self) -> None:
        """Stop every job."""
        self._mpi.close()
