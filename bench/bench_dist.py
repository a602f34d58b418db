"""``make bench-dist``: ``ring_all_reduce_`` against ``dist.all_reduce`` on the same gloo processes.

For each world size ``N`` one group of ``N`` processes on 127.0.0.1 (``ring_ref._processes._gloo``) runs
both all-reduces on the same float32 tensor sizes, taking turns within each repetition (which
one goes first alternates) so that machine noise hits both alike; then, alike,
``ring_reduce_scatter_`` against gloo's ``reduce_scatter_tensor`` and ``ring_all_gather_`` against
its ``all_gather_into_tensor`` (a size is the larger tensor of a rank: the reduce-scatter's input,
the all-gather's output).  A repetition's time is the
slowest rank's (ranks start together after a barrier); reported are medians over repetitions,
and bus bandwidth ``2 (N - 1) / N * bytes / time`` (``(N - 1) / N`` for reduce-scatter and
all-gather), as nccl-tests reports it.  Then the same
processes time DDP training steps of one model with DDP's default all-reduce, with
``ring_ref.distributed.ring_hook`` and on a ``"ring_ref"`` group, and FSDP2 steps (no custom comms)
on gloo's world and on a ``"ring_ref"`` group, again taking turns.  All of this is repeated on ``--runs``
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
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from ring_ref._processes._gloo import SpawnedGroup  # noqa: E402
from ring_ref.distributed import ring_all_gather_, ring_all_reduce_, ring_hook, ring_reduce_scatter_  # noqa: E402
from tests.common.backend_groups import ring_ref_group  # noqa: E402

SIZES = tuple(4 << (10 + 2 * k) for k in range(8))  # 4 KiB, 16 KiB, ..., 64 MiB per rank
TARGETS = (  # (label, smallest and largest size in bytes it applies to, largest ratio)
    ("at >= 1 MiB per rank", 1 << 20, 1 << 62, 1.25),
    ("below 64 KiB per rank", 0, (64 << 10) - 1, 2.0),
)
DDP_TARGET = 1.5
MIN_REPS, MAX_REPS = 5, 60
DDP_STEPS, DDP_WARMUP = 12, 2
BACKEND = ("backend_all_reduce", "backend_reduce_scatter", "backend_all_gather", "backend_chain")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "chain", *BACKEND, "backend_layer")
"""The collectives timed: each gloo's own (its ``dist`` function's name) against the ring's; ``chain``
is ``ring_all_reduce_(schedule="chain")`` (spec/schedules.md) against ``dist.all_reduce``, with no target.
The ``backend_*`` ones are the same ``dist`` call on gloo's world and on a ``"ring_ref"`` group
(``backend_chain``: of order ``chain``); ``backend_layer`` is ``ring_all_reduce_`` called directly
against ``dist.all_reduce`` on a ``"ring_ref"`` group: what the backend layer itself costs."""
RESULT_KEY = {"all_reduce": "collective", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather"}
RESULT_KEY |= {c: c for c in ("chain", *BACKEND, "backend_layer")}
"""Where each collective's rows are in a result (the all-reduce's under its first name)."""
RING_NAME = {"all_reduce": "ring_all_reduce_", "reduce_scatter": "ring_reduce_scatter_"}
RING_NAME["all_gather"] = "ring_all_gather_"
RING_NAME["chain"] = 'ring_all_reduce_(schedule="chain")'
RING_NAME |= {c: f"{c.removeprefix('backend_')} on ring_ref" for c in BACKEND}
RING_NAME |= {"backend_all_reduce": "all_reduce on ring_ref", "backend_layer": "all_reduce on ring_ref"}
GLOO_NAME = {"all_reduce": "dist.all_reduce", "reduce_scatter": "dist.reduce_scatter_tensor"}
GLOO_NAME["all_gather"] = "dist.all_gather_into_tensor"
GLOO_NAME["chain"] = "dist.all_reduce"
GLOO_NAME |= {"backend_all_reduce": "dist.all_reduce", "backend_chain": "dist.all_reduce"}
GLOO_NAME |= {
    "backend_reduce_scatter": GLOO_NAME["reduce_scatter"],
    "backend_all_gather": GLOO_NAME["all_gather"],
}
GLOO_NAME["backend_layer"] = "ring_all_reduce_"
BACKEND_TARGETS = {"backend_all_reduce": 1.25, "backend_chain": 2.0}
"""The backend's targets at >= 1 MiB per rank, against gloo's own all-reduce (the spec's ring, the chain)."""


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _operations(
    collective: str, rank: int, n: int, nbytes: int
) -> tuple[dict[str, Callable[[], object]], Callable[[], None], torch.Tensor, torch.Tensor]:
    """gloo's and the ring's call of ``collective`` on ``nbytes`` per rank, the reset before each
    repetition (an all-reduce works in place), and the two results.  A ``backend_*`` collective is
    the ``dist`` call on gloo's world (``backend_layer``: ``ring_all_reduce_`` called directly)
    against the same ``dist`` call on a ``"ring_ref"`` group."""
    gen = torch.Generator().manual_seed(rank)
    elements = nbytes // 4
    kind = collective.removeprefix("backend_")
    group = None
    if collective.startswith("backend_"):
        group = ring_ref_group("chain" if kind == "chain" else "spec")
    if kind in ("all_reduce", "chain", "layer"):
        source = torch.randn(elements, generator=gen)
        a, b = source.clone(), source.clone()
        first: Callable[[], object] = (
            partial(ring_all_reduce_, a) if kind == "layer" else partial(dist.all_reduce, a)
        )
        second: Callable[[], object] = (
            partial(ring_all_reduce_, b, schedule="chain" if kind == "chain" else "spec")
            if group is None
            else partial(dist.all_reduce, b, group=group)
        )

        def reset() -> None:
            a.copy_(source)
            b.copy_(source)

        return {collective: first, "ring": second}, reset, a, b
    if kind == "reduce_scatter":
        source = torch.randn(elements, generator=gen)
        a, b = torch.empty(elements // n), torch.empty(elements // n)
        first = partial(dist.reduce_scatter_tensor, a, source)
        second = (
            partial(ring_reduce_scatter_, b, source)
            if group is None
            else partial(dist.reduce_scatter_tensor, b, source, group=group)
        )
    else:
        source = torch.randn(elements // n, generator=gen)
        a, b = torch.empty(elements), torch.empty(elements)
        first = partial(dist.all_gather_into_tensor, a, source)
        second = (
            partial(ring_all_gather_, b, source)
            if group is None
            else partial(dist.all_gather_into_tensor, b, source, group=group)
        )
    return {collective: first, "ring": second}, lambda: None, a, b


def collective_rank(rank: int, n: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """On one rank: per size, each repetition's time of gloo's ``spec["collective"]`` and of the ring's."""
    torch.set_num_threads(spec["threads"])
    # torch 2.13 deprecates both in favour of *_single; they are what the issue compares against.
    warnings.filterwarnings(
        "ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
    )
    collective = spec["collective"]
    rows = []
    for nbytes in spec["sizes"]:
        ops, reset, a, b = _operations(collective, rank, n, nbytes)
        for op in ops.values():  # warm-up, and the sanity check below
            op()
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{nbytes} bytes: the ring's {collective} is not gloo's")
        estimate = _timed(ops[collective]) + _timed(ops["ring"])
        budget = torch.tensor([estimate])
        dist.all_reduce(budget, op=dist.ReduceOp.MAX)  # every rank must run the same repetitions
        reps = int(min(MAX_REPS, max(MIN_REPS, spec["budget_s"] / max(float(budget), 1e-6))))
        times: dict[str, list[float]] = {name: [] for name in ops}
        for rep in range(reps):
            reset()
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


def _fsdp(width: int, depth: int, group: dist.ProcessGroup) -> torch.nn.Module:
    """The model under FSDP2 on ``group`` with torch's own comms: each ``Linear``, then the whole."""
    from torch.distributed.device_mesh import DeviceMesh  # FSDP takes a second to import
    from torch.distributed.fsdp import fully_shard

    model = _model(width, depth)
    mesh = DeviceMesh.from_group(group, "cpu")
    for module in [*(m for m in model.modules() if isinstance(m, torch.nn.Linear)), model]:
        fully_shard(module, mesh=mesh)
    return model


def ddp_rank(rank: int, n: int, spec: dict[str, Any]) -> dict[str, list[float]]:
    """On one rank: step times of the same model under DDP's default hook, under ``ring_hook`` and on
    a ``"ring_ref"`` group, and under FSDP2 on gloo's world and on a ``"ring_ref"`` group."""
    torch.set_num_threads(spec["threads"])
    width, depth, batch = spec["width"], spec["depth"], spec["batch"]
    default = DistributedDataParallel(_model(width, depth))
    ring = DistributedDataParallel(_model(width, depth))
    ring.register_comm_hook(None, ring_hook)
    backend = DistributedDataParallel(_model(width, depth), process_group=ring_ref_group("spec"))
    world = dist.group.WORLD
    assert world is not None
    models = {
        "default": default,
        "ring_hook": ring,
        "backend": backend,
        "fsdp_default": _fsdp(width, depth, world),
        "fsdp_backend": _fsdp(width, depth, ring_ref_group("spec")),
    }
    runs = {name: (model, torch.optim.SGD(model.parameters(), lr=1e-3)) for name, model in models.items()}
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


def bus_bandwidth(n: int, nbytes: int, seconds: float, collective: str = "all_reduce") -> float:
    """nccl-tests' bus bandwidth of ``collective`` on ``nbytes`` (its larger tensor), bytes per second."""
    return (2 if collective in ("all_reduce", "chain") else 1) * (n - 1) / n * nbytes / seconds


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
    result: dict[str, Any] = {"n": n}
    with SpawnedGroup(n, group_timeout_s=600) as ring:
        for collective in args.collectives:
            per_rank = ring.run(collective_rank, spec | {"collective": collective}, timeout_s=3600)
            rows = []
            for k, nbytes in enumerate(args.sizes):
                row: dict[str, Any] = {"n": n, "bytes": nbytes}
                for name in (collective, "ring"):
                    median = statistics.median(slowest([r[k][name] for r in per_rank]))
                    row[f"{name}_s"] = median
                    row[f"{name}_busbw_GBps"] = bus_bandwidth(n, nbytes, median, collective) / 1e9
                row["ratio"] = row["ring_s"] / row[f"{collective}_s"]
                row["reps"] = len(per_rank[0][k]["ring"])
                rows.append(row)
            result[RESULT_KEY[collective]] = rows
        ddp = ring.run(ddp_rank, ddp_spec, timeout_s=3600) if args.ddp_steps else None
    if ddp is not None:
        steps = {name: statistics.median(slowest([r[name] for r in ddp])) for name in ddp[0]}
        params = sum(p.numel() for p in _model(args.ddp_width, args.ddp_depth).parameters())
        result["ddp"] = {
            "default_step_s": steps["default"],
            "ring_hook_step_s": steps["ring_hook"],
            "ratio": steps["ring_hook"] / steps["default"],
            "backend_step_s": steps["backend"],
            "backend_ratio": steps["backend"] / steps["default"],
            "fsdp_default_step_s": steps["fsdp_default"],
            "fsdp_backend_step_s": steps["fsdp_backend"],
            "fsdp_ratio": steps["fsdp_backend"] / steps["fsdp_default"],
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
    result: dict[str, Any] = {"n": n, "runs": args.runs}
    for collective in args.collectives:
        key, rows = RESULT_KEY[collective], []
        for k, first in enumerate(runs[0][key]):
            row: dict[str, Any] = {"n": n, "bytes": first["bytes"]}
            for name in (collective, "ring"):
                median = statistics.median(run[key][k][f"{name}_s"] for run in runs)
                row[f"{name}_s"] = median
                row[f"{name}_busbw_GBps"] = bus_bandwidth(n, first["bytes"], median, collective) / 1e9
            row["run_ratios"] = [run[key][k]["ratio"] for run in runs]
            row["ratio"] = statistics.median(row["run_ratios"])
            row["reps"] = sum(run[key][k]["reps"] for run in runs)
            rows.append(row)
        result[key] = rows
    if "ddp" in runs[0]:
        ddps = [run["ddp"] for run in runs]
        result["ddp"] = {
            "default_step_s": statistics.median(d["default_step_s"] for d in ddps),
            "ring_hook_step_s": statistics.median(d["ring_hook_step_s"] for d in ddps),
            "run_ratios": [d["ratio"] for d in ddps],
            "ratio": statistics.median(d["ratio"] for d in ddps),
            "backend_step_s": statistics.median(d["backend_step_s"] for d in ddps),
            "backend_ratio": statistics.median(d["backend_ratio"] for d in ddps),
            "fsdp_default_step_s": statistics.median(d["fsdp_default_step_s"] for d in ddps),
            "fsdp_backend_step_s": statistics.median(d["fsdp_backend_step_s"] for d in ddps),
            "fsdp_ratio": statistics.median(d["fsdp_ratio"] for d in ddps),
            "parameters": ddps[0]["parameters"],
            "steps": sum(d["steps"] for d in ddps),
        }
    return result


def report(results: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for collective in COLLECTIVES:
        if RESULT_KEY[collective] not in results[0]:
            continue
        gloo, ring = GLOO_NAME[collective], RING_NAME[collective]
        lines += [""] if lines else []
        lines += [
            f"| N | per rank | {gloo} | {ring} | ratio | bus bw {collective} | bus bw ring |",
            "|---|---|---|---|---|---|---|",
        ]
        for res in results:
            for row in res[RESULT_KEY[collective]]:
                lines.append(
                    f"| {row['n']} | {fmt_bytes(row['bytes'])} | {fmt_s(row[f'{collective}_s'])} | "
                    f"{fmt_s(row['ring_s'])} | {row['ratio']:.2f}x | "
                    f"{row[f'{collective}_busbw_GBps']:.3f} GB/s | {row['ring_busbw_GBps']:.3f} GB/s |"
                )
    ddp_rows = [res for res in results if "ddp" in res]
    if ddp_rows:
        lines += [
            "",
            "| N | DDP step, default hook | DDP step, ring_hook | ratio | DDP step on ring_ref | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for res in ddp_rows:
            d = res["ddp"]
            lines.append(
                f"| {res['n']} | {fmt_s(d['default_step_s'])} | {fmt_s(d['ring_hook_step_s'])} | "
                f"{d['ratio']:.2f}x | {fmt_s(d['backend_step_s'])} | {d['backend_ratio']:.2f}x |"
            )
        lines += ["", "| N | FSDP2 step on gloo | FSDP2 step on ring_ref | ratio |", "|---|---|---|---|"]
        for res in ddp_rows:
            d = res["ddp"]
            lines.append(
                f"| {res['n']} | {fmt_s(d['fsdp_default_step_s'])} | {fmt_s(d['fsdp_backend_step_s'])} | "
                f"{d['fsdp_ratio']:.2f}x |"
            )
    return lines


def _targets() -> list[tuple[str, str, int, int, float]]:
    """Each target: the collective, how its line starts, the sizes it applies to, the largest ratio."""
    targets = [
        (collective, f"ring / {collective} {label}", low, high, limit)
        for collective in COLLECTIVES[:3]  # the chain has no target (docs/guide/chain.md)
        for label, low, high, limit in TARGETS
    ]
    for collective, limit in BACKEND_TARGETS.items():
        targets.append(
            (collective, f"{RING_NAME[collective]} / gloo at >= 1 MiB per rank", 1 << 20, 1 << 62, limit)
        )
    return targets


def target_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for collective, start, low, high, limit in _targets():
        for res in results:
            rows = res.get(RESULT_KEY[collective], [])
            picked = [row for row in rows if low <= row["bytes"] <= high]
            if picked:
                worst = max(picked, key=lambda row: row["ratio"])
                ratios = ", ".join(f"{fmt_bytes(r['bytes'])} {r['ratio']:.2f}x" for r in picked)
                lines.append(
                    f"{start}, N={res['n']}: worst {worst['ratio']:.2f}x "
                    f"(target <= {limit}x: {verdict(worst['ratio'], limit)}); {ratios}"
                )
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

    shown = [c for c in COLLECTIVES if RESULT_KEY[c] in results[0]]
    fig, axes = plt.subplots(
        len(shown), len(results), figsize=(5.5 * len(results), 4 * len(shown)), squeeze=False
    )
    for axes_row, collective in zip(axes, shown, strict=True):
        for ax, res in zip(axes_row, results, strict=True):
            rows = res[RESULT_KEY[collective]]
            sizes = [row["bytes"] for row in rows]
            for name, label in (
                (collective, f"{GLOO_NAME[collective]} (gloo)"),
                ("ring", RING_NAME[collective]),
            ):
                ax.plot(sizes, [row[f"{name}_busbw_GBps"] for row in rows], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes per rank (float32; the larger tensor)")
            ax.set_ylabel("bus bandwidth (GB/s)")
            ax.set_title(f"{collective}, N = {res['n']} gloo processes on 127.0.0.1")
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
    parser.add_argument(
        "--collectives",
        type=lambda s: [
            c for c in s.split(",") if c in COLLECTIVES or parser.error(f"unknown collective {c!r}")
        ],
        default=list(COLLECTIVES),
        help="comma-separated, of " + ", ".join(COLLECTIVES),
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (torchrun's default)")
    parser.add_argument("--ddp-steps", type=int, default=DDP_STEPS, help="timed DDP steps per hook (0: skip)")
    parser.add_argument("--ddp-width", type=int, default=1024)
    parser.add_argument("--ddp-depth", type=int, default=4)
    parser.add_argument("--ddp-batch", type=int, default=32)
    parser.add_argument("--update", action="store_true", help="write the committed docs/bench/ files")
    parser.add_argument("--out", type=Path, default=None, help="folder for the results (default: scratch)")
    parser.add_argument("--stem", default="bench_dist", help="the results' file name, before .json and .png")
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
    (out / f"{args.stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot(results, out / f"{args.stem}.png")
    print(f"wrote {out / f'{args.stem}.json'} and {out / f'{args.stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
