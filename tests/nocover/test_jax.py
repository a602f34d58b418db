"""JAX targets under difftest and reveal, and the findings about XLA's collectives, each measured here.

Every test runs in a fresh Python process: jax's CPU device count is fixed at
its first use, and a process that has used jax must not fork difftest's worker.
Expected orders and codes are typed in from the measurements written in
``docs/guide/jax.md``, never computed by the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from filelock import FileLock

from tests.common.paths import ROOT
from tests.common.planted_jax import PLANTED


def _python(code: str, timeout_s: float = 500.0) -> Any:
    """Run ``code`` in a fresh interpreter at the repository root; the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.clause("jax-adapter")
def test_import_ring_ref_and_the_torch_and_numpy_paths_do_not_import_jax() -> None:
    code = (
        "import sys, json, numpy, torch, ring_ref\n"
        "from ring_ref import difftest, targets\n"
        "ring_ref.ring_all_reduce(torch.ones(2, 2)); ring_ref.ring_all_reduce(numpy.ones((2, 2)))\n"
        "print(json.dumps('jax' in sys.modules))\n"
    )
    assert _python(code) is False


_MEASURE = """
import json, math, numpy, torch
from ring_ref._reveal import reveal
from ring_ref.difftest import difftest, load_target
psum = load_target("ring_ref.targets:jax_psum", "jax")
found = {"reveal": {n: reveal(psum, n, 2 * n, "float32").summary() for n in range(2, 9)}}
zeros = torch.full((4, 4), -0.0)
signs = {"psum": psum(zeros)[0].item(), "torch.sum": zeros.sum(0)[0].item(),
         "numpy.sum": float(zeros.numpy().sum(0)[0])}
found["zero_signs"] = {k: math.copysign(1.0, v) for k, v in signs.items()}
tiny = torch.tensor([[2.0**-140, 1.0], [2.0**-141, 2.0**-149]])
found["subnormal"] = psum(tiny).tolist()
def codes(target, mode, **options):
    report = difftest(target, modes=[mode], examples=40, seed=7, max_workers=4, isolate=False,
                      framework="jax", dtypes=[torch.float32], **options)
    result = report.modes[mode]
    return result.finding.codes if result.finding else result.verdict
target = "ring_ref.targets:jax_psum"
found["ops"] = {f"{op} {mode}": codes(target, mode, op=op)
                for op, mode in [("avg", "order-free"), ("max", "exact"), ("max", "order-free"),
                                 ("min", "exact"), ("min", "order-free"), ("prod", "bound")]}
found["planted"] = {name: codes("tests.common.planted_jax:" + name, "bound") for name in PLANTED}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Any:
    """Everything measured on ``jax_psum`` and the planted JAX bugs, in one fresh process (in-process
    difftest: one jax, one compilation per shape), once per run: pytest-xdist's workers share it."""
    code = f"PLANTED = {sorted(PLANTED)!r}\n" + _MEASURE
    if worker_id == "master":
        return _python(code, timeout_s=1500.0)
    path = tmp_path_factory.getbasetemp().parent / "jax-measured.json"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            path.write_text(json.dumps(_python(code, timeout_s=1500.0)))
        return json.loads(path.read_text())


@pytest.mark.clause("jax-findings")
def test_in_process_psum_folds_in_device_order_at_n_3_to_8(measured: Any) -> None:
    two = measured["reveal"]["2"]  # two values add the same way in every order: every ring matches
    assert "classification: ring" in two and "matches presets: spec, openmpi-ring, gloo" in two
    for n in range(3, 9):
        fold = ",".join(str(w) for w in range(n))  # device 0, 1, ..., N - 1: typed in, not derived
        assert f"elements 0..{2 * n - 1}: fold {fold}\n" in measured["reveal"][str(n)]
        assert "classification: folds" in measured["reveal"][str(n)]
        # no ring; the fold in device order is the chain preset's (spec/schedules.md)
        # (at N = 3 recursive doubling's tree, (x0 + x1) + x2, is that fold too)
        names = "chain, recursive-doubling" if n == 3 else "chain"
        assert f"matches presets: {names}\n" in measured["reveal"][str(n)]


@pytest.mark.clause("jax-findings")
def test_psum_torch_sum_and_numpy_sum_of_negative_zeros_are_plus_zero(measured: Any) -> None:
    assert measured["zero_signs"] == {"psum": 1.0, "torch.sum": 1.0, "numpy.sum": 1.0}


@pytest.mark.clause("jax-findings")
def test_psum_flushes_subnormals_to_zero(measured: Any) -> None:
    # 2^-140 + 2^-141 and 2^-149 are float32 subnormals, exact in any order; XLA's CPU psum gives 0
    assert measured["subnormal"] == [0.0, 1.0]


@pytest.mark.clause("jax-findings")
def test_pmean_pmax_pmin_under_op(measured: Any) -> None:
    assert measured["ops"] == {
        "avg order-free": ["avg-times-reciprocal"],
        "max exact": ["signed-zero"],
        "max order-free": "pass",
        "min exact": ["signed-zero"],
        "min order-free": "pass",
        "prod bound": ["raised"],
    }


@pytest.mark.clause("jax-planted")
def test_a_planted_jax_bug_per_family_gets_its_code(measured: Any) -> None:
    assert measured["planted"] == {name: [code] for name, code in PLANTED.items()}


@pytest.mark.clause("jax-difftest")
def test_cli_difftest_framework_jax_isolates_psum_and_names_its_order() -> None:
    argv = [sys.executable, "-m", "ring_ref", "difftest", "--framework", "jax", "ring_ref.targets:jax_psum"]
    argv += ["--mode", "exact", "--max-workers", "3", "--examples", "5", "--seed", "5", "--dtypes", "float32"]
    done = subprocess.run(
        [*argv, "--json"], capture_output=True, text=True, timeout=900, cwd=ROOT, check=False
    )
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["isolated"] is True
    assert report["modes"]["exact"]["verdict"] == "fail"
    assert report["modes"]["exact"]["diagnoses"] == ["not-ring-order"]
    assert "--framework jax" in report["replay"]


@pytest.mark.clause("jax-findings")
def test_in_process_psum_is_the_chain_but_for_the_sign_of_a_zero_sum() -> None:
    # Against the chain (the fold in device order) every order probe passes; what is left is the sum of
    # -0.0 values, which psum folds from +0.0.
    argv = [sys.executable, "-m", "ring_ref", "difftest", "--framework", "jax", "ring_ref.targets:jax_psum"]
    argv += ["--schedule", "chain", "--mode", "exact", "--max-workers", "4", "--examples", "20"]
    argv += ["--seed", "3", "--dtypes", "float32", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    exact = json.loads(done.stdout)["modes"]["exact"]
    assert exact["diagnoses"] == ["signed-zero"]
    assert exact["counterexample"]["input"] == [[-0.0, -0.0], [-0.0, -0.0]]


@pytest.mark.clause("jax-findings")
def test_psum_scatter_folds_in_device_order_and_flushes_subnormals() -> None:
    argv = [
        sys.executable,
        "-m",
        "ring_ref",
        "difftest",
        "--framework",
        "jax",
        "ring_ref.targets:jax_psum_scatter",
    ]
    argv += ["--collective", "reduce-scatter", "--max-workers", "4", "--examples", "30", "--seed", "4"]
    argv += ["--dtypes", "float32", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    modes = json.loads(done.stdout)["modes"]
    assert modes["exact"]["diagnoses"] == ["not-ring-order"]
    assert "fold 0,1,2" in modes["exact"]["explanation"]  # device order, typed in
    assert modes["order-free"]["verdict"] == "pass"
    assert modes["bound"]["diagnoses"] == ["out-of-bound"]  # a subnormal comes back as 0.0
