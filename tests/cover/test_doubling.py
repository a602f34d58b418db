"""Recursive doubling (spec/schedules.md, clauses ``doubling-*``): one tree for every element, not a ring.

Expected values come from ``tests.common.planted_orders.recursive_doubling`` (a plain loop over workers,
no ``ring_ref``) or are written out by hand here.
"""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._order import doubling_tree
from ring_ref._reveal import reveal
from ring_ref._trace import trace, trace_json
from ring_ref.core import initial_state, run_ring
from ring_ref.difftest import difftest
from ring_ref.difftest._orders import _fit_of
from ring_ref.invariants import InvariantViolation, check, doubling_expected
from ring_ref.schedule import ALL_GATHER, PRESETS, RECURSIVE_DOUBLING, REDUCE_SCATTER, DoublingSchedule
from tests.common.oracles import same_bits
from tests.common.paths import ROOT
from tests.common.planted_orders import intel_ring, left_fold, mpich_ring, recursive_doubling


@pytest.mark.clause("doubling-order")
@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_doubling_is_its_one_tree_for_every_m(engine: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    for n in range(1, 10):
        for m, trailing in ((1, ()), (n + 1, ()), (7, (2,))):
            x = (torch.randn(n, m, *trailing, generator=gen, dtype=torch.float64) * 1e3).to(dtype)
            want = recursive_doubling(x)
            got = ring_all_reduce(x, engine, schedule="recursive-doubling")  # type: ignore[call-overload]
            assert same_bits(got, want), (n, m, engine)
            if dtype != torch.bfloat16:
                on_numpy = ring_all_reduce(x.numpy(), engine, schedule=RECURSIVE_DOUBLING)  # type: ignore[call-overload]
                assert same_bits(torch.from_numpy(np.asarray(on_numpy)), want)


@pytest.mark.clause("doubling-order")
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_both_engines_give_the_same_bits_for_every_op(op: str) -> None:
    gen = torch.Generator().manual_seed(5)
    for n in (2, 3, 5, 6, 8):
        x = torch.randn(n, 9, generator=gen).to(torch.float16)
        x[0, 0], x[1, 0] = 0.0, -0.0
        ref = ring_all_reduce(x, "reference", schedule="recursive-doubling", op=op)
        fast = ring_all_reduce(x, "fast", schedule="recursive-doubling", op=op)
        assert same_bits(ref, fast), (n, op)


@pytest.mark.clause("doubling-steps")
def test_doubling_steps_written_out_by_hand() -> None:
    rd = RECURSIVE_DOUBLING
    assert PRESETS["recursive-doubling"] == DoublingSchedule("blocks")
    # N = 4: two doubling steps, no pre- or post-step; partners at distance 1, then 2.
    assert rd.all_rounds(4) == ((REDUCE_SCATTER, 0), (REDUCE_SCATTER, 1))
    assert [rd.partner(REDUCE_SCATTER, i, 0, 4) for i in range(4)] == [1, 0, 3, 2]
    assert [rd.partner(REDUCE_SCATTER, i, 1, 4) for i in range(4)] == [2, 3, 0, 1]
    # N = 6: P = 4, rem = 2; 0 -> 1 and 2 -> 3 first; new ranks 1, 3, 4, 5 double; 1 -> 0, 3 -> 2 last.
    assert rd.all_rounds(6) == (
        (REDUCE_SCATTER, 0),
        (REDUCE_SCATTER, 1),
        (REDUCE_SCATTER, 2),
        (ALL_GATHER, 0),
    )
    assert [rd.partner(REDUCE_SCATTER, i, 0, 6) for i in range(6)] == [None, 0, None, 2, None, None]
    assert [rd.partner(REDUCE_SCATTER, i, 1, 6) for i in range(6)] == [None, 3, None, 1, 5, 4]
    assert [rd.partner(REDUCE_SCATTER, i, 2, 6) for i in range(6)] == [None, 4, None, 5, 1, 3]
    assert [rd.partner(ALL_GATHER, i, 0, 6) for i in range(6)] == [1, None, 3, None, None, None]
    assert [(s.src, s.dst) for s in rd.sends(REDUCE_SCATTER, 0, 3)] == [(0, 1)] * 3
    assert rd.all_rounds(1) == ()
    # the tree: ((0 + 1) + 2) at N = 3, ((0 + 1) + (2 + 3)) at N = 4, (((0+1) + (2+3)) + (4+5)) at N = 6
    assert doubling_tree(rd, 3) == ((0, 1), 2)
    assert doubling_tree(rd, 4) == ((0, 1), (2, 3))
    assert doubling_tree(rd, 6) == (((0, 1), (2, 3)), (4, 5))
    assert doubling_tree(rd, 5) == (((0, 1), 2), (3, 4))


@pytest.mark.clause("doubling-invariants")
def test_the_core_runs_doubling_through_its_closed_forms() -> None:
    rd = RECURSIVE_DOUBLING
    assert [doubling_expected(REDUCE_SCATTER, -1, 6, i, rd) for i in range(6)] == [(i,) for i in range(6)]
    assert [doubling_expected(REDUCE_SCATTER, 1, 6, i, rd) for i in range(6)] == [
        (0,),
        (0, 1, 2, 3),
        (2,),
        (0, 1, 2, 3),
        (4, 5),
        (4, 5),
    ]
    assert doubling_expected(ALL_GATHER, 0, 6, 0, rd) == (0, 1, 2, 3, 4, 5)
    seen: list[tuple[str, int]] = []
    state = initial_state([[float(i)] * 6 for i in range(6)])
    out = run_ring(state, lambda a, b: a + b, lambda p, r, s, prov: seen.append((p, r)), schedule=rd)
    assert seen == list(rd.all_rounds(6)) and out == ((15.0,) * 6,) * 6
    # a state the schedule cannot reach: worker 2 claims the pre-step's pair
    wrong = tuple((doubling_expected(REDUCE_SCATTER, 0, 6, i, rd),) * 6 for i in range(6))
    wrong = (*wrong[:2], ((2, 3),) * 6, *wrong[3:])
    with pytest.raises(InvariantViolation, match="worker 2 slot 0 holds contributions"):
        check(wrong, REDUCE_SCATTER, 0, schedule=rd)
    with pytest.raises(ValueError, match="recursive doubling is not a ring"):
        run_ring(state, lambda a, b: a + b, schedule=rd, phases=(REDUCE_SCATTER,))


@pytest.mark.clause("doubling-tools")
def test_reveal_names_recursive_doubling_and_difftest_checks_against_it() -> None:
    assert reveal(recursive_doubling, 4, 9).matches == ["recursive-doubling"]
    assert reveal(recursive_doubling, 6, 13).matches == ["recursive-doubling"]
    # at N = 3 its tree is the chain's fold (0 + 1) + 2: both are named
    assert reveal(recursive_doubling, 3, 7).matches == ["chain", "recursive-doubling"]
    kwargs: dict[str, object] = {"modes": ("exact",), "examples": 15, "seed": 3, "max_workers": 5}
    passed = difftest(recursive_doubling, isolate=False, schedule="recursive-doubling", **kwargs)  # type: ignore[arg-type]
    assert passed.verdict == "pass", passed.render()
    for other in (left_fold, mpich_ring, intel_ring):
        failed = difftest(other, isolate=False, schedule="recursive-doubling", **kwargs)  # type: ignore[arg-type]
        assert failed.verdict == "fail" and failed.diagnoses == ["not-ring-order"], failed.render()


@pytest.mark.clause("doubling-tools")
def test_doubling_trace_names_it_and_its_steps() -> None:
    schema = json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8"))
    doc = trace_json(trace(6, RECURSIVE_DOUBLING), 7, RECURSIVE_DOUBLING)
    jsonschema.validate(doc, schema)
    assert doc["schedule"] == {"kind": "recursive-doubling", "layout": "blocks"}
    # N = 6: the pre-step and two doubling steps, then the post-step
    assert doc["traffic"]["roundsPerPhase"] == 3 and len(doc["rounds"]) == 1 + 3 + 1
    pre = doc["rounds"][1]["sends"]
    assert sorted({(s["src"], s["dst"]) for s in pre}) == [(0, 1), (2, 3)]


@pytest.mark.clause("doubling-tools")
def test_schedule_auto_takes_a_matched_recursive_doubling_where_no_ring_fits() -> None:
    doc = {"ring": None, "matches": ["recursive-doubling"]}
    for even_only in (True, False):
        fitted = _fit_of(doc, 4, even_only=even_only)
        assert fitted is not None and fitted.ring == RECURSIVE_DOUBLING
        assert fitted.option == "--schedule recursive-doubling"
    found = difftest(
        recursive_doubling, isolate=False, schedule="auto", modes=("exact",), examples=10, max_workers=4
    )
    assert found.verdict == "pass", found.render()
