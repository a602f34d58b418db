"""All-reduce implementations for the differential tester's tests: planted bugs and correct ones.

Each buggy one carries the diagnosis code the tester must give it (``EXPECTED``).
The buffer-level ones are written here, worker by worker, on a copy of the
input; they take the schedule from :mod:`ring_ref.schedule`, never from the
reference's own round functions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import Report, difftest
from ring_ref.schedule import all_rounds, right, send_chunk


def _ring_in_place(buffers: torch.Tensor, *, gather_adds: bool = False) -> None:
    """Run the ring on ``buffers`` (shape ``(N, M, ...)``) in place, one worker's slot at a time.

    Each round first copies every outgoing chunk (so a value received in a
    round is never forwarded in it), then updates the receivers one by one:
    reduce-scatter adds, all-gather copies (or, planted, adds).
    """
    n, m = buffers.shape[0], buffers.shape[1]
    k = m // n
    for phase, r in all_rounds(n):
        outgoing = [(i, send_chunk(phase, i, r, n)) for i in range(n)]
        staged = [buffers[i, c * k : (c + 1) * k].clone() for i, c in outgoing]
        for (i, c), data in zip(outgoing, staged, strict=True):
            slot = buffers[right(i, n), c * k : (c + 1) * k]
            if phase == "reduce-scatter" or gather_adds:
                slot.add_(data)
            else:
                slot.copy_(data)


def in_place_ring(x: torch.Tensor) -> torch.Tensor:
    """Correct: the same schedule on a copy of the input, buffers updated in place worker by worker."""
    buffers = x.clone()
    _ring_in_place(buffers)
    return buffers[0].clone()


def torch_sum(x: torch.Tensor) -> torch.Tensor:
    """Correct sum, different order: fails only ``exact`` (not-ring-order)."""
    return torch.sum(x, 0)


def mean_instead_of_sum(x: torch.Tensor) -> torch.Tensor:
    """Bug: divides by N."""
    return ring_all_reduce(x) / x.shape[0]


def gather_adds(x: torch.Tensor) -> torch.Tensor:
    """Bug: all-gather adds the received chunk instead of copying it."""
    buffers = x.clone()
    _ring_in_place(buffers, gather_adds=True)
    return buffers[0].clone()


def mutates_input(x: torch.Tensor) -> torch.Tensor:
    """Bug: runs the ring on the caller's tensor; the result is a copy."""
    _ring_in_place(x)
    return x[0].clone()


def returns_view_of_input(x: torch.Tensor) -> torch.Tensor:
    """Bug: with one worker returns ``x[0]`` itself, a view sharing the input's storage."""
    return x[0] if x.shape[0] == 1 else ring_all_reduce(x)


def computes_in_float32(x: torch.Tensor) -> torch.Tensor:
    """Bug: sums in float32 and returns float32 whatever the input dtype."""
    return ring_all_reduce(x.to(torch.float32))


def stack_of_copies(x: torch.Tensor) -> torch.Tensor:
    """Bug: returns every worker's buffer, shape ``(N, M, ...)``."""
    return torch.stack([ring_all_reduce(x)] * x.shape[0])


def raises_on_one_worker(x: torch.Tensor) -> torch.Tensor:
    """Bug: rejects the valid ``N = 1`` input."""
    if x.shape[0] == 1:
        raise ValueError("a ring needs at least two workers")
    return ring_all_reduce(x)


def drops_last_worker(x: torch.Tensor) -> torch.Tensor:
    """Bug: the last worker's contribution is lost."""
    return x[:-1].sum(0) if x.shape[0] > 1 else x[0].clone()


def moves_to_meta(x: torch.Tensor) -> torch.Tensor:
    """Bug: returns the result on another device."""
    return ring_all_reduce(x).to("meta")


def chunks_rotated(x: torch.Tensor) -> torch.Tensor:
    """Bug: all-gather stores each finished chunk one slot off (every contribution counted once)."""
    return torch.roll(ring_all_reduce(x), shifts=x.shape[1] // x.shape[0], dims=0)


def rejects_non_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Bug: rejects valid non-contiguous input (as a C extension expecting dense memory might)."""
    if not x.is_contiguous():
        raise ValueError("expected a contiguous tensor")
    return ring_all_reduce(x)


Impl = Callable[[torch.Tensor], torch.Tensor]

CORRECT: dict[str, Impl] = {"reference": ring_all_reduce, "in_place_ring": in_place_ring}

EXPECTED: dict[Impl, set[str]] = {
    mean_instead_of_sum: {"mean-not-sum"},
    gather_adds: {"double-counted"},
    mutates_input: {"input-modified"},
    returns_view_of_input: {"aliases-input"},
    computes_in_float32: {"dtype-changed"},
    stack_of_copies: {"wrong-shape"},
    raises_on_one_worker: {"raised"},
    drops_last_worker: {"out-of-bound"},
    moves_to_meta: {"device-changed"},
    chunks_rotated: {"out-of-bound"},
    rejects_non_contiguous: {"raised"},
}
"""Each planted bug and the exact set of codes every failing mode must report for it."""


def run_all(fn: Impl, examples: int = 15, seed: int = 20260101) -> Report:
    """The tester in every mode with a fixed seed, as the planted-implementation tests run it."""
    return difftest(fn, examples=examples, seed=seed)
