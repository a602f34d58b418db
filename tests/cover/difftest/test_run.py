"""A difftest run (``ring_ref.difftest._run``): the options refused before the target is called, the
launcher each target gets, what runs and what the report says, and the replay line that reproduces the run.

Fast, so that ``make mutation`` can run it for each mutant of the run: tiny example budgets, targets run in
pytest's process or a worker, and stand-ins for the rank launchers that record how they were made.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

import ring_ref
from ring_ref import ring_all_reduce
from ring_ref._cli import main
from ring_ref.difftest import Case, Report, TargetError, difftest
from ring_ref.difftest._call import Outcome
from ring_ref.difftest._launch import Isolated
from ring_ref.difftest._options import Options
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder
from ring_ref.difftest._orders import OrderError, reduce_scatter_order, schedule_order
from ring_ref.difftest._rules import Spawn
from ring_ref.difftest._run import _job_target, _launcher, _replay, run_difftest
from ring_ref.difftest._vocabulary import MODES
from tests.common import planted_impls
from tests.common.scripted import Scripted, crashed, right

F32 = [torch.float32]
ALL_DTYPE_NAMES = "float16 bfloat16 float32 float64"

NAMELESS = lambda x: ring_all_reduce(x).clone()  # noqa: E731
"""A target the CLI cannot import."""
SUM_ONLY = ExactOrder("a sum order", SPEC_ORDER.expected)
"""An order that computes sums only (as a saved ``--order`` file does)."""


# --- difftest: the options refused before the target is called ------------------------------------------


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(
    ("options", "word"),
    [
        ({"examples": 0}, "--examples"),
        ({"seed": -1}, "--seed"),
        ({"max_workers": 65}, "--max-workers"),
        ({"max_workers": 0}, "--max-workers"),
        ({"timeout": 0.0}, "--timeout"),
    ],
)
def test_difftest_refuses_the_same_options_before_calling_the_target(
    options: dict[str, Any], word: str
) -> None:
    calls: list[int] = []

    def target(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return ring_all_reduce(x)

    with pytest.raises(ValueError, match=word):
        difftest(target, **{"examples": 1, "seed": 0, **options})
    assert calls == []


# --- difftest: the other refused combinations ------------------------------------------------------------


def refusal(exact: ExactOrder | None = None, **kwargs: Any) -> str:
    """Why difftest refuses these options (``exact``: checking ``exact`` against that order)."""
    calls: list[int] = []

    def target(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return ring_all_reduce(x)

    fn, kwargs = kwargs.pop("fn", target), {"examples": 1, "seed": 0, **kwargs}
    with pytest.raises(ValueError) as refused:
        run_difftest(fn, Options(**kwargs), exact) if exact is not None else difftest(fn, **kwargs)
    assert calls == []
    return str(refused.value)


@pytest.mark.clause("difftest-oracles")
def test_an_unknown_ranks_kind_is_refused_with_the_kinds() -> None:
    problem = refusal(ranks="nccl")
    assert "ranks" in problem and "'gloo'" in problem and "'mpi'" in problem and "'nccl'" in problem


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("dtypes", [[], [torch.int32], [torch.float32, torch.int64]], ids=str)
def test_dtypes_must_be_a_non_empty_set_of_the_four(dtypes: list[torch.dtype]) -> None:
    problem = refusal(dtypes=dtypes)
    assert "dtypes" in problem and "non-empty" in problem
    for name in ALL_DTYPE_NAMES.split():
        assert name in problem


@pytest.mark.clause("difftest-oracles")
def test_bfloat16_is_refused_for_mpi_ranks_with_the_dtypes_numpy_has() -> None:
    problem = refusal(fn="ring_ref:ring_all_reduce", ranks="mpi", dtypes=[torch.float32, torch.bfloat16])
    assert "numpy has no bfloat16" in problem and "--ranks mpi" in problem
    assert "['float16', 'float32', 'float64']; got ['float32', 'bfloat16']" in problem


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("ranks", [None, "gloo"])
def test_mca_options_are_refused_without_mpi_ranks(ranks: str | None) -> None:
    problem = refusal(fn="ring_ref:ring_all_reduce", ranks=ranks, mca={"btl": "self"})
    assert "mca (--mca)" in problem and "ranks='mpi'" in problem and repr(ranks) in problem


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("modes", [(), ("exact", "fast"), ("all", "bitwise")])
def test_modes_must_be_a_non_empty_set_of_the_three(modes: tuple[str, ...]) -> None:
    problem = refusal(modes=modes)
    assert "modes" in problem and "non-empty" in problem
    assert "'exact', 'order-free', 'bound'" in problem and str(list(modes)) in problem


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("op", ["max", "prod", "avg"])
def test_exact_against_a_sum_only_order_refuses_another_op_and_says_what_to_drop(op: str) -> None:
    problem = refusal(SUM_ONLY, op=op)
    assert f"for sum only; op {op!r} is checked against the spec's ring" in problem
    assert problem.endswith("(drop --schedule / --order, or run --mode order-free or bound)")


@pytest.mark.clause("difftest-oracles")
def test_an_order_of_several_ops_lists_them_when_it_refuses_another() -> None:
    problem = refusal(replace(SUM_ONLY, ops=("sum", "max")), op="prod")
    assert problem.startswith("exact checks a sum order for sum, max only; op 'prod' is checked")


@pytest.mark.clause("difftest-oracles")
def test_a_sum_only_order_takes_sum_and_the_other_modes_take_any_op() -> None:
    options = Options(examples=1, seed=0, dtypes=F32, isolate=False)
    summed = run_difftest(ring_all_reduce, replace(options, modes=("exact",), op="sum"), SUM_ONLY)
    maxed = run_difftest(planted_impls.op_ring, replace(options, modes=("bound",), op="max"), SUM_ONLY)
    assert summed.verdict == "pass" and summed.op == "sum"
    assert maxed.verdict == "pass" and list(maxed.modes) == ["bound"]


class Summer:
    """A callable object: no ``__qualname__`` of its own, so no name to import it by."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x)

    def __repr__(self) -> str:
        return "Summer()"


@pytest.mark.clause("difftest-oracles")
def test_a_per_rank_target_must_be_importable_and_isolated() -> None:
    problem = refusal(fn=NAMELESS, ranks="gloo")
    assert "'<lambda>' must be a module-level function or a TARGET string" in problem
    assert "Summer() must be a module-level function" in refusal(fn=Summer(), ranks="gloo")
    problem = refusal(fn="ring_ref:ring_all_reduce", ranks="mpi", isolate=False)
    assert problem.startswith("isolate=False (--in-process) cannot be combined with ranks (--ranks)")


@pytest.mark.clause("difftest-oracles")
def test_a_lambda_cannot_be_isolated_and_the_message_says_how_to_run_it() -> None:
    problem = refusal(fn=NAMELESS, isolate=True)
    assert problem.startswith("'<lambda>' cannot be isolated")
    assert (
        "define it at module level" in problem and "pass isolate=False to run it in this process" in problem
    )
    assert refusal(fn=Summer(), isolate=True).startswith("Summer() cannot be isolated")


@pytest.mark.clause("difftest-oracles")
def test_a_callable_object_runs_in_process_under_its_repr() -> None:
    report = difftest(Summer(), modes=("exact",), examples=1, seed=0, dtypes=F32)
    assert report.verdict == "pass" and not report.isolated and report.target == "Summer()"
    assert report.replay.startswith("ring_ref.difftest.difftest(Summer(), modes=('exact',), ")


# --- difftest: what runs, and the report -------------------------------------------------------------


@pytest.mark.clause("difftest-oracles")
def test_a_correct_target_passes_every_mode_with_the_documented_defaults() -> None:
    report = difftest(ring_all_reduce, examples=2, seed=5, isolate=False)
    assert report.verdict == "pass" and list(report.modes) == ["exact", "order-free", "bound"]
    assert report.target == "ring_ref:ring_all_reduce" and report.seed == 5
    assert not report.isolated and report.timeout_s is None and report.op is None and report.ranks is None
    assert report.replay == (
        "ring-ref difftest ring_ref:ring_all_reduce --examples 2 --seed 5 "
        f"--max-workers 16 --dtypes {ALL_DTYPE_NAMES} --in-process"
    )
    for mode, result in report.modes.items():
        assert result.mode == mode and result.verdict == "pass"
        assert result.finding is None and result.counterexample is None
        # the asked ones, the N = 1 ones (two per dtype), and per N from 1 to 16 the position and one-hot
        # probes (clause difftest-every-n) and, but in exact, a pseudo-random case
        assert result.examples == 2 + 2 * 4 + 16 * (2 if mode == "exact" else 3)


@pytest.mark.clause("difftest-oracles")
def test_the_default_is_a_hundred_examples() -> None:
    def raises(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("no")

    report = difftest(raises, modes=("exact",), seed=0, dtypes=F32)
    assert ", examples=100, " in report.replay


@pytest.mark.clause("difftest-oracles")
def test_only_the_asked_modes_run_and_the_target_label_is_kept() -> None:
    report = difftest(
        NAMELESS,
        modes=("bound", "exact"),
        examples=2,
        seed=1,
        max_workers=3,
        dtypes=[torch.float64, torch.float16],
        label="my label",
    )
    assert list(report.modes) == ["bound", "exact"] and report.target == "my label"
    with pytest.warns(
        DeprecationWarning, match=r"difftest\(target=\) is the name the report prints: pass label="
    ):
        old = difftest(NAMELESS, modes=("bound",), examples=1, seed=1, target="my label")
    assert old.target == "my label"
    assert report.replay == (
        f"ring_ref.difftest.difftest({NAMELESS.__qualname__}, modes=('bound', 'exact'), examples=2, seed=1, "
        "max_workers=3, dtypes=[torch.float64, torch.float16])"
    )


def counting(record: list[Case], fn: Callable[..., torch.Tensor] = ring_all_reduce) -> Callable[..., Any]:
    def target(x: torch.Tensor, **kw: Any) -> torch.Tensor:
        record.append(Case(x.shape[0], x.shape[1], tuple(x.shape[2:]), x.dtype, "?", (), kw.get("op")))
        return fn(x, **kw)

    return target


@pytest.mark.clause("difftest-oracles")
def test_the_generated_inputs_respect_max_workers_dtypes_and_op() -> None:
    seen: list[Case] = []
    report = difftest(
        counting(seen, planted_impls.op_ring),
        modes=("order-free",),
        examples=4,
        seed=1,
        max_workers=3,
        dtypes=[torch.float64, torch.bfloat16],
        isolate=False,
        op="max",
    )
    assert report.verdict == "pass" and report.op == "max"
    assert len(seen) == report.modes["order-free"].examples
    assert {c.n for c in seen} <= {1, 2, 3} and 3 in {c.n for c in seen}
    assert {c.dtype for c in seen} == {torch.float64, torch.bfloat16}
    assert {c.op for c in seen} == {"max"}


@pytest.mark.clause("difftest-oracles")
def test_without_an_op_the_target_is_called_without_one() -> None:
    seen: list[Case] = []
    report = difftest(counting(seen), modes=("bound",), examples=3, seed=2, dtypes=F32, isolate=False)
    assert report.verdict == "pass" and report.op is None
    assert seen and {c.op for c in seen} == {None}


@pytest.mark.clause("difftest-oracles")
def test_an_importable_target_runs_isolated_with_its_timeout_and_its_output_is_reported() -> None:
    report = difftest(
        planted_impls.chatty_correct, modes=("exact",), examples=1, seed=0, dtypes=F32, timeout=7
    )
    assert report.isolated and report.timeout_s == 7 and report.verdict == "pass"
    assert report.replay == (
        "ring-ref difftest tests.common.planted_impls:chatty_correct --mode exact --examples 1 --seed 0 "
        "--max-workers 16 --dtypes float32 --timeout 7"
    )
    assert "on fd 2" in report.output and report.output_bytes >= len(report.output.encode()) > 0


@pytest.mark.clause("difftest-oracles")
def test_a_target_string_runs_isolated_unless_asked() -> None:
    report = difftest(
        "tests.common.planted_impls:chatty_correct",
        modes=("bound",),
        examples=1,
        seed=3,
        dtypes=F32,
        timeout=5,
    )
    assert report.isolated and report.timeout_s == 5 and report.verdict == "pass"
    assert report.modes["bound"].mode == "bound" and "printed" in report.output
    assert report.replay.endswith(" --dtypes float32 --timeout 5")


@pytest.mark.clause("difftest-oracles")
def test_a_target_string_runs_in_process_when_asked() -> None:
    report = difftest(
        "tests.common.planted_impls:op_ring",
        modes=("exact",),
        examples=1,
        seed=0,
        dtypes=F32,
        isolate=False,
        op="min",
    )
    assert (
        not report.isolated
        and report.verdict == "pass"
        and report.target == "tests.common.planted_impls:op_ring"
    )
    assert report.replay.startswith(
        "ring-ref difftest tests.common.planted_impls:op_ring --op min --mode exact "
    )
    assert report.replay.endswith(" --in-process") and report.output == "" and report.output_bytes == 0


class FakeRanks(Scripted):
    """Stands in for a process-group launcher: answers the stacked reference, records how it was made."""

    made: ClassVar[list[tuple[Any, ...]]] = []

    answer_with: ClassVar[Callable[[Case, int], Outcome]] = right

    def __init__(self, *args: Any) -> None:
        super().__init__(FakeRanks.answer_with, per_rank=True)
        FakeRanks.made.append(args)
        FakeRanks.last = self

    last: Scripted


@pytest.fixture
def fake_ranks(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeRanks]]:
    from ring_ref.difftest import _options

    FakeRanks.made, FakeRanks.answer_with = [], right
    monkeypatch.setitem(
        _options.RANK_LAUNCHERS, "gloo", lambda target, timeout, _: FakeRanks("gloo", target, timeout)
    )
    monkeypatch.setitem(_options.RANK_LAUNCHERS, "mpi", lambda *a: FakeRanks("mpi", *a))
    yield FakeRanks


@pytest.mark.clause("difftest-oracles")
def test_gloo_ranks_get_their_launcher_eight_workers_and_a_replay_with_ranks(
    fake_ranks: type[FakeRanks],
) -> None:
    report = difftest("tests.common.planted_rank_impls:x", ranks="gloo", modes=("bound",), examples=1, seed=4)
    assert fake_ranks.made == [("gloo", "tests.common.planted_rank_impls:x", 60.0)]
    assert fake_ranks.last.started == 1 and fake_ranks.last.closed == 1
    assert report.ranks == "gloo" and report.isolated and report.timeout_s == 60.0
    assert report.replay == (
        "ring-ref difftest --ranks gloo tests.common.planted_rank_impls:x --mode bound --examples 1 --seed 4 "
        f"--max-workers 8 --dtypes {ALL_DTYPE_NAMES}"
    )
    assert {c.layout for c in fake_ranks.last.cases} == {"contiguous"}


@pytest.mark.clause("difftest-oracles")
def test_mpi_ranks_get_the_mca_options_and_numpys_dtypes(fake_ranks: type[FakeRanks]) -> None:
    mca = {"coll_tuned_use_dynamic_rules": "1", "btl": "self,vader"}
    report = difftest(
        ring_all_reduce, ranks="mpi", mca=mca, modes=("exact",), examples=1, seed=4, max_workers=2, timeout=3
    )
    assert fake_ranks.made == [("mpi", "ring_ref:ring_all_reduce", 3, Spawn(mca, {}, None))]
    assert report.ranks == "mpi" and report.timeout_s == 3
    assert report.replay == (
        "ring-ref difftest --ranks mpi ring_ref:ring_all_reduce --mode exact --examples 1 --seed 4 "
        "--max-workers 2 --dtypes float16 float32 float64 --timeout 3 "
        "--mca coll_tuned_use_dynamic_rules=1 --mca btl=self,vader"
    )
    assert {c.dtype for c in fake_ranks.last.cases} == {torch.float16, torch.float32, torch.float64}


@pytest.mark.clause("difftest-rank-env")
def test_mpi_ranks_get_the_environment_and_the_launcher_asked_for(fake_ranks: type[FakeRanks]) -> None:
    env = {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}
    report = difftest(
        ring_all_reduce, ranks="mpi", env=env, mpiexec="/v/bin/mpiexec", modes="bound", examples=1, seed=4
    )
    assert fake_ranks.made == [("mpi", "ring_ref:ring_all_reduce", 60.0, Spawn({}, env, "/v/bin/mpiexec"))]
    assert report.replay.endswith(
        " --env MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring --mpiexec /v/bin/mpiexec"
    ), report.replay


@pytest.mark.clause("difftest-oracles")
def test_the_launcher_is_closed_when_the_run_raises(fake_ranks: type[FakeRanks], monkeypatch: Any) -> None:
    def broken(case: Case, k: int) -> Outcome:
        raise RuntimeError("the launcher broke")

    monkeypatch.setattr(FakeRanks, "call", lambda self, case: broken(case, 0))
    with pytest.raises(RuntimeError, match="the launcher broke"):
        difftest("m:f", ranks="gloo", modes=("exact",), examples=1, seed=0)
    assert fake_ranks.last.started == 1 and fake_ranks.last.closed == 1


@pytest.mark.clause("difftest-oracles")
def test_without_a_seed_a_random_one_is_chosen_reported_and_replayed() -> None:
    seeds = set()
    for _ in range(8):  # two of 2^32 seeds alike: about one run in 10^9 of this test
        report = difftest(NAMELESS, modes=("bound",), examples=1, max_workers=2, dtypes=F32)
        assert report.seed >= 0 and f"seed={report.seed}," in report.replay
        seeds.add(report.seed)
    assert len(seeds) == 8  # each run its own search
    assert max(seeds) >= 2**16  # from all of 0 .. 2^32 - 1: fails about once in 2^128 runs of this test


# --- the replay line reproduces the run ------------------------------------------------------------------


def wrong_for_three_workers(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Right except for ``N = 3``, where the first element is off by one (an in-process target)."""
    result = ring_all_reduce(x, op=op)
    if x.shape[0] == 3:
        result = result.clone()
        result.view(-1)[0] += 1
    return result


def run_replay(replay: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    argv = shlex.split(replay)
    assert argv[:2] == ["ring-ref", "difftest"]
    capsys.readouterr()
    main([*argv[1:], "--json"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(
    "options",
    [
        {"modes": ("bound",), "dtypes": [torch.float64]},
        {"modes": ("exact", "bound"), "dtypes": [torch.float64]},  # --mode given twice, not left out (all)
        {
            "modes": ("exact",),
            "dtypes": [torch.float16],
            "op": "max",
            "timeout": 2.5,
        },
    ],
)
def test_the_command_line_replay_finds_the_same_counterexample(
    options: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    report = difftest(wrong_for_three_workers, examples=12, seed=2, max_workers=3, isolate=False, **options)
    assert report.verdict == "fail", report.render()
    replayed = run_replay(report.replay, capsys)
    original = json.loads(report.to_json_text())
    assert replayed["seed"] == original["seed"] == 2 and replayed["op"] == original["op"]
    assert replayed["modes"] == original["modes"]
    assert replayed["replay"] == report.replay


@pytest.mark.clause("difftest-oracles")
def test_the_python_replay_of_a_lambda_finds_the_same_counterexample() -> None:
    target = lambda x, op: wrong_for_three_workers(x, op).clone()  # noqa: E731
    report = difftest(target, modes=("exact",), examples=12, seed=1, max_workers=3, dtypes=F32, op="min")
    assert report.verdict == "fail" and not report.isolated and report.target == target.__qualname__
    assert report.replay == (
        f"ring_ref.difftest.difftest({target.__qualname__}, modes=('exact',), examples=12, seed=1, "
        "max_workers=3, dtypes=[torch.float32], op='min')"
    )
    call = report.replay.replace(target.__qualname__, "target", 1)
    replayed = eval(call, {"ring_ref": ring_ref, "torch": torch, "target": target})
    assert replayed.replay == report.replay
    assert replayed.to_json()["modes"] == report.to_json()["modes"]


# --- collectives: what exact checks them against, and what they refuse ---------------------------------


@pytest.mark.clause("difftest-collectives")
def test_a_reduce_scatter_is_checked_against_the_named_rings_shards_and_replayed_with_both() -> None:
    target = lambda x: planted_impls.reduce_scatter_folded(x).clone()  # noqa: E731
    options: dict[str, Any] = {"modes": ("exact",), "examples": 3, "seed": 1, "max_workers": 3, "dtypes": F32}
    spec = difftest(target, collective="reduce-scatter", **options)
    assert spec.verdict == "pass" and spec.collective == "reduce-scatter", spec.render()
    assert spec.to_json()["exact_against"] == {
        "source": "spec",
        "order": "the spec reduce-scatter ring (direction +1, offset 1, layout even)",
        "option": "",
        "inputs": None,
        "revealed": None,
    }
    ring = difftest(target, collective="reduce-scatter", schedule="1,1,even", **options)
    assert ring.verdict == "pass" and ring.replay.endswith(
        ", dtypes=[torch.float32], schedule='1,1,even', collective='reduce-scatter')"
    ), ring.replay
    names = {"ring_ref": ring_ref, "torch": torch, "target": target}
    replayed = eval(ring.replay.replace(target.__qualname__, "target", 1), names)
    assert replayed.collective == "reduce-scatter" and replayed.replay == ring.replay


@pytest.mark.clause("difftest-collectives")
def test_an_all_gathers_one_bitwise_check_runs_once_for_every_mode() -> None:
    calls: list[int] = []

    def target(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return planted_impls.all_gather_copied(x)

    report = difftest(target, collective="all-gather", examples=3, seed=2, max_workers=3, dtypes=F32)
    assert report.verdict == "pass" and list(report.modes) == ["exact", "order-free", "bound"]
    first = report.modes["exact"]
    assert calls and first.examples == len(calls)  # one search: the other modes are its copies
    for mode in ("order-free", "bound"):
        assert report.modes[mode] == replace(first, mode=mode)
    assert report.to_json()["exact_against"] == {
        "source": "spec",
        "order": "a bitwise copy of every shard (all-gather)",
        "option": "",
        "inputs": None,
        "revealed": None,
    }
    assert report.replay.endswith(", dtypes=[torch.float32], collective='all-gather')"), report.replay


@pytest.mark.clause("difftest-collectives")
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"collective": "all-gather", "op": "max"},
            "an all-gather copies, it reduces nothing: drop op (--op) for --collective all-gather",
        ),
        (
            {"collective": "reduce-scatter", "schedule": "auto"},
            "--collective reduce-scatter checks exact against a named --schedule (or the spec's); --schedule "
            "auto and --order reveal and name all-reduce orders (drop them; ring-ref reveal --collective "
            "reduce-scatter names a reduce-scatter's order)",
        ),
        (
            {"collective": "all-gather", "order": "saved.json"},
            "--collective all-gather checks exact against a named --schedule (or the spec's); --schedule "
            "auto and --order reveal and name all-reduce orders (drop them; ring-ref reveal --collective "
            "reduce-scatter names a reduce-scatter's order)",
        ),
    ],
)
def test_a_collective_refuses_what_only_an_all_reduce_can_do(options: dict[str, Any], message: str) -> None:
    assert refusal(fn=lambda x: x, **options) == message


# --- inside a job: a world of one rank in pytest's own process ---------------------------------------


@pytest.fixture
def one_rank_job(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A gloo world of this one process, as ``torchrun --nproc-per-node 1`` would start it."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "pytest")
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


ON_GROUP = "tests.common.planted_group_impls:all_reduce_on_group"


@pytest.mark.clause("difftest-job")
def test_in_a_job_every_rank_is_called_and_the_replay_starts_the_job_again(one_rank_job: None) -> None:
    report = difftest(ON_GROUP, ranks="job", modes="bound", examples=2, seed=3, dtypes=F32, timeout=7.5)
    assert report.verdict == "pass" and report.ranks == "job" and report.tested_n == [1], report.render()
    assert report.timeout_s == 7.5 and report.isolated
    assert report.replay == (
        f"torchrun --nproc-per-node 1 --no-python ring-ref difftest --ranks job {ON_GROUP} --mode bound "
        "--examples 2 --seed 3 --max-workers 1 --dtypes float32 --timeout 7.5"
    )
    grouped = difftest(ON_GROUP, ranks="job", modes="bound", examples=2, seed=3, dtypes=F32, subgroups=True)
    assert grouped.verdict == "pass" and grouped.replay.endswith(" --dtypes float32 --subgroups")


@pytest.mark.clause("difftest-job")
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"max_workers": 2},
            "max_workers (--max-workers) 2 differs from the job's 1 ranks: --ranks job tests N = the number "
            "of ranks (drop the option, or start a job of that many ranks)",
        ),
        ({"device": "tpu"}, "device (--device) must be 'cpu' or 'cuda'; got 'tpu'"),
    ],
)
def test_in_a_job_what_it_cannot_do_is_refused_before_any_call(
    one_rank_job: None, options: dict[str, Any], message: str
) -> None:
    assert refusal(ranks="job", fn=ON_GROUP, **options) == message


@pytest.mark.clause("difftest-job")
def test_outside_a_job_ranks_job_says_how_to_start_one() -> None:
    assert refusal(ranks="job", fn=ON_GROUP) == (
        "ranks='job' runs inside a job's torch.distributed process group, and none is initialised: "
        "call torch.distributed.init_process_group first on every rank, or run "
        "`torchrun ... -m ring_ref difftest --ranks job TARGET`"
    )


def test_an_mpi_job_refuses_a_target_its_ranks_cannot_import() -> None:
    with pytest.raises(ValueError) as refused:
        _job_target(NAMELESS, "mpi-job", 2, SPEC_ORDER, device="cpu")
    assert str(refused.value) == (
        "--ranks mpi-job loads the target by name on every rank: '<lambda>' must be a module-level "
        "function or a TARGET string"
    )
    assert _job_target(NAMELESS, "job", 2, SPEC_ORDER, device="cpu") == (None, None)
    assert _job_target(wrong_for_three_workers, "job", 2, SPEC_ORDER, device="cpu") == (
        None,
        "tests.cover.difftest.test_run:wrong_for_three_workers",
    )

    class NoName:
        def __call__(self, comm: object, array: object) -> None: ...

        def __repr__(self) -> str:
            return "a callable object"

    with pytest.raises(ValueError, match="on every rank: a callable object must be a module-level"):
        _job_target(NoName(), "mpi-job", 2, SPEC_ORDER, device="cpu")
    assert _job_target(ON_GROUP, "mpi-job", 2, SPEC_ORDER, device="cpu") == (None, ON_GROUP)


@pytest.mark.clause("difftest-job")
@pytest.mark.parametrize("ranks", ["job", "mpi-job"])
def test_schedule_auto_in_a_job_is_refused_with_the_two_commands_that_do_it(ranks: str) -> None:
    assert refusal(ranks=ranks, fn=ON_GROUP, schedule="auto") == (
        "--schedule auto reveals the target's order first, which a job cannot do inside difftest: run "
        f"`ring-ref reveal --ranks {ranks} TARGET --json > order.json` in the job, then "
        f"`ring-ref difftest --ranks {ranks} TARGET --order order.json`"
    )


@pytest.mark.clause("difftest-job")
def test_in_a_job_an_order_saved_at_another_n_is_refused(one_rank_job: None, tmp_path: Path) -> None:
    path = tmp_path / "order.json"  # by hand (spec/reveal.schema.json): N = 2, M = 2, every element 0 + 1
    doc = {"format": "ring-ref-reveal", "version": 1, "n": 2, "m": 2, "dtype": "float32"}
    path.write_text(json.dumps({**doc, "trees": [[0, 1]] * 2}), encoding="utf-8")
    assert refusal(ranks="job", fn=ON_GROUP, order=str(path), dtypes=F32) == (
        "order (--order) holds an order for N = 2, but this job has 1 ranks: reveal it in a job of the "
        "same size"
    )


# --- the replay line, option by option, and the launcher each target gets -----------------------------


JAX_TARGET = "tests.common.planted_jax:psum_loses_the_last_device"


@pytest.mark.clause("jax-difftest")
def test_a_jax_target_is_loaded_for_jax_and_replayed_with_its_framework_and_timeout() -> None:
    report = difftest(
        JAX_TARGET,
        framework="jax",
        isolate=False,
        timeout=5,
        modes="bound",
        examples=1,
        seed=0,
        max_workers=2,
    )
    assert report.replay == (
        f"ring-ref difftest {JAX_TARGET} --mode bound --examples 1 --seed 0 --max-workers 2 "
        f"--dtypes {ALL_DTYPE_NAMES} --framework jax --timeout 5 --in-process"
    )
    # it ran on a jax.Array and its wrong answer was read back (on a tensor it would have raised)
    finding = report.modes["bound"].finding
    assert report.verdict == "fail" and finding is not None and finding.codes == ["out-of-bound"], finding
    launcher, name = _launcher(JAX_TARGET, None, 5.0, None, Options().spawn, framework="jax")
    assert isinstance(launcher, Isolated) and launcher.worker.framework == "jax" and name == JAX_TARGET


def replay_of(options: Options, exact: ExactOrder = SPEC_ORDER, workers: int = 4) -> str:
    """The command line that replays a run of ``TARGET`` with these options (seed 9, float32)."""
    _, line = _replay(TARGET, TARGET, options, MODES, exact, 9, workers, F32, None, True)
    return line


TARGET = "pkg.mod:fn"
BASE = "--examples 100 --seed 9 --max-workers 4 --dtypes float32"


@pytest.mark.clause("difftest-job")
def test_a_replay_line_in_a_job_starts_it_with_its_launcher_and_every_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert replay_of(Options(ranks="mpi-job", subgroups=True)) == (
        f"mpiexec -n 4 ring-ref difftest --ranks mpi-job {TARGET} {BASE} --subgroups"
    )
    assert replay_of(Options(ranks="job", device="cuda")) == (
        f"ring-ref difftest --ranks job {TARGET} {BASE} --device cuda"  # ranks started by hand: no launcher
    )
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert replay_of(Options(ranks="mpi-job"), workers=3) == (
        f"mpirun -n 3 ring-ref difftest --ranks mpi-job {TARGET} {BASE.replace('4', '3')}"
    )
    assert replay_of(Options(ranks="gloo")) == f"ring-ref difftest --ranks gloo {TARGET} {BASE}"


@pytest.mark.clause("difftest-exact-orders")
def test_a_replay_line_names_the_order_exact_checked_and_the_collective() -> None:
    gloo = schedule_order("gloo")
    assert replay_of(Options(), gloo) == f"ring-ref difftest {TARGET} {BASE} --schedule gloo"
    scatter = Options(collective="reduce-scatter")
    assert replay_of(scatter, reduce_scatter_order("1,1,even", 4)) == (
        f"ring-ref difftest {TARGET} {BASE} --schedule=1,1,even --collective reduce-scatter"
    )


@pytest.mark.clause("difftest-job")
def test_in_a_job_cuda_is_refused_where_torch_has_none_and_taken_where_it_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as refused:
        _job_target(ON_GROUP, "job", 2, SPEC_ORDER, device="cuda")
    assert str(refused.value) == (
        "device (--device) cuda puts each rank's tensors on its GPU, but torch here sees no CUDA device "
        "(torch.cuda.is_available() is False): drop --device, or run the job where torch has CUDA"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _job_target(ON_GROUP, "job", 2, SPEC_ORDER, device="cuda") == (None, ON_GROUP)


@pytest.mark.clause("difftest-job")
def test_in_a_job_a_group_that_is_no_process_group_is_refused(one_rank_job: None) -> None:
    assert refusal(ranks="job", fn=ON_GROUP, group="world") == (
        "group must be a torch.distributed process group (torch.distributed.new_group's result) or None "
        "for the default one; got str"
    )


@pytest.mark.clause("difftest-job")
def test_in_a_job_subgroups_refuse_a_target_without_group(one_rank_job: None) -> None:
    with pytest.raises(TargetError, match="'takes_no_group' does not take group=: --subgroups calls"):
        difftest(
            "tests.common.planted_group_impls:takes_no_group",
            ranks="job",
            subgroups=True,
            modes="bound",
            examples=1,
            seed=0,
        )


# --- the report: what it says of the run ------------------------------------------------------------------


def test_the_old_name_of_label_still_works_and_warns_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning) as seen:
        old = difftest(NAMELESS, target="old", modes="bound", examples=1, seed=0, max_workers=1)
    assert old.target == "old" and str(seen[0].message) == (
        "difftest(target=) is the name the report prints: pass label= instead (target= is its old name)"
    )
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add frames between warn and caller
        assert seen[0].filename == __file__
    with pytest.warns(DeprecationWarning):
        both = difftest(NAMELESS, target="old", label="new", modes="bound", examples=1, seed=0, max_workers=1)
    assert both.target == "new"


@pytest.mark.clause("difftest-hints")
def test_a_target_of_the_wrong_signature_is_refused_before_it_is_called() -> None:
    with pytest.raises(TargetError, match=r"TARGET\(a, b, c\) needs 3 positional arguments, but a stacked"):
        difftest(lambda a, b, c: a, modes="bound", examples=1, seed=0)


@pytest.mark.clause("difftest-hints")
def test_a_per_rank_mpi_target_must_take_the_communicator(fake_ranks: type[FakeRanks]) -> None:
    with pytest.raises(TargetError, match="comm"):
        difftest("tests.common.planted_rank_impls:plain_ring", ranks="mpi", modes="bound", examples=1, seed=0)
    assert fake_ranks.made == []


@pytest.mark.clause("difftest-coverage")
def test_the_report_says_what_each_mode_never_tried_for_the_launcher_and_op(
    fake_ranks: type[FakeRanks],
) -> None:
    mpi = difftest(ring_all_reduce, ranks="mpi", modes="bound", examples=1, seed=0, max_workers=2, dtypes=F32)
    coverage = mpi.modes["bound"].coverage
    assert coverage is not None and coverage.untried == [
        ("M not a multiple of N", "--schedule openmpi-ring"),
        ("float16/float64", "--dtypes"),  # numpy has no bfloat16: never offered under MPI
        ("ops other than sum", "--op prod/max/min/avg"),
    ]
    maxed = difftest(NAMELESS, modes="bound", examples=1, seed=0, max_workers=2, dtypes=F32, op="max")
    coverage = maxed.modes["bound"].coverage
    assert coverage is not None and coverage.untried == [
        ("M not a multiple of N", "--schedule openmpi-ring"),
        ("float16/bfloat16/float64", "--dtypes"),
    ]
    assert maxed.exact_against is None  # exact did not run
    exact = difftest(NAMELESS, modes="exact", examples=1, seed=0, max_workers=2, dtypes=F32)
    assert exact.exact_against == SPEC_ORDER


def test_a_launcher_that_broke_ends_the_run_with_the_modes_it_finished(fake_ranks: type[FakeRanks]) -> None:
    def crash_and_break(case: Case, k: int) -> Outcome:
        fake_ranks.last.broken = "a rank crashed: the group cannot call again"
        return crashed(case, k)

    fake_ranks.answer_with = crash_and_break
    report = difftest("m:f", ranks="gloo", examples=1, seed=0, max_workers=2)
    assert isinstance(report, Report) and list(report.modes) == ["exact"], report.render()
    assert report.verdict == "fail" and fake_ranks.last.closed == 1


@pytest.mark.clause("difftest-rank-env")
@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            {"ranks": "mpi", "env": {"I_MPI_ADJUST_ALLREDUCE": "8"}, "mpiexec": "/v/bin/mpiexec"},
            ["--ranks", "mpi", "--env", "I_MPI_ADJUST_ALLREDUCE=8", "--mpiexec", "/v/bin/mpiexec"],
        ),
        ({"framework": "jax"}, ["--framework", "jax"]),
    ],
)
def test_schedule_auto_reveals_the_target_as_the_run_will_call_it(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], words: list[str]
) -> None:
    seen: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 2, "", "ring-ref reveal: error: stood in")

    monkeypatch.setattr("ring_ref.difftest._orders.subprocess.run", run)
    with pytest.raises(OrderError, match="stood in"):
        difftest("m:f", schedule="auto", modes="exact", examples=1, seed=0, **options)
    assert seen and all(argv[-len(words) :] == words for argv in seen), seen


@pytest.mark.clause("difftest-exact-orders")
def test_an_order_file_at_any_path_is_named_and_replayed_as_given(tmp_path: Path) -> None:
    path = tmp_path / "my order=v1.json"  # by hand (spec/reveal.schema.json): N = 2, M = 2, 0 + 1 each
    doc = {"format": "ring-ref-reveal", "version": 1, "n": 2, "m": 2, "dtype": "float32"}
    path.write_text(json.dumps({**doc, "trees": [[0, 1]] * 2}), encoding="utf-8")
    assert refusal(order=str(path), max_workers=1) == (
        f"order (--order) {str(path)!r} holds an order for N = 2, M = 2, float32, the only inputs exact "
        "draws with it, but max_workers (--max-workers) 1 is below its N: drop the option or change it (it "
        "applies to the other modes)"
    )
    named = difftest("ring_ref:ring_all_reduce", order=str(path), modes="exact", examples=1, seed=0)
    assert named.verdict == "pass" and shlex.split(named.replay)[-2:] == ["--order", str(path)]
    nameless = difftest(NAMELESS, order=str(path), modes="exact", examples=1, seed=0, isolate=False)
    assert nameless.verdict == "pass" and nameless.replay.endswith(f", order={str(path)!r})")


@pytest.mark.clause("jax-difftest")
def test_the_python_replay_of_a_jax_lambda_names_its_framework() -> None:
    import jax.numpy as jnp  # the extra ring-ref[jax]

    target = lambda x: jnp.sum(x, axis=0)  # noqa: E731
    report = difftest(target, framework="jax", modes="bound", examples=1, seed=0, max_workers=2, dtypes=F32)
    assert report.verdict == "pass" and report.replay == (
        f"ring_ref.difftest.difftest({target.__qualname__}, modes=('bound',), examples=1, seed=0, "
        "max_workers=2, dtypes=[torch.float32], framework='jax')"
    )
