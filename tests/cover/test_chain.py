"""The chain (spec/schedules.md): a pipelined chain reduce and broadcast whose every element is the left fold.

Oracles are written here, independent of ``ring_ref``: the left fold over workers
``((x_0 ∘ x_1) ∘ x_2) ∘ ...`` per op, the chain's sends typed in by hand for
``N = 3``, and its provenance closed forms typed in from the spec.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ring_ref import ring_all_reduce
from ring_ref._dispatch import Engine
from ring_ref._fast import chain_fold_order
from ring_ref._reveal import reveal
from ring_ref._trace import trace, trace_json
from ring_ref._validate import schedule_of
from ring_ref.core import fold, provenance_state, run_ring
from ring_ref.difftest import difftest
from ring_ref.difftest._inputs import LAYOUTS, lay_out
from ring_ref.difftest._orders import _fit_of, schedule_order
from ring_ref.invariants import InvariantViolation, expected_finished, expected_state
from ring_ref.schedule import ALL_GATHER, CHAIN, PRESETS, REDUCE_SCATTER, ChainSchedule, Phase, Send
from tests.common.oracles import left_fold, same_bits
from tests.common.reveal_targets import linear_fold
from tests.common.strategies import ALL_DTYPES, NUMPY_DTYPES, finite_values

ROOT = Path(__file__).resolve().parents[2]
OPS = ("sum", "prod", "max", "min", "avg")


@st.composite
def chain_inputs(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...], op: str) -> torch.Tensor:
    """Any ``N`` in 1..8 and any ``M`` in 1..24 (no divisibility), trailing ``()`` or ``(2,)``, in a
    contiguous, transposed, strided or sliced tensor."""
    n = draw(st.integers(1, 8))
    m = draw(st.integers(1, 24))
    trailing = draw(st.sampled_from([(), (2,)]))
    dtype = draw(st.sampled_from(dtypes))
    numel = n * m * math.prod(trailing)
    values = finite_values(dtype) if op in ("sum", "max", "min") else st.floats(-8.0, 8.0)
    elements = draw(st.lists(values, min_size=numel, max_size=numel))
    dense = torch.tensor(elements, dtype=torch.float64).to(dtype).reshape(n, m, *trailing)
    dense = torch.where(torch.isfinite(dense), dense, torch.zeros((), dtype=dtype))
    return lay_out(dense, draw(st.sampled_from(LAYOUTS)))


@pytest.mark.clause("chain-order")
@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("op", OPS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_chain_is_the_left_fold_for_every_m(kind: str, engine: Engine, op: str, data: st.DataObject) -> None:
    """torch (every dtype) and numpy (no bfloat16) inputs, any N and M, every memory layout."""
    x = data.draw(chain_inputs(ALL_DTYPES if kind == "torch" else NUMPY_DTYPES, op))
    if kind == "torch":
        got = ring_all_reduce(x, engine, schedule="chain", op=op)
    else:
        array = ring_all_reduce(x.numpy(), engine, schedule=CHAIN, op=op)
        assert isinstance(array, np.ndarray) and array.dtype == x.numpy().dtype
        got = torch.from_numpy(array)
    assert same_bits(got, left_fold(x, op)), (x.shape, x.dtype)


@pytest.mark.clause("chain-order")
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_chain_element_keeps_its_bits_at_every_size_and_offset(engine: Engine) -> None:
    """The same 5 columns embedded at every offset of buffers of every size give the same bits."""
    gen = torch.Generator().manual_seed(7)
    n = 5
    probe = torch.randn(n, 5, generator=gen, dtype=torch.float64).mul(1e6).to(torch.float32)
    probe[:, 0] = torch.tensor([1.0, 2.0**-24, 2.0**-24, -1.0, 2.0**-25])
    want = left_fold(probe, "sum")
    for m in (5, 6, 9, 17, 64, 101):
        for offset in range(m - 5 + 1):
            x = torch.randn(n, m, generator=gen)
            x[:, offset : offset + 5] = probe
            got = ring_all_reduce(x, engine, schedule="chain")
            assert same_bits(got[offset : offset + 5], want), (m, offset)


@pytest.mark.clause("chain-order")
def test_chain_differs_from_every_ring_preset_somewhere() -> None:
    """Not a relabelled ring: on this input the chain's bits differ from every ring preset's."""
    x = torch.tensor([[1.0] * 8, [2.0**-24] * 8, [2.0**-24] * 8, [-1.0] * 8], dtype=torch.float32)
    chain = ring_all_reduce(x, schedule="chain")
    assert same_bits(chain, left_fold(x, "sum"))
    for name, ring in PRESETS.items():
        if ring is not CHAIN:
            assert not same_bits(ring_all_reduce(x, schedule=name), chain), name


# --- the schedule -------------------------------------------------------------------------------

R: Phase = REDUCE_SCATTER
A: Phase = ALL_GATHER
# N = 3, typed in from the spec's chain-steps: reduce 0 -> 1 -> 2, broadcast 2 -> 0 -> 1.
HAND_SENDS: dict[tuple[Phase, int], tuple[tuple[int, int, int], ...]] = {
    (R, 0): ((0, 1, 0),),
    (R, 1): ((0, 1, 1), (1, 2, 0)),
    (R, 2): ((0, 1, 2), (1, 2, 1)),
    (R, 3): ((1, 2, 2),),
    (A, 0): ((2, 0, 0),),
    (A, 1): ((0, 1, 0), (2, 0, 1)),
    (A, 2): ((0, 1, 1), (2, 0, 2)),
    (A, 3): ((0, 1, 2),),
}


@pytest.mark.clause("chain-steps")
def test_chain_sends_for_three_workers_are_the_hand_typed_ones() -> None:
    assert CHAIN.all_rounds(3) == tuple(HAND_SENDS)
    for (phase, t), hand in HAND_SENDS.items():
        assert CHAIN.sends(phase, t, 3) == tuple(Send(phase, t, src, dst, s) for src, dst, s in hand)
        for i in range(3):
            got = CHAIN.recv_segment(phase, i, t, 3)
            want = next((s for _, dst, s in hand if dst == i), None)
            assert got == want, (phase, t, i)


@pytest.mark.clause("chain-steps", "chain-traffic")
@pytest.mark.parametrize("n", range(1, 10))
def test_every_segment_crosses_each_chain_link_once_per_phase(n: int) -> None:
    assert CHAIN.steps_per_phase(n) == 2 * n - 2
    reduce_links = {(i, i + 1) for i in range(n - 1)}
    broadcast_links = {(n - 1, 0)} | {(i, i + 1) for i in range(n - 2)} if n > 1 else set()
    for phase, links in ((R, reduce_links), (A, broadcast_links)):
        crossings = [
            (s.src, s.dst, s.chunk) for t in range(CHAIN.steps_per_phase(n)) for s in CHAIN.sends(phase, t, n)
        ]
        assert sorted(crossings) == sorted((a, b, c) for a, b in links for c in range(n)), phase


def spec_chain_slot(phase: Phase, t: int, n: int, i: int, c: int) -> tuple[int, ...]:
    """chain-invariants, typed in from the spec."""
    if phase == R:
        arrived = i == 0 or c + i - 1 <= t
        return tuple(range(i + 1)) if arrived else (i,)
    p = (i + 1) % n
    return tuple(range(n)) if p == 0 or c + p - 1 <= t else tuple(range(i + 1))


@pytest.mark.clause("chain-invariants")
@pytest.mark.parametrize("n", range(1, 8))
def test_chain_closed_forms_are_the_spec_ones(n: int) -> None:
    for phase, t in ((R, -1), *CHAIN.all_rounds(n)):
        want = tuple(tuple(spec_chain_slot(phase, t, n, i, c) for c in range(n)) for i in range(n))
        assert expected_state(phase, t, n, schedule=CHAIN) == want, (phase, t)
        finished = tuple(frozenset(c for c in range(n) if len(want[i][c]) == n) for i in range(n))
        assert expected_finished(phase, t, n, schedule=CHAIN) == finished, (phase, t)


@pytest.mark.clause("chain-invariants")
@pytest.mark.parametrize("n", range(1, 8))
def test_the_core_runs_the_chain_through_its_closed_forms(n: int) -> None:
    seen: list[tuple[Phase, int]] = []

    def observe(phase: Phase, t: int, _state: object, provenance: object) -> None:
        assert provenance == tuple(
            tuple(spec_chain_slot(phase, t, n, i, c) for c in range(n)) for i in range(n)
        )
        seen.append((phase, t))

    final = run_ring(provenance_state(n), fold, observe, schedule=CHAIN)
    assert final == tuple((tuple(range(n)),) * n for _ in range(n))
    assert len(seen) == 4 * (n - 1)


class _SkipsAWorker(ChainSchedule):
    """A broken chain: worker 1 forwards what it receives without adding (it sends to worker 2 directly)."""

    def send_segment(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        if phase == R and i == 0:
            return None
        return super().send_segment(phase, i, t, n)


class _BroadcastsEarly(ChainSchedule):
    """A broken chain: the broadcast starts one step early, before the last worker has the segment."""

    def send_segment(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        return super().send_segment(phase, i, t + 1 if phase == A else t, n)


class _BroadcastsNothing(ChainSchedule):
    """A broken chain: the reduce is right, the broadcast sends nothing."""

    def send_segment(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        return None if phase == A else super().send_segment(phase, i, t, n)


@pytest.mark.clause("chain-invariants")
@pytest.mark.parametrize(
    ("broken", "words"),
    [
        # the last worker of the fold (3) holds every complete segment; worker 0 holds none
        (_BroadcastsNothing(), r"after the chain broadcast worker 0 lacks segments \[0, 1, 2, 3\]"),
        (_BroadcastsEarly(), r"chain broadcast step 0: worker \d forwards incomplete segment \d"),
    ],
    ids=["nothing", "early"],
)
def test_the_fast_plans_broadcast_check_names_what_a_broken_chain_did(
    broken: ChainSchedule, words: str
) -> None:
    chain_fold_order.cache_clear()
    with pytest.raises(InvariantViolation, match=f"^{words}$"):
        chain_fold_order(4, broken)


@pytest.mark.clause("chain-invariants")
@pytest.mark.parametrize("broken", [_SkipsAWorker(), _BroadcastsEarly()], ids=["skips", "early"])
def test_a_broken_chain_is_caught_by_both_engines(broken: ChainSchedule) -> None:
    n = 4
    with pytest.raises(InvariantViolation):
        run_ring(provenance_state(n), fold, schedule=broken)
    chain_fold_order.cache_clear()
    with pytest.raises(InvariantViolation):
        chain_fold_order(n, broken)


@pytest.mark.clause("chain-bad-input")
def test_bad_chain_layouts_and_names_are_refused() -> None:
    with pytest.raises(
        ValueError, match="unknown chain layout 'diagonal'; choose one of even, blocks, gloo, ceil, floor"
    ):
        schedule_of(ChainSchedule("diagonal"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown schedule 'chains'.*'chain'"):
        ring_all_reduce(torch.zeros(2, 2), schedule="chains")
    x = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="divisible"):
        ring_all_reduce(x, schedule=ChainSchedule("even"))
    assert ring_all_reduce(torch.ones(3, 4), schedule=ChainSchedule("gloo")).tolist() == [3.0] * 4


@pytest.mark.clause("chain-trace", "chain-traffic")
def test_chain_trace_json_names_the_chain_and_its_steps() -> None:
    n, m = 4, 7
    doc = trace_json(trace(n, CHAIN), m, CHAIN)
    jsonschema.validate(doc, json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8")))
    assert doc["schedule"] == {"kind": "chain", "layout": "blocks"}
    assert doc["chunkSizes"] == [2, 2, 2, 1]
    assert doc["traffic"]["roundsPerPhase"] == 2 * n - 2
    # workers 0 .. n - 3 send every segment once in each phase; n - 2 only in the reduce, n - 1 only
    # in the broadcast.
    assert doc["traffic"]["elementsSentByWorker"] == [2 * m, 2 * m, m, m]


# --- reveal and difftest ------------------------------------------------------------------------


def _openmpi_ring_target(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x, "fast", schedule="openmpi-ring")


@pytest.mark.clause("chain-tools")
def test_reveal_names_the_chain_and_difftest_checks_against_it() -> None:
    revealed = reveal(linear_fold, 4, 9)
    assert revealed.matches == ["chain"] and revealed.ring is None
    assert reveal(_openmpi_ring_target, 4, 9).matches == ["openmpi-ring"]
    kwargs: dict[str, object] = {"modes": ("exact",), "examples": 15, "seed": 3, "max_workers": 5}
    passed = difftest(linear_fold, isolate=False, schedule="chain", **kwargs)  # type: ignore[arg-type]
    failed = difftest(_openmpi_ring_target, isolate=False, schedule="chain", **kwargs)  # type: ignore[arg-type]
    assert passed.verdict == "pass", passed.render()
    assert failed.verdict == "fail" and failed.diagnoses == ["not-ring-order"], failed.render()
    assert schedule_order("chain").option == "--schedule chain"


@pytest.mark.clause("chain-tools")
def test_schedule_auto_takes_a_matched_chain_even_where_no_ring_fits() -> None:
    doc = {"ring": None, "matches": ["chain"]}
    for even_only in (True, False):
        fitted = _fit_of(doc, 4, even_only=even_only)
        assert fitted is not None and fitted.ring == CHAIN and fitted.option == "--schedule chain"
    assert _fit_of({"ring": None, "matches": []}, 4) is None


@pytest.mark.clause("chain-order", "input-finite")
@pytest.mark.parametrize(
    ("op", "tail", "want"),
    [
        ("sum", [3.0e38, 3.0e38, 3.0e38], float("inf")),  # overflows
        ("prod", [3.0e38, 3.0e38, 0.0], float("nan")),  # overflows, then infinity times zero
        ("prod", [1.0e-30, 1.0e-30, 1.0], 0.0),  # underflows to zero
    ],
)
def test_the_fast_chains_tail_rounds_silently_whatever_numpys_error_settings(
    op: str, tail: list[float], want: float
) -> None:
    """``N = 3``, ``M = 4``: the kernel folds the first 3 elements, numpy the 4th; a user's ``np.seterr``
    (here: raise on everything) must not turn its rounding into a ``FloatingPointError``."""
    x = np.ones((3, 4), dtype=np.float32)
    x[:, 3] = tail
    with np.errstate(all="raise"):
        got = ring_all_reduce(x, engine="fast", op=op, schedule="chain")
    head = 3.0 if op == "sum" else 1.0  # three ones added, or multiplied
    assert got[:3].tolist() == [head] * 3
    assert (np.isnan(got[3]) and np.isnan(want)) or got[3] == want
