"""Oracles independent of ``ring_ref``: nothing here imports the package.

* ``ring_fold`` is the spec's closed form (clause ``fold-order``) written
  directly on tensors: chunk ``c`` is the left fold over workers
  ``c, c+1, ..., c-1``, each addition in the input dtype.
* ``exact_sum`` is the exact rational sum of every worker's element.
* ``spec_slot`` is the provenance closed form (clauses ``inv-rs-provenance``,
  ``inv-ag-provenance``) typed in from the spec.
* ``bits`` views a tensor's storage as integers so comparisons are bitwise.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import torch
import torch.distributed as dist

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}
"""Each op's name and its ``torch.distributed.ReduceOp``, typed in from torch's documentation."""

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
"""The spec's dtypes by name, in the spec's order, typed in from the spec (not from ``ring_ref._dtypes``)."""
INT_OF_BITS = {16: torch.int16, 32: torch.int32, 64: torch.int64}
"""The signed integer dtype of each width in bits, for reading and writing a float's bits."""
_INT_OF_SIZE = {bits // 8: dtype for bits, dtype in INT_OF_BITS.items()}


def ring_fold(x: torch.Tensor) -> torch.Tensor:
    """The closed-form ring all-reduce result of ``x`` of shape ``(N, M, ...)``."""
    n, m = x.shape[0], x.shape[1]
    k = m // n
    pieces = []
    for c in range(n):
        acc = x[c, c * k : (c + 1) * k]
        for step in range(1, n):
            acc = acc + x[(c + step) % n, c * k : (c + 1) * k]
        pieces.append(acc if n > 1 else acc.clone())
    return torch.cat(pieces)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as a contiguous integer tensor of the same shape."""
    return t.detach().contiguous().view(_INT_OF_SIZE[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape, dtype and bit patterns."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def exact_sum(x: torch.Tensor) -> list[Fraction]:
    """The exact rational sum over axis 0, flattened, of a finite float tensor."""
    flat = x.detach().to(torch.float64).reshape(x.shape[0], -1).tolist()
    return [sum((Fraction(row[j]) for row in flat), Fraction(0)) for j in range(len(flat[0]))]


def spec_slot(phase: str, r: int, i: int, c: int, n: int) -> list[int]:
    """Clauses inv-rs-provenance / inv-ag-provenance, typed in from the spec."""
    rs_last = n - 2
    if phase == "all-gather":
        if (i + 1 - c) % n <= r + 1:
            return [(c + k) % n for k in range(n)]
        r, phase = rs_last, "reduce-scatter"
    d = (i - c) % n
    return [(c + k) % n for k in range(d + 1)] if d <= r + 1 else [i]


def fold(terms: list[torch.Tensor]) -> torch.Tensor:
    """The left fold ``((t0 + t1) + t2) + ...`` in the input dtype."""
    acc = terms[0].clone()
    for t in terms[1:]:
        acc = acc + t
    return acc


def pairwise_tree(terms: list[torch.Tensor]) -> torch.Tensor:
    """Adjacent pairs summed level by level (an odd one out carried up), in the input dtype."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0].clone()


def sums_in_several_orders(x: torch.Tensor, rnd: random.Random) -> list[torch.Tensor]:
    """The sum over axis 0 in the input dtype: shuffled fold, its reverse, pairwise tree, ring, torch.sum."""
    workers = [x[i] for i in range(x.shape[0])]
    rnd.shuffle(workers)
    return [fold(workers), fold(workers[::-1]), pairwise_tree(workers), ring_fold(x), torch.sum(x, 0)]


def _first_extreme(values: list[float], greater: bool) -> float:
    """The first maximum (``greater``) or minimum of ``values`` in order, in Python floats."""
    best = values[0]
    for v in values[1:]:
        if (v > best) if greater else (v < best):
            best = v
    return best


def ring_fold_op(x: torch.Tensor, op: str) -> torch.Tensor:
    """The closed-form ring result of ``x`` (shape ``(N, M, ...)``) for ``op`` (clauses ``op-*``).

    ``sum``/``prod``: the fold of chunk ``c`` over workers ``c, c+1, ..., c-1``
    in the dtype; ``max``/``min``: the first extreme in that order, chosen in
    Python floats; ``avg``: the exact quotient of the ring's sum by ``N``,
    correctly rounded (through float64, innocuous for p <= 24, exact for float64).
    """
    n, m = x.shape[0], x.shape[1]
    k = m // n
    if op in ("sum", "avg"):
        total = ring_fold(x)
        if op == "sum":
            return total
        # Fraction(-0.0) is 0: the sign of a zero sum is carried over by hand (-0.0 / N is -0.0);
        # an overflowed sum stays infinite.
        sums = total.to(torch.float64).reshape(-1).tolist()
        exact = [math.copysign(float(Fraction(v) / n), v) if math.isfinite(v) else v for v in sums]
        return torch.tensor(exact, dtype=torch.float64).to(x.dtype).reshape(total.shape)
    pieces = []
    for c in range(n):
        order = [(c + step) % n for step in range(n)]
        rows = [x[w, c * k : (c + 1) * k] for w in order]
        if op == "prod":
            acc = rows[0].clone()
            for row in rows[1:]:
                acc = acc * row
        else:
            flat = [row.to(torch.float64).reshape(-1).tolist() for row in rows]
            chosen = [_first_extreme([f[e] for f in flat], op == "max") for e in range(len(flat[0]))]
            acc = torch.tensor(chosen, dtype=torch.float64).to(x.dtype).reshape(rows[0].shape)
        pieces.append(acc)
    return torch.cat(pieces)


def schedule_fold(
    x: torch.Tensor, direction: int, offset: int, bounds: list[tuple[int, int]]
) -> torch.Tensor:
    """Clause ``schedule-fold-order`` typed in from the spec, for any ring of the family.

    Each worker's elements in row-major order are cut at ``bounds`` (one
    ``(start, stop)`` per chunk); chunk ``c`` is the left fold over workers
    ``c + k, c + k + d, ...`` (mod ``N``), each addition in the input dtype.
    """
    n = x.shape[0]
    flat = x.reshape(n, -1)
    pieces = []
    for c, (lo, hi) in enumerate(bounds):
        order = [(c + offset + j * direction) % n for j in range(n)]
        acc = flat[order[0], lo:hi].clone()
        for w in order[1:]:
            acc = acc + flat[w, lo:hi]
        pieces.append(acc)
    return torch.cat(pieces).reshape(x.shape[1:])


def blocks_bounds(n: int, s: int) -> list[tuple[int, int]]:
    """OpenMPI's blocks: the first ``s mod n`` chunks hold one element more."""
    sizes = [s // n + (1 if c < s % n else 0) for c in range(n)]
    starts = [sum(sizes[:c]) for c in range(n)]
    return [(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def gloo_bounds(n: int, s: int, itemsize: int) -> list[tuple[int, int]]:
    """gloo's ring chunks, computed in bytes as ``gloo/allreduce.cc`` does (``kMaxSegmentSize`` = 1 MiB)."""
    total = s * itemsize
    max_segment = itemsize * max(1, (1 << 20) // itemsize)
    segments = max((total + max_segment - 1) // max_segment, 2 * n)
    segments += (-segments) % n
    per_rank = segments // n
    segment_bytes = (total + segments - 1) // segments
    segment_bytes += (-segment_bytes) % itemsize
    ranges = []
    for c in range(n):
        lo = min(c * per_rank * segment_bytes, total)
        hi = min((c + 1) * per_rank * segment_bytes, total)
        ranges.append((lo // itemsize, hi // itemsize))
    return ranges


def left_fold(x: torch.Tensor, op: str) -> torch.Tensor:
    """``((x_0 ∘ x_1) ∘ x_2) ∘ ...`` over the workers of ``x`` (``(N, M, ...)``), as spec section 9 defines
    each op: sums and products in the dtype; ``max``/``min`` the first extreme met (``own`` replaces
    the partial only when strictly greater or less); ``avg`` the sum divided once by ``N``, correctly
    rounded (through float64: exact for float64, innocuous double rounding for the narrower formats)."""
    n = x.shape[0]
    acc = x[0].clone()
    for w in range(1, n):
        own = x[w]
        if op in ("sum", "avg"):
            acc = acc + own
        elif op == "prod":
            acc = acc * own
        else:
            take = own > acc if op == "max" else own < acc
            acc = torch.where(take, own, acc)
    if op == "avg":
        acc = (acc.to(torch.float64) / n).to(x.dtype)
    return acc
