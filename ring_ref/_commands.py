"""What each ``ring-ref`` sub-command does once its arguments are parsed and checked
(:mod:`ring_ref._cli`, which imports this module only then: everything heavy is imported here)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import operator
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TextIO

import torch

from ring_ref import _order_stability, _reveal, _svg
from ring_ref._dispatch import ring_all_reduce
from ring_ref._hints import signature_problem
from ring_ref._reveal import RevealError
from ring_ref._trace import check_trace_size, render_table, trace, trace_json
from ring_ref._vectors import _collectives, _ops, _presets, _sums
from ring_ref.core import initial_state, run_ring
from ring_ref.difftest import DTYPES, OrderError, TargetError, _orders, load_target
from ring_ref.difftest._in_job import command_in_job, job_rank, reveal_in_job
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._options import Options, rank_launcher, refused
from ring_ref.difftest._report import Report
from ring_ref.difftest._rules import IN_JOB
from ring_ref.difftest._run import run_difftest
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import (
    PRESETS,
    SPEC,
    ChainSchedule,
    DoublingSchedule,
    Phase,
    preset_schedule,
    reduce_scatter_ring,
)

__all__ = ["COMMANDS"]


def _demo(_args: argparse.Namespace) -> int:
    print("Worked example (spec clause worked-example)")
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    print(f"  worker 0 = {x[0].tolist()}, worker 1 = {x[1].tolist()}")
    buffers: dict[str, list[list[float]]] = {}

    def observe(phase: Phase, r: int, state: State[float], _prov: State[Provenance]) -> None:
        buffers[f"{phase} round {r}"] = [list(row) for row in state]

    run_ring(initial_state([[1.0, 2.0], [3.0, 4.0]]), operator.add, observe)
    for stage, rows in buffers.items():
        print(f"  after {stage}: worker buffers {rows}")
    print(f"  ring_all_reduce(x) = {ring_all_reduce(x).tolist()}")
    print()
    n = 4
    print(f"Round-by-round walkthrough for N = {n} (ring-ref trace -n {n})")
    print()
    print(render_table(trace(n)))
    values = torch.arange(n * n * 2, dtype=torch.float32).reshape(n, 2 * n)
    result = ring_all_reduce(values)
    print()
    print(f"With worker i holding {2 * n} values [{2 * n}i, ..., {2 * n}i + {2 * n - 1}]:")
    print(f"  ring_all_reduce = {result.tolist()}")
    print(f"  torch.sum(x, 0) = {values.sum(0).tolist()}")
    return 0


def _trace_command(args: argparse.Namespace) -> int:
    m = args.n if args.m is None else args.m
    try:
        ring = _orders.schedule_ring(args.schedule)
        if args.collective.alone:  # a preset's name takes its direction as the offset
            ring = reduce_scatter_ring(args.schedule if args.schedule in PRESETS else ring, args.n)
        elif args.schedule in PRESETS:  # by name: what the library runs at this size (schedule-below-n)
            ring = preset_schedule(args.schedule, args.n, m)
        check_trace_size(args.n, m, args.format, ring, collective=args.collective)
        records = trace(args.n, ring, args.op, collective=args.collective)
    except (ValueError, TypeError) as err:
        print(f"ring-ref trace: {err}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(trace_json(records, m, ring, collective=args.collective), indent=1))
    elif args.format == "svg":
        print(_svg.rounds_svg(records), end="")
    else:
        if args.collective.alone:
            print(f"collective: {args.collective} alone (spec section 12)")
        if isinstance(ring, ChainSchedule | DoublingSchedule):
            where = "spec section 15" if isinstance(ring, ChainSchedule) else "spec/schedules.md"
            print(f"schedule: {ring.describe()} ({where}: not a ring; rounds are its steps)\n")
        elif ring != SPEC:
            print(f"ring: {ring.normalized(args.n).describe()} (spec section 10)\n")
        print(render_table(records))
    return 0


def _vectors_command(args: argparse.Namespace) -> int:
    generator = (
        _presets if args.presets else _ops if args.ops else _collectives if args.collectives else _sums
    )
    try:
        written = generator.write(Path(args.out))
    except OSError as err:
        print(f"ring-ref vectors: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _difftest_command(args: argparse.Namespace) -> int:
    """Run ``ring-ref difftest``: 0 pass, 1 fail, 2 usage error (reason on stderr).

    The target runs in a worker process that captures its output, so stdout
    holds only the report; with ``--in-process`` whatever the target prints
    through ``sys.stdout`` goes to stderr under ``--json``.  A broken option rule
    (:func:`ring_ref.difftest._options.refused`) is a usage error in the API's words.
    """
    options = dataclasses.replace(
        args.options, dtypes=[DTYPES[d] for d in dict.fromkeys(args.dtype_names)] or None
    )
    problem = refused(options)
    if problem:
        print(f"ring-ref difftest: error: {problem}", file=sys.stderr)
        return 2
    if args.ranks in IN_JOB:
        return _difftest_in_job(args, options)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            report = run_difftest(args.target, options)
        except OrderError as exc:
            print(f"ring-ref difftest: {exc}", file=sys.stderr)
            return 1 if args.schedule == "auto" else 2
        except (TargetError, RevealError, ValueError) as exc:
            print(f"ring-ref difftest: error: {exc}", file=sys.stderr)
            return 2
    return _print_report(report, args.json)


def _print_report(report: Report, as_json: bool, out: TextIO | None = None) -> int:
    """Print ``report`` (its JSON or its text) on ``out`` (stdout); the exit status of its verdict."""
    print(report.to_json_text() if as_json else report.render(), file=out or sys.stdout, flush=True)
    return 0 if report.verdict == "pass" else 1


def _difftest_in_job(args: argparse.Namespace, options: Options) -> int:
    """``--ranks job`` or ``mpi-job`` on this rank (:func:`~ring_ref.difftest._in_job.command_in_job`): rank
    0 prints the report (or the error) on the stdout this command started with before the others may
    leave, also when a call left ranks inside the target; every rank returns the verdict's status."""
    out = sys.stdout

    def show(outcome: object) -> None:
        if isinstance(outcome, Report):
            _print_report(outcome, args.json, out)
        else:
            print(f"ring-ref difftest: error: {outcome}", file=sys.stderr, flush=True)

    def body(device: str) -> int:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            report = run_difftest(
                args.target, dataclasses.replace(options, device=device) if args.ranks == "job" else options
            )
        return 0 if report.verdict == "pass" else 1

    return command_in_job(
        "difftest",
        args.ranks,
        backend=args.backend,
        device=args.device,
        timeout=args.timeout,
        show=show,
        body=body,
        errors=(TargetError, OrderError, ValueError),
    )


def _reveal_command(args: argparse.Namespace) -> int:  # noqa: PLR0912 - one branch a usage error
    """Run ``ring-ref reveal``: 0 when it ran, 2 on a usage error or a misbehaving target."""
    if args.ranks in IN_JOB and args.collective.alone:
        print(
            "ring-ref reveal: error: --collective reduce-scatter is revealed on --ranks gloo or mpi (or "
            "stacked), not yet inside a job: drop --collective or run it on a gloo group of the same N",
            file=sys.stderr,
        )
        return 2
    if args.ranks in IN_JOB:
        return _reveal_in_job(args)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            if args.checks < 0:
                raise _reveal.RevealError(f"--checks must be 0 or more; got {args.checks}")
            _reveal.check_reveal_size(args.n, args.m, args.dtype)
            if misfit := signature_problem(args.target, args.ranks, args.collective):
                raise TargetError(misfit)
            launcher = (
                rank_launcher(args.ranks, args.target, args.timeout, **args.spawn._asdict())
                if args.ranks
                else None
            )
            scatter = args.collective.scatters
            if scatter and args.m % args.n:
                raise _reveal.RevealError(
                    f"--collective reduce-scatter needs M a multiple of N; got {args.m}"
                )
            if launcher is not None and args.framework != "torch" and args.ranks != "jax":
                raise TargetError("--framework jax is for a stacked TARGET or --ranks jax: drop --ranks")
            fn: Callable[[torch.Tensor], object]
            if launcher is not None:
                fn = _orders.per_rank_target(launcher, args.collective)
            else:
                loaded = load_target(args.target, args.framework)
                fn = _orders.stacked_reduce_scatter(loaded) if scatter else loaded
            try:
                if launcher is not None:
                    launcher.start()
                found = _reveal.reveal(
                    fn, args.n, args.m, args.dtype, checks=args.checks, seed=args.seed, name=args.target
                )
            finally:
                if launcher is not None:
                    launcher.close()
            if args.svg:
                Path(args.svg).write_text(_svg.reveal_svg(found), encoding="utf-8")
        except (TargetError, _reveal.RevealError, OSError) as exc:
            print(f"ring-ref reveal: error: {exc}", file=sys.stderr)
            return 2
    _print_revealed(found, args)
    return 0


def _print_revealed(found: _reveal.Revealed, args: argparse.Namespace, out: TextIO | None = None) -> None:
    """The revealed order on ``out`` (the text or the JSON), each shard's order for a reduce-scatter, and
    on stderr the pointer to difftest when the order is not one ring's fold."""
    out = out or sys.stdout
    whole = time.perf_counter() - args.started
    print(found.to_json_text() if args.json else found.summary(whole), file=out, flush=True)
    if args.collective.scatters and not args.json:
        print("reduce-scatter, each shard's order:", file=out)
        print(
            "\n".join(
                f"  {line}" for line in _orders.shard_orders(found.trees, args.n, found.ring, args.dtype)
            ),
            file=out,
        )
    if found.classification != "ring":
        # reveal names an order, it gives no verdict: the exit status stays 0 (docs/guide/reveal.md)
        ranks = f"--ranks {args.ranks} " if args.ranks else ""
        ranks += "".join(f"{item} " for item in _orders.spawn_options(args.spawn))
        ranks += "" if args.framework == "torch" else f"--framework {args.framework} "
        print(
            f"ring-ref reveal: the order is not one ring's fold ({found.classification}); to find out "
            f"whether that is a bug, run: ring-ref difftest {ranks}{args.target}",
            file=sys.stderr,
        )


def _reveal_in_job(args: argparse.Namespace) -> int:
    """``reveal --ranks job`` or ``mpi-job``: every rank joins and serves; rank 0 reveals and prints (the
    order of the job's own all-reduce at its N, for ``difftest --ranks job --order``)."""
    out = sys.stdout

    def show(outcome: object) -> None:
        if isinstance(outcome, _reveal.Revealed):
            _print_revealed(outcome, args, out)
        else:
            print(f"ring-ref reveal: error: {outcome}", file=sys.stderr, flush=True)

    def run(launcher: Launcher) -> _reveal.Revealed:
        launcher.start()
        found = _reveal.reveal(
            _orders.per_rank_target(launcher),
            args.n,
            args.m,
            args.dtype,
            checks=args.checks,
            seed=args.seed,
            name=args.target,
        )
        if args.svg:
            Path(args.svg).write_text(_svg.reveal_svg(found), encoding="utf-8")
        return found

    def body(device: str) -> int:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            return reveal_in_job(
                args.target,
                run,
                n=args.n,
                checks=args.checks,
                device=device,
                timeout=args.timeout,
                ranks=args.ranks,
            )

    return command_in_job(
        "reveal",
        args.ranks,
        backend=args.backend,
        device=args.device,
        timeout=args.timeout,
        show=show,
        body=body,
        errors=(TargetError, _reveal.RevealError, OSError),
    )


def _invariance(args: argparse.Namespace) -> _order_stability.Invariance:
    """``invariance()`` of the command's arguments, its picture written where ``--svg`` asks."""
    found = _order_stability.invariance(
        args.target,
        args.n,
        args.sizes,
        offsets=args.offsets,
        probe=args.probe,
        dtype=args.dtype,
        ranks=args.ranks,
        **args.spawn._asdict(),
        by_bits=args.by_bits,
        draws=args.draws,
        seed=args.seed,
        timeout=args.timeout,
    )
    if args.svg:
        Path(args.svg).write_text(_svg.invariance_svg(found), encoding="utf-8")
    return found


_INVARIANCE_ERRORS: Final = (TargetError, _reveal.RevealError, _order_stability.InvarianceError, OSError)


def _invariance_command(args: argparse.Namespace) -> int:
    """Run ``ring-ref invariance``: 0 invariant, 1 not invariant, 2 usage error or misbehaving target."""
    if args.ranks in IN_JOB:
        return _invariance_in_job(args)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            found = _invariance(args)
        except _INVARIANCE_ERRORS as exc:
            print(f"ring-ref invariance: error: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(found.to_json()) if args.json else found.render())
    return 0 if found.invariant else 1


def _invariance_in_job(args: argparse.Namespace) -> int:
    """``invariance --ranks job`` or ``mpi-job``: every rank joins and serves; rank 0 measures and prints
    before the others may leave; every rank returns the verdict's status (clause ``invariance-in-job``)."""
    out = sys.stdout
    shown: list[object] = []

    def show(outcome: object) -> None:
        shown.append(outcome)
        if isinstance(outcome, _order_stability.Invariance):
            print(json.dumps(outcome.to_json()) if args.json else outcome.render(), file=out, flush=True)
        else:
            print(f"ring-ref invariance: error: {outcome}", file=sys.stderr, flush=True)

    def body(device: str) -> int:
        del device  # invariance's probes are CPU tensors
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            try:
                return 0 if _invariance(args).invariant else 1
            except _INVARIANCE_ERRORS as exc:  # refused on every rank before the job's run: rank 0 says so
                if not shown and job_rank(args.ranks) == 0:
                    show(exc)
                raise

    return command_in_job(
        "invariance",
        args.ranks,
        backend=None,
        device=None,
        timeout=args.timeout,
        show=show,
        body=body,
        errors=_INVARIANCE_ERRORS,
    )


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo,
    "trace": _trace_command,
    "vectors": _vectors_command,
    "difftest": _difftest_command,
    "reveal": _reveal_command,
    "invariance": _invariance_command,
}
"""Each sub-command's run, by name: its exit status (0, 1, or 2 for a usage error found only now)."""
