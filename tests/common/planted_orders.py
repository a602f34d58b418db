"""Stacked all-reduces whose order moves with the size or the position, and ones whose order never moves.

Each is a plain loop over workers written here (no ``ring_ref``), so the trees
the invariance tests expect are the ones typed in beside them.  They are
module-level functions, loadable by name (``tests.common.planted_orders:NAME``) for
the command line.
"""

from __future__ import annotations

from typing import Final

import torch

from tests.common.reveal_targets import linear_fold

THRESHOLD: Final = 64
"""``switching`` folds up to this many elements per worker and adds pairwise above it."""
BLOCK: Final = 8
"""``tail_path`` adds pairwise in whole blocks of this many elements; the last ``M mod 8`` fold backwards."""


left_fold = linear_fold
"""``((x0 + x1) + x2) + ...``: the same order for every element, size and position (reveal's
linear fold, one loop for both)."""


def pairwise(x: torch.Tensor) -> torch.Tensor:
    """Pairwise halving: ``(x0 + x1) + (x2 + x3)`` for ``N = 4`` (``N`` a power of two)."""
    rows: list[torch.Tensor] = list(x)
    while len(rows) > 1:
        rows = [rows[i] + rows[i + 1] for i in range(0, len(rows), 2)]
    return rows[0].clone()


def reverse_fold(x: torch.Tensor) -> torch.Tensor:
    """``((x_{N-1} + x_{N-2}) + ...) + x0``."""
    acc = x[-1].clone()
    for w in range(x.shape[0] - 2, -1, -1):
        acc = acc + x[w]
    return acc


def switching(x: torch.Tensor) -> torch.Tensor:
    """An implementation that switches algorithm above a size, as NCCL's tuner and OpenMPI's rules do."""
    return left_fold(x) if x.shape[1] <= THRESHOLD else pairwise(x)


def tail_path(x: torch.Tensor) -> torch.Tensor:
    """A vectorised sum: whole blocks of 8 elements pairwise, the last ``M mod 8`` folded backwards."""
    m = x.shape[1]
    whole = m - m % BLOCK
    return torch.cat([pairwise(x[:, :whole]), reverse_fold(x[:, whole:])])
