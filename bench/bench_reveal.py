"""``python bench/bench_reveal.py``: the calls and time of ``ring-ref reveal`` per target and ``N``.

Stacked targets (one ``(N, M)`` call each, ``M = N``): the spec's ring and the
``gloo`` preset on the fast engine, and the hierarchical ring, recursive
doubling and linear fold of ``tests/common/reveal_targets.py``.  Each row gives the
calls (probing, of which counting; checking), the bound of clause
``reveal-counts`` they must stay within (``N + 2`` for a fold, ``N log2 N``
for the other trees) and the wall time of the whole reveal.  ``--ranks``
adds the per-rank runs: ``torch.distributed.all_reduce`` on gloo at ``N = 16``
and OpenMPI's ``MPI_Allreduce`` (``ring_ref.targets:mpi_allreduce``, oversubscribed) at
``N = 32``, through ``ring-ref reveal --ranks``.  Prints a Markdown table
(docs/guide/reveal.md has the one measured here).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ring_ref import ring_all_reduce  # noqa: E402
from ring_ref._reveal import reveal  # noqa: E402
from tests.common import reveal_targets as rt  # noqa: E402

FOLD, TREE = "N + 2 (N + 6 to N = 24)", "N log2 N"
TARGETS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "spec ring (fast engine)": (lambda x: ring_all_reduce(x, "fast"), FOLD),
    "gloo preset (fast engine)": (lambda x: ring_all_reduce(x, "fast", schedule="gloo"), FOLD),
    "hierarchical ring (groups of 8)": (rt.hierarchical_ring, TREE),
    "recursive doubling": (rt.recursive_doubling, TREE),
    "linear fold": (rt.linear_fold, FOLD),
}


def _bound(kind: str, n: int) -> int:
    """Clause ``reveal-counts``'s bound; the set probes (``N <= 24``) take up to 6 calls over ``N``."""
    if kind == FOLD:
        return n + 2 if n > 24 else n + 6
    return int(n * math.log2(n))


def _row(name: str, n: int, m: int, doc: dict[str, object], *, kind: str, seconds: float) -> str:
    by = doc["callsBy"]
    assert isinstance(by, dict)
    probe = int(by["probe"]) + int(by["confirm"])
    within = "yes" if probe <= _bound(kind, n) else "NO"
    return (
        f"| {name} | {n} | {m} | {doc['calls']} ({probe} probing, {by['count']} counting; {by['check']} "
        f"checking) | {kind} = {_bound(kind, n)}: {within} | {doc['classification']} | {seconds:.1f} s |"
    )


def _peak_mib() -> str:
    """This process's peak resident memory so far (the row's own when a run has one row)."""
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB"


def _per_rank(ranks: str, target: str, n: int, m: int, kind: str) -> str:
    command = [sys.executable, "-m", "ring_ref", "reveal", "--ranks", ranks, target]
    command += ["-n", str(n), "-m", str(m)]
    start = time.perf_counter()
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, check=False, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return f"| {ranks} per rank `{target}` | {n} | {m} | failed: {done.stderr.strip()[-200:]} | | | | |"
    row = _row(f"{ranks} per rank `{target}`", n, m, json.loads(done.stdout), kind=kind, seconds=seconds)
    return f"{row} (its own processes) |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="32,64,256,1024", help="N values, comma-separated (4096: minutes)")
    parser.add_argument("--targets", default=",".join(TARGETS), help="target names, comma-separated")
    parser.add_argument("--ranks", action="store_true", help="add the per-rank gloo and MPI runs")
    parser.add_argument("--m", type=int, default=0, help="M for every row (default: M = N)")
    args = parser.parse_args()
    print("| target | N | M | calls | bound | classification | time | peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.targets.split(","):
        target, kind = TARGETS[name]
        for n in map(int, args.sizes.split(",")):
            m = args.m or n
            start = time.perf_counter()
            found = reveal(target, n, m, name=name)
            seconds = time.perf_counter() - start
            row = _row(name, n, m, found.to_json(trees=False), kind=kind, seconds=seconds)
            print(f"{row} {_peak_mib()} |", flush=True)
    if args.ranks:
        print(_per_rank("gloo", "torch.distributed:all_reduce", 16, 34, FOLD), flush=True)
        print(_per_rank("mpi", "ring_ref.targets:mpi_allreduce", 32, 64, TREE), flush=True)


if __name__ == "__main__":
    main()
