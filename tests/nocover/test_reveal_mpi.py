"""``ring-ref reveal --ranks mpi`` past the set probes: OpenMPI's ``MPI_Allreduce`` on 32 ranks.

The finding (docs/guide/reveal.md, "At cluster scale"): Debian's OpenMPI 4.1.4,
default algorithm selection, sums every element of a 64-element float32
``MPI_Allreduce`` over 32 ranks as a balanced binary tree over the ranks in
order (recursive doubling), revealed with count probes within ``N log2 N``
calls.  The tree is written out by a plain pairwise loop here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from ring_ref._cli import main


def _balanced(workers: list[Any]) -> Any:
    level = workers
    while len(level) > 1:
        level = [[level[i], level[i + 1]] for i in range(0, len(level), 2)]
    return level[0]


@pytest.mark.soak  # 32 MPI processes on this machine: about 70 s
@pytest.mark.clause("reveal-counts", "difftest-ranks")
def test_openmpi_allreduce_on_32_ranks_is_recursive_doubling(capsys: pytest.CaptureFixture[str]) -> None:
    n, m = 32, 64
    argv = ["reveal", "--ranks", "mpi", "ring_ref.targets:mpi_allreduce", "-n", str(n), "-m", str(m)]
    argv.append("--json")
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trees"] == [_balanced(list(range(n)))] * m
    assert doc["callsBy"]["count"] == doc["callsBy"]["probe"] <= n * math.log2(n)
