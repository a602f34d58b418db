"""The fast engine's compiled kernel: every element's fold in one pass over the input.

The ring's result for chunk ``c`` is the fold ``((x[w0] ∘ x[w1]) ∘ x[w2]) ∘ ...``
along the chunk's worker order, one rounded combine (``∘``: ``+``, ``*``, the
first maximum or the first minimum; clauses ``op-*``) in the input dtype per
worker.  For the ring's schedule that order is the same cycle of workers for
every chunk, entered at a chunk's own first worker: ``cycle[p], cycle[p + 1],
..., cycle[n - 1], cycle[0], ..., cycle[p - 1]``.  :func:`ring_ref._fast.plan`
proves that from :mod:`ring_ref.schedule` and hands this module the cycle and
each chunk's entry position ``p``; nothing here knows the schedule.

* **Exactly the spec's combines.**  The kernel is a few dozen lines of LLVM IR
  (:func:`source`), written out here: each step is ``partial = partial ∘
  x[worker, element]``, one ``fadd`` or ``fmul`` in ``float`` or ``double``,
  or, for ``max`` (``min``), ``own`` if ``fcmp ogt`` (``olt``) ``own, partial``
  else ``partial``: of equal values the first in fold order stays, sign of zero
  included, as :mod:`ring_ref._ops` defines it.  No instruction carries a
  fast-math flag, so LLVM neither reassociates, contracts nor widens anything.
  A tile's results start as the op's identity (``-0.0``, ``1.0``, ``-inf``,
  ``+inf``), and ``identity ∘ v`` is ``v`` bit for bit for every finite ``v``:
  the chunk's first worker's value, then the spec's combines in its order.
  LLVM vectorises the loop over the *elements* of a row -- independent folds
  side by side -- never over the workers of one fold; ``tests/cover/test_fast.py``
  reads the optimised IR to check that.
* **One pass, rows streamed, partial results in cache.**  A tile is a block of
  consecutive chunks (small chunks) or a block of columns of one chunk (large
  chunks), at most :data:`TILE_BYTES` of partial results, which stay in the L1
  cache while the tile's band of the input streams by row after row.  The
  order of the rows is a small *program* computed once per shape with numpy
  (:func:`program`): walking the cycle from the block's first entry position
  to the end combines each row into the chunks entered so far (pass 1), then
  from the start again up to the last entry position completes the chunks
  that wrap around (pass 2).  Each chunk thus gets its workers in its own
  order; tiling and row order only choose *which elements* are processed when.
  Consecutive rows into the same chunks (every row of a large chunk's tile)
  are combined :data:`FUSED` at a time: the partial results are read and
  written once per four combines, and four rows of the input stream at once.
* **Finiteness for free.**  A sum or product with a NaN or infinite operand
  is never finite, so each finished tile of those is checked while still in
  cache; ``max`` and ``min`` may drop a NaN or infinite operand, so they check
  every input element as it is read instead.  :func:`fold_chunks` returns whether
  the input is proven finite; only when it is not does the caller need the
  exact input scan.
* **One small kernel per (dtype, op, stride), compiled on first use.**  The op
  and whether the input's elements are one apart are fixed in the IR, so a
  call compiles (or loads) only the specialisation it needs, with llvmlite
  (LLVM's optimiser and code generator, no Python-level compiler): 0.1 to
  0.2 s each.
* **Cores.**  Tiles are shared among up to ``threads`` Python threads; the
  kernel runs through ``ctypes``, which releases the GIL.  Plain threads are
  fork-safe (a forked child starts a pool of its own).
* **Compiled once per machine.**  The object code is kept on disk, keyed by
  a hash of the IR, the LLVM version and the host CPU and its features: in
  ``__pycache__`` beside this file or, where that is not writable, in
  ``$XDG_CACHE_HOME/ring_ref`` (``~/.cache/ring_ref``); :data:`CACHE_ENV`
  overrides both.  Where no location is writable the kernel is compiled in
  memory, once per process.

>>> import numpy as np
>>> x = np.array([[1.0, 2.0], [3.0, 4.0]])  # two workers, one element per chunk
>>> out = np.empty(2)
>>> cycle = np.array([0, 1])  # worker 0 sends to 1, 1 to 0
>>> entries = np.array([[0, 2, 0]])  # chunks 0 .. 1 enter at positions 0, 1
>>> fold_chunks(x, out, cycle, entries, chunk_size=1, threads=1)
True
>>> out.tolist()  # chunk 0 = x[0, 0] + x[1, 0], chunk 1 = x[1, 1] + x[0, 1]
[4.0, 6.0]
>>> fold_chunks(x, out, cycle, entries, chunk_size=1, threads=1, op="max"), out.tolist()
(True, [3.0, 4.0])
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, NamedTuple

import llvmlite
import llvmlite.binding as llvm
import numpy as np
import numpy.typing as npt

__all__ = [
    "CACHE_ENV",
    "KERNEL_OPS",
    "MIN_BYTES_PER_THREAD",
    "TILE_BYTES",
    "Compiled",
    "cache_dirs",
    "fold_chunks",
    "kernel",
    "optimised_ir",
    "program",
    "source",
    "tile_shape",
]

TILE_BYTES: Final = 16 << 10
"""Bytes of partial results per tile: what stays in a 32 KiB L1 data cache beside the streaming input."""

MIN_BYTES_PER_THREAD: Final = 1 << 20
"""Input bytes each thread should have before the work is split: below that, starting threads costs more
than it saves."""

KERNEL_OPS: Final = ("sum", "prod", "max", "min")
"""The combines the kernel compiles (``avg`` is the ring's ``sum``, divided by the caller)."""

CACHE_ENV: Final = "RING_REF_CACHE_DIR"
"""The environment variable naming the directory for the compiled kernels, instead of the default ones."""

Array = npt.NDArray[Any]

# --- the kernel's IR -------------------------------------------------------------------------------

_TYPES: Final = {"float32": "float", "float64": "double"}

_IDENTITY: Final = {"sum": "-0.0", "prod": "1.0", "max": "0xFFF0000000000000", "min": "0x7FF0000000000000"}
"""``identity ∘ v == v`` for every finite ``v``: ``-0.0 + v``, ``1.0 * v``, the larger of ``-inf`` and
``v``, the smaller of ``+inf`` and ``v`` (LLVM writes a float constant as the double of the same value)."""

FUSED: Final = 4
"""Workers one step combines in a pass over its elements when consecutive steps share their chunks (a
large chunk's every step does): the partial result is read and written once per four combines, and four
rows of the input stream at once."""

FRESH: Final = -FUSED
"""The ``count`` of a step of :data:`FUSED` rows that start their chunk's folds: its partial results
start as the identity instead of being read (the tile needs no filling)."""

STEP_FIELDS: Final = 3 + FUSED
"""A step of the program: ``(count, a, b, w_0, ..., w_3)``."""

TILE_FIELDS: Final = 8
"""A tile of the program: ``(steps from, to, columns from, to, results from, to, fill from, to)``."""


def _name(dtype: str, unit_stride: bool, op: str) -> str:
    return f"ring_ref_fold_{op}_{dtype}_{'unit' if unit_stride else 'strided'}"


def _combine(op: str, t: str, result: str, partial: str, value: str) -> list[str]:
    """IR for ``result = partial ∘ value``: the incoming partial result combined with a worker's own value."""
    if op in ("sum", "prod"):
        return [f"{result} = {'fadd' if op == 'sum' else 'fmul'} {t} {partial}, {value}"]
    keep = f"{result}.keep"  # max: own if own > incoming (ordered: false for NaN), else incoming
    return [
        f"{keep} = fcmp {'ogt' if op == 'max' else 'olt'} {t} {value}, {partial}",
        f"{result} = select i1 {keep}, {t} {value}, {t} {partial}",
    ]


def _loop(op: str, t: str, unit_stride: bool, label: str, workers: int, *, fresh: bool = False) -> list[str]:
    """The loop ``label``: ``out[i] = (out[i] ∘ x[w_0 s0 + i s1]) ∘ ...`` over ``workers`` rows, ``i = lo ..
    hi - 1`` (``fresh``: ``identity ∘ x[w_0 ...]``, ``out`` not read); with ``max`` and ``min``, every value
    read is checked for NaN and infinity too."""
    check = op in ("max", "min")
    at = f"%{label}.i" if unit_stride else f"%{label}.xi"
    lines = [f"{label}:", f"%{label}.i = phi i64 [ %lo, %dispatch ], [ %{label}.next, %{label} ]"]
    if check:
        lines.append(f"%{label}.bad0 = phi i1 [ %bad.s, %dispatch ], [ %{label}.bad{workers}, %{label} ]")
    if not unit_stride:
        lines.append(f"%{label}.xi = mul nsw i64 %{label}.i, %s1")
    lines.append(f"%{label}.out = getelementptr inbounds {t}, ptr %out, i64 %{label}.i")
    if not fresh:
        lines.append(f"%{label}.r0 = load {t}, ptr %{label}.out")
    for j in range(workers):
        value = f"%{label}.v{j}"
        partial = _IDENTITY[op] if fresh and j == 0 else f"%{label}.r{j}"
        lines += [
            f"%{label}.x{j} = getelementptr inbounds {t}, ptr %row{j}, i64 {at}",
            f"{value} = load {t}, ptr %{label}.x{j}",
            *_combine(op, t, f"%{label}.r{j + 1}", partial, value),
        ]
        if check:  # v - v is NaN exactly when v is NaN or infinite
            lines += [
                f"%{label}.d{j} = fsub {t} {value}, {value}",
                f"%{label}.nf{j} = fcmp une {t} %{label}.d{j}, 0.0",
                f"%{label}.bad{j + 1} = or i1 %{label}.bad{j}, %{label}.nf{j}",
            ]
    lines += [
        f"store {t} %{label}.r{workers}, ptr %{label}.out",
        f"%{label}.next = add nsw i64 %{label}.i, 1",
        f"%{label}.more = icmp slt i64 %{label}.next, %hi",
        f"br i1 %{label}.more, label %{label}, label %step.end",
    ]
    return [lines[0], *("  " + line for line in lines[1:])]


def source(dtype: str, unit_stride: bool, op: str = "sum") -> str:
    """The kernel's LLVM IR for ``x`` and ``out`` of ``dtype``, element stride ``1`` (``unit_stride``) or
    any, and ``op``: the function ``fold(x, s0, s1, out, k, steps, tiles, t0, t1)``.

    It folds tiles ``t0 .. t1 - 1`` of the :func:`program` ``(steps, tiles)``
    into ``out`` and returns 1 when the input is proven finite.  ``x[w s0 + e
    s1]`` is worker ``w``'s element ``e`` (its chunk ``c``: the elements ``c K
    .. c K + K - 1``, ``K = k``); ``out`` holds ``C K`` results (``C <= N``), chunk after
    chunk.  ``tiles[8 t .. 8 t + 7]`` is tile ``t``'s steps, its columns of
    each chunk, the results it finishes and those it first fills with the
    identity.

    >>> print(source("float32", True, "max").splitlines()[1].split("(")[0])
    define i8 @ring_ref_fold_max_float32_unit
    >>> for line in source("float32", True, "max").splitlines():
    ...     if "%single.r1" in line and "=" in line.split("%single.r1")[1][:7]:
    ...         print(line.strip())
    %single.r1.keep = fcmp ogt float %single.v0, %single.r0
    %single.r1 = select i1 %single.r1.keep, float %single.v0, float %single.r0
    """
    if op not in KERNEL_OPS:
        raise ValueError(f"the kernel computes {', '.join(KERNEL_OPS)}, not {op!r}")
    t = _TYPES[dtype]
    check = op in ("max", "min")
    loops = [
        _loop(op, t, unit_stride, "fresh", FUSED, fresh=True),
        _loop(op, t, unit_stride, "fused", FUSED),
        _loop(op, t, unit_stride, "single", 1),
    ]
    rows = [
        line
        for j in range(FUSED)
        for line in (
            f"  %qw{j} = getelementptr inbounds i64, ptr %q, i64 {3 + j}",
            f"  %w{j} = load i64, ptr %qw{j}",
            f"  %offset{j} = mul nsw i64 %w{j}, %s0",
            f"  %row{j} = getelementptr inbounds {t}, ptr %x, i64 %offset{j}",
        )
    ]
    header = f"""\
; fold tiles t0 .. t1 - 1 of the program (steps, tiles) into out; 1 when the input is proven finite
define i8 @{_name(dtype, unit_stride, op)}(ptr noalias readonly %x, i64 %s0, i64 %s1,
    ptr noalias %out, i64 %k, ptr noalias readonly %steps, ptr noalias readonly %tiles, i64 %t0, i64 %t1)
    nounwind {{
entry:
  %none = icmp sge i64 %t0, %t1
  br i1 %none, label %done, label %tile

tile:                            ; tile t: steps s.lo .. s.hi - 1, columns e0 .. ee - 1, out[r.lo .. r.hi - 1]
  %t = phi i64 [ %t0, %entry ], [ %t.next, %tile.end ]
  %bad.t = phi i1 [ false, %entry ], [ %bad.tile, %tile.end ]
  %base = mul nsw i64 %t, {TILE_FIELDS}
  %p0 = getelementptr inbounds i64, ptr %tiles, i64 %base
  %s.lo = load i64, ptr %p0
  %p1 = getelementptr inbounds i64, ptr %p0, i64 1
  %s.hi = load i64, ptr %p1
  %p2 = getelementptr inbounds i64, ptr %p0, i64 2
  %e0 = load i64, ptr %p2
  %p3 = getelementptr inbounds i64, ptr %p0, i64 3
  %ee = load i64, ptr %p3
  %p4 = getelementptr inbounds i64, ptr %p0, i64 4
  %r.lo = load i64, ptr %p4
  %p5 = getelementptr inbounds i64, ptr %p0, i64 5
  %r.hi = load i64, ptr %p5
  %p6 = getelementptr inbounds i64, ptr %p0, i64 6
  %f.lo = load i64, ptr %p6
  %p7 = getelementptr inbounds i64, ptr %p0, i64 7
  %f.hi = load i64, ptr %p7
  %fill.any = icmp slt i64 %f.lo, %f.hi
  br i1 %fill.any, label %fill, label %steps.head

fill:                            ; out[f.lo .. f.hi - 1] = the identity, where no step starts from it
  %f = phi i64 [ %f.lo, %tile ], [ %f.next, %fill ]
  %fp = getelementptr inbounds {t}, ptr %out, i64 %f
  store {t} {_IDENTITY[op]}, ptr %fp
  %f.next = add nsw i64 %f, 1
  %f.more = icmp slt i64 %f.next, %f.hi
  br i1 %f.more, label %fill, label %steps.head

steps.head:
  %steps.any = icmp slt i64 %s.lo, %s.hi
  br i1 %steps.any, label %step, label %tile.check

step:                            ; step s = (count, a, b, w_0 .. w_3): count rows into chunks a .. b
  %s = phi i64 [ %s.lo, %steps.head ], [ %s.next, %step.end ]
  %bad.s = phi i1 [ %bad.t, %steps.head ], [ %bad.step, %step.end ]
  %sb = mul nsw i64 %s, {STEP_FIELDS}
  %q = getelementptr inbounds i64, ptr %steps, i64 %sb
  %count = load i64, ptr %q
  %qa = getelementptr inbounds i64, ptr %q, i64 1
  %a = load i64, ptr %qa
  %qb = getelementptr inbounds i64, ptr %q, i64 2
  %b = load i64, ptr %qb
"""
    middle = f"""\
  %ak = mul nsw i64 %a, %k
  %lo = add nsw i64 %ak, %e0
  %bk = mul nsw i64 %b, %k
  %hi = add nsw i64 %bk, %ee
  %inner.any = icmp slt i64 %lo, %hi
  br i1 %inner.any, label %dispatch, label %step.end

dispatch:
  switch i64 %count, label %single [ i64 {FUSED}, label %fused
                                     i64 {FRESH}, label %fresh ]

"""
    footer = f"""
step.end:
  %bad.step = phi i1 [ %bad.s, %step ], [ {f"%fresh.bad{FUSED}" if check else "%bad.s"}, %fresh ],
                     [ {f"%fused.bad{FUSED}" if check else "%bad.s"}, %fused ],
                     [ {"%single.bad1" if check else "%bad.s"}, %single ]
  %s.next = add nsw i64 %s, 1
  %s.more = icmp slt i64 %s.next, %s.hi
  br i1 %s.more, label %step, label %tile.check

tile.check:                      ; a finished tile of a sum or product: any result NaN or infinite?
  %bad.c0 = phi i1 [ %bad.t, %steps.head ], [ %bad.step, %step.end ]
  %check.any = icmp slt i64 %r.lo, %r.hi
  %check.some = and i1 %check.any, {"false" if check else "true"}
  br i1 %check.some, label %check, label %tile.end

check:
  %c = phi i64 [ %r.lo, %tile.check ], [ %c.next, %check ]
  %bad.c = phi i1 [ %bad.c0, %tile.check ], [ %bad.c.next, %check ]
  %cp = getelementptr inbounds {t}, ptr %out, i64 %c
  %cv = load {t}, ptr %cp
  %cd = fsub {t} %cv, %cv
  %cnf = fcmp une {t} %cd, 0.0
  %bad.c.next = or i1 %bad.c, %cnf
  %c.next = add nsw i64 %c, 1
  %c.more = icmp slt i64 %c.next, %r.hi
  br i1 %c.more, label %check, label %tile.end

tile.end:
  %bad.tile = phi i1 [ %bad.c0, %tile.check ], [ %bad.c.next, %check ]
  %t.next = add nsw i64 %t, 1
  %t.more = icmp slt i64 %t.next, %t1
  br i1 %t.more, label %tile, label %done

done:
  %bad = phi i1 [ false, %entry ], [ %bad.tile, %tile.end ]
  %ok = xor i1 %bad, true
  %ret = zext i1 %ok to i8
  ret i8 %ret
}}
"""
    body = "\n\n".join("\n".join(loop) for loop in loops)
    return "\n".join([header + "\n".join(rows), middle + body, footer])


# --- compiling and caching ---------------------------------------------------------------------------

_lock = threading.Lock()


class _Machine(NamedTuple):
    target: Any
    engine: Any
    key: str


_machine: _Machine | None = None


def _host() -> _Machine:
    """LLVM's target machine for this CPU (all its features) and the engine that holds the kernels."""
    global _machine  # noqa: PLW0603 - created on first use
    if _machine is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        target = llvm.Target.from_default_triple().create_target_machine(
            cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default"
        )
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target)
        key = "\n".join(
            [llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)), target.triple, cpu, features]
        )
        _machine = _Machine(target, engine, key)
    return _machine


def _optimised(dtype: str, unit_stride: bool, op: str) -> Any:
    """The kernel's module after LLVM's ``-O3`` pipeline (loop vectoriser included) for this CPU."""
    machine = _host()
    module = llvm.parse_assembly(source(dtype, unit_stride, op))
    module.triple = machine.target.triple
    module.data_layout = str(machine.target.target_data)
    module.verify()
    options = llvm.create_pipeline_tuning_options(speed_level=3)
    options.loop_vectorization = True
    options.slp_vectorization = True
    builder = llvm.create_pass_builder(machine.target, options)
    builder.getModulePassManager().run(module, builder)
    return module


def optimised_ir(dtype: str, unit_stride: bool, op: str = "sum") -> str:
    """The LLVM IR that :func:`kernel` turns into machine code (after optimisation), as text."""
    return str(_optimised(dtype, unit_stride, op))


def cache_dirs() -> list[Path]:
    """Where compiled kernels are looked for and saved, in order: :data:`CACHE_ENV` if set, else
    ``__pycache__`` beside this file and the per-user cache."""
    if os.environ.get(CACHE_ENV):
        return [Path(os.environ[CACHE_ENV])]
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ring_ref"
    return [Path(__file__).resolve().parent / "__pycache__", user]


_MAGIC: Final = b"ring_ref kernel\n"


def _read(path: Path) -> bytes | None:
    """The object code saved at ``path``, or ``None`` if it is missing or does not match its checksum."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head, digest, code = data[: len(_MAGIC)], data[len(_MAGIC) : len(_MAGIC) + 32], data[len(_MAGIC) + 32 :]
    return code if head == _MAGIC and hashlib.sha256(code).digest() == digest else None


def _write(directory: Path, name: str, code: bytes) -> Path | None:
    """Save ``code`` as ``directory / name`` (atomically); the path, or ``None`` if it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        with os.fdopen(handle, "wb") as file:
            file.write(_MAGIC + hashlib.sha256(code).digest() + code)
        os.replace(temporary, directory / name)
    except OSError:
        return None
    return directory / name


class Compiled(NamedTuple):
    """A kernel ready to call: its ``ctypes`` caller, and where its machine code came from."""

    call: Callable[..., int]
    path: Path | None
    """The object file it was loaded from or saved to; ``None``: compiled in memory only."""
    loaded: bool
    """Whether it was loaded from disk (compiled by an earlier process) rather than compiled now."""


_ARGTYPES: Final = (
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
)

_kernels: dict[tuple[str, bool, str], Compiled] = {}


def _machine_code(dtype: str, unit_stride: bool, op: str) -> tuple[bytes, Path | None, bool]:
    """The kernel's object code, the file it is kept in (``None``: nowhere) and whether it was loaded.

    The first cache directory holding a sound copy wins; otherwise it is
    compiled and saved into the first directory that can be written.
    """
    machine = _host()
    digest = hashlib.sha256(f"{machine.key}\n{source(dtype, unit_stride, op)}".encode()).hexdigest()[:24]
    name = f"_kernel.{_name(dtype, unit_stride, op)}.{digest}.o"
    for directory in cache_dirs():
        code = _read(directory / name)
        if code is not None:
            return code, directory / name, True
    code = machine.target.emit_object(_optimised(dtype, unit_stride, op))
    saved = (_write(directory, name, code) for directory in cache_dirs())
    return code, next((path for path in saved if path is not None), None), False


def kernel(dtype: str, unit_stride: bool, op: str = "sum") -> Compiled:
    """The kernel for ``x`` of ``dtype``, unit or any element stride, and ``op``: loaded from the disk
    cache, or compiled (and saved) on first use."""
    key = (dtype, unit_stride, op)
    with _lock:
        if key not in _kernels:
            code, path, loaded = _machine_code(dtype, unit_stride, op)
            engine = _host().engine
            engine.add_object_file(llvm.ObjectFileRef.from_data(code))
            address = engine.get_function_address(_name(dtype, unit_stride, op))
            _kernels[key] = Compiled(ctypes.CFUNCTYPE(ctypes.c_uint8, *_ARGTYPES)(address), path, loaded)
        return _kernels[key]


# --- the program -------------------------------------------------------------------------------------


def tile_shape(n: int, k: int, itemsize: int, tiles: int = 1) -> tuple[int, int]:
    """``(chunks, columns)`` per tile for ``n`` chunks of ``k`` columns, at least ``tiles`` tiles.

    >>> tile_shape(8, 1 << 19, 4), tile_shape(1024, 4, 4), tile_shape(1024, 4, 4, tiles=2)
    ((1, 4096), (1024, 4), (512, 4))
    """
    chunks = min(TILE_BYTES // (k * itemsize), -(-n // tiles))
    if chunks >= 1:
        return chunks, k
    return 1, max(1, min(TILE_BYTES // itemsize, -(-k * n // tiles)))


def _fuse(steps: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``(worker, a, b)`` steps, in order, as :data:`STEP_FIELDS`-wide records: each run of consecutive
    steps into the same chunks in groups of :data:`FUSED` (the rest one by one)."""
    size = len(steps)
    ab = steps[:, 1:]
    starts = np.flatnonzero(np.r_[True, (ab[1:] != ab[:-1]).any(axis=1)])
    lengths = np.diff(np.r_[starts, size])
    run = np.repeat(np.arange(len(starts)), lengths)
    position = np.arange(size) - starts[run]
    grouped = position < (lengths - lengths % FUSED)[run]
    heads = np.flatnonzero(~grouped | (position % FUSED == 0))
    count = np.where(grouped[heads], FUSED, 1)
    rows = np.where(count[:, None] == FUSED, heads[:, None] + np.arange(FUSED), heads[:, None])
    return np.concatenate([count[:, None], steps[heads, 1:], steps[rows, 0]], axis=1)


def _run_steps(order: npt.NDArray[np.int64], lo: int, hi: int, first: int, up: bool) -> npt.NDArray[np.int64]:
    """The ``(worker, a, b)`` steps of the chunks ``lo .. hi - 1`` entering the cycle ``order`` at ``first,
    first + 1, ...``, from ``lo`` up (``up``) or from ``hi - 1`` down: pass 1, then pass 2 (:func:`program`).
    The chunks entered by a position are the first of the run in the order it enters, so a prefix of ``lo ..
    hi - 1`` going up and, the mirror image, a suffix going down."""
    n, size = len(order), hi - lo
    t = np.arange(first, n, dtype=np.int64)  # pass 1: the row of order[t] into the chunks entered by t
    q = np.arange(first + size - 1, dtype=np.int64)  # pass 2: the row of order[q] into those entering after q
    into, before = np.minimum(t - first + 1, size), np.maximum(q - first + 1, 0)
    if up:
        a, b = np.r_[np.full_like(t, lo), lo + before], np.r_[lo + into - 1, np.full_like(q, hi - 1)]
    else:
        a, b = np.r_[hi - into, np.full_like(q, lo)], np.r_[np.full_like(t, hi - 1), hi - 1 - before]
    return np.stack([order[np.r_[t, q]], a, b], axis=1)


def program(
    cycle: Array, entries: Array, k: int, chunks: int, cols: int, *, count: int | None = None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ``(steps, tiles)`` the kernel runs: every chunk's rows in its fold order.

    The chunks are ``0 .. count - 1`` (all ``n = len(cycle)`` by default).
    Tiles are ``chunks`` whole chunks, or ``cols`` columns of one chunk; the
    tiles over one block of chunks share its steps.  For a run of chunks
    ``lo .. hi - 1`` of the block entering the cycle at ``p, p + 1, ...``, the
    row of ``cycle[p + s]`` (pass 1) is combined into the chunks entered up to
    there, ``lo .. lo + s``; then the row of ``cycle[q]``, ``q < p + hi - lo - 1``
    (pass 2), into the chunks entering after ``q``.  A mirrored run (``stop <
    start``: the chunks ``hi - 1, hi - 2, ..., lo`` entering at ``p, p + 1,
    ...``, as a ring run the other way has them) is the same with the chunks
    counted down: ``hi - 1 - s .. hi - 1`` in pass 1.  Consecutive rows into the
    same chunks make one step of up to :data:`FUSED` rows: ``(count, a, b,
    w_0, ..., w_3)`` combines the rows ``w_0 .. w_{count - 1}``, in that order,
    into the chunks ``a .. b``.  A tile's results start as the op's identity:
    filled by the tile (``tiles[t, 6:8]``), or, in a block of one chunk, by its
    first step (``count`` = :data:`FRESH`), which does not read them.

    >>> steps, tiles = program(np.array([0, 1, 2]), np.array([[0, 3, 0]]), 1, 3, 1)
    >>> steps[:, :4].tolist()  # (count, a, b, w_0): rows 0, 1, 2 of pass 1, then 0, 1 of pass 2
    [[1, 0, 0, 0], [1, 0, 1, 1], [1, 0, 2, 2], [1, 1, 2, 0], [1, 2, 2, 1]]
    >>> tiles.tolist()  # steps 0 .. 4, columns 0 .. 0 of each chunk, results 0 .. 2, filled first
    [[0, 5, 0, 1, 0, 3, 0, 3]]
    >>> steps = program(np.array([0, 2, 1]), np.array([[0, 1, 0], [2, 0, 1]]), 1, 3, 1)[0]
    >>> steps[:, :4].tolist()  # chunk 0 alone, then chunks 2, 1 entering at 1, 2: the mirror
    [[1, 0, 0, 0], [1, 0, 0, 2], [1, 0, 0, 1], [1, 2, 2, 2], [1, 1, 2, 1], [1, 1, 2, 0], [1, 1, 1, 2]]
    >>> program(np.arange(5), np.array([[0, 5, 0]]), 8, 1, 8)[0][:2].tolist()  # one chunk per block
    [[-4, 0, 0, 0, 1, 2, 3], [1, 0, 0, 4, 4, 4, 4]]
    """
    total = len(cycle) if count is None else count
    order = cycle.astype(np.int64)
    blocks: list[npt.NDArray[np.int64]] = []
    filled: list[bool] = []  # whether the block's tiles start by filling their results with the identity
    for c0 in range(0, total, chunks):
        c1 = min(total, c0 + chunks)
        pieces = []
        for start, stop, p in entries.tolist():
            up = start < stop
            lo, hi = (max(start, c0), min(stop, c1)) if up else (max(stop + 1, c0), min(start + 1, c1))
            if lo < hi:  # the run's chunks in this block; the first to enter does so |c - start| after p
                pieces.append(_run_steps(order, lo, hi, p + (lo - start if up else start - (hi - 1)), up))
        steps = _fuse(np.concatenate(pieces))
        fresh = c1 - c0 == 1 and steps[0, 0] == FUSED  # one chunk: its first step starts its fold
        steps[0, 0] = FRESH if fresh else steps[0, 0]
        blocks.append(steps)
        filled.append(not fresh)
    col_tiles = -(-k // cols)
    t = np.arange(len(blocks) * col_tiles, dtype=np.int64)
    block = t // col_tiles
    e0 = (t % col_tiles) * cols
    ee = np.minimum(k, e0 + cols)
    c0s = block * chunks
    c1s = np.minimum(total, c0s + chunks)
    starts = np.cumsum([0, *map(len, blocks)])
    r0, r1 = c0s * k + e0, (c1s - 1) * k + ee
    fill = np.array(filled)[block]
    tiles = np.stack([starts[block], starts[block + 1], e0, ee, r0, r1, r0 * fill, r1 * fill], axis=1)
    return np.ascontiguousarray(np.concatenate(blocks), dtype=np.int64), np.ascontiguousarray(tiles)


class _Program(NamedTuple):
    steps: npt.NDArray[np.int64]
    tiles: npt.NDArray[np.int64]
    addresses: tuple[int, int]
    """Where ``steps`` and ``tiles`` are, for the kernel (valid while this record is referenced)."""


@functools.lru_cache(maxsize=64)
def _program(cycle: bytes, entries: bytes, k: int, chunks: int, cols: int, *, count: int) -> _Program:
    """:func:`program` of a cycle and entries given as int64 bytes, cached."""
    order = np.frombuffer(cycle, dtype=np.int64)
    table = np.frombuffer(entries, dtype=np.int64).reshape(-1, 3)
    steps, tiles = program(order, table, k, chunks, cols, count=count)
    steps.flags.writeable = False
    tiles.flags.writeable = False
    return _Program(steps, tiles, (steps.ctypes.data, tiles.ctypes.data))


@functools.lru_cache(maxsize=256)
def _split(n: int, k: int, itemsize: int, threads: int, budget: int) -> tuple[int, int, tuple[int, ...]]:
    """``(chunks, cols)`` per tile and the tile ranges of at most ``threads`` threads (``budget``:
    :data:`TILE_BYTES`, a key of the cache)."""
    chunks, cols = tile_shape(n, k, itemsize, threads)
    count = -(-n // chunks) * -(-k // cols)
    threads = min(threads, count)
    return chunks, cols, tuple(count * i // threads for i in range(threads + 1))


# --- running it ----------------------------------------------------------------------------------------

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _executor() -> ThreadPoolExecutor:
    """This process's worker threads (a forked child gets its own: the parent's threads are not in it)."""
    global _pool  # noqa: PLW0603 - one pool per process, created on first use
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="ring_ref"))
        return _pool[1]


def _after_fork_in_child() -> None:
    """A child forked while another thread held a lock must not wait for it forever."""
    global _pool_lock, _lock  # noqa: PLW0603 - replaced in the child only
    _pool_lock = threading.Lock()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fold_chunks(
    x: Array, out: Array, cycle: Array, entries: Array, *, chunk_size: int, threads: int, op: str = "sum"
) -> bool:
    """Write the ring's result for ``op`` into ``out``, chunk after chunk; return whether the input is
    proven finite (``False``: it may not be, or the result overflowed).

    ``x`` is ``(N, C K)`` (float32 or float64, native byte order, aligned, any
    strides, only read) with ``K = chunk_size``, ``out`` a contiguous
    ``(C K,)`` array of the same dtype that shares no memory with ``x``: the
    chunks ``0 .. C - 1`` of ``N`` (``C <= N``; the others are not computed);
    ``cycle`` holds the workers in ring order and ``entries`` the rows
    ``(start, stop, p)``: the chunks ``start .. stop - 1`` (or, where ``stop <
    start``, ``start, start - 1, ..., stop + 1``) enter the cycle at positions
    ``p, p + 1, ...`` (all below ``N``).  The tiles are split among at most
    ``threads`` threads.
    """
    k = chunk_size
    count = out.size // k
    threads = max(1, min(threads, x.nbytes // MIN_BYTES_PER_THREAD))
    chunks, cols, bounds = _split(count, k, out.itemsize, threads, TILE_BYTES)
    order, table = cycle.astype(np.int64).tobytes(), entries.astype(np.int64).tobytes()
    run = _program(order, table, k, chunks, cols, count=count)
    s0, s1 = (s // x.itemsize for s in x.strides)
    call = kernel(x.dtype.name, s1 == 1, op).call
    args = (x.ctypes.data, s0, s1, out.ctypes.data, k, *run.addresses)
    if len(bounds) == 2:
        return bool(call(*args, 0, bounds[1]))

    def part(t0: int, t1: int) -> bool:
        return bool(call(*args, t0, t1))

    others = [_executor().submit(part, bounds[i], bounds[i + 1]) for i in range(1, len(bounds) - 1)]
    finite = part(bounds[0], bounds[1])
    return all([f.result() for f in others]) and finite
