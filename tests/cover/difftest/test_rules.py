"""The rules that need no torch (``ring_ref.difftest._rules``): each refusal in full words, and the edges of
each rule, typed in from the option rules the difftest spec and the CLI's help state."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ring_ref.difftest._rules import (
    Options,
    env_names_refused,
    env_refused,
    kinds_refused,
    modes_of,
    option_problem,
    refused_before_torch,
    subgroups_refused,
)


def test_an_unknown_collective_is_refused_with_the_three_names() -> None:
    assert kinds_refused(Options(collective="all-to-all")) == (  # type: ignore[arg-type]
        "collective (--collective) must be one of ['all-reduce', 'reduce-scatter', 'all-gather']; "
        "got 'all-to-all'"
    )


@pytest.mark.parametrize(
    ("framework", "ranks", "refused"),
    [
        ("jax", None, False),
        ("jax", "jax", False),
        ("torch", "gloo", False),
        ("torch", "jax", False),
        ("jax", "gloo", True),
        ("jax", "mpi", True),
        ("numpy", None, True),
    ],
)
def test_jax_is_for_stacked_targets_or_jax_ranks(framework: str, ranks: str | None, refused: bool) -> None:
    problem = kinds_refused(Options(framework=framework, ranks=ranks))  # type: ignore[arg-type]
    if not refused:
        assert problem is None
        return
    assert problem == (
        "framework (--framework) must be one of ['torch', 'jax'], and jax is for stacked targets or "
        f"ranks='jax' (--ranks jax); got framework={framework!r}, ranks={ranks!r}"
    )


SUBGROUPS = (
    "subgroups (--subgroups) tests every smaller N inside a job, through subgroups of its ranks: it needs "
    "ranks='job' or 'mpi-job' (--ranks job / mpi-job); got ranks={!r} (--ranks gloo and mpi draw every N "
    "up to --max-workers already)"
)


@pytest.mark.parametrize("ranks", ["job", "mpi-job"])
def test_subgroups_run_inside_a_job(ranks: str) -> None:
    assert subgroups_refused(True, ranks) is None
    assert refused_before_torch(Options(subgroups=True, ranks=ranks)) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("ranks", ["gloo", "mpi", None])
def test_subgroups_elsewhere_are_refused_naming_the_ranks_given(ranks: str | None) -> None:
    assert subgroups_refused(True, ranks) == SUBGROUPS.format(ranks)
    assert refused_before_torch(Options(subgroups=True, ranks=ranks)) == SUBGROUPS.format(ranks)  # type: ignore[arg-type]
    assert subgroups_refused(False, ranks) is None


def test_env_names_are_refused_all_at_once() -> None:
    assert env_names_refused({"1X": "1", "OK": "2", "A-B": "3"}) == (
        "env (--env) names must be NAME=VALUE with NAME letters, digits and '_' (not first a digit); "
        "got '1X', 'A-B'"
    )
    assert env_refused({"1X": "1"}, None, "gloo") is not None


def test_a_bad_mode_is_refused_naming_every_mode_and_all() -> None:
    with pytest.raises(ValueError) as raised:
        modes_of(["exact", "fast"])
    assert str(raised.value) == (
        "each mode must be one of ['exact', 'order-free', 'bound', 'all']; modes (mode=, --mode) takes one "
        "or a non-empty list of them; got ['exact', 'fast']"
    )


ENV_NEEDS = (
    "env (--env) sets variables in the processes that the tester starts: it needs ranks 'gloo', 'mpi', "
    "'jax', 'mlx'; "
)


def test_env_for_a_stacked_target_says_to_set_it_where_ring_ref_runs() -> None:
    assert env_refused({"X": "1"}, None, None) == (
        f"{ENV_NEEDS}a stacked TARGET runs in the tester's own process: set the variables in the environment "
        "ring-ref runs in; got ranks=None"
    )


@pytest.mark.parametrize("ranks", ["job", "mpi-job"])
def test_env_inside_a_job_says_to_give_it_to_the_jobs_launcher(ranks: str) -> None:
    assert env_refused({"X": "1"}, None, ranks) == (
        f"{ENV_NEEDS}inside your own job give the variables to its launcher (mpiexec -genv NAME VALUE, "
        f"mpirun -x NAME=VALUE, or export NAME=VALUE before torchrun or mlx.launch); got ranks={ranks!r}"
    )
    assert env_refused({}, None, ranks) is None


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
