"""The compiled kernel (``ring_ref._fast._kernel``) on small inputs: bits, finiteness, tiles, threads, cache.

Quick per call (``make mutation``'s tests for the kernel): every result is
compared with a fold written here from the kernel's contract (chunk ``c``
entering the cycle at ``p`` folds the workers ``cycle[p], ..., cycle[p - 1]``,
one combine of the dtype per worker), never with the kernel's own output.
Every test starts with an empty table of kernels and a new LLVM engine, so a
kernel is loaded from the disk cache or compiled from its (possibly mutated)
IR in the test itself.
"""

from __future__ import annotations

import itertools
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llvmlite
import numpy as np
import numpy.typing as npt
import pytest

from ring_ref._fast import _kernel

pytestmark = pytest.mark.clause("fold-order")

OPS = ("sum", "prod", "max", "min")
DTYPES = (np.float32, np.float64)
Array = npt.NDArray[Any]


@pytest.fixture(autouse=True)
def _fresh_kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No kernel, engine or program left from an earlier test (or an earlier, unmutated run): each test
    loads its kernels from the disk cache or compiles them, and computes its programs and tile shapes."""
    forget_kernels(monkeypatch)
    _kernel._program.cache_clear()
    _kernel._split.cache_clear()
    yield
    _kernel._program.cache_clear()
    _kernel._split.cache_clear()


def forget_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a new process would start: no kernel loaded, a new LLVM engine."""
    monkeypatch.setattr(_kernel, "_kernels", {})
    monkeypatch.setattr(_kernel, "_machine", None)


def combine(op: str, partial: Array, own: Array) -> Array:
    """The spec's combine of a partial result with a worker's own values, in their dtype."""
    if op == "sum":
        return partial + own
    if op == "prod":
        return partial * own
    keep = own > partial if op == "max" else own < partial
    return np.where(keep, own, partial)


def expected(x: Array, cycle: Array, entries: Array, k: int, op: str) -> Array:
    """Chunk by chunk, the fold of its workers from its entry position around the cycle."""
    n = len(cycle)
    out = np.empty(n * k, dtype=x.dtype)
    for start, stop, p in entries.tolist():
        for j, c in enumerate(range(start, stop)):
            workers = [int(cycle[(p + j + s) % n]) for s in range(n)]
            acc = x[workers[0], c * k : (c + 1) * k].copy()
            for w in workers[1:]:
                acc = combine(op, acc, x[w, c * k : (c + 1) * k])
            out[c * k : (c + 1) * k] = acc
    return out


def same_bits(a: Array, b: Array) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def values(rng: np.random.Generator, n: int, m: int, dtype: Any, op: str) -> Array:
    """Values whose result depends on the order of the combines (ties of signed zeros for max/min)."""
    if op == "sum":
        x = rng.standard_normal((n, m)) * 2.0 ** rng.integers(-20, 20, (n, m))
    elif op == "prod":
        x = 1 + rng.standard_normal((n, m)) / 7
    else:
        x = rng.choice([-0.0, 0.0, 1.0, -1.0, 0.5], (n, m)) * rng.integers(1, 3, (n, m))
    return x.astype(dtype)


def random_entries(rng: np.random.Generator, n: int) -> Array:
    """Chunks cut into runs, each entering the cycle at a position of its own (``p + len - 1 < n``)."""
    cuts = sorted({0, n, *rng.integers(1, n, rng.integers(0, 3)).tolist()}) if n > 1 else [0, 1]
    rows = []
    for lo, hi in itertools.pairwise(cuts):
        rows.append((lo, hi, int(rng.integers(0, n - (hi - lo) + 1))))
    return np.array(rows, dtype=np.int64)


def layout(x: Array, kind: str) -> Array:
    """The same values as ``x`` (``(N, N K)``), laid out in memory as ``kind`` says."""
    if kind == "contiguous":
        return x
    if kind == "row-slices":  # unit element stride, rows further apart than their length
        wide = np.zeros((x.shape[0], x.shape[1] + 3), dtype=x.dtype)
        wide[:, 1 : 1 + x.shape[1]] = x
        return wide[:, 1 : 1 + x.shape[1]]
    if kind == "transposed":  # element stride N
        return np.ascontiguousarray(x.T).T
    if kind == "reversed":  # negative strides on both axes
        return np.ascontiguousarray(x[::-1, ::-1])[::-1, ::-1]
    if kind == "every-other":  # element stride 2
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), dtype=x.dtype)
        wide[:, ::2] = x
        return wide[:, ::2]
    raise AssertionError(kind)


def run(x: Array, cycle: Array, entries: Array, k: int, op: str, *, threads: int = 1) -> tuple[Array, bool]:
    out = np.full(x.shape[1], 7.0, dtype=x.dtype)  # not the identity: every result must be written
    finite = _kernel.fold_chunks(x, out, cycle, entries, chunk_size=k, threads=threads, op=op)
    return out, finite


@pytest.mark.clause("op-prod", "op-max", "op-min")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["contiguous", "row-slices", "transposed", "reversed", "every-other"])
def test_every_op_dtype_and_layout_folds_each_chunk_in_its_order(op: str, dtype: Any, kind: str) -> None:
    rng = np.random.default_rng(7)
    for n, k in [(2, 1), (3, 2), (5, 3), (6, 9)]:
        cycle = rng.permutation(n)
        entries = random_entries(rng, n)
        x = values(rng, n, n * k, dtype, op)
        got, finite = run(layout(x, kind), cycle, entries, k, op)
        assert finite
        assert same_bits(got, expected(x, cycle, entries, k, op)), (n, k)


@pytest.mark.clause("op-prod", "op-max", "op-min")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [1, 4, 8, 24, 40, 64, 200])
def test_tiles_of_any_size_give_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, op: str, dtype: Any, budget: int
) -> None:
    """Tiny tile budgets: column tiles of one chunk (fused rows, fresh starts), blocks of a few chunks,
    blocks whose last one is short, single rows left over after the fused ones."""
    monkeypatch.setattr(_kernel, "TILE_BYTES", budget)
    rng = np.random.default_rng(budget)
    for n, k in [(1, 5), (2, 3), (4, 5), (5, 2), (7, 6), (9, 1)]:
        cycle = rng.permutation(n)
        entries = random_entries(rng, n)
        x = values(rng, n, n * k, dtype, op)
        got, finite = run(layout(x, "transposed" if n % 2 else "contiguous"), cycle, entries, k, op)
        assert finite
        assert same_bits(got, expected(x, cycle, entries, k, op)), (n, k)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_tiles_shared_among_threads_give_the_same_bits_and_finiteness(
    monkeypatch: pytest.MonkeyPatch, op: str, threads: int
) -> None:
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(_kernel, "TILE_BYTES", 16)
    rng = np.random.default_rng(threads)
    n, k = 5, 4
    cycle = rng.permutation(n)
    entries = random_entries(rng, n)
    x = values(rng, n, n * k, np.float64, op)
    got, finite = run(x, cycle, entries, k, op, threads=threads)
    assert finite and same_bits(got, expected(x, cycle, entries, k, op))
    for column in (0, n * k // 2, n * k - 1):  # in the first thread's tiles, a middle one's, the last's
        bad = x.copy()
        bad[3, column] = np.nan
        assert not run(bad, cycle, entries, k, op, threads=threads)[1], column


def record_tile_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """While ``monkeypatch`` is active, each call of a compiled kernel appends its last two
    arguments (the tile it folds) to the returned list."""
    calls: list[tuple[int, int]] = []
    real = _kernel.kernel

    def recording(*args: Any) -> Any:
        compiled = real(*args)

        def call(*a: Any) -> int:
            calls.append((a[-2], a[-1]))
            return compiled.call(*a)

        return compiled._replace(call=call)

    monkeypatch.setattr(_kernel, "kernel", recording)
    return calls


def test_each_tile_is_folded_once_by_one_of_at_most_threads_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(_kernel, "TILE_BYTES", 16)
    calls = record_tile_calls(monkeypatch)
    x = values(np.random.default_rng(0), 5, 20, np.float64, "sum")
    for threads in (1, 2, 3, 4):
        calls.clear()
        got, finite = run(x, np.arange(5), np.array([[0, 5, 0]]), 4, "sum", threads=threads)
        assert finite and same_bits(got, expected(x, np.arange(5), np.array([[0, 5, 0]]), 4, "sum"))
        tiles = sorted(t for t0, t1 in calls for t in range(t0, t1))
        assert tiles == list(range(len(tiles))) and len(set(tiles)) == len(tiles)
        assert len(tiles) >= 5 and len(calls) == threads, calls


def test_threads_are_used_only_for_inputs_large_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below :data:`MIN_BYTES_PER_THREAD` of input per thread the caller's thread does all the work."""
    started: list[int] = []
    real = _kernel._executor

    def counting() -> Any:
        started.append(1)
        return real()

    monkeypatch.setattr(_kernel, "_executor", counting)
    monkeypatch.setattr(_kernel, "TILE_BYTES", 16)
    x = np.ones((4, 8))
    cycle, entries = np.arange(4), np.array([[0, 4, 0]])
    run(x, cycle, entries, 2, "sum", threads=4)
    assert started == []
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", x.nbytes // 2)
    got, finite = run(x, cycle, entries, 2, "sum", threads=4)
    assert started and finite and got.tolist() == [4.0] * 8


@pytest.mark.clause("bad-input", "op-max", "op-min")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("budget", [16 << 10, 8])
def test_any_non_finite_input_is_never_proven_finite(
    monkeypatch: pytest.MonkeyPatch, op: str, dtype: Any, bad: float, budget: int
) -> None:
    """Wherever the NaN or infinity is (a value max or min drops, too), ``fold`` does not claim finite."""
    monkeypatch.setattr(_kernel, "TILE_BYTES", budget)
    n, k = 4, 3
    cycle, entries = np.array([2, 0, 3, 1]), np.array([[0, 2, 1], [2, 4, 0]])
    base = values(np.random.default_rng(1), n, n * k, dtype, op)
    assert run(base, cycle, entries, k, op)[1]
    for w in range(n):
        for e in (0, k, n * k - 1):
            x = base.copy()
            x[w, e] = bad
            assert not run(layout(x, "transposed"), cycle, entries, k, op)[1], (w, e)
            assert not run(x, cycle, entries, k, op)[1], (w, e)


@pytest.mark.clause("bad-input", "op-max", "op-min")
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_deep_in_a_long_fold_is_found(
    op: str, bad: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine workers, one chunk per tile: each fold's rows come as a fresh step of four, a fused step of
    four (read after the fold began) and a single row; max and min must check the values of every kind."""
    monkeypatch.setattr(_kernel, "TILE_BYTES", 16)
    n, k = 9, 2
    cycle, entries = np.array([4, 7, 0, 2, 8, 1, 5, 3, 6]), np.array([[0, 9, 0]])
    base = values(np.random.default_rng(2), n, n * k, np.float64, op)
    got, finite = run(base, cycle, entries, k, op)
    assert finite and same_bits(got, expected(base, cycle, entries, k, op))
    for w in range(n):
        for e in range(0, n * k, 5):
            x = base.copy()
            x[w, e] = bad
            assert not run(x, cycle, entries, k, op)[1], (w, e)


@pytest.mark.clause("input-finite")
@pytest.mark.parametrize("op", ["sum", "prod"])
def test_a_sum_or_product_that_overflows_is_not_proven_finite(op: str) -> None:
    big = np.finfo(np.float32).max
    x = np.full((2, 2), big, dtype=np.float32)
    got, finite = run(x, np.arange(2), np.array([[0, 2, 0]]), 1, op)
    assert not finite and got.tolist() == [np.inf, np.inf]


@pytest.mark.clause("op-max", "op-min")
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_keep_the_first_of_tied_zeros(op: str) -> None:
    """``-0.0`` and ``0.0`` are equal: the value first in the chunk's order stays, sign included."""
    x = np.array([[-0.0, 0.0, 0.0], [0.0, -0.0, -0.0], [0.0, 0.0, -0.0]])
    cycle, entries = np.arange(3), np.array([[0, 3, 0]])  # chunk c starts at worker c
    got, _ = run(x, cycle, entries, 1, op)
    assert [np.signbit(v) for v in got] == [True, True, True]


@pytest.mark.parametrize("op", ["avg", "mean", "SUM", ""])
def test_an_op_the_kernel_does_not_compile_is_refused(op: str) -> None:
    with pytest.raises(ValueError, match=r"^the kernel computes sum, prod, max, min, not '.*'$") as info:
        _kernel.source("float32", True, op)
    assert repr(op) in str(info.value)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_the_optimised_kernel_works_on_vectors_of_elements(dtype: str, op: str) -> None:
    """LLVM vectorises the loop over a row's elements (what makes the kernel fast), in the input type."""
    scalar = {"float32": "float", "float64": "double"}[dtype]
    ir = _kernel.optimised_ir(dtype, True, op)
    assert f"x {scalar}>" in ir
    assert ("x double>" in ir) == (dtype == "float64")


# --- tile shapes -------------------------------------------------------------------------------------


def check_shape(n: int, k: int, itemsize: int, tiles: int, budget: int) -> None:
    """Whole chunks per tile where one fits the budget, else one chunk's columns (at least one); no more
    than fits; for one tile, the most that fit; asking for more tiles never gives fewer."""
    chunks, cols = _kernel.tile_shape(n, k, itemsize, tiles)
    one = _kernel.tile_shape(n, k, itemsize)
    assert type(chunks) is int and type(cols) is int and 1 <= chunks <= n and 1 <= cols <= k
    assert chunks * cols * itemsize <= budget or (chunks, cols) == (1, 1)
    assert cols == k or chunks == 1
    if k * itemsize <= budget:
        assert cols == k and one == (min(n, budget // (k * itemsize)), k)
    else:
        assert one == (1, max(1, budget // itemsize))
    assert -(-n // chunks) * -(-k // cols) >= -(-n // one[0]) * -(-k // one[1])


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("tiles", [1, 2, 3, 7])
def test_tile_shape_is_the_largest_that_fits(
    monkeypatch: pytest.MonkeyPatch, itemsize: int, tiles: int
) -> None:
    for budget in (8, 24, 64, 100):
        monkeypatch.setattr(_kernel, "TILE_BYTES", budget)
        for n in range(1, 9):
            for k in range(1, 14):
                check_shape(n, k, itemsize, tiles, budget)
    assert _kernel.tile_shape(8, 1, 8) == (8, 1)  # default: one tile


# --- the program ---------------------------------------------------------------------------------------


def run_program(x: Array, steps: Array, tiles: Array, k: int, op: str) -> Array:
    """Interpret ``(steps, tiles)`` as the kernel's docstring describes them."""
    identity = {"sum": -0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[op]
    out = np.full(x.shape[1], np.nan, dtype=x.dtype)
    for s_lo, s_hi, e0, ee, _r0, _r1, f0, f1 in tiles.tolist():
        out[f0:f1] = identity
        for count, a, b, *workers in steps[s_lo:s_hi].tolist():
            cols = [c * k + e for c in range(a, b + 1) for e in range(e0, ee)]
            if count == -_kernel.FUSED:
                out[cols] = identity
            for w in workers[: abs(count)]:
                out[cols] = combine(op, out[cols], x[w, cols])
    return out


@pytest.mark.parametrize(
    ("n", "k", "chunks", "cols"),
    [(3, 1, 3, 1), (5, 8, 1, 8), (5, 8, 1, 3), (6, 2, 4, 2), (7, 3, 2, 3), (1, 4, 1, 4), (9, 5, 1, 2)],
)
def test_the_program_gives_every_chunk_its_workers_in_order(n: int, k: int, chunks: int, cols: int) -> None:
    rng = np.random.default_rng(n * k)
    for _ in range(3):
        cycle = rng.permutation(n)
        entries = random_entries(rng, n)
        steps, tiles = _kernel.program(cycle, entries, k, chunks, cols)
        assert steps.dtype == tiles.dtype == np.int64
        assert steps.shape[1] == _kernel.STEP_FIELDS and tiles.shape[1] == _kernel.TILE_FIELDS
        assert steps.flags.c_contiguous and tiles.flags.c_contiguous
        x = values(rng, n, n * k, np.float64, "sum")
        want = expected(x, cycle, entries, k, "sum")
        assert same_bits(run_program(x, steps, tiles, k, "sum"), want)
        assert_fused(steps)
        # every result covered by exactly one tile's results, in order
        covered = [i for *_, r0, r1, _f0, _f1 in tiles.tolist() for i in range(r0, r1)]
        assert covered == sorted(covered) and set(covered) == set(range(n * k))


def assert_fused(steps: Array) -> None:
    """Each run of consecutive rows into the same chunks comes four rows to a step, the rest one by one."""
    for _, group in itertools.groupby(steps.tolist(), key=lambda step: (step[1], step[2])):
        counts = [abs(step[0]) for step in group]
        rows = sum(counts)
        assert counts == [4] * (rows // 4) + [1] * (rows % 4), counts


def test_rows_into_the_same_chunks_are_fused_four_at_a_time() -> None:
    """A large chunk's tile: its rows come four to a step (the fast loop), the rest one by one."""
    for n in range(1, 12):
        steps, _ = _kernel.program(np.arange(n), np.array([[0, n, 0]]), 16, 1, 16)
        counts = [abs(c) for c in steps[:, 0].tolist()]
        assert sum(counts) == n * n  # every chunk gets n rows
        per_chunk = [abs(c) for c in steps[steps[:, 1] == 0][:, 0].tolist()]
        assert per_chunk == [4] * (n // 4) + [1] * (n % 4), n
        assert (steps[0, 0] == -4) == (n >= 4)


def test_every_block_of_one_chunk_starts_its_fold_with_its_first_step() -> None:
    """Not only the first: each one-chunk block whose first step has four rows starts the fold there
    (``count`` = FRESH, identity not read) and its tiles fill nothing first; a shorter one is filled."""
    for n in (2, 4, 5, 9):
        for cols in (16, 5):
            steps, tiles = _kernel.program(np.roll(np.arange(n), 1), np.array([[0, n, 0]]), 16, 1, cols)
            for s_lo, _s_hi, *_, f_lo, f_hi in tiles.tolist():
                assert (steps[s_lo, 0] == _kernel.FRESH) == (n >= 4), (n, cols)
                assert (f_lo < f_hi) == (n < 4), (n, cols)


# --- compiling and caching -----------------------------------------------------------------------------


def fold_once(dtype: Any = np.float64, stride: bool = True) -> bool:
    x = np.arange(9.0).reshape(3, 3).astype(dtype)
    x = layout(x, "contiguous" if stride else "transposed")
    out = np.empty(3, dtype=dtype)
    finite = _kernel.fold_chunks(x, out, np.array([1, 2, 0]), np.array([[0, 3, 0]]), chunk_size=1, threads=1)
    return finite and out.tolist() == [9.0, 12.0, 15.0]


def test_the_cache_directory_named_by_the_environment_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cache = tmp_path / "a" / "b"  # made, parents too
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "file"))  # saved beside, not via /tmp
    monkeypatch.setenv(_kernel.CACHE_ENV, str(cache))
    forget_kernels(monkeypatch)
    assert _kernel.cache_dirs() == [cache]
    assert fold_once()
    compiled = _kernel.kernel("float64", True, "sum")
    assert (compiled.path, compiled.loaded) == (next(cache.iterdir()), False)
    assert compiled.path is not None
    assert [p.name for p in cache.iterdir()] == [compiled.path.name]  # no temporary file left
    forget_kernels(monkeypatch)
    again = _kernel.kernel("float64", True, "sum")
    assert (again.path, again.loaded) == (compiled.path, True)
    assert fold_once()
    other = _kernel.kernel("float32", False, "max")
    assert other.path is not None and other.path != compiled.path and not other.loaded
    assert other.path.parent == cache


def test_the_default_cache_directories(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = Path(_kernel.__file__).resolve().parent
    monkeypatch.delenv(_kernel.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _kernel.cache_dirs() == [package / "__pycache__", tmp_path / "xdg" / "ring_ref"]
    monkeypatch.setenv(_kernel.CACHE_ENV, "")  # empty: not set
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _kernel.cache_dirs() == [package / "__pycache__", tmp_path / "home" / ".cache" / "ring_ref"]


DAMAGES: list[Callable[[bytes], bytes]] = [
    lambda data: data[:-1],  # truncated code
    lambda data: data[:10],  # truncated header
    lambda data: b"X" + data[1:],  # not our magic
    lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:],  # the checksum
    lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # the code
    lambda data: b"",
]


def test_a_damaged_cache_file_is_compiled_again_and_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    forget_kernels(monkeypatch)
    first = _kernel.kernel("float64", True, "sum")
    assert first.path is not None
    sound = first.path.read_bytes()
    for damage in DAMAGES:
        first.path.write_bytes(damage(sound))
        forget_kernels(monkeypatch)
        second = _kernel.kernel("float64", True, "sum")
        assert (second.path, second.loaded) == (first.path, False)
        assert first.path.read_bytes() == sound  # rewritten whole
    assert fold_once()


def test_the_first_directory_with_a_sound_copy_wins_then_the_first_writable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # nothing can be made inside a file
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setattr(_kernel, "cache_dirs", lambda: [blocked / "x", a, b])
    forget_kernels(monkeypatch)
    first = _kernel.kernel("float32", True, "min")
    assert first.path is not None and first.path.parent == a and not first.loaded
    assert not b.exists()
    b.mkdir()
    first.path.rename(b / first.path.name)
    forget_kernels(monkeypatch)
    second = _kernel.kernel("float32", True, "min")
    assert (second.path, second.loaded) == (b / first.path.name, True)
    assert fold_once(np.float32)


def test_without_a_writable_directory_the_kernel_is_compiled_in_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setattr(_kernel, "cache_dirs", lambda: [blocked / "a", blocked / "b"])
    forget_kernels(monkeypatch)
    assert fold_once(stride=False)
    compiled = _kernel.kernel("float64", False, "sum")
    assert (compiled.path, compiled.loaded) == (None, False)
    assert list(_kernel._kernels) == [("float64", False, "sum")]  # compiled once per process
    assert _kernel.kernel("float64", False, "sum") is compiled
    assert list(tmp_path.iterdir()) == [blocked]


def test_kernels_of_each_op_and_stride_in_one_process_are_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    forget_kernels(monkeypatch)
    rng = np.random.default_rng(3)
    x = values(rng, 3, 6, np.float64, "sum")
    cycle, entries = np.array([2, 0, 1]), np.array([[0, 3, 1]])
    for kind in ("contiguous", "transposed"):
        for op in OPS:
            got, _ = run(layout(x, kind), cycle, entries, 2, op)
            assert same_bits(got, expected(x, cycle, entries, 2, op)), (kind, op)


def test_a_forked_child_is_not_stopped_by_locks_held_in_the_parent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A child forked while another thread compiles a kernel or starts the pool gets locks of its own."""
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    forget_kernels(monkeypatch)
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
    monkeypatch.setattr(_kernel, "TILE_BYTES", 8)
    with _kernel._lock, _kernel._pool_lock:
        pid = os.fork()
        if pid == 0:  # the child
            signal.alarm(20)
            ok = False
            try:
                x = np.arange(18.0).reshape(3, 6)
                out = np.empty(6)
                cycle, entries = np.array([1, 2, 0]), np.array([[0, 3, 0]])
                finite = _kernel.fold_chunks(x, out, cycle, entries, chunk_size=2, threads=3)
                ok = finite and out.tolist() == [18.0, 21.0, 24.0, 27.0, 30.0, 33.0]
                ok = ok and _kernel._pool is not None and _kernel._pool[0] == os.getpid()
            finally:
                os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_pool_is_made_once_per_process() -> None:
    first = _kernel._executor()
    assert _kernel._executor() is first


@pytest.mark.parametrize(("unit", "op"), [(True, "sum"), (False, "sum"), (True, "max")])
def test_a_kernel_whose_ir_changed_is_compiled_again_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unit: bool, op: str
) -> None:
    """The cache never serves code made from other IR (a new version of the package, say), also when only
    one op's IR changed."""
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    old = _kernel.kernel("float64", unit, op)
    assert old.path is not None and not old.loaded
    real = _kernel.source

    def changed(dtype: str, unit_stride: Any, which: str = "sum") -> str:
        return real(dtype, unit_stride, which) + (
            "\n; changed\n" if (unit_stride, which) == (unit, op) else ""
        )

    monkeypatch.setattr(_kernel, "source", changed)
    forget_kernels(monkeypatch)
    new = _kernel.kernel("float64", unit, op)
    assert not new.loaded and new.path is not None and new.path != old.path
    assert fold_once(stride=unit)


def test_code_compiled_by_another_llvmlite_is_compiled_again_not_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cache files are keyed by the compiler too: an upgraded llvmlite never loads the old code."""
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    old = _kernel.kernel("float64", True, "sum")
    assert old.path is not None and not old.loaded
    monkeypatch.setattr(llvmlite, "__version__", "0.0.0+another")
    forget_kernels(monkeypatch)
    new = _kernel.kernel("float64", True, "sum")
    assert not new.loaded and new.path is not None and new.path != old.path
    assert sorted(tmp_path.iterdir()) == sorted([old.path, new.path])
    assert fold_once()


@pytest.mark.parametrize(
    ("op", "dtype", "kind"),
    [
        ("sum", np.float32, "transposed"),
        ("prod", np.float64, "contiguous"),
        ("max", np.float64, "transposed"),
        ("min", np.float32, "contiguous"),
    ],
)
def test_a_kernel_compiled_now_computes_its_op(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str, dtype: Any, kind: str
) -> None:
    """With an empty cache every op's kernel is compiled in the test (not loaded) and computes that op."""
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    rng = np.random.default_rng(11)
    x = values(rng, 5, 10, dtype, op)
    cycle, entries = np.array([3, 0, 4, 1, 2]), np.array([[0, 2, 2], [2, 5, 0]])
    got, finite = run(layout(x, kind), cycle, entries, 2, op)
    assert finite and same_bits(got, expected(x, cycle, entries, 2, op))
    assert not _kernel.kernel(np.dtype(dtype).name, kind == "contiguous", op).loaded


def test_without_an_op_every_entry_point_means_sum(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_kernel.CACHE_ENV, str(tmp_path))
    assert _kernel.source("float64", False) == _kernel.source("float64", False, "sum")
    assert _kernel.optimised_ir("float32", True) == _kernel.optimised_ir("float32", True, "sum")
    assert _kernel.kernel("float64", True) is _kernel.kernel("float64", True, "sum")
    assert fold_once()


def test_a_changed_tile_budget_takes_effect_at_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tile shapes are cached per budget: a call after the budget changed tiles by the new one."""
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
    calls = record_tile_calls(monkeypatch)
    x = values(np.random.default_rng(5), 5, 20, np.float64, "sum")
    cycle, entries = np.arange(5), np.array([[0, 5, 0]])
    for budget, tiles in ((16 << 10, 3), (16, 10)):  # whole chunks shared by three threads, then columns
        monkeypatch.setattr(_kernel, "TILE_BYTES", budget)
        calls.clear()
        got, finite = run(x, cycle, entries, 4, "sum", threads=3)
        assert finite and same_bits(got, expected(x, cycle, entries, 4, "sum"))
        assert sum(t1 - t0 for t0, t1 in calls) == tiles and len(calls) == 3, (budget, calls)


@pytest.mark.parametrize("op", OPS)
def test_each_stride_has_its_own_optimised_ir(op: str) -> None:
    assert _kernel.optimised_ir("float32", True, op) != _kernel.optimised_ir("float32", False, op)
