"""``--ranks jax``: ``jax.distributed`` processes over gloo, the finding about their ``psum``, a planted bug.

Every run is the ``ring-ref`` command in a fresh process (the tester must not
have imported jax: it forks the ranks).  Expected folds and codes are typed in
from the measurements written in ``docs/guide/jax.md``, never computed by the
code under test.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.common.paths import ROOT
from tests.common.planted_jax import PLANTED_RANKS
from tests.common.processes import ring_ref_json
from tests.common.reveal_targets import flat

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))


def _reveal(n: int) -> Any:
    return ring_ref_json(
        "reveal",
        "--ranks",
        "jax",
        "ring_ref.targets:jax_psum_ranks",
        "-n",
        str(n),
        "-m",
        str(2 * n),
        status=0,
    )


@pytest.mark.clause("jax-findings", "jax-ranks")
def test_multi_process_psum_over_gloo_is_the_gloo_preset_at_n_2_to_4() -> None:
    # N = 2: two values add the same way in every order, so every ring preset matches
    assert set(_reveal(2)["matches"]) >= {"spec", "openmpi-ring", "gloo"}
    # typed in: chunk c folds ranks c-1, c-2, ..., c (mod N), gloo's ring (-1, N-1, gloo); the first
    # two operands of a fold are written in increasing order, as reveal writes every tree
    by_chunk = {
        3: [[[1, 2], 0], [[0, 2], 1], [[0, 1], 2]],
        4: [[[[2, 3], 1], 0], [[[0, 3], 2], 1], [[[0, 1], 3], 2], [[[1, 2], 0], 3]],
    }
    for n, trees in by_chunk.items():
        found = _reveal(n)
        alike = ["mpich-ring"] if n == 3 else []  # at N = 3, M = 6 gloo's and ceil's cuts and trees agree
        assert found["classification"] == "ring" and found["matches"] == ["gloo", *alike], found
        assert found["ring"] == {"direction": -1, "offset": n - 1, "layout": "gloo"}
        assert found["trees"] == [flat(tree) for tree in trees for _ in range(2)]  # version 3: folds flat


@pytest.mark.clause("jax-findings", "jax-ranks")
def test_multi_process_psum_passes_exact_against_gloo_but_in_bfloat16() -> None:
    args = ["difftest", "--ranks", "jax", "ring_ref.targets:jax_psum_ranks", "--schedule", "gloo"]
    args += ["--mode", "exact", "--examples", "5", "--seed", "1"]
    same = ring_ref_json(*args, "--dtypes", "float16", "float32", "float64", status=0)
    jsonschema.validate(same, SCHEMA)
    assert same["ranks"] == "jax" and same["verdict"] == "pass"
    bf16 = ring_ref_json(*args, "--dtypes", "bfloat16", status=1)
    assert bf16["diagnoses"] == ["not-ring-order"]


@pytest.mark.clause("jax-planted", "jax-ranks")
def test_a_process_returning_other_bits_is_ranks_disagree() -> None:
    for name, code in PLANTED_RANKS.items():
        args = ["difftest", "--ranks", "jax", f"tests.common.planted_jax:{name}", "--mode", "order-free"]
        doc = ring_ref_json(*args, "--examples", "10", "--seed", "3", "--max-workers", "3", status=1)
        jsonschema.validate(doc, SCHEMA)
        assert doc["diagnoses"] == [code]
        cex = doc["modes"]["order-free"]["counterexample"]
        assert cex["ranks"] == [cex["n"] - 1]  # the last process, the one the bug is planted in
        assert doc["replay"].startswith(f"ring-ref difftest --ranks jax tests.common.planted_jax:{name}")


@pytest.mark.clause("jax-ranks")
def test_ops_reach_a_jax_rank_by_name() -> None:
    args = ["difftest", "--ranks", "jax", "ring_ref.targets:jax_psum_ranks", "--op", "max", "--mode"]
    doc = ring_ref_json(
        *args, "order-free", "--examples", "3", "--max-workers", "3", "--dtypes", "float32", status=0
    )
    assert doc["op"] == "max" and doc["verdict"] == "pass"


@pytest.mark.clause("jax-ranks")
def test_a_hung_process_is_timed_out_with_every_ranks_stack() -> None:
    args = [
        "difftest",
        "--ranks",
        "jax",
        "tests.common.planted_jax:psum_ranks_process_1_hangs",
        "--timeout",
        "5",
    ]
    doc = ring_ref_json(
        *args, "--mode", "bound", "--examples", "2", "--seed", "3", "--max-workers", "2", status=1
    )
    assert doc["diagnoses"] == ["timed-out"]
    cex = doc["modes"]["bound"]["counterexample"]
    assert cex["n"] == 2 and cex["ranks"] == [0, 1]  # rank 0 waits in the psum for rank 1
    assert "in psum_ranks_process_1_hangs" in cex["stack"] and "in jax_psum_ranks" in cex["stack"]
