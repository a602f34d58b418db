"""Stacked all-reduces whose order moves with the size or the position, and ones whose order never moves.

Each is a plain loop over workers written here (no ``ring_ref``), so the trees
the invariance tests expect are the ones typed in beside them.  They are
module-level functions, loadable by name (``tests.common.planted_orders:NAME``) for
the command line.
"""

from __future__ import annotations

from collections.abc import Callable
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


# --- Targets that switch algorithm at a size, to a ring (issue #40: invariance over the whole buffer) ---

RING_ABOVE: Final = 64
"""``fold_then_ring`` folds up to this many elements per worker and runs a ring above it."""
RING_FROM: Final = 4096
"""``doubling_then_ring`` adds by recursive doubling below this many elements per worker, by a ring from it
on (OpenMPI 5's default all-reduce switches there for these sizes)."""


def blocks_ring(x: torch.Tensor) -> torch.Tensor:
    """A ring as OpenMPI cuts it: the first ``M mod N`` chunks one element longer, chunk ``c`` folded
    ``c, c + 1, ..., c + N - 1`` (mod ``N``): the spec's ring when ``N`` divides ``M``."""
    return _flat_ring(x, _blocks_cuts, 0, 1)


def recursive_doubling(x: torch.Tensor) -> torch.Tensor:
    """OpenMPI's recursive doubling: the first ``2 (N - P)`` workers add in pairs (``P`` the largest power
    of two up to ``N``), then the ``P`` partial sums pairwise: ``(x0 + x1) + x2`` for ``N = 3``."""
    rows: list[torch.Tensor] = list(x)
    extra = len(rows) - (1 << (len(rows).bit_length() - 1))
    rows = [rows[2 * i] + rows[2 * i + 1] for i in range(extra)] + rows[2 * extra :]
    return pairwise(torch.stack(rows))


def fold_then_ring(x: torch.Tensor) -> torch.Tensor:
    """A linear fold up to ``RING_ABOVE`` elements, a ring above: chunk 0 of the ring folds ``0, 1, ...``
    like the fold, so a probe at offset 0 alone sees no change."""
    return left_fold(x) if x.shape[1] <= RING_ABOVE else blocks_ring(x)


def doubling_then_ring(x: torch.Tensor) -> torch.Tensor:
    """Recursive doubling below ``RING_FROM`` elements, a ring from it on, as OpenMPI 5's default decision
    at ``N = 3``, where the ring's chunk 0 folds ``(x0 + x1) + x2`` like recursive doubling."""
    return recursive_doubling(x) if x.shape[1] < RING_FROM else blocks_ring(x)


# --- Rings as the libraries cut them (issue #40: presets told apart; issue #41: the libraries' presets) ---


def _blocks_cuts(n: int, s: int) -> list[tuple[int, int]]:
    """``floor(s / n)``-element chunks, the first ``s mod n`` one longer (OpenMPI)."""
    small, extra = divmod(s, n)
    return [(c * small + min(c, extra), (c + 1) * small + min(c + 1, extra)) for c in range(n)]


def _ceil_cuts(n: int, s: int) -> list[tuple[int, int]]:
    """``ceil(s / n)``-element chunks until the buffer ends (MPICH, MLX)."""
    size = -(-s // n)
    return [(min(c * size, s), min((c + 1) * size, s)) for c in range(n)]


def _floor_cuts(n: int, s: int) -> list[tuple[int, int]]:
    """``floor(s / n)``-element chunks, the rest on the last (Intel MPI)."""
    return [(c * (s // n), s if c == n - 1 else (c + 1) * (s // n)) for c in range(n)]


def _flat_ring(
    x: torch.Tensor, cuts: Callable[[int, int], list[tuple[int, int]]], start: int, step: int
) -> torch.Tensor:
    """Each chunk ``c`` of the flat buffer (``cuts``) folded over ``c + start, c + start + step, ...``."""
    n = int(x.shape[0])
    flat = x.reshape(n, -1)
    s = int(flat.shape[1])
    out = torch.empty(s, dtype=x.dtype)
    for c, (lo, hi) in enumerate(cuts(n, s)):
        acc = flat[(c + start) % n, lo:hi].clone()
        for j in range(1, n):
            acc = acc + flat[(c + start + j * step) % n, lo:hi]
        out[lo:hi] = acc
    return out.reshape(x.shape[1:])


def mpich_ring(x: torch.Tensor) -> torch.Tensor:
    """A ring as MPICH cuts it: ``ceil(M / N)``-element chunks of the flat buffer, the tail ones short or
    empty (3, 3, 3, 0 at ``M = 9``, ``N = 4``), chunk ``c`` folded ``c + 1, c + 2, ..., c`` (mod ``N``).

    At ``N = 3`` its trees are gloo's wherever the two layouts cut alike: at ``M = 2N``, ``2N - 1``, 64
    and 4096, not at ``M = 2N + 1`` (3, 3, 1 against gloo's 4, 3, 0)."""
    return _flat_ring(x, _ceil_cuts, 1, 1)


def intel_ring(x: torch.Tensor) -> torch.Tensor:
    """A ring as Intel MPI's ring allreduce (``I_MPI_ADJUST_ALLREDUCE=8``) cuts it: ``floor(M / N)``-element
    chunks of the flat buffer, the rest on the last (2, 2, 2, 3 at ``M = 9``, ``N = 4``), chunk ``c``
    folded ``c, c + 1, ..., c - 1`` (mod ``N``): the spec's ring when ``N`` divides ``M``."""
    return _flat_ring(x, _floor_cuts, 0, 1)


def mlx_ring(x: torch.Tensor) -> torch.Tensor:
    """A ring as MLX's ring backend runs it (one ring, ``M >= N``): ``ceil(M / N)``-element chunks of the
    flat buffer, the tail ones short or empty, rank ``i`` sending to ``i - 1``, chunk ``c`` folded
    ``c, c - 1, ..., c + 1`` (mod ``N``)."""
    return _flat_ring(x, _ceil_cuts, 0, -1)


def openmpi_ring_algorithm(x: torch.Tensor) -> torch.Tensor:
    """OpenMPI's ring algorithm as its source runs it: recursive doubling for fewer elements than workers
    (``count < size``), its ring on blocks from there on."""
    return recursive_doubling(x) if x[0].numel() < x.shape[0] else blocks_ring(x)


def mlx_all_sum(x: torch.Tensor) -> torch.Tensor:
    """MLX's ring ``all_sum`` as its source runs it: for fewer elements than workers the input padded to
    ``N`` one-element chunks and the ring run the other way (rank ``i`` sending to ``i + 1``: element ``c``
    folds ``c, c + 1, ...``), :func:`mlx_ring` from there on."""
    return _flat_ring(x, _ceil_cuts, 0, 1) if x[0].numel() < x.shape[0] else mlx_ring(x)
