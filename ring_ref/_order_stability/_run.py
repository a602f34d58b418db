"""``invariance()``: the probe region in every placement, its trees revealed (or its bits compared), and the
result.

Reveal mode (clause ``invariance-reveal``): for every batch of placements (at
one size, regions that do not overlap), :func:`ring_ref._reveal.reveal` on the
target seen through :class:`~ring_ref._order_stability._placement.Embedded`, so each
probed element's tree is the target's own for that element at that size and
offset.  By bits
(clause ``invariance-by-bits``): random probe values all-reduced alone
(``M = K``, offset 0) and inside larger buffers of random values at every
placement, their bits compared; a few draws, no reveal, any target kind and
any ``N``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Final

import torch

from ring_ref._dtypes import to_hex
from ring_ref._names import INVARIANCE_DRAWS
from ring_ref._order_stability._placement import Embedded, InvarianceError, Placement, batches, placements
from ring_ref._order_stability._report import Invariance, Method
from ring_ref._reveal import CHECKS, check_reveal_size, reveal
from ring_ref._reveal._target import REVEAL_DTYPES
from ring_ref.difftest import load_target
from ring_ref.difftest._job import job_size, run_in_job, run_in_mpi_job
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._options import rank_launcher
from ring_ref.difftest._orders import per_rank_target
from ring_ref.difftest._rules import IN_JOB, Options, Spawn, spawn_refused
from ring_ref.difftest._vocabulary import DEFAULT_TIMEOUT_S, RANKS, Ranks

__all__ = ["BITS_DRAWS", "invariance"]

BITS_DRAWS: Final = INVARIANCE_DRAWS
"""Random probe inputs a ``--by-bits`` screen tries (each in every placement) before it calls the bits
invariant."""

_EXPONENTS: Final = 8
"""Random values are ``±(1 + u) 2^e``, ``e`` in ``-8 .. 8``: wide enough that most orders round apart."""


def _random(shape: tuple[int, int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Random values of both signs over ``2^16`` of magnitude, exactly representable in ``dtype``."""
    sign = torch.randint(0, 2, shape, generator=generator, dtype=torch.float64) * 2 - 1
    mantissa = 1 + torch.rand(shape, generator=generator, dtype=torch.float64)
    exponent = torch.randint(-_EXPONENTS, _EXPONENTS + 1, shape, generator=generator, dtype=torch.float64)
    return (sign * mantissa * torch.exp2(exponent)).to(dtype)


def _by_bits(
    fn: Callable[[torch.Tensor], object],
    *,
    n: int,
    k: int,
    order: list[Placement],
    dtype: str,
    draws: int,
    seed: int,
) -> tuple[list[list[Hashable]], list[list[float]] | None, int]:
    """``(outcomes, counterexample, calls)``: bits per placement, from the first draw where any differ."""
    generator = torch.Generator().manual_seed(seed)
    torch_dtype = REVEAL_DTYPES[dtype]
    outcomes: list[list[Hashable]] = []
    calls = 0
    for _ in range(draws):
        x = _random((n, k), torch_dtype, generator)
        outcomes = []
        for p in order:
            fill = None if p == order[0] else _random((n, p.m), torch_dtype, generator)
            outcomes.append(list(to_hex(Embedded(fn, p, fill)(x))))
            calls += 1
        if any(o != outcomes[0] for o in outcomes):
            rows: list[list[float]] = x.to(torch.float64).tolist()
            return outcomes, rows, calls
    return outcomes, None, calls


def _check(n: int, k: int, dtype: str, *, by_bits: bool, draws: int, checks: int) -> None:
    if dtype not in ("float32", "float64"):
        raise InvarianceError(f"invariance supports dtype float32 or float64; got {dtype!r}")
    if by_bits:
        if n < 1:
            raise InvarianceError(f"N = {n} must be at least 1")
        if draws < 1:
            raise InvarianceError(f"draws must be 1 or more; got {draws}")
    else:
        check_reveal_size(n, k, dtype)
    if checks < 0:
        raise InvarianceError(f"checks must be 0 or more; got {checks}")


def _refuse(target: Callable[[torch.Tensor], object] | str, ranks: Ranks | None, spawn: Spawn) -> None:
    """:class:`InvarianceError` for ranks, launcher options or a per-rank target that cannot serve."""
    if spawn.mca and ranks != "mpi":
        raise InvarianceError("mca options are passed to mpirun: they need ranks='mpi' (--ranks mpi)")
    if refusal := spawn_refused(Options(ranks=ranks, env=spawn.env, mpiexec=spawn.mpiexec)):
        raise InvarianceError(refusal)
    if ranks is not None and ranks not in RANKS:
        raise InvarianceError(f"ranks must be one of {', '.join(RANKS)}; got {ranks!r}")
    if ranks is not None and not isinstance(target, str):
        raise InvarianceError(
            "a per-rank target runs in processes of its own: give it by name (package.module:function or "
            "path/to/file.py:function), not as a function object"
        )


def _resolve(
    target: Callable[[torch.Tensor], object] | str,
    ranks: Ranks | None,
    spawn: Spawn,
    timeout: float,
) -> tuple[Callable[[torch.Tensor], object], Launcher | None]:
    """The stacked function to place probes into, and the rank launcher behind it (to close)."""
    if ranks is None:
        return (load_target(target) if isinstance(target, str) else target), None
    assert isinstance(target, str)  # _refuse
    launcher = rank_launcher(ranks, target, timeout, **spawn._asdict())
    return per_rank_target(launcher), launcher


def _in_job(
    target: str,
    ranks: Ranks,
    n: int,
    timeout: float,
    measure: Callable[[Callable[[torch.Tensor], object]], Invariance],
) -> Invariance:
    """``ranks="job"`` or ``"mpi-job"``: on every rank of the job this process is in, serve ``target``; on
    rank 0 also measure through the job's ranks.  Every rank gets the result (clause
    ``invariance-in-job``)."""
    size = job_size(ranks, None, None)
    if n != size:
        raise InvarianceError(f"n (-n) must be the job's {size} ranks; got {n}")

    def run(launcher: Launcher) -> Invariance:
        launcher.start()
        return measure(per_rank_target(launcher))

    if ranks == "mpi-job":
        return run_in_mpi_job(target, run, timeout_s=timeout)
    return run_in_job(target, run, timeout_s=timeout)


def invariance(
    target: Callable[[torch.Tensor], object] | str,
    n: int,
    sizes: Sequence[int],
    *,
    offsets: Sequence[int] | None = None,
    probe: int | None = None,
    dtype: str = "float32",
    ranks: Ranks | None = None,
    mca: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    mpiexec: str | None = None,
    by_bits: bool = False,
    draws: int = BITS_DRAWS,
    checks: int = CHECKS,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Invariance:
    """Whether ``target``'s order for each element depends on the message size or where the element sits.

    ``target`` is stacked (``fn(x)``, ``x`` of shape ``(N, M)``, returning the
    ``(M,)`` sum, like :func:`ring_ref.ring_all_reduce`), or with ``ranks``
    (``"gloo"``, ``"mpi"``, ``"jax"``, ``"mlx"``) the name of a per-rank target, as ``difftest
    --ranks`` runs it (``mca``: OpenMPI's ``--mca`` options; ``env``: the ranks' environment variables;
    ``mpiexec``: the launcher, as for :func:`~ring_ref.difftest.difftest`); with ``ranks="mpi-job"``
    (or ``"job"``, in a ``torch.distributed`` group already joined) every rank of the job this process
    is in calls it, rank 0 measures, and every rank gets the result.  ``K =
    probe`` elements (default ``min(32, smallest M - smallest offset)``) are
    placed at every offset in every size where they fit (``offsets=None``:
    at each size, offsets that probe every chunk of a ring of ``n`` workers
    and the buffer's end, :func:`~ring_ref._order_stability.chunk_offsets`); their trees are
    revealed in each placement (``N <= 65536``, reveal's limit), or with
    ``by_bits`` random values' bits are compared with those of the region
    all-reduced alone (``draws`` inputs).  Raises
    :class:`~ring_ref._order_stability.InvarianceError` (a ``ValueError``) for
    sizes, offsets or options that cannot serve, and
    :class:`~ring_ref._reveal.RevealError` for a target that misbehaves.

    >>> from ring_ref import ring_all_reduce
    >>> found = invariance(lambda x: ring_all_reduce(x), 3, [3, 6], probe=3)
    >>> found.invariant
    False
    >>> print(found.summary_line())
    order changes with M: at chunk boundaries, M/N (each element folds its chunk, the spec ring)
    """
    start = time.perf_counter()
    itemsize = REVEAL_DTYPES[dtype].itemsize if dtype in REVEAL_DTYPES else 4
    k, placed = placements(sizes, offsets, probe, n=n, itemsize=itemsize)
    _check(n, k, dtype, by_bits=by_bits, draws=draws, checks=checks)
    spawn = Spawn(mca or {}, env or {}, mpiexec)
    _refuse(target, ranks, spawn)
    name = target if isinstance(target, str) else getattr(target, "__qualname__", type(target).__name__)

    def measure(fn: Callable[[torch.Tensor], object]) -> Invariance:
        return _measure(
            fn,
            name,
            n,
            k,
            placed,
            dtype=dtype,
            by_bits=by_bits,
            draws=draws,
            checks=checks,
            seed=seed,
            start=start,
        )

    if ranks in IN_JOB:
        assert isinstance(target, str) and ranks is not None  # _refuse
        return _in_job(target, ranks, n, timeout, measure)
    fn, launcher = _resolve(target, ranks, spawn, timeout)
    try:
        if launcher is not None:
            launcher.start()
        return measure(fn)
    finally:
        if launcher is not None:
            launcher.close()


def _measure(
    fn: Callable[[torch.Tensor], object],
    name: str,
    n: int,
    k: int,
    placed: list[Placement],
    *,
    dtype: str,
    by_bits: bool,
    draws: int,
    checks: int,
    seed: int,
    start: float,
) -> Invariance:
    """The outcomes of ``fn`` (stacked, or through a launcher already started) at every placement."""
    counterexample = None
    if by_bits:
        order = [Placement(k, 0), *(p for p in placed if p != Placement(k, 0))]
        outcomes, counterexample, calls = _by_bits(
            fn, n=n, k=k, order=order, dtype=dtype, draws=draws, seed=seed
        )
    else:
        order, outcomes, calls = placed, [], 0
        for batch in batches(placed, k):
            also = tuple(p.offset for p in batch[1:])
            found = reveal(
                Embedded(fn, batch[0], also=also),
                n,
                k * len(batch),
                dtype,
                checks=checks,
                seed=seed,
                name=name,
            )
            trees: list[Hashable] = list(found.trees)
            outcomes += [trees[i * k : (i + 1) * k] for i in range(len(batch))]
            calls += found.calls
    method: Method = "bits" if by_bits else "reveal"
    result = Invariance(name, n, k, dtype, method, order, outcomes, calls, time.perf_counter() - start)
    result.counterexample = counterexample
    return result
