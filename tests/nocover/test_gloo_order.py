"""gloo's order, shown on the real engine: ``torch.distributed.all_reduce`` over gloo processes.

``ring-ref reveal`` on it must fit the ``gloo`` preset, and
``ring_all_reduce(x, schedule="gloo")`` must give gloo's bits on random inputs
of every dtype, ``M`` divisible by ``N`` or not, with trailing dimensions.  The
ranks run in :class:`ring_ref._processes._gloo.SpawnedGroup`; rank ``i`` contributes
``x[i]``.  ``verify`` runs a few ``N``; the full ``N = 2 .. 8`` sweep is ``soak``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ring_ref import ring_all_reduce
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._reveal import reveal
from ring_ref.difftest._oracles import ExactOrder
from tests.common.oracles import same_bits
from tests.common.reveal_targets import flat

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _rank_all_reduce(rank: int, _world_size: int, x: torch.Tensor) -> torch.Tensor:
    mine = x[rank].clone()
    dist.all_reduce(mine, op=dist.ReduceOp.SUM)
    return mine


def _inputs(n: int, seed: int) -> list[torch.Tensor]:
    """Random values spread over 2^16 in magnitude, so that orders of addition differ in the bits."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for m, trailing in ((1, ()), (n, ()), (n + 1, ()), (2 * n - 1, (3,)), (3 * n + 2, ()), (37, (2,))):
        for dtype in DTYPES:
            scale = torch.exp2(torch.randint(-8, 8, (n, m, *trailing), generator=gen).double())
            cases.append((torch.randn(n, m, *trailing, generator=gen, dtype=torch.float64) * scale).to(dtype))
    return cases


def _check(n: int) -> None:
    """gloo's bits on every case; and the inputs tell orders apart: OpenMPI's ring differs somewhere."""
    differs = 0
    with SpawnedGroup(n) as ring:
        for x in _inputs(n, seed=n):
            results = ring.run(_rank_all_reduce, x, timeout_s=60)
            want = ring_all_reduce(x, schedule="gloo")
            for rank, got in enumerate(results):
                assert same_bits(got, want), (n, tuple(x.shape), x.dtype, rank)
            differs += not same_bits(results[0], ring_all_reduce(x, schedule="openmpi-ring"))
    assert differs > 0 or n == 2  # for N = 2 every order of one addition is the same


@pytest.mark.clause("schedule-presets", "schedule-layouts")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_gloo_preset_equals_torch_distributed_gloo(n: int) -> None:
    _check(n)


@pytest.mark.soak
@pytest.mark.clause("schedule-presets")
@pytest.mark.parametrize("n", range(2, 9))
def test_soak_gloo_preset_equals_gloo_for_every_n_up_to_eight(n: int) -> None:
    _check(n)


def _reveal_gloo(n: int) -> None:
    with SpawnedGroup(n) as ring:

        def gloo(x: torch.Tensor) -> torch.Tensor:
            return ring.run(_rank_all_reduce, x, timeout_s=60)[0]

        for m in (n, 2 * n + 3):
            for dtype in ("float32", "float64"):
                found = reveal(gloo, n, m, dtype)
                assert "gloo" in found.matches, found.summary()
                assert found.classification == "ring", found.summary()
                if n >= 3:  # for N = 2 every ring is the same one
                    assert found.ring is not None and found.ring.direction == -1, found.summary()
                    assert (found.ring.offset, found.ring.layout) == (n - 1, "gloo"), found.summary()
                assert found.probe_calls <= n + 4


@pytest.mark.clause("reveal-report", "schedule-presets")
def test_reveal_on_gloo_fits_the_gloo_preset() -> None:
    # N = 3, M = 4 written out: gloo cuts 4 elements into 6 segments of 1, 2 per rank: chunks 2, 2, 0;
    # chunk 0 folds workers 2, 1, 0 and chunk 1 folds 0, 2, 1.
    with SpawnedGroup(3) as ring:
        found = reveal(lambda x: ring.run(_rank_all_reduce, x, timeout_s=60)[0], 3, 4)
    assert found.to_json()["trees"] == [flat(t) for t in [[[1, 2], 0], [[1, 2], 0], [[0, 2], 1], [[0, 2], 1]]]
    # M = 4 at N = 3: gloo's segments and ceil's chunks cut alike (2, 2, 0), and a fold's first two operands
    # commute, so MPICH's ring makes these trees too (reveal says at which M they are told apart)
    assert found.matches == ["gloo", "mpich-ring"]
    _reveal_gloo(4)


@pytest.mark.soak
@pytest.mark.clause("reveal-report")
@pytest.mark.parametrize("n", range(2, 9))
def test_soak_reveal_on_gloo_fits_the_gloo_preset_for_every_n_up_to_eight(n: int) -> None:
    _reveal_gloo(n)


@pytest.mark.clause("reveal-report", "difftest-exact-orders")
def test_per_rank_reveal_and_auto_on_torch_distributed_all_reduce(capsys: pytest.CaptureFixture[str]) -> None:
    """``--ranks gloo``: ``torch.distributed.all_reduce(tensor)`` on every rank, as a user calls it."""
    import json

    from ring_ref._cli import main

    assert (
        main(["reveal", "--ranks", "gloo", "torch.distributed:all_reduce", "-n", "3", "-m", "4", "--json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    # as in test_reveal_on_gloo_fits_the_gloo_preset: chunks of 2, 2, 0 folding 2,1,0 and 0,2,1
    assert doc["trees"] == [flat(t) for t in [[[1, 2], 0], [[1, 2], 0], [[0, 2], 1], [[0, 2], 1]]]
    assert doc["matches"] == ["gloo", "mpich-ring"]  # as above: alike at this N and M
    common = ["--mode", "exact", "--examples", "8", "--seed", "2", "--max-workers", "3"]
    assert (
        main(["difftest", "--ranks", "gloo", "torch.distributed:all_reduce", *common, "--schedule", "auto"])
        == 0
    )
    captured = capsys.readouterr()
    assert "exact checks against the gloo schedule's order, which --schedule auto" in captured.out
    assert "exact: PASS" in captured.out


@pytest.mark.clause("difftest-order-probes", "difftest-ranks")
def test_gloo_fails_exact_at_every_seed_and_passes_its_schedule() -> None:
    """The order probes: ``exact`` fails gloo's all-reduce whatever the seed, even with one example."""
    from ring_ref.difftest import Report
    from ring_ref.difftest._options import Options
    from ring_ref.difftest._orders import schedule_order
    from ring_ref.difftest._run import run_difftest

    def exact(target: str, seed: int, order: ExactOrder | None = None) -> Report:
        options = Options(
            ranks="gloo", modes=("exact",), examples=1, seed=seed, max_workers=3, dtypes=[torch.float32]
        )
        return run_difftest(target, options, order)

    for seed in (0, 1, 2):
        report = exact("torch.distributed:all_reduce", seed)
        finding = report.modes["exact"].finding
        assert report.verdict == "fail" and finding is not None, report.render()
        assert finding.codes == ["not-ring-order"], report.render()
        assert "the target sums that element as fold" in finding.explanation
        assert "where the spec's ring folds" in finding.explanation
    spec_ring = exact("ring_ref.distributed:ring_all_reduce_", 0)
    probes = spec_ring.modes["exact"].probes
    assert spec_ring.verdict == "pass" and probes is not None, spec_ring.render()
    # N - 1 calls per N and M: M = 2N, and at N = 3 M = 3N too, where gloo's layout cuts otherwise
    assert probes.workers == {"float32": [2, 3]} and probes.calls == 1 + 2 * 2
    # gloo's layout: M = 2N - 1 and 2N too, and at N = 3 M = 2N + 1 and 3N, where other layouts cut otherwise
    gloo = exact("torch.distributed:all_reduce", 0, schedule_order("gloo"))
    probes = gloo.modes["exact"].probes
    assert gloo.verdict == "pass" and probes is not None and probes.calls == 2 + 4 * 2, gloo.render()
