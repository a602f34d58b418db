"""All-reduce implementations for the differential tester's tests: planted bugs and correct ones.

Each buggy one carries the diagnosis code the tester must give it (``EXPECTED``).
The buffer-level ones are written here, worker by worker, on a copy of the
input; they take the schedule from :mod:`ring_ref.schedule`, never from the
reference's own round functions.  ``OP_EXPECTED`` holds the targets of the
other reduction ops (``fn(x, op=...)``, difftest ``--op``), correct and planted,
with the codes each mode must report.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import Report, difftest
from ring_ref.schedule import all_rounds, right, send_chunk
from tests.common.oracles import blocks_bounds, schedule_fold

Combine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _add(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return incoming + own


def _ring_in_place(buffers: torch.Tensor, *, gather_adds: bool = False, combine: Combine = _add) -> None:
    """Run the ring on ``buffers`` (shape ``(N, M, ...)``) in place, one worker's slot at a time.

    Each round first copies every outgoing chunk (so a value received in a
    round is never forwarded in it), then updates the receivers one by one:
    reduce-scatter stores ``combine(incoming, own)`` (by default adds),
    all-gather copies (or, planted, combines).
    """
    n, m = buffers.shape[0], buffers.shape[1]
    k = m // n
    for phase, r in all_rounds(n):
        outgoing = [(i, send_chunk(phase, i, r, n)) for i in range(n)]
        staged = [buffers[i, c * k : (c + 1) * k].clone() for i, c in outgoing]
        for (i, c), data in zip(outgoing, staged, strict=True):
            slot = buffers[right(i, n), c * k : (c + 1) * k]
            if phase == "reduce-scatter" or gather_adds:
                slot.copy_(combine(data, slot))
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


def narrows_float64(x: torch.Tensor) -> torch.Tensor:
    """Bug: sums float64 in float32 and widens the result back, as a target converting a float64 array with
    ``mlx.core.array`` (which makes float32 of it) does; every other dtype correctly."""
    if x.dtype != torch.float64:
        return ring_all_reduce(x)
    return ring_all_reduce(x.to(torch.float32)).to(torch.float64)


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


def chunks_rotated_at_three(x: torch.Tensor) -> torch.Tensor:
    """Bug at ``N = 3`` only: :func:`chunks_rotated`'s (zeros, the search's favourite input, pass)."""
    return chunks_rotated(x) if x.shape[0] == 3 else ring_all_reduce(x)


def rejects_non_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Bug: rejects valid non-contiguous input (as a C extension expecting dense memory might)."""
    if not x.is_contiguous():
        raise ValueError("expected a contiguous tensor")
    return ring_all_reduce(x)


def fast_engine(x: torch.Tensor) -> torch.Tensor:
    """Correct: the reference's fast engine (the same bits), called from the target's own process."""
    return ring_all_reduce(x, engine="fast")


def openmpi_ring_preset(x: torch.Tensor) -> torch.Tensor:
    """Correct under ``--schedule openmpi-ring``: the reference's preset, any ``M``."""
    return ring_all_reduce(x, schedule="openmpi-ring")


def gloo_preset(x: torch.Tensor) -> torch.Tensor:
    """Correct under ``--schedule gloo``: the reference's preset, any ``M``."""
    return ring_all_reduce(x, schedule="gloo")


def openmpi_ring_written_out(x: torch.Tensor) -> torch.Tensor:
    """Correct under ``--schedule openmpi-ring``: the spec's fold on OpenMPI's blocks, typed in."""
    return schedule_fold(x, 1, 0, blocks_bounds(x.shape[0], x[0].numel()))


def even_ring_ignoring_the_remainder(x: torch.Tensor) -> torch.Tensor:
    """Correct where ``N`` divides ``M`` (the spec's ring on ``M // N`` rows per chunk, typed in); the rows
    past the last chunk keep worker 0's values: at an M that N does not divide, no ring's fold."""
    n, m = x.shape[0], x.shape[1]
    out = x[0].clone()
    out[: m - m % n] = schedule_fold(x[:, : m - m % n], 1, 0, blocks_bounds(n, (m - m % n) * x[0, 0].numel()))
    return out


def drops_the_remainder(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Bug under ``--schedule openmpi-ring``: the last ``M mod N`` rows come back zero (a ring that cuts
    ``M // N`` rows per chunk and forgets the rest); correct wherever ``N`` divides ``M``."""
    n, m = x.shape[0], x.shape[1]
    out = ring_all_reduce(x, schedule="openmpi-ring", op=op).clone()
    out[m - m % n :] = 0
    return out


Impl = Callable[[torch.Tensor], torch.Tensor]

CORRECT: dict[str, Impl] = {
    "reference": ring_all_reduce,
    "in_place_ring": in_place_ring,
    "fast_engine": fast_engine,
}

EXPECTED: dict[Impl, set[str]] = {
    mean_instead_of_sum: {"mean-not-sum"},
    gather_adds: {"double-counted"},
    mutates_input: {"input-modified"},
    returns_view_of_input: {"aliases-input"},
    computes_in_float32: {"dtype-changed"},
    narrows_float64: {"narrowed-dtype"},
    stack_of_copies: {"wrong-shape"},
    raises_on_one_worker: {"raised"},
    drops_last_worker: {"out-of-bound"},
    moves_to_meta: {"device-changed"},
    chunks_rotated: {"out-of-bound"},
    rejects_non_contiguous: {"raised"},
}
"""Each planted bug and the exact set of codes every failing mode must report for it."""


# The other reduction ops: targets called as fn(x, op=...) (difftest --op).


def _first_max(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """The spec's max (clause op-max): own only when strictly greater, so ties keep the earlier value."""
    return torch.where(own > incoming, own, incoming)


def _first_min(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return torch.where(own < incoming, own, incoming)


def _last_max(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """A max that keeps the later value on ties (``numpy.maximum``'s second argument, in effect)."""
    return torch.where(own >= incoming, own, incoming)


def _last_min(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return torch.where(own <= incoming, own, incoming)


def _mul(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return incoming * own


_COMBINES: dict[str, Combine] = {"sum": _add, "avg": _add, "prod": _mul, "max": _first_max, "min": _first_min}


def _divide_once(total: torch.Tensor, n: int) -> torch.Tensor:
    """``total / n`` rounded once to the dtype (through float64: innocuous for 24 bits or fewer)."""
    return (total.to(torch.float64) / n).to(total.dtype)


def op_ring(x: torch.Tensor, op: str) -> torch.Tensor:
    """Correct for every op: the ring on a copy, receivers storing ``incoming op own``; avg divides once."""
    buffers = x.clone()
    _ring_in_place(buffers, combine=_COMBINES[op])
    result = buffers[0].clone()
    return _divide_once(result, x.shape[0]) if op == "avg" else result


def gloo_op_ring(x: torch.Tensor, op: str) -> torch.Tensor:
    """Right for every op under ``--schedule gloo`` (the reference's gloo ring); not the spec's order."""
    return ring_all_reduce(x, schedule="gloo", op=op)


def sums_whatever_the_op(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: ignores ``op`` and sums (for ``avg``: never divides)."""
    return ring_all_reduce(x)


def other_extreme(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: swaps max and min (a wrong entry in an op table)."""
    return ring_all_reduce(x, op={"max": "min", "min": "max"}.get(op, op))


def keeps_the_last_zero(x: torch.Tensor, op: str) -> torch.Tensor:
    """The ring with a max (min) that keeps the later value on ties: right by value, another zero where
    -0 and +0 tie (signed-zero, exact only)."""
    buffers = x.clone()
    _ring_in_place(buffers, combine=_last_max if op == "max" else _last_min)
    return buffers[0].clone()


def prod_in_torch_order(x: torch.Tensor, op: str) -> torch.Tensor:
    """A correct product in another order (``torch.prod``): not-ring-order under exact only."""
    return torch.prod(x, 0)


def gather_multiplies(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: all-gather multiplies the received chunk into the slot instead of copying it."""
    buffers = x.clone()
    _ring_in_place(buffers, gather_adds=True, combine=_mul)
    return buffers[0].clone()


def unsigned_zero_product(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: a zero product is written as +0 (its sign, the exclusive or of the signs, is lost)."""
    result = ring_all_reduce(x, op="prod")
    return torch.where(result == 0, torch.zeros_like(result), result)


def divides_first(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug (for avg as the spec defines it): each contribution divided by N before the ring sums them,
    as DDP scales gradients; a different rounding for N not a power of two."""
    return ring_all_reduce(x / x.shape[0])


def premultiplies(x: torch.Tensor, op: str) -> torch.Tensor:
    """NCCL's floating-point average (clause op-avg): each contribution times 1/N rounded, then the sum."""
    return ring_all_reduce(x * torch.tensor(1.0 / x.shape[0], dtype=torch.float64).to(x.dtype))


def multiplies_after_the_sum(x: torch.Tensor, op: str) -> torch.Tensor:
    """XLA's CPU ``pmean`` (measured, docs/guide/jax.md): the ring's sum, then times 1/N rounded to the
    dtype, a second rounding where the spec divides once."""
    return ring_all_reduce(x) * torch.tensor(1.0 / x.shape[0], dtype=torch.float64).to(x.dtype)


def op_chunks_rotated(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: all-gather stores each finished chunk one slot off, for any op."""
    return torch.roll(ring_all_reduce(x, op=op), shifts=x.shape[1] // x.shape[0], dims=0)


def drops_last_worker_op(x: torch.Tensor, op: str) -> torch.Tensor:
    """Bug: the last worker's contribution is lost, for any op (avg still divides by N).  The N - 1 others
    are reduced on a ring whose layout takes any M (N - 1 need not divide M, as at the probes' M = N)."""
    if x.shape[0] == 1:
        return x[0].clone()
    if op == "avg":
        return _divide_once(ring_all_reduce(x[:-1], schedule="openmpi-ring"), x.shape[0])
    return ring_all_reduce(x[:-1], op=op, schedule="openmpi-ring")


def max_is_sum(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Bug: ``torch.sum`` whatever the op.  Its first failure is at ``N = 1`` (``[[-0.0, 0.0]]``: the
    sum turns -0.0 into +0.0), where one worker tells no op from another: the op probes run at
    ``N = 2`` name it (``sum-not-op``, not ``signed-zero``)."""
    return torch.sum(x, 0)


OpImpl = Callable[..., torch.Tensor]
PASS: set[str] = set()
"""The expected codes of a mode that must pass."""

OP_EXPECTED: list[tuple[OpImpl, str, dict[str, set[str]]]] = [
    *(
        (op_ring, op, {"exact": PASS, "order-free": PASS, "bound": PASS})
        for op in ("prod", "max", "min", "avg")
    ),
    (sums_whatever_the_op, "max", {mode: {"sum-not-op"} for mode in ("exact", "order-free", "bound")}),
    (sums_whatever_the_op, "avg", {mode: {"sum-not-op"} for mode in ("exact", "order-free", "bound")}),
    (max_is_sum, "max", {mode: {"sum-not-op"} for mode in ("exact", "order-free", "bound")}),
    (other_extreme, "min", {mode: {"wrong-op"} for mode in ("exact", "order-free", "bound")}),
    (keeps_the_last_zero, "max", {"exact": {"signed-zero"}, "order-free": PASS, "bound": PASS}),
    (keeps_the_last_zero, "min", {"exact": {"signed-zero"}, "order-free": PASS, "bound": PASS}),
    (prod_in_torch_order, "prod", {"exact": {"not-ring-order"}, "order-free": PASS, "bound": PASS}),
    (gather_multiplies, "prod", {mode: {"double-counted"} for mode in ("exact", "order-free", "bound")}),
    (unsigned_zero_product, "prod", {mode: {"signed-zero"} for mode in ("exact", "order-free", "bound")}),
    # Each quotient x_i / N rounded, then summed, stays within the average's forward-error bound: only
    # exact and order-free (where the sum is exact and one rounding is the whole error) tell it apart.
    *(
        (fn, "avg", {"exact": {"avg-divided-first"}, "order-free": {"avg-divided-first"}, "bound": PASS})
        for fn in (divides_first, premultiplies)
    ),
    (
        multiplies_after_the_sum,
        "avg",
        {"exact": {"avg-times-reciprocal"}, "order-free": {"avg-times-reciprocal"}, "bound": PASS},
    ),
    *(
        (op_chunks_rotated, op, {mode: {"out-of-bound"} for mode in ("exact", "order-free", "bound")})
        for op in ("prod", "max", "min", "avg")
    ),
    *(
        (drops_last_worker_op, op, {mode: {"out-of-bound"} for mode in ("exact", "order-free", "bound")})
        for op in ("prod", "max", "min", "avg")
    ),
]
"""Per op target and op, the codes each mode must report (empty: the mode passes)."""

OP_SOAK: set[tuple[OpImpl, str]] = {
    (keeps_the_last_zero, "min"),
    (max_is_sum, "max"),  # every mode: test_ops.py's test_a_sum_failing_first_on_one_worker_is_sum_not_op
    (premultiplies, "avg"),
    *((op_chunks_rotated, op) for op in ("prod", "min", "avg")),
    *((drops_last_worker_op, op) for op in ("max", "min", "avg")),
}
"""The entries of :data:`OP_EXPECTED` only the soak test runs (the same code and path as another op's)."""


# --collective reduce-scatter / all-gather, stacked: (N, M, ...) -> (N, M/N, ...), (N, S, ...) -> (N*S, ...).


def _fold_chunks(x: torch.Tensor, owner: Callable[[int, int], int]) -> torch.Tensor:
    """Row ``r``: chunk ``owner(r, N)`` of the sum, folded left in the order ``c + 1, c + 2, ..., c``
    (``c`` that chunk; the spec's reduce-scatter ring), every addition rounded to the dtype."""
    n, rows = x.shape[0], x.shape[1] // x.shape[0]
    out = []
    for r in range(n):
        c = owner(r, n)
        piece = x[:, c * rows : (c + 1) * rows]
        total = piece[(c + 1) % n].clone()
        for j in range(2, n + 1):
            total = total + piece[(c + j) % n]
        out.append(total)
    return torch.stack(out)


def reduce_scatter_folded(x: torch.Tensor) -> torch.Tensor:
    """A correct reduce-scatter in the spec's reduce-scatter ring order (passes every mode)."""
    return _fold_chunks(x, lambda r, n: r)


def reduce_scatter_next_chunk(x: torch.Tensor) -> torch.Tensor:
    """Bug: rank r holds chunk r + 1 (``wrong-shard``)."""
    return _fold_chunks(x, lambda r, n: (r + 1) % n)


def reduce_scatter_by_torch_sum(x: torch.Tensor) -> torch.Tensor:
    """``torch.sum``'s shards: a correct reduce-scatter in another order (``not-ring-order``, exact only)."""
    n = x.shape[0]
    return torch.sum(x, 0).reshape(n, x.shape[1] // n, *x.shape[2:])


def all_gather_copied(x: torch.Tensor) -> torch.Tensor:
    """A correct all-gather: the shards, in rank order, copied (passes every mode)."""
    return x.reshape(-1, *x.shape[2:]).clone()


def all_gather_adds_zero(x: torch.Tensor) -> torch.Tensor:
    """Bug: the shards go through an addition of zero: -0 ends +0 (``gather-changed-bits``)."""
    return x.reshape(-1, *x.shape[2:]) + 0.0


def all_gather_reversed(x: torch.Tensor) -> torch.Tensor:
    """Bug: rank r's shard lands in slot N - 1 - r (``gather-misplaced``)."""
    return x.flip(0).reshape(-1, *x.shape[2:])


COLLECTIVE_EXPECTED: list[tuple[Impl, str, dict[str, set[str]]]] = [
    (reduce_scatter_folded, "reduce-scatter", {"exact": PASS, "order-free": PASS, "bound": PASS}),
    (
        reduce_scatter_next_chunk,
        "reduce-scatter",
        {m: {"wrong-shard"} for m in ("exact", "order-free", "bound")},
    ),
    (
        reduce_scatter_by_torch_sum,
        "reduce-scatter",
        {"exact": {"not-ring-order"}, "order-free": PASS, "bound": PASS},
    ),
    (all_gather_copied, "all-gather", {"exact": PASS, "order-free": PASS, "bound": PASS}),
    (
        all_gather_adds_zero,
        "all-gather",
        {m: {"gather-changed-bits"} for m in ("exact", "order-free", "bound")},
    ),
    (all_gather_reversed, "all-gather", {m: {"gather-misplaced"} for m in ("exact", "order-free", "bound")}),
]
"""Stacked reduce-scatter and all-gather targets: the collective and the codes each mode must report."""


def run_all(fn: Impl, examples: int = 15, seed: int = 20260101) -> Report:
    """The tester in every mode with a fixed seed, as the planted-implementation tests run it."""
    return difftest(fn, examples=examples, seed=seed)


# Misbehaving targets: what isolation must survive (tests/nocover/test_difftest_isolation.py).
# Each is importable by name, so the tester runs it in a worker process.


def exits_with_sys_exit(x: torch.Tensor) -> torch.Tensor:
    """Calls ``sys.exit(0)``: a ``SystemExit`` on every call (``raised``)."""
    sys.exit(0)


def exits_with_os_exit(x: torch.Tensor) -> torch.Tensor:
    """Ends its process with ``os._exit(0)`` (``crashed``, exit status 0)."""
    os._exit(0)


def sleeps_forever(x: torch.Tensor) -> torch.Tensor:
    """Never returns (``timed-out``)."""
    while True:
        time.sleep(3600)


def segfaults(x: torch.Tensor) -> torch.Tensor:
    """Reads address 0 (``crashed``, SIGSEGV)."""
    ctypes.string_at(0)
    return ring_all_reduce(x)


def raises_keyboard_interrupt(x: torch.Tensor) -> torch.Tensor:
    """Raises ``KeyboardInterrupt`` itself (``raised``)."""
    raise KeyboardInterrupt


_CALLS = itertools.count()


def wrong_every_other_call(x: torch.Tensor) -> torch.Tensor:
    """Right on even calls, off by one on odd ones (``nondeterministic``)."""
    result = ring_all_reduce(x)
    return result + 1 if next(_CALLS) % 2 else result


def patches_the_tester(x: torch.Tensor) -> torch.Tensor:
    """Makes every check in its own process say "pass", then returns twice the sum (``double-counted``)."""
    import ring_ref
    from ring_ref.difftest import _call, _diagnosis, _oracles, _search, _verdict

    # setattr: mypy refuses to assign a lambda over an overloaded function.
    setattr(ring_ref, "ring_all_reduce", lambda t: 2 * t.sum(0))  # noqa: B010
    setattr(torch, "equal", lambda *args, **kwargs: True)  # noqa: B010
    _oracles.check_values = lambda *args, **kwargs: _oracles.Checked(None)
    setattr(_search, "passes", lambda *args, **kwargs: (True, 0, 0))  # noqa: B010
    _verdict.passes = lambda *args, **kwargs: (True, 0, 0)
    _diagnosis.diagnose = lambda *args, **kwargs: None
    _call.input_problem = lambda *args, **kwargs: ""
    return 2 * x.sum(0)


def writes_over_the_tester_pipes(x: torch.Tensor) -> torch.Tensor:
    """Writes a fake "pass" into every file descriptor above 2 (``crashed``: a garbled reply)."""
    for fd in range(3, 256):
        with contextlib.suppress(OSError):
            os.write(fd, b'{"kind": "answer", "verdict": "pass"}')
    return 2 * x.sum(0)


def chatty_correct(x: torch.Tensor) -> torch.Tensor:
    """Correct, but writes to file descriptors 1 and 2 directly and through ``print``."""
    os.write(1, b"{ not json, on fd 1\n")
    os.write(2, b"on fd 2\n")
    print("printed", flush=False)
    return ring_all_reduce(x)


def leaves_a_thread_and_a_child(x: torch.Tensor) -> torch.Tensor:
    """Correct, but starts a non-daemon thread and a child process that never end.

    The child's process ID is appended to the file named by ``RING_REF_TEST_PIDFILE``, if set.
    """
    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    child = subprocess.Popen(["sleep", "3600"])
    pidfile = os.environ.get("RING_REF_TEST_PIDFILE")
    if pidfile:
        with open(pidfile, "a", encoding="utf-8") as f:
            f.write(f"{child.pid}\n")
    return ring_all_reduce(x)


def crashes_with_three_workers(x: torch.Tensor) -> torch.Tensor:
    """Correct except that it ends its process (status 3) when ``N = 3`` (``crashed``, then restarted)."""
    if x.shape[0] == 3:
        os._exit(3)
    return ring_all_reduce(x)


MISBEHAVING: dict[Impl, str] = {
    exits_with_sys_exit: "raised",
    exits_with_os_exit: "crashed",
    sleeps_forever: "timed-out",
    segfaults: "crashed",
    raises_keyboard_interrupt: "raised",
    wrong_every_other_call: "nondeterministic",
    patches_the_tester: "double-counted",
    writes_over_the_tester_pipes: "crashed",
    crashes_with_three_workers: "crashed",
}
"""Each misbehaving target and the one code each mode must report for it (run isolated)."""
