"""The option rules that read dtypes, ops and order files (``ring_ref.difftest._options``), word for word.

The rules every run checks before it calls the target: ``difftest()`` and the command line share them
(their refusals through ``difftest()``: ``test_run.py``).
"""

from __future__ import annotations

import pytest
import torch

from ring_ref.difftest import DTYPES
from ring_ref.difftest._options import Options, allowed_dtypes, check_order_file_fits, refused
from ring_ref.difftest._oracles import SavedOrder


def test_an_op_other_than_sum_is_refused_with_auto_or_an_order_file_and_nowhere_else() -> None:
    words = (
        "--op {} checks exact against the spec's ring or a named --schedule; --schedule auto and --order "
        "reveal and name sum orders (drop them; order-free and bound need no order)"
    )
    assert refused(Options(op="max", schedule="auto")) == words.format("max")
    assert refused(Options(op="prod", order="saved.json")) == words.format("prod")
    assert refused(Options(op="sum", schedule="auto")) is None  # reveal names sum orders
    assert refused(Options(schedule="auto")) is None  # no op: the sum
    assert refused(Options(op="max", schedule="gloo")) is None  # a named ring orders any op


def test_mpi_ranks_in_a_job_or_started_take_numpys_dtypes_only() -> None:
    numpys = (torch.float16, torch.float32, torch.float64)
    assert allowed_dtypes("mpi") == allowed_dtypes("mpi-job") == numpys
    assert allowed_dtypes("gloo") == allowed_dtypes(None) == tuple(DTYPES.values())
    assert refused(Options(ranks="mpi-job", dtypes=(torch.bfloat16,))) == (
        "--ranks mpi hands each rank a numpy array, and numpy has no bfloat16: choose dtypes from "
        "['float16', 'float32', 'float64']; got ['bfloat16']"
    )


def test_an_order_file_refuses_a_max_workers_below_its_n_and_dtypes_without_its_own() -> None:
    saved = SavedOrder(3, 5, torch.float32, [], "blocks")
    head = (
        "order (--order) 'o.json' holds an order for N = 3, M = 5, float32, the only inputs exact draws "
        "with it, but "
    )
    tail = ": drop the option or change it (it applies to the other modes)"
    with pytest.raises(ValueError) as both:
        check_order_file_fits("o.json", saved, 2, [torch.float64])
    assert str(both.value) == (
        f"{head}max_workers (--max-workers) 2 is below its N and dtypes (--dtypes) ['float64'] leave out "
        f"its dtype{tail}"
    )
    with pytest.raises(ValueError) as fewer:
        check_order_file_fits("o.json", saved, 2, None)
    assert str(fewer.value) == f"{head}max_workers (--max-workers) 2 is below its N{tail}"
    check_order_file_fits("o.json", saved, 3, [torch.float32, torch.float64])  # its N and dtype: fits
    check_order_file_fits("o.json", saved, None, None)
