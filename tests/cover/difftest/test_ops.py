"""The tester for the other reductions (``--op``): each op's oracles, inputs, diagnoses and report.

The oracles are checked bit for bit against ``tests/common/oracles.py`` (which
imports nothing from ``ring_ref``) and against results computed here in other
orders; the bounds against values worked out by hand; the planted op bugs of
``tests/common/planted_impls.py`` must get their codes.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import shlex
from fractions import Fraction

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from ring_ref._cli import main
from ring_ref.difftest import DTYPES, MODES, Case, Mode, difftest
from ring_ref.difftest._call import call_target
from ring_ref.difftest._diagnosis import diagnose
from ring_ref.difftest._diagnosis_probes import op_probe_values
from ring_ref.difftest._inputs import cases, near_one_log_bound
from ring_ref.difftest._options import Options
from ring_ref.difftest._oracles import check_values
from ring_ref.difftest._orders import schedule_order
from ring_ref.difftest._run import run_difftest
from tests.common import planted_impls
from tests.common.oracles import bits, ring_fold_op, same_bits, sums_in_several_orders
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
ALL_DTYPES = tuple(DTYPES.values())
NOT_SUM = ("prod", "max", "min", "avg")

pytestmark = pytest.mark.clause("difftest-ops")


# Results in other orders, computed here.


def _fold(rows: list[torch.Tensor], op: str) -> torch.Tensor:
    acc = rows[0].clone()
    for row in rows[1:]:
        acc = acc * row if op == "prod" else acc + row
    return acc


def _pairwise(rows: list[torch.Tensor], op: str) -> torch.Tensor:
    while len(rows) > 1:
        rows = [_fold(rows[i : i + 2], op) for i in range(0, len(rows), 2)]
    return rows[0].clone()


def _extremes(rows: list[torch.Tensor], op: str, keep_first: bool) -> torch.Tensor:
    """The max (min) of ``rows`` in their order, ties kept first or last, chosen on Python floats."""
    flat = [r.to(torch.float64).reshape(-1).tolist() for r in rows]
    out = []
    for e in range(len(flat[0])):
        best = flat[0][e]
        for f in flat[1:]:
            v = f[e]
            better = v > best if op == "max" else v < best
            if better or (not keep_first and v == best):
                best = v
        out.append(best)
    return torch.tensor(out, dtype=torch.float64).to(rows[0].dtype).reshape(rows[0].shape)


def _divided_once(total: torch.Tensor, n: int) -> torch.Tensor:
    """``total / n`` correctly rounded (through float64: innocuous for 24 bits or fewer, exact for 53)."""
    flat = total.to(torch.float64).reshape(-1).tolist()
    quotients = [math.copysign(float(Fraction(v) / n), v) if math.isfinite(v) else v for v in flat]
    return torch.tensor(quotients, dtype=torch.float64).to(total.dtype).reshape(total.shape)


def results_in_several_orders(x: torch.Tensor, op: str, rnd: random.Random) -> list[torch.Tensor]:
    """The op over axis 0 in several orders: shuffled, reversed, pairwise (and ties both ways)."""
    if op == "avg":
        return [_divided_once(total, x.shape[0]) for total in sums_in_several_orders(x, rnd)]
    rows = [x[i] for i in range(x.shape[0])]
    rnd.shuffle(rows)
    if op == "prod":
        return [_fold(rows, op), _fold(rows[::-1], op), _pairwise(rows, op), torch.prod(x, 0)]
    return [_extremes(order, op, keep) for order in (rows, rows[::-1]) for keep in (True, False)]


# The planted op targets.


def _cover_entries() -> list[tuple[planted_impls.OpImpl, str, dict[str, set[str]], tuple[Mode, ...]]]:
    """The planted op targets of the fast tests, each with the modes run: one mode, taking turns, where
    every mode must report the same codes, else every mode (the soak test runs each entry in every mode)."""
    chosen = []
    entries = [e for e in planted_impls.OP_EXPECTED if (e[0], e[1]) not in planted_impls.OP_SOAK]
    for i, (fn, op, expected) in enumerate(entries):
        uniform = bool(expected["exact"]) and all(expected[m] == expected["exact"] for m in MODES)
        chosen.append((fn, op, expected, (MODES[i % 3],) if uniform else MODES))
    return chosen


def _check_planted(
    fn: planted_impls.OpImpl, op: str, expected: dict[str, set[str]], modes: tuple[Mode, ...]
) -> None:
    report = difftest(fn, op=op, modes=modes, examples=12, seed=20260101)
    assert report.op == op and f" --op {op} " in report.replay
    for mode in modes:
        result = report.modes[mode]
        codes = set(result.finding.codes) if result.finding is not None else set()
        assert codes == expected[mode], (mode, report.render())
        assert (result.verdict == "pass") == (not expected[mode])
        if result.counterexample is not None:
            assert result.counterexample.op == op


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("fn", "op", "expected", "modes"),
    _cover_entries(),
    ids=[f"{fn.__name__}-{op}-{'-'.join(modes)}" for fn, op, _, modes in _cover_entries()],
)
def test_planted_op_target_gets_its_codes(
    fn: planted_impls.OpImpl, op: str, expected: dict[str, set[str]], modes: tuple[Mode, ...]
) -> None:
    _check_planted(fn, op, expected, modes)


@pytest.mark.clause("difftest-diagnoses")
def test_a_sum_failing_first_on_one_worker_is_sum_not_op_in_every_mode() -> None:
    # Its first failure is the N = 1 case [[-0.0, 0.0]] (torch.sum gives +0.0): one worker cannot tell a
    # sum from a max, so the op probes must run on more workers before a code is named (issue 29, item 15).
    report = difftest(planted_impls.max_is_sum, op="max", examples=20, seed=20260101)
    for mode in MODES:
        result = report.modes[mode]
        assert result.finding is not None and result.finding.codes == ["sum-not-op"], report.render()
        assert "the target computed sum when asked for max" in result.finding.explanation
        assert "a correct max" not in result.finding.explanation


def test_a_zero_of_the_wrong_sign_on_one_worker_is_no_tie_under_exact() -> None:
    # One worker holds -0.0: no other value ties with it, so +0.0 is no other fold order's zero.
    def plus_zero_max(x: torch.Tensor, op: str) -> torch.Tensor:
        result = planted_impls.op_ring(x, op)
        return torch.where(result == 0, torch.zeros_like(result), result)

    one = Case(1, 2, (), torch.float32, "contiguous", (-0.0, 1.0), "max")
    finding = diagnose(plus_zero_max, call_target(plus_zero_max, one), "exact")
    assert finding is not None and finding.codes == ["signed-zero"], finding
    assert "no fold order gives it" in finding.explanation
    assert "a correct max" not in finding.explanation


@pytest.mark.soak
@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("fn", "op", "expected"),
    planted_impls.OP_EXPECTED,
    ids=[f"{fn.__name__}-{op}" for fn, op, _ in planted_impls.OP_EXPECTED],
)
def test_soak_planted_op_target_gets_its_codes_in_every_mode(
    fn: planted_impls.OpImpl, op: str, expected: dict[str, set[str]]
) -> None:
    _check_planted(fn, op, expected, MODES)


# The oracles, per op.


@given(st.sampled_from(("sum", *NOT_SUM)), st.data())
def test_exact_is_the_independent_ring_fold_of_each_op(op: str, data: st.DataObject) -> None:
    case = data.draw(cases("exact", ALL_DTYPES, max_workers=8, op=op))  # type: ignore[arg-type]
    want = ring_fold_op(case.tensor(), op)
    assert check_values("exact", case, want).mismatch is None
    e = data.draw(st.integers(0, want.numel() - 1))
    flipped = bits(want).reshape(-1).clone()
    flipped[e] ^= 1
    mismatch = check_values("exact", case, flipped.view(want.dtype).reshape(want.shape)).mismatch
    assert mismatch is not None and mismatch.count == 1


@settings(max_examples=60)
@given(st.sampled_from(NOT_SUM), st.data(), st.randoms(use_true_random=False))
def test_order_free_oracles_accept_every_order_and_equal_the_ring(
    op: str, data: st.DataObject, rnd: random.Random
) -> None:
    case = data.draw(cases("order-free", ALL_DTYPES, op=op))  # type: ignore[arg-type]
    x = case.tensor()
    ring = ring_fold_op(x, op)
    assert check_values("order-free", case, ring).mismatch is None
    for result in results_in_several_orders(x, op, rnd):
        assert check_values("order-free", case, result).mismatch is None, (op, result)
        if op == "prod":
            assert same_bits(result, ring)  # order-free inputs: every order gives the same bits
        else:  # max, min; avg of -0.0 values folded from +0.0: the same values, zeros may differ in sign
            assert torch.equal(result, ring)


@settings(max_examples=60)
@given(st.sampled_from(NOT_SUM), st.data(), st.randoms(use_true_random=False))
def test_bound_oracles_accept_every_order(op: str, data: st.DataObject, rnd: random.Random) -> None:
    case = data.draw(cases("bound", ALL_DTYPES, op=op))  # type: ignore[arg-type]
    x = case.tensor()
    for result in [ring_fold_op(x, op), *results_in_several_orders(x, op, rnd)]:
        checked = check_values("bound", case, result)
        assert checked.mismatch is None, (op, checked)
        if op == "prod":  # the generator keeps every subset product normal
            assert (checked.overflow_skipped, checked.underflow_skipped) == (0, 0)


@given(cases("order-free", ALL_DTYPES, op="prod"), st.randoms(use_true_random=False))
def test_order_free_products_are_exact_at_every_step_of_every_order(case: Case, rnd: random.Random) -> None:
    x = case.tensor()
    rows = [x[i] for i in range(case.n)]
    rnd.shuffle(rows)
    acc = rows[0].clone()
    exact = [Fraction(v) for v in acc.to(torch.float64).reshape(-1).tolist()]
    for row in rows[1:]:
        acc = acc * row
        exact = [
            a * Fraction(v) for a, v in zip(exact, row.to(torch.float64).reshape(-1).tolist(), strict=True)
        ]
        assert [Fraction(v) for v in acc.to(torch.float64).reshape(-1).tolist()] == exact


@given(cases("bound", ALL_DTYPES, max_workers=6, op="prod"))
def test_bound_products_of_every_subset_stay_normal(case: Case) -> None:
    fmt_normal = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126, torch.float32: 2.0**-126}
    top = {
        torch.float16: 65504.0,
        torch.bfloat16: 3.3895313892515355e38,
        torch.float32: 3.4028234663852886e38,
    }
    per = len(case.values) // case.n
    for e in range(per):
        column = [abs(Fraction(case.values[i * per + e])) for i in range(case.n)]
        nonzero = [v for v in column if v != 0]
        for size in range(2, len(nonzero) + 1):
            for subset in itertools.combinations(nonzero, size):
                p = math.prod(subset, start=Fraction(1))
                assert Fraction(fmt_normal.get(case.dtype, 2.0**-1022)) < p
                assert p < Fraction(top.get(case.dtype, 1.7976931348623157e308))


def test_near_one_inputs_span_a_factor_two_inside_the_normal_range() -> None:
    # (min(emax, -emin) - 1) / N, worked out by hand: float16 emax 15, emin -14.
    assert near_one_log_bound(torch.float16, 2) == 6.5
    assert near_one_log_bound(torch.float16, 13) == 1.0
    assert near_one_log_bound(torch.float64, 1) == 1021.0


def _one(case: Case, values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(case.dtype).reshape(case.m, *case.trailing)


def test_prod_bound_is_tight_and_honest_about_range() -> None:
    f16 = torch.float16
    # N = 2: (1 + 2**-10)**2 = 1 + 2**-9 + 2**-20; gamma_1 |P| is just over 2**-11.
    near = Case(2, 2, (), f16, "contiguous", (1 + 2**-10, 1.0, 1 + 2**-10, 1.0), "prod")
    assert check_values("bound", near, _one(near, [1 + 2**-9, 1.0])).mismatch is None
    off = check_values("bound", near, _one(near, [1 + 2**-9 + 2**-10, 1.0])).mismatch
    assert off is not None and off.index == (0,) and "gamma_1 * |P|" in off.detail
    # 256 * 256 = 65536 reaches float16's overflow threshold 65520; 255 * 256 = 65280 does not.
    over = Case(2, 2, (), f16, "contiguous", (256.0, 1.0, 256.0, 1.0), "prod")
    assert check_values("bound", over, _one(over, [math.inf, 1.0])) == (None, 1, 0)
    below = Case(2, 2, (), f16, "contiguous", (255.0, 1.0, 256.0, 1.0), "prod")
    refused = check_values("bound", below, _one(below, [math.inf, 1.0])).mismatch
    assert refused is not None and "no order can overflow" in refused.detail
    # 2**-7 * 2**-8 = 2**-15 is below the smallest normal 2**-14: any value of the right sign passes.
    tiny = Case(2, 2, (), f16, "contiguous", (2**-7, -1.0, -(2**-8), 1.0), "prod")
    assert check_values("bound", tiny, _one(tiny, [-0.0, -1.0])) == (None, 0, 1)
    assert check_values("bound", tiny, _one(tiny, [-(2**-15), -1.0])) == (None, 0, 1)
    wrong_sign = check_values("bound", tiny, _one(tiny, [0.0, -1.0])).mismatch
    assert wrong_sign is not None and "exclusive or" in wrong_sign.detail
    # A zero input: every order gives a zero of the signs' exclusive or, or NaN once 256 * 256 overflowed.
    zero = Case(3, 3, (), f16, "contiguous", (256.0, 2.0, 1.0, 256.0, -3.0, 1.0, 0.0, -0.0, 1.0), "prod")
    assert check_values("bound", zero, _one(zero, [math.nan, 0.0, 1.0])) == (None, 1, 0)
    assert check_values("bound", zero, _one(zero, [0.0, 0.0, 1.0])) == (None, 0, 0)
    for bad in ([-0.0, 0.0, 1.0], [1.0, 0.0, 1.0]):
        assert check_values("bound", zero, _one(zero, bad)).mismatch is not None
    nan = check_values("bound", zero, _one(zero, [0.0, math.nan, 1.0])).mismatch
    assert nan is not None and nan.index == (1,) and "NaN" in nan.detail
    # N = 3: the last product's operands carry up to gamma_1 of rounding, so the range tests widen by
    # (1 -+ gamma_1): 2**-7 * 2**-7 = 2**-14 (the smallest normal) counts as "could underflow",
    # 2**-7 * 2**-6 does not; 256 * 255.875 = 65504 (the largest finite) counts as "could overflow".
    edge = Case(3, 3, (), f16, "contiguous", (2**-7, 2**-7, 256.0, 2**-7, 2**-6, 255.875, 1, 1, 1), "prod")
    assert check_values("bound", edge, _one(edge, [2**-14, 2**-13, math.inf])) == (None, 1, 1)
    # gamma_2 * 2**-13 is a hair over float16's spacing there, 2**-23: one step is in bound, two are not.
    assert check_values("bound", edge, _one(edge, [2**-14, 2**-13 + 2**-23, 65504.0])) == (None, 0, 1)
    assert check_values("bound", edge, _one(edge, [2**-14, 2**-13 + 2**-22, 65504.0])).mismatch is not None
    # 256 * 256 * 2**-10 = 64: finite and right, though another order overflows on the way.
    detour = Case(3, 3, (), f16, "contiguous", (256.0, 1, 1, 256.0, 1, 1, 2**-10, 1, 1), "prod")
    assert check_values("bound", detour, _one(detour, [64.0, 1, 1])) == (None, 0, 0)
    assert check_values("bound", detour, _one(detour, [math.inf, 1, 1])) == (None, 1, 0)


def _avg_room(values: list[float], p: int, min_subnormal: float) -> Fraction:
    """The avg bound typed in from the spec: gamma A / N + max(u (|S| + gamma A) / N, eta)."""
    n = len(values)
    u = Fraction(1, 2**p)
    g = (n - 1) * u / (1 - (n - 1) * u)
    s = sum((Fraction(v) for v in values), Fraction(0))
    a = sum((abs(Fraction(v)) for v in values), Fraction(0))
    return g * a / n + (0 if n == 1 else max(u * (abs(s) + g * a) / n, Fraction(min_subnormal) / 2))


def _edges(centre: Fraction, room: Fraction, dtype: torch.dtype) -> tuple[Fraction, Fraction, list[Fraction]]:
    """The lowest and highest ``dtype`` values within ``room`` of ``centre``, and the two just outside."""
    start = torch.tensor([float(centre)], dtype=torch.float64).to(dtype)
    assert abs(Fraction(float(start)) - centre) <= room  # the nearest value is always inside

    def walk(towards: float) -> tuple[Fraction, Fraction]:
        inside, step = start.clone(), start.clone()
        while abs(Fraction(float(step)) - centre) <= room:
            inside = step
            step = torch.nextafter(step, torch.tensor([towards], dtype=dtype))
        return Fraction(float(inside)), Fraction(float(step))

    (lowest, below), (highest, above) = walk(-math.inf), walk(math.inf)
    return lowest, highest, [below, above]


def test_avg_bound_is_tight_to_its_derivation() -> None:
    f16 = torch.float16
    for column in ([1.0, 1.0, 3.0], [1.5, -0.3330078125], [2.0**-24, 2.0**-24, 0.0], [7.0]):
        n = len(column)
        case = Case(
            n, n, (), f16, "contiguous", tuple(v if c == 0 else 0.0 for v in column for c in range(n)), "avg"
        )
        exact = sum((Fraction(v) for v in column), Fraction(0)) / n
        room = _avg_room(column, 11, 2.0**-24)
        lowest, highest, just_out = _edges(exact, room, f16)
        for y in (lowest, highest):
            assert check_values("bound", case, _one(case, [float(y)] + [0.0] * (n - 1))).mismatch is None
        for y in just_out:
            assert check_values("bound", case, _one(case, [float(y)] + [0.0] * (n - 1))).mismatch is not None
    # The spec's example: 5 / 3 rounded once is 1.6669921875; dividing first gives 1.666015625.
    spec = Case(3, 3, (), f16, "contiguous", (1.0, 0, 0, 1.0, 0, 0, 3.0, 0, 0), "avg")
    assert check_values("order-free", spec, _one(spec, [1.6669921875, 0, 0])).mismatch is None
    assert check_values("order-free", spec, _one(spec, [1.666015625, 0, 0])).mismatch is not None
    overflow = Case(2, 2, (), f16, "contiguous", (65504.0, 0.0, 65504.0, 0.0), "avg")
    assert check_values("bound", overflow, _one(overflow, [math.inf, 0.0])) == (None, 1, 0)


def test_max_and_min_accept_exactly_the_inputs_holding_the_extreme() -> None:
    f32 = torch.float32
    # Element 0: -0 (worker 0) and +0 (worker 1) tie; element 1: only +0 holds the maximum (worker 1: -1).
    case = Case(2, 2, (), f32, "contiguous", (-0.0, 0.0, 0.0, -1.0), "max")
    for zero in (0.0, -0.0):
        assert check_values("order-free", case, _one(case, [zero, 0.0])).mismatch is None
    minus = check_values("bound", case, _one(case, [0.0, -0.0])).mismatch
    assert minus is not None and minus.index == (1,) and "a zero of a sign no worker holds" in minus.detail
    low = Case(2, 2, (), f32, "contiguous", (3.0, 0.0, -2.0, -0.0), "min")
    assert check_values("order-free", low, _one(low, [-2.0, -0.0])).mismatch is None
    assert check_values("order-free", low, _one(low, [-2.0, 0.0])).mismatch is None
    wrong = check_values("order-free", low, _one(low, [3.0, 0.0])).mismatch
    assert (
        wrong is not None
        and wrong.index == (0,)
        and wrong.expected == -2.0
        and "not the minimum" in wrong.detail
    )


# Diagnosis details.


def test_op_probes_give_every_op_a_different_exact_value() -> None:
    # Worked out by hand: 2, 3 and 3, 2 for N = 2; 2, 3, 2 for N = 3.
    assert op_probe_values(2, torch.float16) == {"sum": 5.0, "prod": 6.0, "max": 3.0, "min": 2.0, "avg": 2.5}
    assert op_probe_values(2, torch.float16, flipped=True) == op_probe_values(2, torch.float16)
    three = op_probe_values(3, torch.bfloat16, flipped=True)  # 3, 2, 3
    assert three == {"sum": 8.0, "prod": 18.0, "max": 3.0, "min": 2.0, "avg": 2.671875}
    # 2**8 * 3**8 is beyond float16's range: the product is left out there, not guessed.
    assert "prod" not in op_probe_values(16, torch.float16)
    for n in range(2, 17):
        values = op_probe_values(n, torch.float32)
        assert len(set(values.values())) == len(values), n


def test_signed_zero_needs_the_values_in_their_places() -> None:
    # Only zeros: rotating the chunks changes nothing but zero signs, yet it is a misplacement.
    case = Case(2, 2, (), torch.float32, "contiguous", (-0.0, 0.0, 0.0, 0.0), "max")
    rotated = diagnose(
        planted_impls.op_chunks_rotated, call_target(planted_impls.op_chunks_rotated, case), "exact"
    )
    assert rotated is not None and rotated.codes == ["out-of-bound"], rotated
    # The ring keeping the last of tied zeros: chunk 0 folds workers 0, 1 (-0, then +0) and keeps +0.
    tie = diagnose(
        planted_impls.keeps_the_last_zero, call_target(planted_impls.keeps_the_last_zero, case), "exact"
    )
    assert tie is not None and tie.codes == ["signed-zero"] and "the ring keeps the first" in tie.explanation


def test_a_lost_worker_is_not_taken_for_another_op() -> None:
    # With N = 2, losing worker 1 gives 2 on the probe 2, 3 (the minimum), but 3 on the probe 3, 2.
    case = Case(2, 2, (), torch.float32, "contiguous", (1.0, 0.0, 5.0, 0.0), "max")
    outcome = call_target(planted_impls.drops_last_worker_op, case)
    for mode in MODES:
        found = diagnose(planted_impls.drops_last_worker_op, outcome, mode)
        assert (
            found is not None
            and found.codes == ["out-of-bound"]
            and "worker(s) [1] lost" in found.explanation
        )


def test_a_target_without_op_is_raised_with_a_hint() -> None:
    report = difftest(planted_impls.torch_sum, op="max", modes=("bound",), examples=1, seed=0)
    finding = report.modes["bound"].finding
    assert finding is not None and finding.codes == ["raised"]
    assert "unexpected keyword argument 'op'" in finding.explanation
    assert "with --op the target is called with op= too (op='max')" in finding.explanation


def test_a_reduce_op_is_taken_by_name_and_the_python_replay_names_it() -> None:
    def local_ring(x: torch.Tensor, op: str) -> torch.Tensor:  # no importable name: a Python replay line
        return planted_impls.op_ring(x, op)

    report = difftest(local_ring, op=dist.ReduceOp.MIN, modes=("exact",), examples=3, seed=1)
    assert report.verdict == "pass" and report.op == "min" and report.to_json()["op"] == "min"
    assert report.replay.endswith(", op='min')")
    plain = difftest(lambda x: x.sum(0), modes=("order-free",), examples=1, seed=1)
    assert plain.op is None and plain.to_json()["op"] == "sum" and "op=" not in plain.replay
    with pytest.raises(ValueError, match="unknown reduction op"):
        difftest(planted_impls.op_ring, op="mean")


# The command line and the JSON report.


def test_cli_op_reports_json_by_the_schema_and_replays(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["difftest", "tests.common.planted_impls:keeps_the_last_zero", "--op", "max", "--examples", "12"]
    assert main([*args, "--seed", "20260101", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["op"] == "max" and doc["diagnoses"] == ["signed-zero"]
    assert doc["summary"].startswith("FAIL (exact only)") and "correct max" in doc["summary"]
    cex = doc["modes"]["exact"]["counterexample"]
    assert cex["op"] == "max" and doc["modes"]["bound"]["underflow_skipped"] == 0
    assert " --op max " in doc["replay"]
    # The replay line reproduces the counterexample (each mode runs on its own: exact alone suffices).
    assert main([*shlex.split(doc["replay"])[1:], "--mode", "exact", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["modes"] == {"exact": doc["modes"]["exact"]}
    broken = {**doc, "op": "mean"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)


@pytest.mark.clause("difftest-exact-orders")
def test_cli_checks_an_op_against_a_named_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    """``--schedule gloo`` makes exact check gloo's order for the op too: gloo's ring passes it and
    fails the spec's order, the spec's ring the other way round; revealed orders stay sum-only."""
    gloo, spec = "tests.common.planted_impls:gloo_op_ring", "tests.common.planted_impls:op_ring"
    common = ["--op", "prod", "--mode", "exact", "--examples", "60", "--seed", "3"]
    assert main(["difftest", gloo, *common, "--schedule", "gloo"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["difftest", gloo, *common]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["difftest", spec, *common, "--schedule", "gloo", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["op"] == "prod" and "--schedule gloo" in doc["replay"]
    assert main(["difftest", spec, "--op", "max", "--schedule", "auto", "--mode", "order-free"]) == 2
    assert "--schedule auto and --order reveal and name sum orders" in capsys.readouterr().err
    assert main(["difftest", spec, "--op", "max", "--mode", "order-free", "--examples", "2"]) == 0
    assert "PASS" in capsys.readouterr().out
    options = Options(op="avg", modes=("exact",), examples=20)
    assert run_difftest(planted_impls.gloo_op_ring, options, schedule_order("gloo")).verdict == "pass"
    with pytest.raises(SystemExit):
        main(["difftest", spec, "--op", "mean"])


def tree_of_quotients(x: torch.Tensor, op: str) -> torch.Tensor:
    """Each contribution divided by N, then summed pairwise (not the ring's order)."""
    return _pairwise([x[i] / x.shape[0] for i in range(x.shape[0])], "sum")


def tree_of_premultiplied(x: torch.Tensor, op: str) -> torch.Tensor:
    """Each contribution times 1/N rounded, then summed pairwise."""
    reciprocal = torch.tensor(1.0 / x.shape[0], dtype=torch.float64).to(x.dtype)
    return _pairwise([x[i] * reciprocal for i in range(x.shape[0])], "sum")


def sum_times_reciprocal(x: torch.Tensor, op: str) -> torch.Tensor:
    """The ring's sum times 1/N rounded: divided last, but not correctly rounded; not divided first."""
    return ring_fold_op(x, "sum") * torch.tensor(1.0 / x.shape[0], dtype=torch.float64).to(x.dtype)


# N = 3: the pairwise tree adds workers 0 and 1 first, the ring's chunk 2 workers 2 and 0.
SCALED = (
    -3.7734375,
    2.685546875,
    -0.5380859375,
    2.09765625,
    -3.982421875,
    -0.43701171875,
    1.7724609375,
    -2.169921875,
    3.5625,
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
def test_contributions_scaled_first_in_any_order_are_named(dtype: torch.dtype) -> None:
    case = Case(3, 3, (), dtype, "contiguous", tuple(float(torch.tensor(v).to(dtype)) for v in SCALED), "avg")
    for fn, words in (
        (tree_of_quotients, "each divided by N first"),
        (tree_of_premultiplied, "1/N rounded first"),
    ):
        outcome = call_target(fn, case)
        x = case.tensor()
        assert not same_bits(fn(x, "avg"), ring_fold_op(x, "avg"))  # the case separates them
        found = diagnose(fn, outcome, "exact")
        assert found is not None and found.codes == ["avg-divided-first"], found
        assert words in found.explanation


def test_the_ring_of_premultiplied_contributions_is_named_bit_for_bit() -> None:
    # NCCL's average: x_i * fl(1/3) rounded, summed by the ring; float16 fl(1/3) = 0.333251953125.
    # On 1 and 5 dividing first gives 2.0, the average; premultiplying gives 1.9990234375.
    case = Case(3, 3, (), torch.float16, "contiguous", (1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 0.0, 0.0, 0.0), "avg")
    found = diagnose(planted_impls.premultiplies, call_target(planted_impls.premultiplies, case), "exact")
    assert found is not None and found.codes == ["avg-divided-first"], found
    assert "bit for bit the ring's sum of the contributions each multiplied by 1/N rounded first" in (
        found.explanation
    )
    assert "x_i * 0.333251953125 rounded" in found.explanation


@pytest.mark.clause("difftest-diagnoses", "op-avg")
def test_an_average_divided_last_by_a_rounded_reciprocal_is_named_not_taken_for_one_divided_first() -> None:
    # In bfloat16 the ring's sum times 1/3 rounded misses the sum divided once in this case's last element;
    # the two-worker probe names it (before avg-times-reciprocal existed it was out-of-bound, never
    # avg-divided-first).
    case = Case(
        3,
        3,
        (),
        torch.bfloat16,
        "contiguous",
        tuple(float(torch.tensor(v).bfloat16()) for v in SCALED),
        "avg",
    )
    found = diagnose(sum_times_reciprocal, call_target(sum_times_reciprocal, case), "exact")
    assert found is not None and found.codes == ["avg-times-reciprocal"], found
