"""The option rules that read dtypes, ops and order files (``ring_ref.difftest._options``), word for word.

The rules every run checks before it calls the target: ``difftest()`` and the command line share them
(their refusals through ``difftest()``: ``test_run.py``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from ring_ref.difftest import DTYPES
from ring_ref.difftest._options import Options, allowed_dtypes, check_order_file_fits, option_problem, refused
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


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(
    "options",
    [
        {"examples": 1, "seed": None, "max_workers": 1},
        {"examples": 1, "seed": 0, "max_workers": 64, "timeout": 0.001},
        {"examples": 100, "seed": 2**40, "max_workers": 16, "timeout": 60.0},
    ],
)
def test_options_within_the_documented_ranges_are_accepted(options: dict[str, Any]) -> None:
    assert option_problem(**options) == ""


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"examples": 0}, ["examples (--examples)", "at least 1", "got 0"]),
        ({"examples": -3}, ["--examples", "at least 1", "got -3"]),
        ({"seed": -1}, ["seed (--seed)", "non-negative integer", "got -1"]),
        ({"max_workers": 0}, ["max_workers (--max-workers)", "between 1 and 64", "got 0"]),
        ({"max_workers": 65}, ["--max-workers", "between 1 and 64", "got 65"]),
        ({"timeout": 0.0}, ["timeout (--timeout)", "positive number of seconds", "got 0"]),
        ({"timeout": -2.5}, ["--timeout", "positive", "got -2.5"]),
        ({"timeout": math.inf}, ["--timeout", "positive", "got inf"]),
        ({"timeout": math.nan}, ["--timeout", "positive", "got nan"]),
    ],
)
def test_each_refused_option_is_named_with_its_range(options: dict[str, Any], words: list[str]) -> None:
    problem = option_problem(**{"examples": 5, "seed": 3, "max_workers": 4, **options})
    for word in words:
        assert word in problem
