"""Launchers and the raw answers they carry: what runs isolated, and how the tester reads what came back."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import Case, difftest
from ring_ref.difftest._call import Garbled, aliases, decode, input_problem, observe
from ring_ref.difftest._diagnosis import Finding
from ring_ref.difftest._launch import OUTPUT_LIMIT, OutputLog
from ring_ref.difftest._report import ModeResult, Report
from tests.common import planted_impls
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
CASE = Case(2, 2, (2,), torch.float32, "strided", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))


@pytest.mark.clause("difftest-isolation")
def test_importable_targets_run_isolated_and_lambdas_in_process() -> None:
    named = difftest(planted_impls.in_place_ring, modes=("exact",), examples=2, seed=1)
    by_string = difftest("tests.common.planted_impls:in_place_ring", modes=("exact",), examples=2, seed=1)
    lam = difftest(lambda x: ring_all_reduce(x.clone()), modes=("exact",), examples=2, seed=1)
    forced = difftest(planted_impls.in_place_ring, modes=("exact",), examples=2, seed=1, isolate=False)
    assert (named.isolated, by_string.isolated, lam.isolated, forced.isolated) == (True, True, False, False)
    assert named.to_json()["timeout_s"] == 60 and lam.to_json()["timeout_s"] is None
    assert "(isolated: the target ran in a worker process, at most 60 s per call)" in named.render()
    assert "(not isolated:" in lam.render()
    assert forced.replay.endswith(" --in-process")
    assert named.modes == by_string.modes == forced.modes
    with pytest.raises(ValueError, match="cannot be isolated: the worker imports the target by name"):
        difftest(lambda x: x.sum(0), isolate=True)


@pytest.mark.clause("difftest-isolation")
def test_a_function_whose_name_now_means_something_else_runs_in_process() -> None:
    def in_place_ring(x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x)

    in_place_ring.__module__, in_place_ring.__qualname__ = "tests.common.planted_impls", "in_place_ring"
    assert not difftest(in_place_ring, modes=("exact",), examples=1, seed=1).isolated


@pytest.mark.clause("difftest-isolation")
def test_the_answer_is_read_from_raw_bits() -> None:
    head, payload = observe(planted_impls.mutates_input, CASE)
    answer = decode(json.loads(json.dumps(head)), payload)
    assert answer.result is not None and answer.argument is not None
    assert answer.result.values is not None
    assert torch.equal(answer.result.values, ring_all_reduce(CASE.tensor()))
    assert answer.argument.stride == CASE.tensor().stride() != (4, 2, 1)  # the layout arrived exactly
    assert answer.argument.values is not None
    assert not torch.equal(answer.argument.values, CASE.tensor())  # mutates_input changed it


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda h: h.update(type=3), "type is not a string"),
        (lambda h: h["result"].update(shape="(2, 2)"), "result.shape is not a list of integers"),
        (lambda h: h["result"].update(bits=10**9), "result.bits is not a byte count within the payload"),
        (lambda h: h["result"].update(dtype="torch.int8"), "result has bits but is not a CPU tensor"),
        (lambda h: h["result"].update(shape=[3, 2]), "bytes of bits for shape"),
        (lambda h: h["argument"].update(storage=[1]), "argument.storage is not a start and an end"),
        (lambda h: h.pop("argument"), "unexplained payload bytes"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.clause("difftest-isolation")
def test_a_garbled_answer_is_refused(change: Any, words: str) -> None:
    head, payload = observe(ring_all_reduce, CASE)
    change(head)
    with pytest.raises(Garbled, match=words.replace("(", r"\(").replace(")", r"\)")):
        decode(head, payload)


def test_output_log_keeps_the_start_and_the_end() -> None:
    log = OutputLog()
    for k in range(1000):
        log.add(f"line {k}\n")
    assert log.bytes == sum(len(f"line {k}\n") for k in range(1000))
    assert log.text.startswith("line 0\nline 1\n") and log.text.endswith("line 998\nline 999\n")
    assert "characters left out" in log.text and len(log.text) < 2 * OUTPUT_LIMIT + 100
    short = OutputLog()
    short.add("hello\n")
    assert short.text == "hello\n"


@pytest.mark.clause("difftest-report")
def test_report_shows_stack_and_output_of_the_counterexample() -> None:
    finding = Finding(
        ["timed-out"], "no answer within 1 s (--timeout); the worker was killed", stack="S1\nS2\n"
    )
    result = ModeResult("bound", "fail", 1, 0, finding, CASE, output="said hello\n")
    report = Report("t:f", 1, "replay", {"bound": result}, isolated=True, timeout_s=1.0, output_bytes=11)
    text = report.render()
    assert "      S1\n      S2\n" in text and "      said hello" in text
    assert "The target wrote 11 byte(s)" in text
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    cex = doc["modes"]["bound"]["counterexample"]
    assert (cex["stack"], cex["output"]) == ("S1\nS2\n", "said hello\n")


def _in_place(t: torch.Tensor) -> None:
    t.mul_(2)


def _returns_self(t: torch.Tensor) -> torch.Tensor:
    return t.mul_(2)


def _new_but_scribbles(t: torch.Tensor) -> torch.Tensor:
    out = t * 2
    t.zero_()
    return out


@pytest.mark.clause("difftest-ranks")
@pytest.mark.parametrize(
    ("fn", "modified"), [(_in_place, False), (_returns_self, False), (_new_but_scribbles, True)]
)
def test_a_rank_working_in_place_may_change_its_argument(fn: Any, modified: bool) -> None:
    rank_case = Case(2, 2, (2,), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))
    answer = decode(*observe(fn, rank_case, 1))
    assert answer.rank == 1 and answer.argument is not None and answer.result is not None
    assert answer.argument.shape == (2, 2) and answer.argument.stride == (2, 1)
    doubled = 2 * rank_case.rank_tensor(1)
    assert answer.result.values is not None and torch.equal(answer.result.values, doubled)
    problem = input_problem(answer, rank_case)
    assert bool(problem) == modified, problem
    assert not aliases(answer)  # aliasing is a stacked target's bug; a rank may return its argument
