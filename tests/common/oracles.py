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

import numpy as np
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


def ring_fold_op(x: torch.Tensor, op: str, direction: int = 1, offset: int = 0) -> torch.Tensor:
    """The closed-form ring result of ``x`` (shape ``(N, M, ...)``) for ``op`` (clauses ``op-*``).

    ``sum``/``prod``: the fold of chunk ``c`` over workers ``c + k, c + k + d, ...``
    (``d = direction``, ``k = offset``; the spec's ring ``c, c+1, ..., c-1`` by
    default) in the dtype; ``max``/``min``: the first extreme in that order, chosen in
    Python floats; ``avg``: the exact quotient of the ring's sum by ``N``,
    correctly rounded (through float64, innocuous for p <= 24, exact for float64).
    """
    n, m = x.shape[0], x.shape[1]
    k = m // n
    if op == "avg":
        total = ring_fold_op(x, "sum", direction, offset)
        # Fraction(-0.0) is 0: the sign of a zero sum is carried over by hand (-0.0 / N is -0.0);
        # an overflowed sum stays infinite.
        sums = total.to(torch.float64).reshape(-1).tolist()
        exact = [math.copysign(float(Fraction(v) / n), v) if math.isfinite(v) else v for v in sums]
        return torch.tensor(exact, dtype=torch.float64).to(x.dtype).reshape(total.shape)
    pieces = []
    for c in range(n):
        order = [(c + offset + step * direction) % n for step in range(n)]
        rows = [x[w, c * k : (c + 1) * k] for w in order]
        if op in ("sum", "prod"):
            acc = rows[0].clone()
            for row in rows[1:]:
                acc = acc + row if op == "sum" else acc * row
        else:
            flat = [row.to(torch.float64).reshape(-1).tolist() for row in rows]
            chosen = [_first_extreme([f[e] for f in flat], op == "max") for e in range(len(flat[0]))]
            acc = torch.tensor(chosen, dtype=torch.float64).to(x.dtype).reshape(rows[0].shape)
        pieces.append(acc)
    return torch.cat(pieces)


def reduce_scatter_fold(x: torch.Tensor, op: str = "sum", direction: int = 1) -> torch.Tensor:
    """Clause ``rsc-fold-order`` typed in from the spec: ``(N, M, ...)`` to ``(N, M / N, ...)``.

    Row ``r`` is chunk ``r`` (rows ``r M / N .. (r + 1) M / N - 1``) folded over the
    workers ``r + d, r + 2d, ..., r`` (mod ``N``), each step in the dtype.
    """
    n, m = x.shape[0], x.shape[1]
    return ring_fold_op(x, op, direction, direction).reshape(n, m // n, *x.shape[2:])


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


def schedule_fold_by_worker(
    x: torch.Tensor, direction: int, offset: int, bounds: list[tuple[int, int]]
) -> torch.Tensor:
    """:func:`schedule_fold` for all elements at once, one addition per step of the folds (large ``N``).

    Element ``e`` of chunk ``c`` is the left fold over workers ``c + k, c + k + d,
    ...`` (mod ``N``): step ``j`` adds, for every element together, worker
    ``c + k + j d``'s value of it, in the input dtype.
    """
    n = x.shape[0]
    flat = x.detach().reshape(n, -1).numpy()  # numpy adds float32 and float64 in their own dtype, rounded
    chunk = np.array([c for c, (lo, hi) in enumerate(bounds) for _ in range(lo, hi)], dtype=np.int64)
    columns = np.arange(flat.shape[1])
    acc = flat[(chunk + offset) % n, columns]
    for j in range(1, n):
        acc = acc + flat[(chunk + offset + j * direction) % n, columns]
    return torch.from_numpy(acc).reshape(x.shape[1:])


def blocks_bounds(n: int, s: int) -> list[tuple[int, int]]:
    """OpenMPI's blocks: the first ``s mod n`` chunks hold one element more."""
    sizes = [s // n + (1 if c < s % n else 0) for c in range(n)]
    starts = [sum(sizes[:c]) for c in range(n)]
    return [(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def ceil_bounds(n: int, s: int) -> list[tuple[int, int]]:
    """MPICH's and MLX's chunks: ``ceil(s / n)`` elements each until the buffer ends (3, 3, 3, 0 for
    ``s = 9``, ``n = 4``)."""
    size, left, ranges = (s + n - 1) // n, s, []
    for _ in range(n):
        take = min(size, left)
        ranges.append((s - left, s - left + take))
        left -= take
    return ranges


def floor_bounds(n: int, s: int) -> list[tuple[int, int]]:
    """Intel MPI's chunks: ``floor(s / n)`` elements each, the rest on the last (2, 2, 2, 3 for ``s = 9``,
    ``n = 4``)."""
    sizes = [s // n] * (n - 1) + [s - (n - 1) * (s // n)]
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


def shard_fold(x: torch.Tensor, r: int, direction: int, op: str = "sum") -> torch.Tensor:
    """Rank ``r``'s reduce-scatter shard of ``x`` ``(N, M, ...)``: rows ``r*M/N ...`` folded left over
    the ranks ``r + d, r + 2d, ..., r`` (mod ``N``), typed in from the convention.

    ``sum``/``prod`` combine in the dtype; ``max``/``min`` keep the first extreme (a tie keeps what
    came first); ``avg`` is the fold's sum divided by ``N`` exactly and rounded once.
    """
    n = x.shape[0]
    rows = x.shape[1] // n
    terms = [x[(r + j * direction) % n, r * rows : (r + 1) * rows] for j in range(1, n + 1)]
    acc = terms[0].clone()
    for term in terms[1:]:
        if op in ("sum", "avg"):
            acc = acc + term
        elif op == "prod":
            acc = acc * term
        else:
            acc = torch.where(term > acc if op == "max" else term < acc, term, acc)
    if op != "avg":
        return acc
    sums = acc.to(torch.float64).reshape(-1).tolist()
    exact = [math.copysign(float(Fraction(v) / n), v) for v in sums]
    return torch.tensor(exact, dtype=torch.float64).to(x.dtype).reshape(acc.shape)


def special_values(n: int, dtype: torch.dtype) -> torch.Tensor:
    """NaNs with payloads and signs, signed zeros, infinities and subnormals, as bit patterns."""
    width = torch.finfo(dtype).bits
    ints = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    mantissa = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}[dtype]
    exponent_all = ((1 << (width - 1 - mantissa)) - 1) << mantissa
    patterns = [
        exponent_all | 1,  # signalling-style NaN payload
        exponent_all | (1 << (mantissa - 1)) | 5,  # quiet NaN with a payload
        (1 << (width - 1)) | exponent_all | 3,  # negative NaN
        1 << (width - 1),  # -0.0
        0,
        1,  # the smallest subnormal
        exponent_all,  # +inf
        (1 << (width - 1)) | exponent_all,  # -inf
    ]
    signed = [p - (1 << width) if p >= 1 << (width - 1) else p for p in patterns]
    rows = [torch.tensor(signed, dtype=ints).roll(r) for r in range(n)]
    return torch.stack(rows).view(dtype).reshape(n, 4, 2)


def left_fold(x: torch.Tensor, op: str) -> torch.Tensor:
    """``((x_0 ∘ x_1) ∘ x_2) ∘ ...`` over the workers of ``x`` (``(N, M, ...)``), as spec/operations.md
    defines each op: sums and products in the dtype; ``max``/``min`` the first extreme met (``own`` replaces
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
