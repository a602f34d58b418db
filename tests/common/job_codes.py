"""Run under ``torchrun``: ``difftest(ranks="job")`` from inside the job, on the planted per-rank targets.

``python -m torch.distributed.run --standalone --nproc-per-node N -m tests.common.job_codes OUT_DIR``: every
rank joins the job's gloo group, then calls :func:`ring_ref.difftest.difftest` with ``ranks="job"`` on each
correct target and each planted bug that leaves no rank inside the target (the others end the job:
``tests/nocover/test_difftest_job.py`` runs them one job each), then
:func:`ring_ref.testing.assert_matches_reference` on one bug, and writes ``OUT_DIR/rank-R.json``: the codes
per target and the assertion's message, so that the test can see that every rank got the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from ring_ref.difftest import difftest
from ring_ref.testing import assert_matches_reference
from tests.common import planted_rank_impls

CORRECT = ("plain_ring", "returns_a_new_tensor")
"""Targets that pass."""
ENDS_THE_JOB = ("receives_first", "exits_mid_call", "rank_1_raises")
"""Planted bugs that leave ranks inside the target: the job ends after their report."""


def targets() -> list[str]:
    """The targets run in one job, by name."""
    bugs = [f.__name__ for f in planted_rank_impls.EXPECTED if f.__name__ not in ENDS_THE_JOB]
    return [f"tests.common.planted_rank_impls:{name}" for name in (*CORRECT, *bugs)]


def main(out: Path) -> None:
    """Every target, then the assertion, on this rank; the rank's file."""
    dist.init_process_group("gloo")
    codes = {}
    for target in targets():
        report = difftest(target, ranks="job", modes=("order-free", "bound"), examples=8, seed=1, timeout=20)
        codes[target] = report.diagnoses
    try:
        assert_matches_reference(planted_rank_impls.gather_adds, "bound", ranks="job", examples=8, seed=1)
        message = ""
    except AssertionError as exc:
        message = str(exc)
    rank = dist.get_rank()
    (out / f"rank-{rank}.json").write_text(json.dumps({"codes": codes, "assertion": message}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
