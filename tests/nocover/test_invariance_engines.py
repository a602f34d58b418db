"""``ring-ref invariance`` on real engines (clause ``invariance-findings``): gloo's and OpenMPI's all-reduce.

The per-rank targets run as ``difftest --ranks`` runs them: ``torch.distributed.all_reduce`` on
every rank of a gloo group, ``MPI_Allreduce`` (``ring_ref.targets:mpi_allreduce``) on every rank of an
``mpirun`` job, with the ``--mca`` options that pick OpenMPI's algorithm.  The expected trees are the
ones measured here, typed in (``docs/guide/invariance.md``); the chunk-boundary summaries are checked
against the rings of spec/schedules.md by the report itself.  Requires OpenMPI and mpi4py (``make test``
installs them); without them the MPI test fails, it is not skipped.
"""

from __future__ import annotations

import pytest

from ring_ref.difftest._vocabulary import Ranks
from ring_ref.invariance import invariance

pytestmark = pytest.mark.clause("invariance-findings")

PAIRWISE_4 = ((0, 1), (2, 3))
DYNAMIC = {"coll_tuned_use_dynamic_rules": "1"}


def _spec_fold(c: int) -> object:
    """Chunk ``c``'s fold under the spec ring, N = 4: ``c, c+1, c+2, c+3``, canonical (``reveal-trees``)."""
    order = [(c + j) % 4 for j in range(4)]
    first = tuple(sorted(order[:2]))
    return ((first, order[2]), order[3])


def test_torch_distributed_all_reduce_on_gloo_changes_at_the_gloo_presets_chunks() -> None:
    found = invariance(
        "torch.distributed:all_reduce", 4, [8, 16, 4096], offsets=[0, 3], probe=8, ranks="gloo"
    )
    assert not found.invariant
    assert found.summary_line() == (
        "order changes with M: at chunk boundaries, the gloo layout's chunks (each element folds its chunk, "
        "the gloo ring)"
    )
    # Measured at M = 8 (offset 0): elements 2, 3 fold 0,3,2,1 and elements 4, 5 fold 1,0,3,2.
    assert found.trees[0][2:6] == [(((0, 3), 2), 1)] * 2 + [(((0, 1), 3), 2)] * 2


@pytest.mark.parametrize(
    ("algorithm", "sizes"),
    [("default", [8, 4096, 65536]), ("3", [8, 16, 4096]), ("4", [8, 16, 4096])],
    ids=["default", "recursive-doubling", "ring"],
)
def test_openmpi_orders(algorithm: str, sizes: list[int]) -> None:
    mca = None if algorithm == "default" else {**DYNAMIC, "coll_tuned_allreduce_algorithm": algorithm}
    found = invariance(
        "ring_ref.targets:mpi_allreduce", 4, sizes, offsets=[0, 3], probe=8, ranks="mpi", mca=mca, timeout=120
    )
    if algorithm == "4":
        assert not found.invariant
        assert found.summary_line() == (
            "order changes with M: at chunk boundaries, M/N (each element folds its chunk, the spec ring)"
        )
        assert found.trees[0] == [_spec_fold(c) for c in (0, 0, 1, 1, 2, 2, 3, 3)]
    else:
        # 4 ranks on one machine: the default rules pick recursive doubling here, pairs (0, 1) and (2, 3).
        assert found.invariant, found.render()
        assert all(row == [PAIRWISE_4] * 8 for row in found.trees)


@pytest.mark.clause("invariance-by-bits")
@pytest.mark.parametrize("ranks", ["gloo", "mpi"])
def test_by_bits_screens_per_rank_targets(ranks: Ranks) -> None:
    # Both rings' chunks move between the region alone (M = 8), M = 16 and the offsets.
    target = "torch.distributed:all_reduce" if ranks == "gloo" else "ring_ref.targets:mpi_allreduce"
    mca = {**DYNAMIC, "coll_tuned_allreduce_algorithm": "4"} if ranks == "mpi" else None
    found = invariance(target, 4, [16, 4096], offsets=[0, 3], probe=8, ranks=ranks, mca=mca, by_bits=True)
    assert not found.invariant
    assert found.counterexample is not None and len(found.counterexample) == 4
    assert found.placements[0] == (8, 0)  # the region alone first
    # Random values round two orders alike for many elements; some element of the draw differs.
    assert found.changes and all(c.was != c.now and c.b != (8, 0) for c in found.changes)


@pytest.mark.clause("invariance-placements", "invariance-summary")
def test_openmpi_default_at_three_ranks_switches_to_its_ring_at_4096() -> None:
    # Measured (OpenMPI 4.1): 3 ranks add by recursive doubling, (x0 + x1) + x2, up to M = 64 and run the
    # ring at M = 4096, whose chunk 0 folds 0, 1, 2 too: offset 0 alone calls it invariant.
    found = invariance("ring_ref.targets:mpi_allreduce", 3, [7, 64, 4096], ranks="mpi", timeout=120)
    assert found.summary_line() == (
        "order changes above M = 64 (every element fold 0,1,2 (chain, recursive-doubling) up to M "
        "= 64, each element folds its "
        "chunk of the openmpi-ring ring from M = 4096 on)"
    )
    # regions at each layout's chunk starts: floor's 1365 and 2730 cover blocks' 1366 and 2731 (K = 7); in
    # openmpi-ring's blocks (1366, 1365, 1365) element 1365 is chunk 0's, 2730 chunk 1's, 4089 chunk 2's
    assert found.placements[-4:] == [(4096, 0), (4096, 1365), (4096, 2730), (4096, 4089)]
    assert [row[0] for row in found.trees[-4:]] == [((0, 1), 2), ((0, 1), 2), ((1, 2), 0), ((0, 2), 1)]
