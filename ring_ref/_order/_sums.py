"""A tree's sum in a dtype: each addition rounded to it, a multiway node summed exactly, rounded once."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS, FloatFormat
from ring_ref._order._trees import Fold, Tree

__all__ = ["evaluate", "exact_sum"]


def evaluate(tree: Tree, x: torch.Tensor) -> torch.Tensor:
    """The tree's additions on ``x`` of shape ``(N, ...)``, each rounded to ``x``'s dtype; a multiway
    node the :func:`exact_sum` of its terms."""
    if isinstance(tree, int):
        return x[tree].clone()
    if isinstance(tree, Fold):
        workers = tree.order.tolist()
        total = torch.add(x[workers[0]], x[workers[1]])
        for w in workers[2:]:
            total = torch.add(total, x[w])
        return total
    if len(tree) == 2:
        return torch.add(evaluate(tree[0], x), evaluate(tree[1], x))
    return exact_sum(torch.stack([evaluate(child, x) for child in tree]))


def _quantum(values: npt.NDArray[np.float64], fmt: FloatFormat) -> npt.NDArray[np.float64]:
    """The spacing of ``fmt``'s values at each of ``values`` (its subnormal spacing below ``2**emin``)."""
    _, exponent = np.frexp(np.where(values == 0, 1.0, values))
    quantum: npt.NDArray[np.float64] = np.ldexp(1.0, np.maximum(exponent - 1, fmt.emin) - fmt.precision + 1)
    return quantum


def _round_to(values: npt.NDArray[np.float64], fmt: FloatFormat) -> npt.NDArray[np.float64]:
    """Float64 ``values`` correctly rounded to ``fmt`` (to nearest, ties to even; beyond it +-inf)."""
    quantum = _quantum(values, fmt)
    rounded = np.round(values / quantum) * quantum
    return np.where(np.abs(rounded) > fmt.max_finite, np.copysign(np.inf, values), rounded)


def exact_sum(parts: torch.Tensor) -> torch.Tensor:
    """The exact sum over the first axis of ``parts``, correctly rounded once to its dtype.

    Summed in float64 where that is exact (the terms' finest spacing and total
    magnitude within 53 bits), else per element with ``math.fsum`` (and, where
    that lands on a tie of a narrower dtype, the sign of its residual).

    >>> exact_sum(torch.tensor([[1.0], [2.0**-24], [2.0**-60]])).item() == 1 + 2.0**-23
    True
    """
    fmt = FORMATS[str(parts.dtype).removeprefix("torch.")]
    wide = parts.to(torch.float64).reshape(parts.shape[0], -1).numpy()
    total = wide.sum(axis=0)
    exact = np.abs(wide).sum(axis=0) < _quantum(wide, fmt).min(axis=0) * 2.0**53
    for e in np.flatnonzero(~exact & np.isfinite(wide).all(axis=0)).tolist():
        column = wide[:, e].tolist()
        total[e] = math.fsum(column)
        tie = fmt.precision < 53 and abs(total[e] / _quantum(total[e : e + 1], fmt)[0] % 1) == 0.5
        residual = math.fsum([*column, -total[e]]) if tie else 0.0
        if residual:
            total[e] = np.nextafter(total[e], math.copysign(math.inf, residual))
    rounded = _round_to(total, fmt) if fmt.precision < 53 else total
    return torch.from_numpy(rounded.reshape(parts.shape[1:])).to(parts.dtype)
