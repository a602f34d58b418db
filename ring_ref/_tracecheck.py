"""Trace-level differential check: compare an implementation with the reference round by round.

Output-only checking cannot see a fault whose damage a later round overwrites
(an extra reduce-scatter round, say, adds into slots that all-gather then
replaces).  This module compares *every round's buffers* instead.

The callback protocol
---------------------
The implementation under test is a function ``fn(worker_tensors, on_round)``
that returns its result (shape ``(M, ...)``) and, after every round it runs,
calls ``on_round(phase, round, buffers)`` with

* ``phase``: ``"reduce-scatter"`` or ``"all-gather"``;
* ``round``: the round number within the phase, ``0 .. N-2``;
* ``buffers``: a ``torch.Tensor`` of shape ``(N, M, ...)`` and the input's
  dtype, every worker's buffer after the round (row ``i`` is worker ``i``).

The checker copies ``buffers`` at once, so an implementation may keep updating
the same tensor in place.  With ``N = 1`` no round runs and ``on_round`` must
not be called.  Reports are compared in order with the reference's rounds
(:func:`ring_ref.schedule.all_rounds`), each slot bit for bit; the first
difference is named as ``(phase, round, worker, slot)``.

Every op of ``spec/operations.md`` (``op="sum"`` by default, ``"prod"``, ``"max"``,
``"min"``, ``"avg"``) reports the same rounds; the buffers hold the op's
partial results (clause ``op-trace``).  For ``avg`` they hold the ring's
*sums*, and the one division by ``N`` is checked in the result: an
implementation that divides before or during the rounds differs at the first
round it does so.


>>> import torch
>>> from ring_ref import ring_all_reduce
>>> def silent(x, on_round):  # right answer, but reports no rounds
...     return ring_all_reduce(x)
>>> print(first_mismatch(silent, torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
reduce-scatter round 0: not reported (the implementation reported 0 of the reference's 2 rounds)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ring_ref._dtypes import bits
from ring_ref._ops import Op, finish_torch, op_name, torch_combine
from ring_ref._torch_adapter import chunk_state
from ring_ref._validate import check_torch
from ring_ref.core import run_ring
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import REDUCE_SCATTER, Phase, all_rounds

RoundCallback = Callable[[str, int, torch.Tensor], None]
"""``on_round(phase, round, buffers)``: called by the implementation after every round."""

TracedImplementation = Callable[[torch.Tensor, RoundCallback], torch.Tensor]
"""``fn(worker_tensors, on_round) -> result``: an implementation that reports its rounds."""


class Mismatch(NamedTuple):
    """The first place an implementation's trace differs from the reference.

    ``worker`` and ``slot`` are ``None`` when the whole round is wrong (missing,
    extra, or of the wrong shape); ``phase`` is ``"result"`` for the returned value.
    """

    phase: str
    round: int
    worker: int | None
    slot: int | None
    reason: str

    def __str__(self) -> str:
        where = "result" if self.phase == "result" else f"{self.phase} round {self.round}"
        if self.worker is not None:
            where += f", worker {self.worker}"
        if self.slot is not None:
            where += f", slot {self.slot}"
        return f"{where}: {self.reason}"


class TraceMismatch(AssertionError):
    """An implementation's round-by-round trace differs from the reference's."""

    def __init__(self, mismatch: Mismatch) -> None:
        super().__init__(f"trace differs from the reference at {mismatch}")
        self.mismatch = mismatch


class RoundBuffers(NamedTuple):
    """One ``on_round`` call: the phase, the round and a private copy of the buffers."""

    phase: str
    round: int
    buffers: torch.Tensor


def reference_rounds(
    worker_tensors: torch.Tensor, op: str = "sum"
) -> tuple[tuple[RoundBuffers, ...], torch.Tensor]:
    """The reference's buffers after every round, and its result, for a valid input and ``op``.

    For ``avg`` the rounds hold sums and only the result is divided by ``N``.

    >>> import torch
    >>> rounds, result = reference_rounds(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    >>> [(r.phase, r.round, r.buffers.tolist()) for r in rounds]
    [('reduce-scatter', 0, [[1.0, 6.0], [4.0, 4.0]]), ('all-gather', 0, [[4.0, 6.0], [4.0, 6.0]])]
    >>> rounds, result = reference_rounds(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "max")
    >>> rounds[0].buffers.tolist(), result.tolist()
    ([[1.0, 4.0], [3.0, 4.0]], [3.0, 4.0])
    """
    the_op = op_name(op)
    check_torch(worker_tensors)
    x = worker_tensors.detach()
    rounds: list[RoundBuffers] = []

    def observe(phase: Phase, r: int, state: State[torch.Tensor], _prov: State[Provenance]) -> None:
        rounds.append(RoundBuffers(phase, r, torch.stack([torch.cat(row) for row in state])))

    final = run_ring(chunk_state(x), torch_combine(the_op), observe)
    return tuple(rounds), finish_torch(the_op, torch.cat(final[0]), len(final))


def record_rounds(
    fn: TracedImplementation, worker_tensors: torch.Tensor
) -> tuple[list[RoundBuffers], torch.Tensor]:
    """Run ``fn`` on ``worker_tensors`` and collect its reports (copied when made) and its result."""
    reports: list[RoundBuffers] = []

    def on_round(phase: str, r: int, buffers: torch.Tensor) -> None:
        if not isinstance(buffers, torch.Tensor):
            raise TypeError(
                f"on_round(phase, round, buffers) expects buffers as a torch.Tensor of shape (N, M, ...); "
                f"got {type(buffers).__name__} for {phase} round {r}. Pass every worker's buffer stacked."
            )
        reports.append(RoundBuffers(str(phase), int(r), buffers.detach().clone()))

    result = fn(worker_tensors, on_round)
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"the implementation must return a torch.Tensor; got {type(result).__name__}.")
    return reports, result


def _first_slot(phase: str, r: int, got: torch.Tensor, want: torch.Tensor, n: int) -> Mismatch | None:
    """The first ``(worker, slot)`` whose bits differ between two ``(N, M, ...)`` buffer tensors."""
    k = want.shape[1] // n
    got_bits, want_bits = bits(got), bits(want)
    for i in range(want.shape[0]):
        for c in range(n):
            g, w = got_bits[i, c * k : (c + 1) * k], want_bits[i, c * k : (c + 1) * k]
            if not torch.equal(g, w):
                at = int((g != w).flatten().nonzero()[0])
                gv = got[i, c * k : (c + 1) * k].flatten()[at].item()
                wv = want[i, c * k : (c + 1) * k].flatten()[at].item()
                return Mismatch(
                    phase, r, i, c, f"element {at} of the slot is {gv!r}, the reference has {wv!r}"
                )
    return None


def _round_mismatch(rep: RoundBuffers, ref: RoundBuffers, k: int, n: int) -> Mismatch | None:
    """How report ``k`` differs from the reference's round ``k``: its label, its shape, or a slot."""
    if (rep.phase, rep.round) != (ref.phase, ref.round):
        rs_rounds = ", ".join(str(r) for p, r in all_rounds(n) if p == REDUCE_SCATTER)
        return Mismatch(
            rep.phase,
            rep.round,
            None,
            None,
            f"unexpected round: the reference's round {k + 1} is {ref.phase} round {ref.round} "
            f"(reduce-scatter rounds: {rs_rounds or 'none'})",
        )
    if rep.buffers.shape != ref.buffers.shape or rep.buffers.dtype != ref.buffers.dtype:
        return Mismatch(
            rep.phase,
            rep.round,
            None,
            None,
            f"buffers are {tuple(rep.buffers.shape)} {rep.buffers.dtype}, expected "
            f"{tuple(ref.buffers.shape)} {ref.buffers.dtype} (every worker's buffer, stacked)",
        )
    return _first_slot(rep.phase, rep.round, rep.buffers.to(ref.buffers.device), ref.buffers, n)


def _result_mismatch(result: torch.Tensor, want: torch.Tensor, n: int, op: Op) -> Mismatch | None:
    if result.shape != want.shape or result.dtype != want.dtype:
        return Mismatch(
            "result",
            -1,
            None,
            None,
            f"result is {tuple(result.shape)} {result.dtype}, expected {tuple(want.shape)} {want.dtype}",
        )
    slot = _first_slot("result", -1, result.to(want.device)[None], want[None], n)
    if slot is None:
        return None
    if op == "avg":
        slot = slot._replace(reason=f"{slot.reason} (the ring's sum divided by N = {n} once, clause op-avg)")
    return slot._replace(worker=None)


def first_mismatch(
    fn: TracedImplementation, worker_tensors: torch.Tensor, op: str = "sum"
) -> Mismatch | None:
    """Run ``fn`` and the reference (for ``op``) on ``worker_tensors``; the first difference, or ``None``.

    Checked in order: each report's ``(phase, round)`` against the reference's
    next round (an extra or out-of-order round is named as reported), its shape
    and dtype, then every slot bit for bit; then missing rounds; then the result.
    """
    the_op = op_name(op)
    expected, want_result = reference_rounds(worker_tensors, the_op)
    reports, result = record_rounds(fn, worker_tensors)
    n = worker_tensors.shape[0]
    for k, rep in enumerate(reports):
        if k >= len(expected):
            return Mismatch(
                rep.phase,
                rep.round,
                None,
                None,
                f"extra round: the reference runs only {len(expected)} rounds",
            )
        mismatch = _round_mismatch(rep, expected[k], k, n)
        if mismatch is not None:
            return mismatch
    if len(reports) < len(expected):
        missing = expected[len(reports)]
        return Mismatch(
            missing.phase,
            missing.round,
            None,
            None,
            f"not reported (the implementation reported {len(reports)} of the reference's "
            f"{len(expected)} rounds)",
        )
    return _result_mismatch(result, want_result, n, the_op)


def check_trace(fn: TracedImplementation, worker_tensors: torch.Tensor, op: str = "sum") -> None:
    """Raise :class:`TraceMismatch` naming the first ``(phase, round, worker, slot)`` that differs.

    ``op`` is the reduction op both run (``spec/operations.md``; ``"sum"`` by default).
    """
    mismatch = first_mismatch(fn, worker_tensors, op)
    if mismatch is not None:
        raise TraceMismatch(mismatch)
