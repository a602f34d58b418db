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

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ring_ref._tracecheck import (
    Mismatch,
    RoundCallback,
    TracedImplementation,
    TraceMismatch,
    check_trace,
    first_mismatch,
)
from ring_ref.difftest import Report, Target, difftest
from ring_ref.difftest._vocabulary import DEFAULT_TIMEOUT_S, Collective, CollectiveName, OpTarget, Ranks
from ring_ref.schedule import RingSchedule

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
    mode: str | Sequence[str] = "all",
    *,
    examples: int = 100,
    seed: int | None = None,
    max_workers: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    isolate: bool | None = None,
    ranks: Ranks | None = None,
    op: object = None,
    schedule: str | RingSchedule | None = None,
    order: str | Path | None = None,
    mca: Mapping[str, str] | None = None,
    collective: Collective | CollectiveName = Collective.ALL_REDUCE,
    group: object = None,
    device: str = "cpu",
    subgroups: bool = False,
    env: Mapping[str, str] | None = None,
    mpiexec: str | None = None,
) -> Report:
    """Check ``fn`` against the reference; raise ``AssertionError`` with the report on failure.

    ``mode`` is ``"exact"``, ``"order-free"``, ``"bound"``, ``"all"`` or a list
    of them.  The error message is the report: the verdict per mode, the
    diagnosis codes with their explanation, the counterexample and the line
    that replays it; under pytest the traceback stops at the caller (no source
    of this module).  Returns the passing :class:`ring_ref.difftest.Report`.

    Every other option is :func:`ring_ref.difftest.difftest`'s, as on the
    command line: a module-level function (or a ``"module:function"`` string)
    runs isolated in a worker process, each call limited to ``timeout``
    seconds, a lambda or local function in this process (``isolate``);
    ``ranks="gloo"`` or ``"mpi"`` (with ``mca``, ``env`` and ``mpiexec``) for a per-rank target;
    ``ranks="job"`` (with ``group``, ``device``, ``subgroups``: every smaller
    ``N`` too, on subgroups, ``fn(tensor, group=G)``) inside a job's process group,
    called on every rank, which all get the same report or the same error;
    ``op`` for another reduction; ``schedule`` (a preset name, a
    :class:`~ring_ref.schedule.RingSchedule`, ``"DIRECTION,OFFSET,LAYOUT"`` or
    ``"auto"``) or ``order`` (a ``ring-ref reveal --json`` file) for what
    ``exact`` checks against; ``collective`` (``"reduce-scatter"``,
    ``"all-gather"``) for what ``fn`` computes.

    >>> from ring_ref import ring_all_reduce
    >>> assert_matches_reference(ring_all_reduce, mode="order-free", examples=5, seed=0, op="max").op
    'max'
    >>> assert_matches_reference(ring_all_reduce, ["exact", "bound"], examples=5, seed=0).modes.keys()
    dict_keys(['exact', 'bound'])
    """
    __tracebackhide__ = True
    report = difftest(
        fn,
        modes=mode,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        timeout=timeout,
        isolate=isolate,
        ranks=ranks,
        op=op,
        schedule=schedule,
        order=order,
        mca=mca,
        collective=collective,
        group=group,
        device=device,
        subgroups=subgroups,
        env=env,
        mpiexec=mpiexec,
    )
    if report.verdict != "pass":
        raise AssertionError(report.render()) from None
    return report
