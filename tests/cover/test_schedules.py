"""The ring schedule family (spec/schedules.md): sends, fold order, layouts, presets, invariants, bad input.

Expected values come from the spec's own code blocks, from ``tests/common/oracles.py``
(which imports nothing from ``ring_ref``) or are written out by hand here.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from ring_ref import Engine, ring_all_reduce, schedule
from ring_ref._chunks import chunk_bounds
from ring_ref.core import fold, provenance_state, run_ring, step
from ring_ref.invariants import InvariantViolation, check_round, expected_state
from ring_ref.schedule import (
    ALL_GATHER,
    COLLECTIVES,
    GLOO,
    LAYOUTS,
    OPENMPI_RING,
    PHASES,
    PRESETS,
    REDUCE_SCATTER,
    SPEC,
    ChainSchedule,
    Collective,
    Layout,
    RingSchedule,
    Send,
    all_rounds,
    send_chunk,
    sends,
)
from tests.common.oracles import (
    blocks_bounds,
    ceil_bounds,
    floor_bounds,
    gloo_bounds,
    same_bits,
    schedule_fold,
)
from tests.cover.test_spec_clauses import SPEC_PY

RINGS = [RingSchedule(d, k, "even") for d in (1, -1) for k in (-1, 0, 1, 2, 5)]


@pytest.mark.clause("schedule-family")
@pytest.mark.parametrize("n", range(1, 13))
def test_spec_preset_is_the_spec_functions(n: int) -> None:
    for i in range(n):
        assert SPEC.right(i, n) == schedule.right(i, n)
        assert SPEC.left(i, n) == schedule.left(i, n)
        assert SPEC.owned_chunk(i, n) == schedule.owned_chunk(i, n)
        for r in range(n - 1):
            assert SPEC.rs_send_chunk(i, r, n) == schedule.rs_send_chunk(i, r, n)
            assert SPEC.ag_send_chunk(i, r, n) == schedule.ag_send_chunk(i, r, n)
            assert SPEC.rs_recv_chunk(i, r, n) == schedule.rs_recv_chunk(i, r, n)
            assert SPEC.ag_recv_chunk(i, r, n) == schedule.ag_recv_chunk(i, r, n)
        for phase in (REDUCE_SCATTER, ALL_GATHER):
            for r in range(n - 1):
                assert SPEC.sends(phase, r, n) == schedule.sends(phase, r, n)


@pytest.mark.clause("schedule-family")
@pytest.mark.parametrize("n", range(1, 10))
def test_family_sends_match_spec_code(n: int) -> None:
    for ring in RINGS:
        d, k = ring.direction, ring.offset
        for i in range(n):
            assert ring.right(i, n) == (i + d) % n
            assert ring.owned_chunk(i, n) == SPEC_PY["family_owned_chunk"](i, n, d, k)
            for r in range(n - 1):
                assert ring.rs_send_chunk(i, r, n) == SPEC_PY["family_rs_send_chunk"](i, r, n, d, k)
                assert ring.ag_send_chunk(i, r, n) == SPEC_PY["family_ag_send_chunk"](i, r, n, d, k)


@pytest.mark.clause("schedule-presets", "schedule-fold-order")
def test_presets_are_the_named_rings() -> None:
    # the chain is not a ring; the libraries' rings came after it
    assert list(PRESETS) == [
        "spec",
        "openmpi-ring",
        "gloo",
        "chain",
        "mpich-ring",
        "intel-ring",
        "mlx-ring",
        "recursive-doubling",
    ]
    assert PRESETS["mlx-ring"] == RingSchedule(-1, 0, "ceil")
    assert PRESETS["mpich-ring"] == RingSchedule(1, 1, "ceil")
    assert PRESETS["intel-ring"] == RingSchedule(1, 0, "floor")
    # MPICH, N = 4 (allreduce_intra_ring.c): step i sends chunk rank - 1 - i; chunk c folds c+1, ..., c.
    assert [PRESETS["mpich-ring"].rs_send_chunk(i, 0, 4) for i in range(4)] == [3, 0, 1, 2]
    assert PRESETS["mpich-ring"].fold_order(0, 4) == (1, 2, 3, 0)
    assert PRESETS["chain"] == ChainSchedule("blocks")
    assert PRESETS["spec"] == RingSchedule(1, 0, "even")
    assert PRESETS["openmpi-ring"] == RingSchedule(1, 0, "blocks")
    assert PRESETS["gloo"] == RingSchedule(-1, -1, "gloo")
    # gloo, N = 4, written out: rank i sends to i - 1; chunk c folds c-1, c-2, c-3, c.
    assert [GLOO.right(i, 4) for i in range(4)] == [3, 0, 1, 2]
    assert [GLOO.fold_order(c, 4) for c in range(4)] == [
        (3, 2, 1, 0),
        (0, 3, 2, 1),
        (1, 0, 3, 2),
        (2, 1, 0, 3),
    ]
    assert [GLOO.owned_chunk(i, 4) for i in range(4)] == [0, 1, 2, 3]
    assert [OPENMPI_RING.fold_order(c, 3) for c in range(3)] == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]


@pytest.mark.clause("schedule-below-n")
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_a_named_library_ring_runs_what_the_library_runs_below_n_elements(engine: Engine) -> None:
    f32 = np.float32
    # N = 4, one element: OpenMPI's ring hands the call to recursive doubling, (x0 + x1) + (x2 + x3);
    # the ring (+1, 0, blocks) itself folds ((x0 + x1) + x2) + x3
    x = np.array([[1.0], [1e8], [-1e8], [1.0]], f32)
    doubling = (x[0, 0] + x[1, 0]) + (x[2, 0] + x[3, 0])
    ring = ((x[0, 0] + x[1, 0]) + x[2, 0]) + x[3, 0]
    assert (doubling, ring) == (f32(0.0), f32(1.0))
    for arrays in (x, torch.from_numpy(x)):
        assert float(ring_all_reduce(arrays, engine, schedule="openmpi-ring")[0]) == doubling
        assert float(ring_all_reduce(arrays, engine, schedule=OPENMPI_RING)[0]) == ring  # a value: the ring
    # N = 3, one element: MLX pads to N and runs its ring the other way, element 0 folding 0, 1, 2; its
    # ring (-1, 0, ceil) folds 0, 2, 1
    y = np.array([[1e8], [1.0], [-1e8]], f32)
    other_way, mlx = (y[0, 0] + y[1, 0]) + y[2, 0], (y[0, 0] + y[2, 0]) + y[1, 0]
    assert (other_way, mlx) == (f32(0.0), f32(1.0))
    for arrays in (y, torch.from_numpy(y)):
        assert float(ring_all_reduce(arrays, engine, schedule="mlx-ring")[0]) == other_way
        assert float(ring_all_reduce(arrays, engine, schedule=PRESETS["mlx-ring"])[0]) == mlx
    # from N elements on, the named preset is its ring: N = 3, M = 3, element 0 of mlx-ring folds 0, 2, 1
    z = np.array([[1e8, 0.0, 0.0], [1.0, 0.0, 0.0], [-1e8, 0.0, 0.0]], f32)
    assert float(ring_all_reduce(z, engine, schedule="mlx-ring")[0]) == mlx
    # every other preset is the same schedule at every size; an empty buffer keeps the ring (nothing to add)
    assert set(schedule.BELOW_N) == {"openmpi-ring", "mlx-ring"}
    assert schedule.preset_schedule("openmpi-ring", 4, 0) == OPENMPI_RING


@pytest.mark.clause("schedule-layouts")
def test_layouts_written_out_by_hand() -> None:
    assert chunk_bounds("even", 3, 6) == [(0, 2), (2, 4), (4, 6)]
    assert chunk_bounds("blocks", 3, 7) == [(0, 3), (3, 5), (5, 7)]
    assert chunk_bounds("blocks", 4, 2) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds("gloo", 2, 5, itemsize=4) == [(0, 4), (4, 5)]
    assert chunk_bounds("gloo", 4, 4, itemsize=2) == [(0, 2), (2, 4), (4, 4), (4, 4)]
    assert chunk_bounds("gloo", 3, 7, itemsize=8) == [(0, 4), (4, 7), (7, 7)]
    # Past gloo's 1 MiB segments: 3,000,001 float32 = 12 MB -> 12 segments of 250,001 elements,
    # 4 segments per rank; float64 -> 24 segments of 125,001, 8 per rank.
    assert chunk_bounds("gloo", 3, 3_000_001, itemsize=4)[0] == (0, 1_000_004)
    assert chunk_bounds("gloo", 3, 3_000_001, itemsize=8)[0] == (0, 1_000_008)
    # MPICH and MLX: ceil(S / N) until the buffer ends; Intel MPI: floor(S / N), the rest last.
    assert chunk_bounds("ceil", 4, 9) == [(0, 3), (3, 6), (6, 9), (9, 9)]
    assert chunk_bounds("ceil", 4, 2) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert chunk_bounds("ceil", 3, 7) == [(0, 3), (3, 6), (6, 7)]
    assert chunk_bounds("floor", 4, 9) == [(0, 2), (2, 4), (4, 6), (6, 9)]
    assert chunk_bounds("floor", 4, 2) == [(0, 0), (0, 0), (0, 0), (0, 2)]
    assert chunk_bounds("floor", 3, 7) == [(0, 2), (2, 4), (4, 7)]


@pytest.mark.clause("schedule-layouts")
@pytest.mark.parametrize("n", range(1, 9))
def test_layouts_match_spec_code_and_gloo_formula(n: int) -> None:
    for s in [*range(1, 3 * n + 3), 1_000_003, 2_621_447]:
        for itemsize in (2, 4, 8):
            cases: tuple[tuple[Layout, list[tuple[int, int]]], ...] = (
                ("blocks", blocks_bounds(n, s)),
                ("gloo", gloo_bounds(n, s, itemsize)),
                ("ceil", ceil_bounds(n, s)),
                ("floor", floor_bounds(n, s)),
            )
            for layout, oracle in cases:
                got = chunk_bounds(layout, n, s, itemsize=itemsize)
                assert got == oracle, (layout, n, s, itemsize)
                sizes = SPEC_PY["family_chunk_sizes"](layout, n, s, itemsize)
                assert [hi - lo for lo, hi in got] == sizes
        if s % n == 0:
            assert [hi - lo for lo, hi in chunk_bounds("even", n, s)] == SPEC_PY["family_chunk_sizes"](
                "even", n, s, 4
            )


def _bounds(ring: RingSchedule, n: int, s: int, itemsize: int) -> list[tuple[int, int]]:
    if ring.layout == "blocks":
        return blocks_bounds(n, s)
    if ring.layout == "gloo":
        return gloo_bounds(n, s, itemsize)
    if ring.layout == "ceil":
        return ceil_bounds(n, s)
    if ring.layout == "floor":
        return floor_bounds(n, s)
    return [(c * s // n, (c + 1) * s // n) for c in range(n)]


@pytest.mark.clause("schedule-fold-order", "schedule-layouts", "schedule-presets")
@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_ring_is_its_fold_bit_for_bit(engine: Engine, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    rings = [
        *(ring for ring in PRESETS.values() if isinstance(ring, RingSchedule)),
        *(RingSchedule(d, k, lay) for d in (1, -1) for k in (0, 2, -3) for lay in LAYOUTS),
    ]
    for n in (1, 2, 3, 5, 8):
        for m, trailing in ((n, ()), (2 * n, (3,)), (2 * n + 1, ()), (3, (2, 2))):
            x = (torch.randn(n, m, *trailing, generator=gen, dtype=torch.float64) * 1e3).to(dtype)
            for ring in rings:
                if ring.layout == "even" and m % n:
                    continue
                want = schedule_fold(
                    x, ring.direction, ring.offset, _bounds(ring, n, x[0].numel(), x.element_size())
                )
                got = ring_all_reduce(x, engine, schedule=ring)
                assert same_bits(got, want), (ring, n, m, trailing)
                if dtype != torch.bfloat16 and engine == "reference":
                    array = ring_all_reduce(x.numpy(), schedule=ring)
                    assert array.dtype == x.numpy().dtype
                    assert same_bits(torch.from_numpy(array), want), (ring, n, m)
    named = ring_all_reduce(x, engine, schedule="gloo")
    assert same_bits(named, ring_all_reduce(x, engine, schedule=GLOO))


@pytest.mark.clause("schedule-fold-order")
def test_schedules_keep_the_input_gradients_and_storage() -> None:
    base = torch.randn(3, 10, dtype=torch.float64)
    x = base.t().contiguous().t()[:, :7].requires_grad_()  # non-contiguous rows
    before = x.detach().clone()
    got = ring_all_reduce(x, schedule="gloo")
    got.sum().backward()  # type: ignore[no-untyped-call]
    assert x.grad is not None and torch.equal(x.grad, torch.ones_like(x))
    assert torch.equal(x.detach(), before)
    assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    one = torch.randn(1, 5)
    alone = ring_all_reduce(one, schedule="openmpi-ring")
    assert (
        torch.equal(alone, one[0]) and alone.untyped_storage().data_ptr() != one.untyped_storage().data_ptr()
    )


@pytest.mark.clause("schedule-fold-order", "schedule-invariants")
@pytest.mark.parametrize("n", range(1, 9))
def test_final_provenance_is_the_fold_order(n: int) -> None:
    for ring in RINGS:
        final = run_ring(provenance_state(n), fold, schedule=ring)
        for i in range(n):
            assert final[i] == tuple(
                SPEC_PY["family_fold_order"](c, n, ring.direction, ring.offset) for c in range(n)
            )


@pytest.mark.clause("schedule-invariants")
@pytest.mark.parametrize("n", range(1, 10))
def test_closed_forms_match_spec_code(n: int) -> None:
    for ring in RINGS:
        d, k = ring.direction, ring.offset
        for r in range(-1, n - 1):
            want = tuple(
                tuple(SPEC_PY["family_rs_slot"](n, r, i, c, d, k) for c in range(n)) for i in range(n)
            )
            assert expected_state(REDUCE_SCATTER, r, n, schedule=ring) == want
        for r in range(n - 1):
            want = tuple(
                tuple(SPEC_PY["family_ag_slot"](n, r, i, c, d, k) for c in range(n)) for i in range(n)
            )
            assert expected_state(ALL_GATHER, r, n, schedule=ring) == want


@pytest.mark.clause("schedule-invariants")
@pytest.mark.parametrize("n", range(2, 9))
def test_each_round_changes_exactly_the_received_slot(n: int) -> None:
    for ring in RINGS:
        state = provenance_state(n)
        for phase, r in all_rounds(n):
            after = step(state, phase, r, fold, schedule=ring)
            for i in range(n):
                changed = [c for c in range(n) if after[i][c] != state[i][c]]
                assert changed == [ring.recv_chunk(phase, i, r, n)]
            state = after


@pytest.mark.clause("schedule-invariants")
def test_a_wrong_schedule_is_caught_by_the_invariants() -> None:
    """Rounds run with one ring and checked against another: the closed forms refuse the first round."""
    n = 4
    before = provenance_state(n)
    after = step(before, REDUCE_SCATTER, 0, fold, schedule=SPEC)
    with pytest.raises(InvariantViolation, match=r"the schedule \(direction -1, offset -1, layout gloo\)"):
        check_round(before, after, REDUCE_SCATTER, 0, schedule=GLOO)
    check_round(
        before, step(before, REDUCE_SCATTER, 0, fold, schedule=GLOO), REDUCE_SCATTER, 0, schedule=GLOO
    )


@pytest.mark.clause("schedule-bad-input")
@pytest.mark.parametrize(
    ("bad", "kind", "words"),
    [
        ("ring", ValueError, "unknown schedule 'ring'"),
        ("GLOO", ValueError, "unknown schedule 'GLOO'"),
        ((1, 0, "even"), TypeError, "schedule must be a preset name or a RingSchedule"),
        (None, TypeError, "schedule must be a preset name or a RingSchedule"),
        (RingSchedule(2, 0, "even"), ValueError, "schedule direction must be +1"),
        (RingSchedule(0, 0, "even"), ValueError, "schedule direction must be +1"),
        (RingSchedule(True, 0, "even"), ValueError, "schedule direction must be +1"),
        (RingSchedule(1, 0.5, "even"), TypeError, "schedule offset must be an int"),  # type: ignore[arg-type]
        (RingSchedule(1, 0, "rows"), ValueError, "unknown schedule layout 'rows'"),  # type: ignore[arg-type]
    ],
)
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_bad_schedules_are_refused_by_name(
    bad: object, kind: type[Exception], words: str, engine: Engine
) -> None:
    x = torch.randn(2, 4)
    before = x.clone()
    with pytest.raises(kind, match=re.escape(words)):
        ring_all_reduce(x, engine, schedule=bad)  # type: ignore[call-overload]
    with pytest.raises(kind, match=re.escape(words)):
        ring_all_reduce(x.numpy(), engine, schedule=bad)  # type: ignore[call-overload]
    assert torch.equal(x, before)


@pytest.mark.clause("schedule-bad-input", "schedule-layouts")
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_any_m_is_accepted_by_blocks_and_gloo_only(engine: Engine) -> None:
    x = torch.arange(15.0).reshape(3, 5)
    column_sums = [15.0, 18.0, 21.0, 24.0, 27.0]
    for name in ("openmpi-ring", "gloo", "mpich-ring", "intel-ring"):
        assert ring_all_reduce(x, engine, schedule=name).tolist() == column_sums
        assert ring_all_reduce(np.asarray(x), engine, schedule=name).tolist() == column_sums
    for ring in ("spec", RingSchedule(-1, 1, "even")):
        with pytest.raises(ValueError, match=re.escape("M = 5 is not divisible by N = 3")):
            ring_all_reduce(x, engine, schedule=ring)


@pytest.mark.clause("schedule-family", "schedule-layouts", "traffic")
def test_traces_cover_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import jsonschema  # type: ignore[import-untyped]

    from ring_ref._cli import main
    from ring_ref._trace import trace, trace_json
    from tests.common.paths import ROOT

    schema = json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8"))
    doc = trace_json(trace(3, GLOO), 4, GLOO)
    jsonschema.validate(doc, schema)
    assert doc["schedule"] == {"direction": -1, "offset": 2, "layout": "gloo"}
    # gloo cuts 4 elements over 3 ranks into 6 segments of 1, two per rank: chunks of 2, 2, 0.
    assert doc["chunkSizes"] == [2, 2, 0]
    first = doc["rounds"][1]["sends"]
    assert [(s["src"], s["dst"], s["chunk"], s["elements"]) for s in first] == [
        (0, 2, 1, 2),
        (1, 0, 2, 0),
        (2, 1, 0, 2),
    ]
    # Worker 0 sends chunks 1, 2 (reduce-scatter) and 0, 1 (all-gather): 2 + 0 + 2 + 2 elements, and so on.
    assert doc["traffic"]["elementsSentByWorker"] == [6, 4, 6]
    last = doc["rounds"][-1]["workers"][0]["slots"]
    assert [s["contributions"] for s in last] == [[2, 1, 0], [0, 2, 1], [1, 0, 2]]
    assert "schedule" not in trace_json(trace(3), 3) and "chunkSizes" not in trace_json(trace(3), 3)
    assert main(["trace", "-n", "4", "--schedule=-1,1,even"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ring: direction -1, offset 1, layout even")
    assert "reduce-scatter round 0 (receiver adds into the slot): 0->3 chunk 3, 1->0 chunk 0" in out
    assert main(["trace", "-n", "3", "-m", "4"]) == 2
    assert "M = 4 is not divisible by N = 3" in capsys.readouterr().err
    assert main(["trace", "-n", "3", "--schedule", "ring"]) == 2
    assert "unknown schedule 'ring'" in capsys.readouterr().err


@pytest.mark.clause("dist-reduce-scatter")
def test_reduce_scatter_ring_takes_k_equal_d_and_leaves_chunk_r_at_rank_r() -> None:
    """Presets keep their direction and layout with ``k = d`` (typed in from RS_CONVENTION); a
    ``RingSchedule`` with ``k ≡ d`` passes as it is, another is refused naming the ring to pass."""
    from ring_ref.schedule import reduce_scatter_ring

    assert reduce_scatter_ring(None, 4) == RingSchedule(1, 1, "even")
    assert reduce_scatter_ring("spec", 4) == RingSchedule(1, 1, "even")
    assert reduce_scatter_ring("openmpi-ring", 4) == RingSchedule(1, 1, "blocks")
    assert reduce_scatter_ring("gloo", 4) == RingSchedule(-1, -1, "gloo")
    assert reduce_scatter_ring(RingSchedule(-1, 3, "even"), 4) == RingSchedule(-1, 3, "even")
    assert reduce_scatter_ring(RingSchedule(1, 0, "even"), 1) == RingSchedule(1, 0, "even")
    with pytest.raises(ValueError, match=re.escape("Use RingSchedule(-1, -1, 'blocks') or a preset name")):
        reduce_scatter_ring(RingSchedule(-1, 0, "blocks"), 3)
    for name in (None, "spec", "openmpi-ring", "gloo"):
        for n in range(1, 7):
            ring = reduce_scatter_ring(name, n)
            # schedule-family's owned chunk, i - k - (N - 1) d, typed in from the spec
            assert [(i - ring.offset - (n - 1) * ring.direction) % n for i in range(n)] == list(range(n))


# ==========================================================================================================
# The schedule's round listing (``sends``) and each chunk's fold start, against the spec's formulas.
# ==========================================================================================================


SPEC_SEND = {REDUCE_SCATTER: lambda i, r, n: (i - r) % n, ALL_GATHER: lambda i, r, n: (i + 1 - r) % n}


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology")
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_every_send_of_every_round_of_both_phases_is_the_spec_formula(n: int) -> None:
    for phase in PHASES:
        for r in range(n - 1):
            want = tuple(Send(phase, r, i, (i + 1) % n, SPEC_SEND[phase](i, r, n)) for i in range(n))
            assert sends(phase, r, n) == want
            assert [send_chunk(phase, i, r, n) for i in range(n)] == [s.chunk for s in want]


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology")
@pytest.mark.clause("schedule-family", "schedule-fold-order")
@pytest.mark.parametrize(
    "ring",
    [
        *(ring for ring in PRESETS.values() if isinstance(ring, RingSchedule)),
        RingSchedule(1, 3, "even"),
        RingSchedule(-1, 2, "blocks"),
    ],
)
def test_each_chunks_fold_starts_at_worker_c_plus_k(ring: RingSchedule) -> None:
    for n in range(1, 8):
        for c in range(n):
            assert ring.fold_start(c, n) == (c + ring.offset) % n == ring.fold_order(c, n)[0]


@pytest.mark.clause("rsc-shape")
def test_each_collective_is_one_value_that_answers_for_itself() -> None:
    """A name reads into its value (a value stays itself; another name is refused), the value prints and
    writes to JSON as its name, and it answers every question the modules above ask of it."""
    ar, rs, ag = (Collective(name) for name in COLLECTIVES)
    assert (ar, rs, ag) == (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER)
    assert Collective(rs) is rs and f"{rs}" == "reduce-scatter" and json.dumps([ag]) == '["all-gather"]'
    assert [c.phases for c in (ar, rs, ag)] == [PHASES, (REDUCE_SCATTER,), (ALL_GATHER,)]
    assert [(c.alone, c.scatters, c.gathers, c.reduces) for c in (ar, rs, ag)] == [
        (False, False, False, True),
        (True, True, False, True),
        (True, False, True, False),
    ]
    assert [c.option for c in (ar, rs, ag)] == [
        "",
        " --collective reduce-scatter",
        " --collective all-gather",
    ]
    # (N, M, ...) = (4, 8, 3): all-reduce keeps (M, ...), reduce-scatter M / N rows, all-gather N * S rows
    assert [c.result_shape(4, 8, (3,)) for c in (ar, rs, ag)] == [(8, 3), (4, 2, 3), (32, 3)]
    assert [c.result_shape(4, 8, (), 1) for c in (ar, rs, ag)] == [(8,), (2,), (32,)]
    with pytest.raises(ValueError, match="broadcast"):
        Collective("broadcast")
