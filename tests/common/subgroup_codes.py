"""Run under ``torchrun`` (4 ranks): ``subgroups=True`` from inside the job, through the Python API.

``python -m torch.distributed.run --standalone --nproc-per-node 4 -m tests.common.subgroup_codes OUT_DIR``:
every rank joins the job's gloo group, then

* checks the odd-group bug of ``tests/common/planted_group_impls.py`` without subgroups (only ``N = 4``),
* checks the correct target with :func:`ring_ref.testing.assert_matches_reference` and ``subgroups=True``,
* asserts on the odd-group bug with ``subgroups=True`` (it fails, at ``N = 3``),
* on ranks 0 and 1 only, asks for subgroups of a group of two of the four ranks (refused),

and writes ``OUT_DIR/rank-R.json``, so that the test can see that every rank got the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from ring_ref.difftest import difftest
from ring_ref.testing import assert_matches_reference
from tests.common import planted_group_impls

BUG = "tests.common.planted_group_impls:odd_group_last_rank_keeps_input"
OPTIONS = {"examples": 20, "seed": 1, "timeout": 20.0}


def main(out: Path) -> None:
    """The three checks (and the refusal on ranks 0 and 1); the rank's file."""
    dist.init_process_group("gloo")
    pair = dist.new_group([0, 1])  # every rank creates it; only ranks 0 and 1 are in it
    found: dict[str, object] = {}
    whole = difftest(BUG, ranks="job", modes=("bound",), **OPTIONS)  # type: ignore[arg-type]
    found["without"] = [whole.verdict, whole.tested_n]
    correct = assert_matches_reference(
        planted_group_impls.all_reduce_on_group,
        ["order-free", "bound"],
        ranks="job",
        subgroups=True,
        **OPTIONS,  # type: ignore[arg-type]
    )
    found["correct"] = [correct.verdict, correct.tested_n]
    try:
        assert_matches_reference(BUG, "bound", ranks="job", subgroups=True, **OPTIONS)  # type: ignore[arg-type]
        found["with"] = ""
    except AssertionError as exc:
        found["with"] = str(exc)
    rank = dist.get_rank()
    if rank < 2:
        try:
            difftest(BUG, ranks="job", group=pair, subgroups=True, **OPTIONS)  # type: ignore[arg-type]
        except ValueError as exc:
            found["pair"] = str(exc)
    (out / f"rank-{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
