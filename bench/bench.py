"""``make bench``: the fast engine, the reference engine and ``torch.sum(x, 0)``, side by side.

Times are medians of repeated runs after one warm-up run, the engines taking
turns within each repetition so that machine noise hits all of them alike.
Every case runs twice: on one thread (``torch.set_num_threads(1)``, which the
fast engine's kernel follows too) and on the default thread count; the
reference engine runs on one thread only.  Peak extra memory is measured once
per engine and size in a fresh subprocess (see :func:`measure_memory`), and so
is the fast engine's first call including the kernel's compilation, with an
empty and then a filled compilation cache (:func:`first_call`).  The direction
row (:func:`time_directions`) times the fast engine on rings of direction -1
beside the spec ring at ``N = M = 4096``; ``--only directions`` runs it alone.
Writes ``bench.json`` and ``bench.png`` to ``--out``; ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ring_ref import _fast, ring_all_reduce
from ring_ref._dtypes import bits
from ring_ref._fast import _kernel
from ring_ref.schedule import GLOO, SPEC, RingSchedule, Schedule

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
ENGINES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fast": lambda x: ring_all_reduce(x, engine="fast"),
    "reference": lambda x: ring_all_reduce(x, engine="reference"),
    "torch.sum": lambda x: torch.sum(x, 0),
}
TARGETS = (
    ("fast / torch.sum at float32 N=8 M=2^22", "f32 N=8 M=2^22", 1.1),
    ("fast / torch.sum at float64 N=8 M=2^22", "f64 N=8 M=2^22", 1.1),
    ("fast / torch.sum at float32 N=1024 M=4096", "f32 N=1024 M=4096", 3.0),
)
"""Each target holds at one thread and at the default thread count (issue 18)."""
FIRST_CALL_TARGET_S = 2.0
"""The fast engine's first call in a fresh process: importing llvmlite, compiling the kernel and the plan."""


class Case(NamedTuple):
    """One benchmarked input: ``n`` workers of ``m`` elements of ``dtype``."""

    label: str
    n: int
    m: int
    dtype: str


CASES = (
    Case("f32 N=8 M=2^22", 8, 2**22, "float32"),
    Case("f64 N=8 M=2^22", 8, 2**22, "float64"),
    Case("f32 N=8 M=2^16", 8, 2**16, "float32"),
    Case("f32 N=64 M=2^16", 64, 2**16, "float32"),
    Case("f32 N=256 M=4096", 256, 4096, "float32"),
    Case("f32 N=1024 M=4096", 1024, 4096, "float32"),
    Case("f16 N=8 M=2^20", 8, 2**20, "float16"),
    Case("bf16 N=8 M=2^20", 8, 2**20, "bfloat16"),
)
SWEEP = tuple(
    Case(f"f32 N={n} M=4096", n, 4096, "float32") for n in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
)
"""Time against N at a fixed M = 4096, for the plot and for where the reference stops being practical."""
DIRECTION_CASE = Case("f32 N=4096 M=4096", 4096, 4096, "float32")
DIRECTION_RINGS: dict[str, Schedule] = {
    "spec (+1, 0, even)": SPEC,
    "direction -1 (-1, 0, even)": RingSchedule(-1, 0, "even"),
    "gloo preset (-1, -1, gloo)": GLOO,
}
"""The rings of the direction row: the spec's first, the baseline of the others' ratios (issue 40)."""
DIRECTION_TARGET = 2.0
"""Each ring's time per call over the spec ring's, at :data:`DIRECTION_CASE` (issue 40)."""
MEMORY_RESOLUTION_BYTES = 1 << 20
"""Below this output size the resident-set figures are mostly allocator reuse and page rounding."""
WARM_M = 1 << 18
"""Elements per worker of the memory probe's second warm-up: enough to start torch's thread pool."""
MAX_RUNS = 15
SLOW_S = 10.0
"""Runs per engine: as many as ``--budget`` allows, at most ``MAX_RUNS``, and at least 3
unless one run takes ``SLOW_S`` or more."""


def make_input(case: Case) -> torch.Tensor:
    """Standard-normal values, generated in place (no temporary the size of the input)."""
    return torch.empty((case.n, case.m), dtype=DTYPES[case.dtype]).normal_(
        generator=torch.Generator().manual_seed(0)
    )


def runs_of(engine: str, case: Case, reference_max_n: int) -> bool:
    """Whether ``engine`` is run at all on ``case`` (the reference only up to ``reference_max_n``)."""
    return engine != "reference" or case.n <= reference_max_n


def time_case(case: Case, reference_max_n: int, budget_s: float, *, reference: bool = True) -> dict[str, Any]:
    """Median seconds per engine on ``case``, plus the fast engine's first (plan-compiling) call.

    ``reference=False`` leaves the reference engine out (the default-threads pass).
    """
    x = make_input(case)
    engines = [e for e in ENGINES if runs_of(e, case, reference_max_n) and (reference or e != "reference")]
    _fast.plan.cache_clear()
    first: dict[str, float] = {}
    results: dict[str, torch.Tensor] = {}
    for engine in engines:
        start = time.perf_counter()
        results[engine] = ENGINES[engine](x)
        first[engine] = time.perf_counter() - start
    same = None
    if "reference" in results:
        same = bool(torch.equal(bits(results["fast"]), bits(results["reference"])))
    slowest = max(first[e] for e in engines if e != "fast")
    reps = max(1, min(MAX_RUNS, int(budget_s / max(slowest, 1e-9))))
    if reps < 3 and slowest < SLOW_S:
        reps = 3
    samples: dict[str, list[float]] = {e: [] for e in engines}
    for rep in range(reps):
        for engine in engines[rep % len(engines) :] + engines[: rep % len(engines)]:
            start = time.perf_counter()
            ENGINES[engine](x)
            samples[engine].append(time.perf_counter() - start)
    medians = {e: statistics.median(s) for e, s in samples.items()}
    return {
        "case": case._asdict(),
        "median_s": medians,
        "runs": {e: len(s) for e, s in samples.items()},
        "fast_first_call_s": first["fast"],
        "bitwise_equal_to_reference": same,
    }


def time_directions(budget_s: float) -> dict[str, Any]:
    """The fast engine on each ring of :data:`DIRECTION_RINGS` at :data:`DIRECTION_CASE`: median seconds
    per call, taking turns, and the first call (compiling the plan and the kernel's program for the ring)."""
    x = make_input(DIRECTION_CASE)
    ring_all_reduce(torch.ones((2, 2)), engine="fast")  # the kernel, loaded once for all rings
    _fast.plan.cache_clear()
    _kernel._program.cache_clear()
    first = {}
    for name, ring in DIRECTION_RINGS.items():
        start = time.perf_counter()
        ring_all_reduce(x, engine="fast", schedule=ring)
        first[name] = time.perf_counter() - start
    reps = max(3, min(MAX_RUNS, int(budget_s / max(*first.values(), 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in DIRECTION_RINGS}
    names = list(DIRECTION_RINGS)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            start = time.perf_counter()
            ring_all_reduce(x, engine="fast", schedule=DIRECTION_RINGS[name])
            samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    spec = medians[names[0]]
    return {
        "case": DIRECTION_CASE._asdict(),
        "median_s": medians,
        "over_spec": {name: t / spec for name, t in medians.items()},
        "first_call_s": first,
        "runs": reps,
    }


def direction_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """The direction row at each thread count: every ring's time per call and its ratio to the spec ring's."""
    lines = []
    for where, row in rows.items():
        lines.append(
            f"  {row['case']['label']}, {where}: "
            + ", ".join(
                f"{name} {fmt_s(t)} ({fmt_x(row['over_spec'][name])}; "
                f"first call {fmt_s(row['first_call_s'][name])})"
                for name, t in row["median_s"].items()
            )
        )
        for name, ratio in list(row["over_spec"].items())[1:]:
            verdict = "met" if ratio <= DIRECTION_TARGET else "MISSED"
            lines.append(
                f"target {name} / spec ring at {row['case']['label']}, {where} <= {DIRECTION_TARGET:g}: "
                f"{ratio:.2f}  {verdict}"
            )
    return lines


def run_directions(budget_s: float, default_threads: int) -> dict[str, dict[str, Any]]:
    """:func:`time_directions` on one thread and on ``default_threads``."""
    rows = {}
    for threads in (1, default_threads):
        torch.set_num_threads(threads)
        rows[f"{threads} thread{'s' if threads > 1 else ''}"] = time_directions(budget_s)
    torch.set_num_threads(default_threads)
    return rows


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure_memory(engine: str, case: Case) -> dict[str, Any]:
    """Peak extra resident memory of one call, in *this* (fresh) process.

    torch allocates CPU tensors with ``malloc`` (large blocks are ``mmap``-ed and
    returned on free), which ``tracemalloc`` does not see, and torch keeps no
    CPU peak statistics; so the resident set is measured instead.  After
    building the input and warm-up calls on small inputs (loading kernels,
    starting threads, compiling the fast engine's plan for this ``N``), the
    kernel's high-water mark is reset (``/proc/self/clear_refs``); the peak
    extra memory is ``VmHWM`` after the call minus ``VmRSS`` before it.  Where
    the reset is not allowed, ``ru_maxrss`` before and after is used instead.
    """
    x = make_input(case)
    run = ENGINES[engine]
    run(torch.ones((case.n, case.n) if engine == "fast" else (2, 2), dtype=x.dtype))
    run(torch.ones((2, WARM_M), dtype=x.dtype))
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        method = "VmHWM - VmRSS, high-water mark reset via /proc/self/clear_refs"
        before = _rss_kib("VmRSS")
    except OSError:
        method = "ru_maxrss delta (high-water mark could not be reset)"
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run(x)
    if method.startswith("VmHWM"):
        peak = _rss_kib("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    extra = (peak - before) * 1024
    return {
        "extra_bytes": extra,
        "input_bytes": x.numel() * x.element_size(),
        "output_bytes": result.numel() * result.element_size(),
        "method": method,
    }


def memory_in_subprocess(engine: str, case: Case, threads: int) -> dict[str, Any]:
    """Run :func:`measure_memory` in a fresh interpreter on ``threads`` torch threads; return its figures."""
    out = subprocess.run(
        [sys.executable, __file__, "--threads", str(threads), "--memory", engine, json.dumps(case._asdict())],
        check=True,
        capture_output=True,
        text=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


FIRST_CALL_PROBE = """
import json, sys, time
start = time.perf_counter()
import torch
import ring_ref
imported, cpu = time.perf_counter(), time.process_time()
torch.set_num_threads(int(sys.argv[1]))
x = torch.ones((8, 2**16), dtype=torch.float32)
ring_ref.ring_all_reduce(x, engine="fast")
done, cpu = time.perf_counter(), time.process_time() - cpu
ring_ref.ring_all_reduce(x, engine="fast")
again = time.perf_counter() - done
print(json.dumps({"import_s": imported - start, "first_call_s": done - imported, "first_call_cpu_s": cpu,
                  "second_call_s": again}))
"""
"""Seconds to import ``ring_ref`` (and torch) and for the first fast call, float32, in a fresh interpreter.

The call is on ``N = 8, M = 2^16`` contiguous float32: it imports the kernel
module (and llvmlite), compiles or loads the kernel, and compiles the plan for
``N = 8``.
"""


def first_call(threads: int) -> dict[str, dict[str, float]]:
    """:data:`FIRST_CALL_PROBE` in two fresh interpreters sharing an empty kernel cache: cold, then warm.

    ``RING_REF_CACHE_DIR`` (:data:`ring_ref._fast._kernel.CACHE_ENV`) points at a new
    temporary directory, which the kernel prefers to every other cache
    location, so the first run compiles the kernel and the second loads it,
    as on a machine where it ran before.
    """
    figures = {}
    with tempfile.TemporaryDirectory(prefix="ring-ref-kernels-") as cache:
        for name in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", FIRST_CALL_PROBE, str(threads)],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "RING_REF_CACHE_DIR": cache},
            )
            figures[name] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def fmt_s(seconds: float | None) -> str:
    """Seconds as a short human string."""
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def fmt_x(ratio: float | None) -> str:
    """A ratio as ``1.23x``."""
    return "—" if ratio is None else f"{ratio:.2f}x"


def relative_memory(row: dict[str, Any], engine: str, base: str) -> float | None:
    """Peak extra memory of ``engine`` on ``row``'s case over its ``base`` (input or output) size."""
    figures = row["memory"].get(engine)
    return None if figures is None else float(figures["extra_bytes"] / figures[f"{base}_bytes"])


def report(rows: list[dict[str, Any]], reference_max_n: int, threads: int) -> list[str]:
    """The table that ``make bench`` prints (Markdown, pasted into ``docs/guide/engines.md``)."""
    lines = [
        f"| case | fast, 1 thread | torch.sum, 1 thread | fast / sum, 1 thread | fast, {threads} threads "
        f"| torch.sum, {threads} threads | fast / sum, {threads} threads | reference, 1 thread "
        "| reference / sum | fast peak extra / output | reference peak extra / input "
        "| torch.sum peak extra / output |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        t, d = row["median_s"], row["default_threads"]["median_s"]
        ref = t.get("reference")
        ref_time = fmt_s(ref) if ref is not None else f"skipped (N > {reference_max_n})"
        lines.append(
            f"| {row['case']['label']} | {fmt_s(t['fast'])} | {fmt_s(t['torch.sum'])} | "
            f"{fmt_x(t['fast'] / t['torch.sum'])} | {fmt_s(d['fast'])} | {fmt_s(d['torch.sum'])} | "
            f"{fmt_x(d['fast'] / d['torch.sum'])} | {ref_time} | "
            f"{fmt_x(None if ref is None else ref / t['torch.sum'])} | "
            f"{fmt_x(relative_memory(row, 'fast', 'output'))} | "
            f"{fmt_x(relative_memory(row, 'reference', 'input'))} | "
            f"{fmt_x(relative_memory(row, 'torch.sum', 'output'))} |"
        )
    return lines


def target_lines(
    rows: list[dict[str, Any]], sweep: list[dict[str, Any]], cold: dict[str, dict[str, float]], threads: int
) -> list[str]:
    """Each target of the issues with the measured figure and met / missed."""
    by_label = {row["case"]["label"]: row for row in rows}
    lines = []
    for text, label, limit in TARGETS:
        for where, t in (
            ("1 thread", by_label[label]["median_s"]),
            (f"{threads} threads", by_label[label]["default_threads"]["median_s"]),
        ):
            ratio = t["fast"] / t["torch.sum"]
            verdict = "met" if ratio <= limit else "MISSED"
            lines.append(f"target {text}, {where} <= {limit:g}: {ratio:.2f}  {verdict}")
    compile_s = cold["cold"]["first_call_s"]
    lines.append(
        f"target first fast call in a fresh process, importing llvmlite and compiling the kernel, <= "
        f"{FIRST_CALL_TARGET_S:g} s: {compile_s:.2f} s ({cold['cold']['first_call_cpu_s']:.2f} s of CPU; "
        f"after {cold['cold']['import_s']:.2f} s to import torch and ring_ref)  "
        f"{'met' if compile_s <= FIRST_CALL_TARGET_S else 'MISSED'}"
    )
    lines.append(
        f"first fast call with the kernel already compiled on disk: {cold['warm']['first_call_s']:.2f} s "
        f"(after {cold['warm']['import_s']:.2f} s of imports); the next call: "
        f"{fmt_s(cold['warm']['second_call_s'])}"
    )
    big = [r for r in rows if r["memory"]["fast"]["output_bytes"] >= MEMORY_RESOLUTION_BYTES]
    worst = max(big, key=lambda r: relative_memory(r, "fast", "output") or 0.0)
    fast_mem = relative_memory(worst, "fast", "output") or 0.0
    verdict = "met" if fast_mem <= 1.1 else "MISSED"
    lines.append(
        f"target fast peak extra <= 1.1 x output (worst, output >= 1 MiB: {worst['case']['label']}): "
        f"{fast_mem:.2f}  {verdict}"
    )
    ref_rows = [r for r in rows if "reference" in r["memory"]]
    if ref_rows:
        ref_mem = max(relative_memory(r, "reference", "input") or 0.0 for r in ref_rows)
        lines.append(
            f"target reference peak extra <= 1.1 x input (worst measured case): {ref_mem:.2f}  "
            f"{'met' if ref_mem <= 1.1 else 'MISSED'}"
        )
    practical = [r["case"]["n"] for r in sweep if r["median_s"].get("reference", float("inf")) <= 1.0]
    lines.append(
        "reference engine practical (<= 1 s per call at M = 4096, float32) up to N = "
        f"{max(practical) if practical else 'none'}"
    )
    return lines


def plot(sweep: list[dict[str, Any]], path: Path) -> None:
    """Time against N (log-log) for each engine and the baseline, M = 4096 float32."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for engine, style in (("reference", "s-"), ("fast", "o-"), ("torch.sum", "^--")):
        points = [(r["case"]["n"], r["median_s"][engine]) for r in sweep if engine in r["median_s"]]
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=engine)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("N (workers)")
    ax.set_ylabel("median time per call (s)")
    ax.set_title("ring_all_reduce, float32, M = 4096 elements per worker")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_cases(reference_max_n: int, budget_s: float, default_threads: int) -> list[dict[str, Any]]:
    """Every case of :data:`CASES` timed at one thread and at ``default_threads``, with its memory."""
    rows = []
    for case in CASES:
        torch.set_num_threads(1)
        row = time_case(case, reference_max_n, budget_s)
        torch.set_num_threads(default_threads)
        row["default_threads"] = time_case(case, reference_max_n, budget_s, reference=False)
        row["memory"] = {
            e: memory_in_subprocess(e, case, 1) for e in ENGINES if runs_of(e, case, reference_max_n)
        }
        if case.n > reference_max_n:
            print(f"  {case.label}: reference skipped (N = {case.n} > --reference-max-n {reference_max_n})")
        rows.append(row)
        print(
            f"  {case.label}, 1 thread: "
            + ", ".join(f"{e} {fmt_s(s)}" for e, s in row["median_s"].items())
            + f"; {default_threads} threads: "
            + ", ".join(f"{e} {fmt_s(s)}" for e, s in row["default_threads"]["median_s"].items()),
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; ``--memory`` is the subprocess entry."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "bench", help="folder for bench.json and bench.png"
    )
    parser.add_argument(
        "--reference-max-n",
        type=int,
        default=64,
        help="run the reference engine only up to this N (default 64)",
    )
    parser.add_argument(
        "--budget", type=float, default=3.0, help="seconds of repeated runs per engine and size"
    )
    parser.add_argument(
        "--only",
        choices=["directions"],
        help="run only this row: 'directions', the rings of the other direction against the spec ring's",
    )
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--memory", nargs=2, metavar=("ENGINE", "CASE_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    default_threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.memory:
        print(json.dumps(measure_memory(args.memory[0], Case(**json.loads(args.memory[1])))))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = platform.processor() or platform.machine()
    print(
        f"torch {torch.__version__}, 1 thread and {default_threads} threads (the default), {cpu}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    if args.only == "directions":
        print("\n".join(direction_lines(run_directions(args.budget, default_threads))))
        return 0
    cold = first_call(default_threads)
    print(f"  first fast call in a fresh process: {json.dumps(cold)}", flush=True)
    rows = run_cases(args.reference_max_n, args.budget, default_threads)
    torch.set_num_threads(1)
    sweep = []
    for case in SWEEP:
        sweep.append(time_case(case, args.reference_max_n, args.budget))
        print(
            f"  sweep {case.label}, 1 thread: "
            + ", ".join(f"{e} {fmt_s(s)}" for e, s in sweep[-1]["median_s"].items()),
            flush=True,
        )
    directions = run_directions(args.budget, default_threads)
    print()
    table = report(rows, args.reference_max_n, default_threads)
    targets = target_lines(rows, sweep, cold, default_threads) + direction_lines(directions)
    print("\n".join(table))
    print()
    print("\n".join(targets))
    checked = rows + sweep + [r["default_threads"] for r in rows]
    mismatched = [r["case"]["label"] for r in checked if r["bitwise_equal_to_reference"] is False]
    print(
        "fast == reference bit for bit on every size both ran: "
        + ("yes" if not mismatched else f"NO: {mismatched}")
    )
    first = {r["case"]["label"]: r["fast_first_call_s"] for r in rows}
    print(
        "fast engine first call per size (compiles and caches the plan for N; the kernel is compiled): "
        + ", ".join(f"{k} {fmt_s(v)}" for k, v in first.items())
    )
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    payload = {
        "cases": rows,
        "sweep": sweep,
        "directions": directions,
        "first_call": cold,
        "table": table,
        "targets": targets,
        "torch": torch.__version__,
        "threads": [1, default_threads],
        "loadavg_end": os.getloadavg()[0],
    }
    (args.out / "bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(sweep, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
