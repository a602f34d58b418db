"""``make bench``: the fast engine, the reference engine and ``torch.sum(x, 0)``, side by side.

Times are medians of repeated runs after one warm-up run, the engines taking
turns within each repetition so that machine noise hits all of them alike.
Peak extra memory is measured once per engine and size in a fresh subprocess
(see :func:`measure_memory`).  Writes ``bench/results/bench.json`` and
``bench/results/bench.png``; ``--help`` lists the options.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ring_ref import _fast, ring_all_reduce
from ring_ref._dtypes import bits

HERE = Path(__file__).resolve().parent
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENGINES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fast": lambda x: ring_all_reduce(x, engine="fast"),
    "reference": lambda x: ring_all_reduce(x, engine="reference"),
    "torch.sum": lambda x: torch.sum(x, 0),
}
TARGETS = (
    ("fast / torch.sum at float32 N=8 M=2^22", "f32 N=8 M=2^22", 1.5),
    ("fast / torch.sum at float32 N=1024 M=4096", "f32 N=1024 M=4096", 30.0),
)


class Case(NamedTuple):
    """One benchmarked input: ``n`` workers of ``m`` elements of ``dtype``."""

    label: str
    n: int
    m: int
    dtype: str


CASES = (
    Case("f32 N=8 M=2^22", 8, 2**22, "float32"),
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


def time_case(case: Case, reference_max_n: int, budget_s: float) -> dict[str, Any]:
    """Median seconds per engine on ``case``, plus the fast engine's first (plan-compiling) call."""
    x = make_input(case)
    engines = [e for e in ENGINES if runs_of(e, case, reference_max_n)]
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


def report(rows: list[dict[str, Any]], reference_max_n: int) -> list[str]:
    """The table and target lines that ``make bench`` prints (Markdown, pasted into the README)."""
    lines = [
        "| case | fast | reference | torch.sum | fast / sum | reference / sum | fast peak extra / output "
        "| reference peak extra / input | torch.sum peak extra / output |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        t = row["median_s"]
        ref = t.get("reference")
        ref_time = fmt_s(ref) if ref is not None else f"skipped (N > {reference_max_n})"
        lines.append(
            f"| {row['case']['label']} | {fmt_s(t['fast'])} | {ref_time} | {fmt_s(t['torch.sum'])} | "
            f"{fmt_x(t['fast'] / t['torch.sum'])} | {fmt_x(None if ref is None else ref / t['torch.sum'])} | "
            f"{fmt_x(relative_memory(row, 'fast', 'output'))} | "
            f"{fmt_x(relative_memory(row, 'reference', 'input'))} | "
            f"{fmt_x(relative_memory(row, 'torch.sum', 'output'))} |"
        )
    return lines


def target_lines(rows: list[dict[str, Any]], sweep: list[dict[str, Any]]) -> list[str]:
    """Each target of the issue with the measured figure and met / missed."""
    by_label = {row["case"]["label"]: row for row in rows}
    lines = []
    for text, label, limit in TARGETS:
        t = by_label[label]["median_s"]
        ratio = t["fast"] / t["torch.sum"]
        lines.append(f"target {text} <= {limit:g}: {ratio:.2f}  {'met' if ratio <= limit else 'MISSED'}")
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; ``--memory`` is the subprocess entry."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="folder for bench.json and bench.png"
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
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for every engine and the baseline (default 1; 0 keeps torch's default)",
    )
    parser.add_argument("--memory", nargs=2, metavar=("ENGINE", "CASE_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.memory:
        print(json.dumps(measure_memory(args.memory[0], Case(**json.loads(args.memory[1])))))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = platform.processor() or platform.machine()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}, load {os.getloadavg()[0]:.2f}"
    )
    rows = []
    for case in CASES:
        row = time_case(case, args.reference_max_n, args.budget)
        row["memory"] = {
            e: memory_in_subprocess(e, case, args.threads)
            for e in ENGINES
            if runs_of(e, case, args.reference_max_n)
        }
        if case.n > args.reference_max_n:
            print(
                f"  {case.label}: reference skipped (N = {case.n} > --reference-max-n {args.reference_max_n})"
            )
        rows.append(row)
        print(
            f"  {case.label}: " + ", ".join(f"{e} {fmt_s(s)}" for e, s in row["median_s"].items()), flush=True
        )
    sweep = []
    for case in SWEEP:
        sweep.append(time_case(case, args.reference_max_n, args.budget))
        print(
            f"  sweep {case.label}: "
            + ", ".join(f"{e} {fmt_s(s)}" for e, s in sweep[-1]["median_s"].items()),
            flush=True,
        )
    print()
    table = report(rows, args.reference_max_n)
    targets = target_lines(rows, sweep)
    print("\n".join(table))
    print()
    print("\n".join(targets))
    mismatched = [r["case"]["label"] for r in rows + sweep if r["bitwise_equal_to_reference"] is False]
    print(
        "fast == reference bit for bit on every size both ran: "
        + ("yes" if not mismatched else f"NO: {mismatched}")
    )
    cold = {r["case"]["label"]: r["fast_first_call_s"] for r in rows}
    print(
        "fast engine first call (compiles and caches the plan for N): "
        + ", ".join(f"{k} {fmt_s(v)}" for k, v in cold.items())
    )
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    payload = {
        "cases": rows,
        "sweep": sweep,
        "table": table,
        "targets": targets,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "loadavg_end": os.getloadavg()[0],
    }
    (args.out / "bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(sweep, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
