"""Testing other implementations against the reference, from a test suite.

``assert_matches_reference`` runs the differential tester; ``check_trace`` and
``first_mismatch`` compare an implementation's buffers round by round (the
``on_round`` callback protocol of :mod:`ring_ref._tracecheck`).

>>> import torch
>>> from ring_ref import ring_all_reduce
>>> assert_matches_reference(ring_all_reduce, mode="exact", examples=5, seed=0).verdict
'pass'
>>> assert_matches_reference(lambda x: x.mean(0), mode="order-free", examples=20, seed=0)
Traceback (most recent call last):
...
AssertionError: FAIL: ...mean-not-sum...
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ring_ref._tracecheck import (
    Mismatch,
    RoundCallback,
    TracedImplementation,
    TraceMismatch,
    check_trace,
    first_mismatch,
)
from ring_ref.difftest import DTYPES, MODES, Mode, Report, Target, difftest
from ring_ref.difftest._vocabulary import DEFAULT_TIMEOUT_S, OpTarget, Ranks

__all__ = [
    "Mismatch",
    "RoundCallback",
    "TraceMismatch",
    "TracedImplementation",
    "assert_matches_reference",
    "check_trace",
    "first_mismatch",
]


def assert_matches_reference(
    fn: Target | OpTarget | str,
    mode: Mode | str = "all",
    *,
    examples: int = 100,
    seed: int | None = None,
    max_workers: int | None = None,
    dtypes: Sequence[torch.dtype] = tuple(DTYPES.values()),
    timeout: float = DEFAULT_TIMEOUT_S,
    isolate: bool | None = None,
    ranks: Ranks | None = None,
    op: object = None,
) -> Report:
    """Check ``fn`` against the reference; raise ``AssertionError`` with the diagnosis on failure.

    ``mode`` is ``"exact"``, ``"order-free"``, ``"bound"`` or ``"all"``.  The
    error message is the full report: the verdict per mode, the diagnosis codes
    with their explanation, the counterexample and the seed to replay it.
    Returns the passing :class:`ring_ref.difftest.Report`.

    A module-level function (or a ``"module:function"`` string) runs isolated
    in a worker process, each call limited to ``timeout`` seconds; a lambda or
    local function runs in this process (see :func:`ring_ref.difftest.difftest`
    for ``isolate``).  ``ranks="gloo"``: ``fn`` is a per-rank target, called on
    every rank of a gloo group with that rank's tensor (``torch.distributed.all_reduce``
    style); every rank's result is checked.  ``op`` (``"prod"``, ``"max"``, ``"min"``,
    ``"avg"``, ``"sum"`` or a ``torch.distributed.ReduceOp``): ``fn`` is also given ``op=``
    and checked with that op's oracles (see :func:`ring_ref.difftest.difftest`).

    >>> from ring_ref import ring_all_reduce
    >>> assert_matches_reference(ring_all_reduce, mode="order-free", examples=5, seed=0, op="max").op
    'max'
    """
    if mode == "all":
        modes: tuple[Mode, ...] = MODES
    elif mode in MODES:
        modes = (next(m for m in MODES if m == mode),)
    else:
        raise ValueError(f"mode must be one of {[*MODES, 'all']}; got {mode!r}")
    report = difftest(
        fn,
        modes=modes,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        timeout=timeout,
        isolate=isolate,
        ranks=ranks,
        op=op,
    )
    if report.verdict != "pass":
        raise AssertionError(report.render())
    return report
