"""``--ranks mlx``: MLX ring processes on loopback, the order of MLX's ``all_sum``, a planted narrowing bug.

Every run is the ``ring-ref`` command (or ``torchrun``) in a fresh process: the tester must not have
imported MLX, since it forks the ranks.  Expected folds and codes are typed in from the measurements
written in ``docs/guide/ranks.md`` (*MLX's ring under test*), never computed by the code under test:
chunk ``c`` of ``ceil(M / N)`` elements (the last ones short or empty) folds ranks ``c, c-1, ..., c+1``
(mod ``N``), written as reveal writes every tree, its first two operands in increasing order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from ring_ref._processes._mlx import loopback_hostfile
from tests.common.paths import ROOT
from tests.common.processes import ring_ref_json

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
TARGET = "ring_ref.targets:mlx_all_sum"


def _reveal(n: int, m: int, dtype: str = "float32") -> Any:
    return ring_ref_json(
        "reveal", "--ranks", "mlx", TARGET, "-n", str(n), "-m", str(m), "--dtype", dtype, status=0
    )


def _mlx_folds(n: int, m: int) -> list[object]:
    """Typed in from the measured rule: element ``e`` is in chunk ``e // ceil(M / N)``, which folds
    ``c, c-1, ..., c+1``; reveal writes a fold's first two ranks in increasing order (two ranks as the
    pair ``[0, 1]``)."""
    size = -(-m // n)
    folds: list[object] = []
    for e in range(m):
        c = e // size
        fold = [(c - k) % n for k in range(n)]
        fold[:2] = sorted(fold[:2])
        folds.append(fold if n == 2 else {"fold": fold})
    return folds


@pytest.mark.clause("mlx-findings", "mlx-ranks")
def test_mlx_all_sum_folds_each_ceil_chunk_from_its_own_rank_down_at_n_4_m_9() -> None:
    # M = 9 at N = 4: chunks of 3, 3, 3 and 0 elements, the ceil layout: MLX's ring preset
    found = _reveal(4, 9)
    assert found["classification"] == "ring" and found["matches"] == ["mlx-ring"], found
    assert found["ring"] == {"direction": -1, "offset": 0, "layout": "ceil"}
    assert (
        found["trees"]
        == [{"fold": [0, 3, 2, 1]}] * 3 + [{"fold": [0, 1, 3, 2]}] * 3 + [{"fold": [1, 2, 0, 3]}] * 3
    )
    assert found["trees"] == _mlx_folds(4, 9)


@pytest.mark.soak
@pytest.mark.clause("mlx-findings", "mlx-ranks")
@pytest.mark.parametrize(("n", "m"), [(2, 4), (2, 5), (3, 9), (3, 7), (4, 8), (4, 10), (5, 10), (5, 13)])
def test_soak_mlx_all_sum_folds_at_n_2_to_5_m_multiple_and_not(n: int, m: int) -> None:
    found = _reveal(n, m)
    assert found["trees"] == _mlx_folds(n, m), found
    if m % n == 0:  # equal chunks: a ring of the family, direction -1 from the chunk's own rank
        assert found["classification"] == "ring", found
    if m % n == 0 and n > 3:  # (at N = 3 the same trees are also direction +1, offset 2: fit's canonical)
        assert found["ring"] == {"direction": -1, "offset": 0, "layout": "even"}


@pytest.mark.soak
@pytest.mark.clause("mlx-findings")
def test_soak_mlx_all_sum_order_is_the_same_in_every_dtype_and_below_n_elements_differs() -> None:
    for dtype in ("float64", "float16", "bfloat16"):
        assert _reveal(4, 9, dtype)["trees"] == _mlx_folds(4, 9), dtype
    # fewer elements than ranks: not the rule above (typed in from the measurement at N = 3, M = 2)
    assert _reveal(3, 2)["trees"] == [{"fold": [0, 1, 2]}, {"fold": [1, 2, 0]}]


@pytest.mark.soak
@pytest.mark.clause("mlx-ranks", "mlx-findings")
def test_soak_mlx_all_sum_passes_order_free_and_bound_and_a_saved_reveal_certifies_it(
    tmp_path: Path,
) -> None:
    args = ["difftest", "--ranks", "mlx", TARGET, "--examples", "20", "--seed", "1"]
    doc = ring_ref_json(*args, status=1)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks"] == "mlx" and doc["diagnoses"] == ["not-ring-order"]
    assert [doc["modes"][m]["verdict"] for m in ("exact", "order-free", "bound")] == ["fail", "pass", "pass"]
    saved = tmp_path / "mlx-n3-m7.json"
    saved.write_text(json.dumps(_reveal(3, 7)), encoding="utf-8")
    certified = ring_ref_json(
        *args[:4], "--mode", "exact", "--order", str(saved), "--examples", "30", status=0
    )
    assert certified["verdict"] == "pass"


@pytest.mark.soak
@pytest.mark.clause("mlx-ranks")
def test_soak_invariance_runs_on_mlx_ranks_and_sees_the_order_move() -> None:
    doc = ring_ref_json("invariance", "--ranks", "mlx", TARGET, "-n", "3", "--sizes", "6,7", status=1)
    assert doc["invariant"] is False, doc


@pytest.mark.soak
@pytest.mark.clause("mlx-ranks", "difftest-narrowed-dtype")
def test_soak_a_target_converting_with_mx_array_is_narrowed_dtype() -> None:
    args = ["difftest", "--ranks", "mlx", "tests.common.planted_mlx:converts_with_mx_array"]
    doc = ring_ref_json(*args, "--dtypes", "float64", "--examples", "20", "--seed", "1", status=1)
    assert doc["diagnoses"] == ["narrowed-dtype"]
    assert all(doc["modes"][m]["diagnoses"] == ["narrowed-dtype"] for m in doc["modes"])


@pytest.mark.soak
@pytest.mark.clause("mlx-ranks")
def test_soak_ops_reach_an_mlx_rank_and_mlx_has_no_product() -> None:
    args = ["difftest", "--ranks", "mlx", TARGET, "--mode", "order-free", "--examples", "5"]
    for op in ("max", "min"):
        assert ring_ref_json(*args, "--op", op, "--max-workers", "3", status=0)["verdict"] == "pass", op
    prod = ring_ref_json(*args, "--op", "prod", "--max-workers", "2", status=1)
    assert prod["diagnoses"] == ["raised"]


@pytest.mark.soak
@pytest.mark.clause("mlx-ranks")
def test_soak_mlx_all_sum_joins_a_torchrun_job_from_mlx_hostfile_and_rank(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    hosts = loopback_hostfile(2, tmp_path / "hosts.json")  # the tester imports no MLX: it may write one
    env = {**os.environ, "MLX_HOSTFILE": str(hosts)}
    env.pop("MLX_RANK", None)  # each rank's comes from torchrun's RANK
    command = [torchrun, "--nproc-per-node", "2", "-m", "ring_ref", "difftest", "--ranks", "job", TARGET]
    command += ["--mode", "order-free", "--examples", "10", "--seed", "1"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS" in done.stdout


@pytest.mark.clause("mlx-ranks", "difftest-rank-env")
def test_env_reaches_every_mlx_rank_mlxs_own_variables_too() -> None:
    """``--env NAME=VALUE`` with ``--ranks mlx``: each forked rank has it before it joins MLX's ring (the
    target raises where ``RING_REF_ENV_PROBE`` or MLX's ``MLX_RING_VERBOSE`` is missing)."""
    args = ["difftest", "--ranks", "mlx", "tests.common.planted_mlx:all_sum_if_told", "--mode", "order-free"]
    args += ["--examples", "3", "--max-workers", "3", "--seed", "0"]
    told = ["--env", "RING_REF_ENV_PROBE=on", "--env", "MLX_RING_VERBOSE=1"]
    assert ring_ref_json(*args, *told, status=0)["verdict"] == "pass"
    assert ring_ref_json(*args, status=1)["diagnoses"] == ["raised"]
