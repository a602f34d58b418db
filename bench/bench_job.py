"""``make bench-job``: one call of a per-rank target under ``--ranks job`` vs ``--ranks gloo``, side by side.

Run under ``torchrun`` (the Makefile does: ``--standalone --nproc-per-node N``).
Every rank joins the job's gloo group and serves (:func:`ring_ref.difftest._job.run_in_job`);
rank 0's driver times ``--calls`` calls of the same case (``N`` = the job's size,
``M`` = ``--m`` float32 elements per rank) through the job's launcher
(:class:`~ring_ref.difftest._job.JobRanks`: cases and answers through the
job's store) and through a gloo group of ``N`` ranks forked by the tester
(:class:`~ring_ref.difftest._ranks.GlooRanks`: pipes), in alternating rounds so
that machine noise hits both alike, and prints the median time per call of
each and their ratio.  The job's ranks wait on the store while the gloo group
runs, and the other way round.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from ring_ref.difftest import Report
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._job import run_in_job
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._ranks import GlooRanks

TARGET = "ring_ref.distributed:ring_all_reduce_"


def _per_call(launcher: Launcher, case: Case, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        outcome = launcher.call(case)
        if outcome.failure is not None or len(outcome.answers) != case.n:
            raise SystemExit(f"a call failed: {outcome.failure}")
    return (time.perf_counter() - start) / calls


def main() -> None:
    """Time both launchers on rank 0; print the table there."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=50, help="calls per round (default 50)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--m", type=int, default=1024, help="float32 elements per rank (default 1024)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    case = Case(n, args.m, (), torch.float32, "contiguous", tuple(float(i % 7) for i in range(n * args.m)))
    times: dict[str, list[float]] = {"job": [], "gloo": []}

    def timed(job: Launcher) -> Report:
        job.start()
        gloo = GlooRanks(TARGET, 60.0)
        try:
            gloo.call(case)  # start the group before timing
            for _ in range(args.rounds):
                times["job"].append(_per_call(job, case, args.calls))
                times["gloo"].append(_per_call(gloo, case, args.calls))
        finally:
            gloo.close()
        return Report(TARGET, 0, "")

    run_in_job(TARGET, timed, timeout_s=60.0)
    if dist.get_rank() == 0:
        job, gloo = statistics.median(times["job"]), statistics.median(times["gloo"])
        print(f"N = {n}, M = {args.m} float32 per rank, {TARGET}, {args.rounds} x {args.calls} calls each")
        print(f"--ranks job : {job * 1e3:7.2f} ms per call (median of the rounds)")
        print(f"--ranks gloo: {gloo * 1e3:7.2f} ms per call")
        print(f"job / gloo  : {job / gloo:7.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
