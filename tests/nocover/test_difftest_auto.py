"""`ring-ref difftest --schedule auto` from the command line: reveal, fit a ring, check `exact` against it.

Each run reveals in ``ring-ref reveal`` processes of its own (issue #29 item 3).
"""

from __future__ import annotations

import pytest

from ring_ref._cli import main

COMMON = ["--mode", "exact", "--schedule", "auto", "--examples", "6", "--seed", "5", "--max-workers", "4"]


@pytest.mark.clause("difftest-exact-orders")
@pytest.mark.parametrize(
    ("target", "fitted"),
    [
        ("ring_ref:ring_all_reduce", "the spec schedule's order"),
        ("tests.common.planted_impls:fast_engine", "the spec schedule's order"),
        ("tests.common.planted_impls:even_ring_ignoring_the_remainder", "the spec schedule's order"),
        ("tests.common.planted_impls:openmpi_ring_preset", "the openmpi-ring schedule's order"),
        ("tests.common.planted_impls:gloo_preset", "the gloo schedule's order"),
    ],
)
def test_auto_passes_the_reference_and_the_presets_and_names_the_fitted_ring(
    target: str, fitted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The even layout is tried first (M = 2N); M = 2N + 1 only tells layouts apart, and an even-layout
    target that refuses it, or sums it as no ring's fold, is not failed for that."""
    assert main(["difftest", target, *COMMON]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the report's lines, rewrapped
    assert f"exact checks against {fitted}, which --schedule auto found" in out and "exact: PASS" in out, out
    if fitted == "the spec schedule's order":
        assert "revealed at N = 4, M = 8" in out and "only M divisible by N" in out
    else:
        assert "revealed at N = 4, M = 9" in out


@pytest.mark.clause("difftest-ranks", "difftest-exact-orders")
def test_auto_on_torch_distributed_all_reduce_over_gloo_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["difftest", "--ranks", "gloo", "torch.distributed:all_reduce", *COMMON]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "revealed at N = 4, M = 9" in out and "exact checks against the gloo schedule's order" in out, out
    assert "exact: PASS" in out
