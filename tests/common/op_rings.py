"""A ring for every reduction op, typed in from spec/operations.md, with switches that plant real bugs.

Nothing here imports ``ring_ref``: the schedule (worker ``i`` sends to ``i + 1``;
reduce-scatter round ``r`` sends chunk ``(i - r) mod N``, all-gather round ``r``
chunk ``(i + 1 - r) mod N``) and the combines are written out from the spec.
``op_ring`` runs on one stacked ``(N, M, ...)`` buffer tensor and may report
every round through ``on_round(phase, round, buffers)`` (the protocol of
``ring_ref.testing.check_trace``).

The faults (``fault=``), each a bug people write:

* ``"sum-not-op"``: reduce-scatter adds whatever the op (and ``avg`` is not divided);
* ``"own-on-tie"``: ``max``/``min`` keep ``own`` when the two compare equal
  (``numpy.maximum(incoming, own)``, ``own >= incoming``): the other zero wins a ``-0``/``+0`` tie;
* ``"max-for-min"``: ``min`` takes the larger;
* ``"op-in-all-gather"``: all-gather combines by the op (``avg``: adds) instead of copying;
* ``"divide-first"``: ``avg`` divides every contribution by ``N`` (rounded) before the ring;
* ``"premultiply"``: ``avg`` multiplies every contribution by ``1/N`` rounded to the dtype
  before the ring (NCCL's ``PreMulSum`` for floating-point ``ncclAvg``);
* ``"reciprocal"``: ``avg`` multiplies the ring's sum by ``1/N`` rounded to the dtype;
* ``"divide-when-finished"``: ``avg`` divides each chunk where it is finished, at the end of
  reduce-scatter, and all-gather copies the quotient: the same result, other round buffers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reporter = Callable[[str, int, torch.Tensor], None]

FAULTS = (
    "sum-not-op",
    "own-on-tie",
    "max-for-min",
    "op-in-all-gather",
    "divide-first",
    "premultiply",
    "reciprocal",
    "divide-when-finished",
)


def combine(op: str, incoming: torch.Tensor, own: torch.Tensor, fault: str | None = None) -> torch.Tensor:
    """What a reduce-scatter receiver stores for ``op`` (clauses ``op-*``), or the planted variant."""
    if op in ("sum", "avg") or fault == "sum-not-op":
        return incoming + own
    if op == "prod":
        return incoming * own
    larger = op == "max" or fault == "max-for-min"
    if fault == "own-on-tie":
        keep_own = own >= incoming if larger else own <= incoming
    else:
        keep_own = own > incoming if larger else own < incoming
    return torch.where(keep_own, own, incoming)


def divide(total: torch.Tensor, n: int) -> torch.Tensor:
    """``total / n`` correctly rounded to the dtype (via float64: ``53 >= 2p + 2`` for p <= 24)."""
    return (total.to(torch.float64) / n).to(total.dtype)


def reciprocal(n: int, dtype: torch.dtype) -> torch.Tensor:
    """``1/n`` rounded to ``dtype``."""
    return torch.tensor(1.0 / n, dtype=torch.float64).to(dtype)


def _finish(result: torch.Tensor, op: str, n: int, fault: str | None) -> torch.Tensor:
    """``avg``'s one division of worker 0's buffer, or the planted variant; the buffer for other ops."""
    if op != "avg" or fault in ("sum-not-op", "divide-first", "premultiply", "divide-when-finished"):
        return result
    if fault == "reciprocal":
        return result * reciprocal(n, result.dtype)
    return divide(result, n)


def op_ring(
    x: torch.Tensor,
    op: str,
    on_round: Reporter | None = None,
    *,
    fault: str | None = None,
) -> torch.Tensor:
    """Worker 0's final buffer of the ring for ``op`` on ``x`` (shape ``(N, M, ...)``)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}")
    n, m = x.shape[0], x.shape[1]
    k = m // n
    buf = x.detach().clone()
    if fault == "divide-first":
        buf = divide(buf, n)
    elif fault == "premultiply":
        buf = buf * reciprocal(n, x.dtype)

    def rows(c: int) -> slice:
        return slice(c * k, (c + 1) * k)

    def report(phase: str, r: int) -> None:
        if on_round is not None:
            on_round(phase, r, buf)

    for r in range(n - 1):
        old = buf.clone()
        for i in range(n):
            src = (i - 1) % n
            c = (src - r) % n
            buf[i, rows(c)] = combine(op, old[src, rows(c)], old[i, rows(c)], fault)
        if fault == "divide-when-finished" and r == n - 2:
            for i in range(n):
                c = (i + 1) % n
                buf[i, rows(c)] = divide(buf[i, rows(c)], n)
        report("reduce-scatter", r)
    for r in range(n - 1):
        old = buf.clone()
        for i in range(n):
            src = (i - 1) % n
            c = (src + 1 - r) % n
            if fault == "op-in-all-gather":
                buf[i, rows(c)] = combine(op, old[src, rows(c)], old[i, rows(c)])
            else:
                buf[i, rows(c)] = old[src, rows(c)]
        report("all-gather", r)
    return _finish(buf[0].clone(), op, n, fault)
