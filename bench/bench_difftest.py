"""``make bench-difftest``: the differential tester isolated and in-process, side by side.

The same run (``--examples`` per mode, all three modes, one seed) of the
tester on ``ring_ref:ring_all_reduce`` is timed both ways, taking turns so
that machine noise hits both alike: through the Python API in this process
(``difftest(..., isolate=True/False)``; the isolated run includes forking its
worker and loading the target there) and end to end through the command line
(``ring-ref difftest`` vs ``ring-ref difftest --in-process``, a fresh
interpreter each).  Prints the wall times, their medians and the ratio
isolated / in-process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ring_ref.difftest import difftest

ROOT = Path(__file__).resolve().parent.parent
TARGET = "ring_ref:ring_all_reduce"


def _api(isolate: bool, examples: int, seed: int) -> float:
    start = time.perf_counter()
    report = difftest(TARGET, examples=examples, seed=seed, isolate=isolate)
    elapsed = time.perf_counter() - start
    if report.verdict != "pass" or report.isolated != isolate:
        raise SystemExit(f"unexpected report: {report.summary()}")
    return elapsed


def _cli(isolate: bool, examples: int, seed: int) -> float:
    command = [sys.executable, "-m", "ring_ref", "difftest", TARGET, "--examples", str(examples)]
    command += ["--seed", str(seed), *([] if isolate else ["--in-process"])]
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    """Run the comparison and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="examples per mode (default 200)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    _api(True, 5, args.seed)  # warm-up: first imports, Hypothesis' caches
    print(f"ring-ref difftest {TARGET} --examples {args.examples} --seed {args.seed} (all three modes)")
    for label, run in (("Python API, in one process", _api), ("command line, fresh process", _cli)):
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for isolate in (False, True):
                times[isolate].append(run(isolate, args.examples, args.seed))
        inproc, isolated = statistics.median(times[False]), statistics.median(times[True])
        print(f"{label}:")
        print(f"  in-process  {' '.join(f'{t:6.2f}' for t in times[False])} s  median {inproc:6.2f} s")
        print(f"  isolated    {' '.join(f'{t:6.2f}' for t in times[True])} s  median {isolated:6.2f} s")
        print(f"  ratio isolated / in-process: {isolated / inproc:.2f} (target: at most 1.3)")


if __name__ == "__main__":
    main()
