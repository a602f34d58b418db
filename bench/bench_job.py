"""``make bench-job``: one call of a per-rank target under ``--ranks job`` vs ``--ranks gloo``, side by side.

The same case (``N`` ranks, ``M`` = ``--elements`` float32 elements per rank,
``ring_ref.distributed:ring_all_reduce_``) is called ``--calls`` times per
round, in alternating rounds so that machine noise hits both alike: through a
gloo group of ``N`` ranks forked by this process
(:class:`~ring_ref.difftest._ranks.GlooRanks`: cases and answers through
pipes), and in a ``torchrun --standalone`` job of ``N`` ranks
(:class:`~ring_ref.difftest._job.JobRanks`: through the job's store; this
script runs itself there with ``--in-job``, and only the calls are timed, not
the job's start).  Prints the median time per call of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ring_ref.difftest import Report
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._job import run_in_job
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._ranks import GlooRanks

TARGET = "ring_ref.distributed:ring_all_reduce_"
ROOT = Path(__file__).resolve().parent.parent


def _case(n: int, m: int) -> Case:
    return Case(n, m, (), torch.float32, "contiguous", tuple(float(i % 7) for i in range(n * m)))


def _per_call(launcher: Launcher, case: Case, calls: int) -> float:
    launcher.call(case)  # the group up, the target loaded
    start = time.perf_counter()
    for _ in range(calls):
        outcome = launcher.call(case)
        if outcome.failure is not None or len(outcome.answers) != case.n:
            raise SystemExit(f"a call failed: {outcome.failure}")
    return (time.perf_counter() - start) / calls


def _in_job(calls: int, m: int) -> None:
    """Inside the job: time the calls on rank 0, print the seconds per call there."""
    dist.init_process_group("gloo")
    case = _case(dist.get_world_size(), m)
    took: list[float] = []

    def timed(job: Launcher) -> Report:
        job.start()
        took.append(_per_call(job, case, calls))
        return Report(TARGET, 0, "")

    run_in_job(TARGET, timed, timeout_s=60.0)
    if took:
        print(took[0])
    dist.destroy_process_group()


def main() -> None:
    """Alternate the rounds; print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--calls", type=int, default=50, help="calls per round (default 50)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--elements", type=int, default=1024, help="M per rank (default 1024)")
    parser.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_job:
        _in_job(args.calls, args.elements)
        return
    times: dict[str, list[float]] = {"job": [], "gloo": []}
    job_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.n)]
    job_cmd += [__file__, "--in-job", "--calls", str(args.calls), "--elements", str(args.elements)]
    for _ in range(args.rounds):
        done = subprocess.run(job_cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        times["job"].append(float(done.stdout.split()[-1]))
        gloo = GlooRanks(TARGET, 60.0)
        try:
            times["gloo"].append(_per_call(gloo, _case(args.n, args.elements), args.calls))
        finally:
            gloo.close()
    job, gloo_s = statistics.median(times["job"]), statistics.median(times["gloo"])
    print(f"N = {args.n}, M = {args.elements} float32, {TARGET}, {args.rounds} rounds x {args.calls} calls")
    print(f"--ranks job : {job * 1e3:7.2f} ms per call (median of the rounds; each: {times['job']})")
    print(f"--ranks gloo: {gloo_s * 1e3:7.2f} ms per call (each: {times['gloo']})")
    print(f"job / gloo  : {job / gloo_s:7.2f}")


if __name__ == "__main__":
    main()
