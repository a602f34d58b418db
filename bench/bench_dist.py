"""``make bench-dist``: ``ring_all_reduce_`` against ``dist.all_reduce`` on the same gloo processes.

For each world size ``N`` one group of ``N`` processes on 127.0.0.1 (``ring_ref._processes._gloo``) runs
both all-reduces on the same float32 tensor sizes, taking turns within each repetition (which
one goes first alternates) so that machine noise hits both alike.  A repetition's time is the
slowest rank's (ranks start together after a barrier); reported are medians over repetitions,
and bus bandwidth ``2 (N - 1) / N * bytes / time``, as nccl-tests reports it.  Then the same
processes time DDP training steps of one model with DDP's default all-reduce and with
``ring_ref.distributed.ring_hook``, again taking turns.  The chain (``schedule="chain"``, spec
section 15: a pipelined chain reduce and broadcast, N segments, 2 (N - 1) steps of S / N elements per
phase) takes turns with them on the same tensors; its bus bandwidth is computed with the same
all-reduce formula, so that the columns compare times.  All of this is repeated on ``--runs``
fresh groups (default 5), and every cell is the median over the runs: one run's ratios tend to
move together, by up to about 1.5x between runs on this 2-core machine (with 3 groups, one
unlucky pair of them moved a cell by about 0.1x).

Every ratio is printed against its target (reported, not asserted).  Results go to a JSON file
and a plot in a scratch folder (``build/bench-dist``); ``--update`` writes the committed
``docs/bench/bench_dist.json`` and ``bench_dist.png`` (shown in the docs) instead.  ``--help`` lists
the options.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ring_ref._processes._gloo import ProcessRing
from ring_ref.distributed import ring_all_reduce_, ring_hook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = tuple(4 << (10 + 2 * k) for k in range(8))  # 4 KiB, 16 KiB, ..., 64 MiB per rank
TARGETS = (  # (label, smallest and largest size in bytes it applies to, largest ratio)
    ("at >= 1 MiB per rank", 1 << 20, 1 << 62, 1.25),
    ("below 64 KiB per rank", 0, (64 << 10) - 1, 2.0),
)
DDP_TARGET = 1.5
COLLECTIVES = ("all_reduce", "ring", "chain")
MIN_REPS, MAX_REPS = 5, 60
DDP_STEPS, DDP_WARMUP = 12, 2


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def collective_rank(rank: int, n: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """On one rank: per size, each repetition's time of ``dist.all_reduce`` and of the ring."""
    torch.set_num_threads(spec["threads"])
    rows = []
    for nbytes in spec["sizes"]:
        gen = torch.Generator().manual_seed(rank)
        source = torch.randn(nbytes // 4, generator=gen)
        a, b, c = source.clone(), source.clone(), source.clone()
        dist.all_reduce(a)  # warm-up, and the sanity check below
        ring_all_reduce_(b)
        ring_all_reduce_(c, schedule="chain")
        if not (torch.allclose(a, b, rtol=1e-4, atol=1e-4) and torch.allclose(a, c, rtol=1e-4, atol=1e-4)):
            raise AssertionError(f"{nbytes} bytes: the ring's or the chain's sum is not dist.all_reduce's")
        ops: dict[str, Callable[[], object]] = {
            "all_reduce": partial(dist.all_reduce, a),
            "ring": partial(ring_all_reduce_, b),
            "chain": partial(ring_all_reduce_, c, schedule="chain"),
        }
        estimate = sum(_timed(op) for op in ops.values())
        budget = torch.tensor([estimate])
        dist.all_reduce(budget, op=dist.ReduceOp.MAX)  # every rank must run the same repetitions
        reps = int(min(MAX_REPS, max(MIN_REPS, spec["budget_s"] / max(float(budget), 1e-6))))
        times: dict[str, list[float]] = {name: [] for name in ops}
        for rep in range(reps):
            for tensor in (a, b, c):
                tensor.copy_(source)
            for name in list(ops) if rep % 2 == 0 else list(ops)[::-1]:
                times[name].append(_timed(ops[name]))
        rows.append({"bytes": nbytes, **times})
    return rows


def _model(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def ddp_rank(rank: int, n: int, spec: dict[str, Any]) -> dict[str, list[float]]:
    """On one rank: step times of the same model under DDP's default hook and under ``ring_hook``."""
    torch.set_num_threads(spec["threads"])
    width, depth, batch = spec["width"], spec["depth"], spec["batch"]
    default = DistributedDataParallel(_model(width, depth))
    ring = DistributedDataParallel(_model(width, depth))
    ring.register_comm_hook(None, ring_hook)
    runs = {
        "default": (default, torch.optim.SGD(default.parameters(), lr=1e-3)),
        "ring_hook": (ring, torch.optim.SGD(ring.parameters(), lr=1e-3)),
    }
    gen = torch.Generator().manual_seed(rank)
    inputs, targets = torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)
    times: dict[str, list[float]] = {name: [] for name in runs}

    def step(name: str) -> None:
        model, optimizer = runs[name]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    for k in range(DDP_WARMUP + spec["steps"]):
        order = list(runs) if k % 2 == 0 else list(runs)[::-1]
        for name in order:
            elapsed = _timed(partial(step, name))
            if k >= DDP_WARMUP:
                times[name].append(elapsed)
    return times


def slowest(per_rank: list[list[float]]) -> list[float]:
    """Per repetition, the slowest rank's time: a collective is done when its last rank is."""
    return [max(times) for times in zip(*per_rank, strict=True)]


def bus_bandwidth(n: int, nbytes: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, bytes per second."""
    return 2 * (n - 1) / n * nbytes / seconds


def fmt_bytes(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"


def verdict(ratio: float, limit: float) -> str:
    return "met" if ratio <= limit else "MISSED"


def measure_once(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both benchmarks on one group of ``n`` processes."""
    spec = {"sizes": args.sizes, "threads": args.threads, "budget_s": args.budget}
    ddp_spec = {"threads": args.threads, "steps": args.ddp_steps, "width": args.ddp_width}
    ddp_spec |= {"depth": args.ddp_depth, "batch": args.ddp_batch}
    with ProcessRing(n, group_timeout_s=600) as ring:
        per_rank = ring.run(collective_rank, spec, timeout_s=3600)
        ddp = ring.run(ddp_rank, ddp_spec, timeout_s=3600) if args.ddp_steps else None
    rows = []
    for k, nbytes in enumerate(args.sizes):
        row: dict[str, Any] = {"n": n, "bytes": nbytes}
        for name in COLLECTIVES:
            median = statistics.median(slowest([r[k][name] for r in per_rank]))
            row[f"{name}_s"] = median
            row[f"{name}_busbw_GBps"] = bus_bandwidth(n, nbytes, median) / 1e9
        row["ratio"] = row["ring_s"] / row["all_reduce_s"]
        row["chain_ratio"] = row["chain_s"] / row["all_reduce_s"]
        row["reps"] = len(per_rank[0][k]["ring"])
        rows.append(row)
    result: dict[str, Any] = {"n": n, "collective": rows}
    if ddp is not None:
        steps = {name: statistics.median(slowest([r[name] for r in ddp])) for name in ddp[0]}
        params = sum(p.numel() for p in _model(args.ddp_width, args.ddp_depth).parameters())
        result["ddp"] = {
            "default_step_s": steps["default"],
            "ring_hook_step_s": steps["ring_hook"],
            "ratio": steps["ring_hook"] / steps["default"],
            "parameters": params,
            "steps": args.ddp_steps,
        }
    return result


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both benchmarks on ``args.runs`` fresh groups of ``n`` processes, one after another.

    A cell is the median over the runs: of the times, and of the per-run ratios (kept in
    ``run_ratios``).  A run's ratios move together (where its processes and gloo's threads
    landed on the cores), so whole runs are repeated rather than repetitions within one.
    """
    runs = [measure_once(n, args) for _ in range(args.runs)]
    rows = []
    for k, first in enumerate(runs[0]["collective"]):
        row: dict[str, Any] = {"n": n, "bytes": first["bytes"]}
        for name in COLLECTIVES:
            median = statistics.median(run["collective"][k][f"{name}_s"] for run in runs)
            row[f"{name}_s"] = median
            row[f"{name}_busbw_GBps"] = bus_bandwidth(n, first["bytes"], median) / 1e9
        row["run_ratios"] = [run["collective"][k]["ratio"] for run in runs]
        row["ratio"] = statistics.median(row["run_ratios"])
        row["chain_run_ratios"] = [run["collective"][k]["chain_ratio"] for run in runs]
        row["chain_ratio"] = statistics.median(row["chain_run_ratios"])
        row["reps"] = sum(run["collective"][k]["reps"] for run in runs)
        rows.append(row)
    result: dict[str, Any] = {"n": n, "runs": args.runs, "collective": rows}
    if "ddp" in runs[0]:
        ddps = [run["ddp"] for run in runs]
        result["ddp"] = {
            "default_step_s": statistics.median(d["default_step_s"] for d in ddps),
            "ring_hook_step_s": statistics.median(d["ring_hook_step_s"] for d in ddps),
            "run_ratios": [d["ratio"] for d in ddps],
            "ratio": statistics.median(d["ratio"] for d in ddps),
            "parameters": ddps[0]["parameters"],
            "steps": sum(d["steps"] for d in ddps),
        }
    return result


def report(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| N | per rank | dist.all_reduce | ring_all_reduce_ | ratio | chain | chain ratio "
        "| bus bw all_reduce | bus bw ring | bus bw chain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for row in res["collective"]:
            lines.append(
                f"| {row['n']} | {fmt_bytes(row['bytes'])} | {fmt_s(row['all_reduce_s'])} | "
                f"{fmt_s(row['ring_s'])} | {row['ratio']:.2f}x | {fmt_s(row['chain_s'])} | "
                f"{row['chain_ratio']:.2f}x | {row['all_reduce_busbw_GBps']:.3f} GB/s | "
                f"{row['ring_busbw_GBps']:.3f} GB/s | {row['chain_busbw_GBps']:.3f} GB/s |"
            )
    ddp_rows = [res for res in results if "ddp" in res]
    if ddp_rows:
        lines += ["", "| N | DDP step, default hook | DDP step, ring_hook | ratio |", "|---|---|---|---|"]
        for res in ddp_rows:
            d = res["ddp"]
            lines.append(
                f"| {res['n']} | {fmt_s(d['default_step_s'])} | {fmt_s(d['ring_hook_step_s'])} | "
                f"{d['ratio']:.2f}x |"
            )
    return lines


def target_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for label, low, high, limit in TARGETS:
        for res in results:
            picked = [row for row in res["collective"] if low <= row["bytes"] <= high]
            if picked:
                worst = max(picked, key=lambda row: row["ratio"])
                ratios = ", ".join(f"{fmt_bytes(r['bytes'])} {r['ratio']:.2f}x" for r in picked)
                lines.append(
                    f"ring / all_reduce {label}, N={res['n']}: worst {worst['ratio']:.2f}x "
                    f"(target <= {limit}x: {verdict(worst['ratio'], limit)}); {ratios}"
                )
    for res in results:
        ratios = ", ".join(f"{fmt_bytes(r['bytes'])} {r['chain_ratio']:.2f}x" for r in res["collective"])
        lines.append(f"chain / all_reduce, N={res['n']} (reported; no target): {ratios}")
    for res in results:
        if "ddp" in res:
            ratio = res["ddp"]["ratio"]
            lines.append(
                f"DDP step ring_hook / default, N={res['n']}: {ratio:.2f}x "
                f"(target <= {DDP_TARGET}x: {verdict(ratio, DDP_TARGET)})"
            )
    return lines


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Bus bandwidth against size, one panel per world size."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        sizes = [row["bytes"] for row in res["collective"]]
        for name, label in (
            ("all_reduce", "dist.all_reduce (gloo)"),
            ("ring", "ring_all_reduce_"),
            ("chain", 'ring_all_reduce_(schedule="chain")'),
        ):
            ax.plot(sizes, [row[f"{name}_busbw_GBps"] for row in res["collective"]], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank (float32)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"N = {res['n']} gloo processes on 127.0.0.1")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks for each world size, print the table and the targets, write JSON and plot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4])
    parser.add_argument(
        "--sizes", type=lambda s: [int(v) for v in s.split(",")], default=list(SIZES), help="bytes per rank"
    )
    parser.add_argument(
        "--budget", type=float, default=2.0, help="seconds of repetitions per size, N and run"
    )
    parser.add_argument("--runs", type=int, default=5, help="fresh process groups per N (medians over them)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (torchrun's default)")
    parser.add_argument("--ddp-steps", type=int, default=DDP_STEPS, help="timed DDP steps per hook (0: skip)")
    parser.add_argument("--ddp-width", type=int, default=1024)
    parser.add_argument("--ddp-depth", type=int, default=4)
    parser.add_argument("--ddp-batch", type=int, default=32)
    parser.add_argument("--update", action="store_true", help="write the committed docs/bench/ files")
    parser.add_argument("--out", type=Path, default=None, help="folder for the results (default: scratch)")
    args = parser.parse_args(argv)
    out = args.out or (ROOT / "docs" / "bench" if args.update else ROOT / "build" / "bench-dist")
    load_before = os.getloadavg()
    started = time.monotonic()
    results = [measure(n, args) for n in args.world_sizes]
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()
    lines = report(results)
    print("\n".join(lines))
    print()
    print("\n".join(target_lines(results)))
    print(
        f"\nload average {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} CPUs; "
        f"{elapsed:.0f} s"
    )
    payload = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "threads_per_rank": args.threads,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "seconds": elapsed,
        },
        "targets": target_lines(results),
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_dist.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(results, out / "bench_dist.png")
    print(f"wrote {out / 'bench_dist.json'} and {out / 'bench_dist.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
