"""The order probes (``ring_ref.difftest._probes``): ``exact`` fails every other order, whatever the seed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._dtypes import bits
from ring_ref._order import Tree, canonical, evaluate
from ring_ref._reveal import reveal
from ring_ref.difftest import Case, difftest
from ring_ref.difftest._options import Options
from ring_ref.difftest._oracles import ExactOrder, SavedOrder
from ring_ref.difftest._orders import file_order, schedule_order
from ring_ref.difftest._probes import first_failing_probe, probe_cases
from ring_ref.difftest._search import run_difftest
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _insertions(tree: Tree, leaf: int) -> Iterator[Tree]:
    """Every tree made by hanging ``leaf`` above a node of ``tree``."""
    yield (tree, leaf)
    if not isinstance(tree, int):
        a, b = tree
        yield from ((t, b) for t in _insertions(a, leaf))
        yield from ((a, t) for t in _insertions(b, leaf))


def all_trees(n: int) -> list[Tree]:
    """Every rooted binary tree on workers ``0 .. n - 1`` ((2n - 3)!! of them), canonical."""
    trees: list[Tree] = [(0, 1)]
    for leaf in range(2, n):
        trees = [t for tree in trees for t in _insertions(tree, leaf)]
    return [canonical(t) for t in trees]


def _first_telling(expected: Tree, target: Tree | None, n: int, dtype: torch.dtype) -> int | None:
    """Of the probes designed from ``expected`` (one element), the number of the first on which ``target``
    (``None``: the exact sum, rounded once) gives other bits than ``expected``'s additions."""
    order = ExactOrder(
        "one tree", lambda c: torch.zeros(0), saved=SavedOrder(n, 1, dtype, [expected], "even")
    )

    def result(tree: Tree | None, x: torch.Tensor) -> torch.Tensor:
        if tree is not None:
            return evaluate(tree, x)
        exact = [float(sum(map(Fraction, column), Fraction(0))) for column in x.double().T.tolist()]
        return torch.tensor(exact, dtype=torch.float64).to(x.dtype)

    def differs(case: Case) -> bool:
        x = case.tensor()
        return not torch.equal(bits(result(target, x)), bits(result(expected, x)))

    failing, run = first_failing_probe(order, n, [dtype], differs)
    return None if failing is None else run.calls


@pytest.mark.clause("difftest-order-probes")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_probes_tell_every_other_tree_apart(dtype: torch.dtype) -> None:
    # Independent of the search and the reference: the trees evaluated addition by addition.
    assert len(all_trees(4)) == 15 and len(all_trees(5)) == 105
    cases: list[tuple[int, list[Tree], list[Tree]]] = [(4, all_trees(4), all_trees(4))]
    five = all_trees(5)
    chosen: list[Tree] = [((((0, 1), 2), 3), 4), ((0, 1), ((2, 3), 4)), ((((3, 4), 0), 1), 2)]
    cases.append((5, [canonical(t) for t in chosen], five))
    for n, expected_trees, targets in cases:
        for expected in expected_trees:
            for target in targets:
                told = _first_telling(expected, target, n, dtype)
                assert (told is None) == (target == expected), (n, expected, target, told)
            assert _first_telling(expected, None, n, dtype) is not None, "rounding once fails too"


def last_element_other_fold(x: torch.Tensor) -> torch.Tensor:
    """The spec's ring, except that at N = 3 the last element is folded 1,2,0 instead of 2,0,1."""
    out = ring_all_reduce(x)
    if x.shape[0] == 3:
        flat_out, flat_x = out.reshape(-1), x.reshape(3, -1)
        flat_out[-1] = (flat_x[1, -1] + flat_x[2, -1]) + flat_x[0, -1]
    return out


def double_accumulator(x: torch.Tensor) -> torch.Tensor:
    """Sums in float64 and rounds once: no tree of additions in the dtype."""
    return x.double().sum(0).to(x.dtype)


@pytest.mark.clause("difftest-order-probes", "difftest-exact-orders")
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_one_element_of_another_order_fails_exact_at_every_seed(seed: int) -> None:
    report = difftest(
        last_element_other_fold, modes=("exact",), examples=1, seed=seed, max_workers=4, isolate=False
    )
    result = report.modes["exact"]
    finding, case = result.finding, result.counterexample
    assert result.verdict == "fail" and finding is not None and case is not None, report.render()
    assert finding.codes == ["not-ring-order"] and case.n == 3
    assert finding.mismatch is not None and finding.mismatch.index == (case.m - 1,)
    # both orders: the target's, revealed, and the spec ring's for the last chunk
    assert "the target sums that element as fold 1,2,0" in finding.explanation, finding.explanation
    assert "where the spec's ring folds 2,0,1" in finding.explanation
    again = difftest(
        last_element_other_fold, modes=("exact",), examples=1, seed=seed, max_workers=4, isolate=False
    )
    assert again.modes["exact"].counterexample == case, "the counterexample replays"


@pytest.mark.clause("difftest-order-probes", "difftest-exact-orders")
def test_a_wider_accumulator_is_named_as_rounding_once() -> None:
    report = difftest(double_accumulator, examples=1, seed=0, max_workers=3, isolate=False)
    assert report.summary().startswith("FAIL (exact only): ")
    assert "but does not round after every addition" in report.summary()
    finding = report.modes["exact"].finding
    assert finding is not None and finding.codes == ["not-ring-order"], report.render()
    assert (
        "the target accumulates in higher precision or otherwise does not round after every addition"
        in finding.explanation
    )
    assert "different summation order" not in finding.explanation and "swamped" not in finding.explanation


@pytest.mark.clause("difftest-order-probes")
def test_correct_targets_pass_and_the_report_says_what_was_probed() -> None:
    def gloo_ring(x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x, "fast", schedule="gloo")

    def openmpi_ring(x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x, "fast", schedule="openmpi-ring")

    report = difftest(ring_all_reduce, modes=("exact",), examples=1, seed=3, max_workers=4, isolate=False)
    result = report.modes["exact"]
    assert result.verdict == "pass" and result.probes is not None, report.render()
    # N - 1 calls per N and dtype, M = 2N only (the even layout takes no other M); 16-bit ones too
    assert result.probes.calls == 4 * (1 + 2 + 3)
    names = ("float16", "bfloat16", "float32", "float64")
    assert result.probes.workers == {name: [2, 3, 4] for name in names}
    assert "order probes: 24 calls at N = 2..4 (float16, bfloat16, float32, float64)" in report.render()
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["modes"]["exact"]["order_probes"] == {"calls": 24, "n": {name: [2, 3, 4] for name in names}}
    # gloo's layout takes any M: an uneven M = 2N - 1 as well; gloo's own ring passes, OpenMPI's fails
    options = Options(modes=("exact",), examples=1, seed=3, max_workers=4, isolate=False)
    gloo = run_difftest(gloo_ring, options, schedule_order("gloo"))
    other = run_difftest(openmpi_ring, options, schedule_order("gloo"))
    probes = gloo.modes["exact"].probes
    assert gloo.verdict == "pass" and probes is not None and probes.calls == 2 * 24, gloo.render()
    assert other.verdict == "fail" and other.diagnoses == ["not-ring-order"], other.render()
    assert {(c.n, c.m) for c in probe_cases(schedule_order("gloo"), 3, [torch.float32])} == {
        (2, 4),
        (2, 3),
        (3, 6),
        (3, 5),
    }
    # other modes, and other ops, have no probes
    bound = difftest(ring_all_reduce, modes=("bound",), examples=1, seed=3, max_workers=4, isolate=False)
    assert bound.modes["bound"].probes is None and "order_probes" not in bound.to_json()["modes"]["bound"]


@pytest.mark.clause("difftest-order-probes", "difftest-exact-orders")
def test_an_order_file_is_probed_at_its_own_size_and_dtype(tmp_path: Path) -> None:
    # The spec's ring saved at N = 5 (beyond --max-workers 3) is probed at its own N and dtype; a saved order
    # from which the target differs in its last element only fails.
    found = reveal(last_element_other_fold, 3, 6)
    saved = tmp_path / "order.json"
    found_doc = found.to_json()
    found_doc["trees"][-1] = [[0, 2], 1]  # the spec ring's own last element: the target now differs there
    saved.write_text(json.dumps(found_doc), encoding="utf-8")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(reveal(ring_all_reduce, 5, 10).to_json()), encoding="utf-8")
    options = Options(modes=("exact",), examples=1, seed=0, max_workers=3, isolate=False)
    report = run_difftest(ring_all_reduce, options, file_order(spec_file))
    probes = report.modes["exact"].probes
    assert report.verdict == "pass" and probes is not None and probes.workers == {"float32": [5]}
    assert probes.calls == 4, report.render()
    report = run_difftest(last_element_other_fold, options, file_order(saved))
    result = report.modes["exact"]
    assert result.verdict == "fail" and result.counterexample is not None, report.render()
    assert (result.counterexample.n, result.counterexample.m) == (3, 6)
    assert result.finding is not None and f"the order saved in {saved}" in result.finding.explanation
