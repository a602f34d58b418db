"""The order probes (``ring_ref.difftest._probes``): ``exact`` fails every other order, whatever the seed."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._dtypes import bits
from ring_ref._order import Tree, canonical, evaluate, layout_sizes
from ring_ref._reveal import reveal
from ring_ref.difftest import Case, difftest
from ring_ref.difftest._options import Options
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder, SavedOrder
from ring_ref.difftest._orders import file_order, schedule_order
from ring_ref.difftest._probes import ProbeRun, first_failing_probe, probe_cases, size_form
from ring_ref.difftest._run import run_difftest
from ring_ref.difftest._vocabulary import Collective
from tests.common.paths import ROOT
from tests.common.planted_orders import mpich_ring

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def gloo_preset(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x, "fast", schedule="gloo")


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
    # N - 1 calls per N, M and dtype; M = 2N, and from N = 3 on, where the chunks fold differently, M = 3N,
    # where gloo's layout cuts otherwise (the even layout takes no uneven M); 16-bit ones too
    assert result.probes.calls == 4 * (1 + 2 * 2 + 2 * 3)
    names = ("float16", "bfloat16", "float32", "float64")
    assert result.probes.workers == {name: [2, 3, 4] for name in names}
    assert (
        "order probes: 44 calls at N = 2..4 (float16, bfloat16, float32, float64); M = 2N (N = 2); "
        "M = 2N, 3N (N = 3..4)"
    ) in report.render()
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["modes"]["exact"]["order_probes"] == {
        "calls": 44,
        "n": {name: [2, 3, 4] for name in names},
        "m": {"2": [4], "3": [6, 9], "4": [8, 12]},
    }
    # gloo's layout takes any M: uneven M = 2N - 1 and 2N + 1 as well, and 3N from N = 3 on; gloo's own
    # ring passes, OpenMPI's fails
    options = Options(modes=("exact",), examples=1, seed=3, max_workers=4, isolate=False)
    gloo = run_difftest(gloo_ring, options, schedule_order("gloo"))
    other = run_difftest(openmpi_ring, options, schedule_order("gloo"))
    probes = gloo.modes["exact"].probes
    assert gloo.verdict == "pass" and probes is not None, gloo.render()
    assert probes.calls == 4 * (2 + 4 * 2 + 4 * 3)
    assert other.verdict == "fail" and other.diagnoses == ["not-ring-order"], other.render()
    assert {(c.n, c.m) for c in probe_cases(schedule_order("gloo"), 3, [torch.float32])} == {
        (2, 4),
        (2, 3),
        (3, 6),
        (3, 5),
        (3, 7),
        (3, 9),
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


@pytest.mark.clause("difftest-order-probes")
@pytest.mark.parametrize("seed", range(10))
def test_a_ring_cut_like_gloo_at_small_sizes_fails_the_gloo_schedule_at_every_seed(seed: int) -> None:
    # MPICH's ceil(M/N)-element chunks cut as gloo's do at M = 2N and 2N - 1 (and at N = 3 its folds are
    # gloo's): only a size where the layouts differ, M = 2N + 1 (3, 3, 1 against 4, 3, 0), tells them apart.
    common: dict[str, Any] = {"examples": 10, "seed": seed, "max_workers": 3, "isolate": False}
    report = difftest(mpich_ring, modes=("exact",), schedule="gloo", **common)
    assert report.verdict == "fail" and report.diagnoses == ["not-ring-order"], report.render()
    # the gloo preset itself still passes
    assert difftest(gloo_preset, modes=("exact",), schedule="gloo", **common).verdict == "pass"


@pytest.mark.clause("difftest-order-probes")
def test_the_probe_sizes_tell_every_layout_from_the_others() -> None:
    # typed in from the layouts' definitions (spec/schedules.md) at N = 3: gloo cuts 2 ceil(M / 6)-element
    # chunks, blocks ceil or floor of M / 3, even M / 3; M = 7 is the first M >= 6 where gloo and blocks
    # cut differently (4, 3, 0 / 3, 2, 2), M = 9 the first where gloo and even do (4, 4, 1 / 3, 3, 3)
    assert layout_sizes("gloo", 3) == (7, 9)
    assert layout_sizes("blocks", 3) == (7,)  # blocks and even agree wherever both cut
    assert layout_sizes("even", 3) == (9,)
    assert [schedule_order(name).probe_sizes(3) for name in ("gloo", "openmpi-ring", "spec", "chain")] == [
        (6, 5, 7, 9),
        (6, 5, 7, 2),  # and N - 1: OpenMPI's ring runs recursive doubling below N elements
        (6, 9),
        (6, 5),  # one fold for every chunk: the layout changes no tree
    ]


# --- the probes' values, sizes and report line, each from the rules of the module's docstring ---


def _small_exponent(n: int, dtype: torch.dtype) -> tuple[int, int]:
    """``(s, p)`` of the docstring: s is 0, or lower where ``2^(s + N + p + 1)`` would pass the dtype's
    largest power of two ``2^emax``; p the precision (typed in: IEEE 754 and bfloat16's definitions)."""
    p = {torch.float32: 24, torch.float64: 53, torch.float16: 11, torch.bfloat16: 8}[dtype]
    emax = math.frexp(torch.finfo(dtype).max)[1] - 1
    return min(0, emax - (n + p + 1)), p


@pytest.mark.clause("difftest-order-probes")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 4, 6])
def test_each_probe_holds_plus_and_minus_b_once_and_every_other_worker_its_small_value(
    n: int, dtype: torch.dtype
) -> None:
    s, p = _small_exponent(n, dtype)
    big = 2.0 ** (s + n + p + 1)
    cases = [c for c in probe_cases(SPEC_ORDER, n, [dtype]) if c.n == n]
    assert cases, "no probe at this N"
    for case in cases:
        columns = [case.values[w * case.m : (w + 1) * case.m] for w in range(n)]
        for e in range(case.m):
            column = [columns[w][e] for w in range(n)]
            assert column.count(big) == 1 and column.count(-big) == 1, column
            assert all(v == 2.0 ** (s + w) for w, v in enumerate(column) if abs(v) != big), column


def test_every_dtype_is_probed_up_to_its_limit_and_no_further() -> None:
    # the N small values add exactly while N <= p: 8 in bfloat16, 11 in float16, 24 in float32
    cases = list(probe_cases(SPEC_ORDER, 12, [torch.bfloat16, torch.float32]))
    by_dtype = {d: sorted({c.n for c in cases if c.dtype == d}) for d in (torch.bfloat16, torch.float32)}
    assert by_dtype == {torch.bfloat16: list(range(2, 9)), torch.float32: list(range(2, 13))}


def test_a_reduce_scatters_probes_are_at_m_2n_and_carry_the_collective() -> None:
    cases = list(probe_cases(SPEC_ORDER, 4, [torch.float32], Collective.REDUCE_SCATTER))
    assert [(c.n, c.m) for c in cases] == [(2, 4), (3, 6), (3, 6), (4, 8), (4, 8), (4, 8)]
    assert {c.collective for c in cases} == {Collective.REDUCE_SCATTER}
    found, run = first_failing_probe(
        SPEC_ORDER, 4, [torch.float32], lambda case: False, collective=Collective.REDUCE_SCATTER
    )
    assert found is None and run.calls == 6
    found, _ = first_failing_probe(
        SPEC_ORDER, 4, [torch.float32], lambda case: case.n == 3, collective=Collective.REDUCE_SCATTER
    )
    assert found is not None and (found.n, found.m, found.collective) == (3, 6, Collective.REDUCE_SCATTER)


def test_probes_start_at_the_smallest_n_asked() -> None:
    found, run = first_failing_probe(SPEC_ORDER, 4, [torch.float32], lambda case: False, min_workers=3)
    assert found is None and run.workers == {"float32": [3, 4]}
    assert run.calls == sum(1 for c in probe_cases(SPEC_ORDER, 4, [torch.float32]) if c.n >= 3)


@pytest.mark.parametrize(
    ("calls", "workers", "line"),
    [
        (0, {}, "no order probes"),
        (1, {"float32": [2]}, "order probes: 1 calls at N = 2 (float32)"),
        (3, {"float32": [2, 3]}, "order probes: 3 calls at N = 2..3 (float32)"),
        (
            9,
            {"float32": [2, 3, 4], "float64": [2, 3, 4], "float16": [2]},
            "order probes: 9 calls at N = 2..4 (float32, float64), N = 2 (float16)",
        ),
    ],
)
def test_the_probes_line_says_calls_and_n_per_dtype(
    calls: int, workers: dict[str, list[int]], line: str
) -> None:
    assert ProbeRun(calls, workers).describe() == line


def test_the_probes_line_names_each_size_probed_as_a_multiple_of_n() -> None:
    assert [size_form(m, 3) for m in (6, 5, 7, 2, 4, 9, 11, 14)] == [
        "2N", "2N-1", "2N+1", "N-1", "N+1", "3N", "4N-1", "14"
    ]  # fmt: skip
    sizes = {2: [4, 3], 3: [6, 5, 7, 2], 4: [8, 7, 9, 3], 5: [10, 9, 11, 4], 7: [14, 13, 15, 6]}
    assert ProbeRun(9, {"float32": [2, 3, 4, 5, 7]}, sizes).describe() == (
        "order probes: 9 calls at N = 2..7 (float32); M = 2N-1, 2N (N = 2); "
        "M = N-1, 2N-1, 2N, 2N+1 (N = 3..5, 7)"
    )
    found, ran = first_failing_probe(SPEC_ORDER, 4, [torch.float32], lambda case: False)
    assert found is None and ran.sizes == {2: [4], 3: [6, 9], 4: [8, 12]}  # 2N, and 3N from N = 3
