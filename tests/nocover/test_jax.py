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

from tests.paths import ROOT
from tests.planted_jax import PLANTED


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


@pytest.mark.clause("jax-findings")
def test_in_process_psum_folds_in_device_order_at_n_2_to_8() -> None:
    code = (
        "import json\n"
        "from ring_ref._reveal import reveal\n"
        "from ring_ref.difftest import load_target\n"
        "psum = load_target('ring_ref.targets:jax_psum', 'jax')\n"
        "print(json.dumps({n: reveal(psum, n, 2 * n, 'float32').summary() for n in range(2, 9)}))\n"
    )
    found = _python(code)
    for n in range(2, 9):
        fold = ",".join(str(w) for w in range(n))  # device 0, 1, ..., N - 1: typed in, not derived
        assert f"elements 0..{2 * n - 1}: fold {fold}\n" in found[str(n)]
        assert "classification: folds" in found[str(n)]
        assert "matches presets: none" in found[str(n)]


@pytest.mark.clause("jax-findings")
def test_psum_torch_sum_and_numpy_sum_of_negative_zeros_are_plus_zero() -> None:
    code = (
        "import json, math, numpy, torch\n"
        "from ring_ref.difftest import load_target\n"
        "psum = load_target('ring_ref.targets:jax_psum', 'jax')\n"
        "zeros = torch.full((4, 4), -0.0)\n"
        "got = {'psum': psum(zeros)[0].item(), 'torch.sum': zeros.sum(0)[0].item(),\n"
        "       'numpy.sum': float(zeros.numpy().sum(0)[0])}\n"
        "print(json.dumps({k: math.copysign(1.0, v) for k, v in got.items()}))\n"
    )
    assert _python(code) == {"psum": 1.0, "torch.sum": 1.0, "numpy.sum": 1.0}


@pytest.mark.clause("jax-difftest")
def test_cli_difftest_framework_jax_isolates_psum_and_names_its_order() -> None:
    argv = [sys.executable, "-m", "ring_ref", "difftest", "--framework", "jax", "ring_ref.targets:jax_psum"]
    argv += ["--max-workers", "3", "--examples", "8", "--seed", "5", "--dtypes", "float32", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=500, cwd=ROOT, check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["isolated"] is True
    assert {m: r["verdict"] for m, r in report["modes"].items()} == {
        "exact": "fail",
        "order-free": "pass",
        "bound": "pass",
    }
    assert report["modes"]["exact"]["diagnoses"] == ["not-ring-order"]
    assert "--framework jax" in report["replay"]


_DIFFTEST = (
    "import json\n"
    "from ring_ref.difftest import difftest\n"
    "def codes(target, **options):\n"
    "    report = difftest(target, examples=8, seed=7, max_workers=3, isolate=False, framework='jax',\n"
    "                      **options)\n"
    "    return {m: r.finding.codes if r.finding else r.verdict for m, r in report.modes.items()}\n"
)


@pytest.mark.clause("jax-findings")
def test_pmean_pmax_pmin_under_op() -> None:
    code = _DIFFTEST + (
        "import torch\n"
        "psum = 'ring_ref.targets:jax_psum'\n"
        "ops = ('avg', 'max', 'min', 'prod')\n"
        "print(json.dumps({op: codes(psum, op=op, dtypes=[torch.float32]) for op in ops}))\n"
    )
    found = _python(code)
    assert found["avg"] == {"exact": ["not-ring-order"], "order-free": "pass", "bound": "pass"}
    for op in ("max", "min"):
        assert found[op] == {"exact": ["signed-zero"], "order-free": "pass", "bound": "pass"}
    assert found["prod"] == {"exact": ["raised"], "order-free": ["raised"], "bound": ["raised"]}


@pytest.mark.clause("jax-planted")
def test_a_planted_jax_bug_per_family_gets_its_code() -> None:
    code = _DIFFTEST + (
        f"print(json.dumps({{name: codes('tests.planted_jax:' + name) for name in {sorted(PLANTED)!r}}}))\n"
    )
    found = _python(code)
    for name, code_name in PLANTED.items():
        assert found[name] == {"exact": [code_name], "order-free": [code_name], "bound": [code_name]}, name
