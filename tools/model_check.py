"""Exhaustive SPIN verification of ``spec/ring_all_reduce.pml`` (``make model-check``).

For each configuration and each ``N`` this generates the verifier with
``spin -a``, compiles it with ``cc`` and runs an exhaustive search, all in a
fresh temporary directory (nothing is written into the repository).  A run
passes only if SPIN reports zero errors *and* the search was complete: full
state storage (no bitstate or hash-compact approximation), no depth or memory
limit hit.  Any error, incomplete search or tool failure exits non-zero.

Stands apart from ``ring_ref`` (imports only the standard library);
``tests/nocover/test_spin.py`` uses :func:`verify` and :func:`simulate` and checks the
model's sends against ``ring_ref.schedule``.

Usage::

    python tools/model_check.py            # N = 2 .. 8
    python tools/model_check.py --max-n 9  # widen the bound (9 needs about 1 GiB)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

ROOT: Final = Path(__file__).resolve().parent.parent
MODEL: Final = ROOT / "spec" / "ring_all_reduce.pml"
MODEL_NAME: Final = MODEL.name

MIN_N: Final = 2
MAX_N: Final = 15
"""The model keeps a slot's provenance in a signed 16-bit ``short`` beyond N = 8."""

FLAGS: Final = frozenset({"ALTERNATE", "FAULT_AG_ADD", "FAULT_FORWARD", "UNCHECKED_INDEX"})
"""The model's optional macros (see the header of ``spec/ring_all_reduce.pml``)."""

PAN_DEPTH: Final = 100_000
"""DFS depth limit; the deepest path at N = 9 is under 1 000 steps, and hitting it fails the run."""

MEMLIM_MB: Final = 4096
"""pan stops (and the run fails as incomplete) rather than use more memory than this."""

COMMAND_TIMEOUT_S: Final = 600

OPTIMISE_FROM_N: Final = 8
"""Compile pan with ``-O2`` from this N on; below it ``-O0`` (compiling takes longer than searching)."""

SPIN_MISSING: Final = "spin is not installed; install it with `apt-get install -y spin`"


class ModelCheckError(RuntimeError):
    """SPIN, the C compiler or pan could not be run, or their output was not understood."""


@dataclass(frozen=True)
class Config:
    """One instance of the model: ``N`` workers, ``cap`` slots per link, extra macros.

    >>> Config(3, cap=0, flags=("ALTERNATE",)).defines()
    ['-DN=3', '-DCAP=0', '-DALTERNATE']
    >>> Config(1)
    Traceback (most recent call last):
    ...
    ValueError: N = 1 is outside the model's range 2 .. 15; pick N in that range
    """

    n: int
    cap: int = 1
    flags: tuple[str, ...] = ()
    direction: int = 1
    """The ring's direction (``schedule-family``): worker ``w`` sends to ``w + direction``."""
    offset: int = 0
    """Chunk ``c``'s fold starts at worker ``c + offset`` (``|offset| < n``)."""

    def __post_init__(self) -> None:
        if not MIN_N <= self.n <= MAX_N:
            raise ValueError(
                f"N = {self.n} is outside the model's range {MIN_N} .. {MAX_N}; pick N in that range"
            )
        if self.cap < 0:
            raise ValueError(f"cap = {self.cap} is negative; use 0 (rendezvous) or more link slots")
        unknown = sorted(set(self.flags) - FLAGS)
        if unknown:
            raise ValueError(f"unknown model flags {unknown}; the model defines {sorted(FLAGS)}")
        if self.direction not in (1, -1) or not -self.n < self.offset < self.n:
            raise ValueError(
                f"direction {self.direction}, offset {self.offset}: the model takes direction 1 or -1 "
                f"and an offset with |offset| < N = {self.n}"
            )

    def defines(self) -> list[str]:
        """The ``-D`` options that select this instance, for ``spin``."""
        ring = (
            []
            if (self.direction, self.offset) == (1, 0)
            else [f"-DDIR={self.direction}", f"-DOFF={self.offset}"]
        )
        return [f"-DN={self.n}", f"-DCAP={self.cap}", *(f"-D{flag}" for flag in self.flags), *ring]

    def describe(self) -> str:
        """A short human-readable name, e.g. ``1-slot links, send first``."""
        links = "rendezvous links" if self.cap == 0 else f"{self.cap}-slot links"
        order = "odd workers receive first" if "ALTERNATE" in self.flags else "send first"
        faults = [flag for flag in self.flags if flag != "ALTERNATE"]
        ring = (
            [] if (self.direction, self.offset) == (1, 0) else [f"ring d={self.direction:+d} k={self.offset}"]
        )
        return ", ".join([links, order, *faults, *ring])


@dataclass(frozen=True)
class Verdict:
    """What one exhaustive pan run reported."""

    config: Config
    errors: int
    states_stored: int
    depth: int
    pan_seconds: float
    wall_seconds: float
    complete: bool
    """Full state storage, and no depth or memory limit cut the search short."""
    violation: str | None
    """pan's report of the first error (``assertion violated ...``, ``invalid end state``)."""
    replay: str | None
    """``spin -t`` replaying the counterexample trail, when pan wrote one."""
    output: str = field(repr=False)

    @property
    def verified(self) -> bool:
        """No error in a complete search: the properties hold in every reachable state."""
        return self.errors == 0 and self.complete and self.replay is None


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ModelCheckError(SPIN_MISSING if name == "spin" else f"`{name}` is not on PATH")
    return path


def _run(argv: Sequence[str], cwd: Path, *, check: bool = True) -> tuple[int, str]:
    """Run a command; return its exit status and stdout + stderr (raise on failure if ``check``)."""
    proc = subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise ModelCheckError(f"`{' '.join(argv)}` exited with {proc.returncode}:\n{out}")
    return proc.returncode, out


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        raise ModelCheckError(f"pan output has no match for {pattern!r}:\n{text}")
    return float(match.group(1))


def _prepare(workdir: Path) -> None:
    shutil.copyfile(MODEL, workdir / MODEL_NAME)


def verify(config: Config) -> Verdict:
    """Generate, compile and run pan for ``config`` in a temporary directory.

    When pan finds an error it writes a trail; the trail is replayed with
    ``spin -t`` and the replay is returned in :attr:`Verdict.replay`.
    """
    spin, cc = _tool("spin"), os.environ.get("CC", "cc")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ring-spin-") as tmp:
        workdir = Path(tmp)
        _prepare(workdir)
        _run([spin, *config.defines(), "-a", MODEL_NAME], workdir)
        optimise = "-O2" if config.n >= OPTIMISE_FROM_N else "-O0"
        _run([_tool(cc), optimise, "-DSAFETY", f"-DMEMLIM={MEMLIM_MB}", "-o", "pan", "pan.c"], workdir)
        # -q: channels must be empty in a valid end state; -n: no unreached-code listing.
        _, output = _run(["./pan", f"-m{PAN_DEPTH}", "-q", "-n"], workdir)
        replay = None
        if (workdir / f"{MODEL_NAME}.trail").exists():
            # spin exits non-zero when the replayed trail ends in an assertion violation.
            _, replay = _run([spin, "-t", *config.defines(), MODEL_NAME], workdir, check=False)
    first_error = re.search(r"^pan:1: (.*)$", output, re.MULTILINE)
    complete = (
        "Full statespace search" in output
        and "Search not completed" not in output
        and "max search depth too small" not in output
        and "MEMLIM" not in output
        and "out of memory" not in output
    )
    return Verdict(
        config=config,
        errors=int(_number(r"errors: (\d+)", output)),
        states_stored=int(_number(r"^\s*([\d.e+]+) states, stored", output)),
        depth=int(_number(r"depth reached (\d+)", output)),
        pan_seconds=_number(r"pan: elapsed time ([\d.e+]+) seconds", output),
        wall_seconds=time.perf_counter() - started,
        complete=complete,
        violation=first_error.group(1) if first_error else None,
        replay=replay,
        output=output,
    )


class Simulation(NamedTuple):
    """One random simulation run: spin's exit status (non-zero on a violated assertion) and output."""

    returncode: int
    output: str


def simulate(config: Config, seed: int) -> Simulation:
    """Run one random simulation (``spin -n<seed>``); the output holds the model's printed transfers."""
    spin = _tool("spin")
    with tempfile.TemporaryDirectory(prefix="ring-spin-") as tmp:
        workdir = Path(tmp)
        _prepare(workdir)
        return Simulation(*_run([spin, f"-n{seed}", *config.defines(), MODEL_NAME], workdir, check=False))


VERIFIED_LINKS: Final[tuple[tuple[int, tuple[str, ...]], ...]] = ((1, ()), (0, ("ALTERNATE",)))
"""The deadlock-free ``(cap, flags)`` configurations ``make model-check`` verifies (``buffered-links``)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Verify every configuration in :data:`VERIFIED_LINKS` for each N; print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--min-n", type=int, default=MIN_N)
    parser.add_argument("--max-n", type=int, default=8)
    args = parser.parse_args(argv)
    if args.min_n > args.max_n:
        parser.error(f"--min-n {args.min_n} is above --max-n {args.max_n}")
    header = f"{'configuration':<44} {'N':>2} {'states stored':>14} {'depth':>6} {'pan s':>7} {'total s':>8}"
    print(header)
    print("-" * len(header))
    failed = 0
    started = time.perf_counter()
    for cap, flags in VERIFIED_LINKS:
        for n in range(args.min_n, args.max_n + 1):
            try:
                verdict = verify(Config(n, cap, flags))
            except (ModelCheckError, ValueError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            status = "ok" if verdict.verified else "FAILED"
            print(
                f"{verdict.config.describe():<44} {n:>2} {verdict.states_stored:>14,} {verdict.depth:>6} "
                f"{verdict.pan_seconds:>7.2f} {verdict.wall_seconds:>8.2f}  {status}",
                flush=True,
            )
            if not verdict.verified:
                failed += 1
                print(verdict.output, verdict.replay or "", sep="\n", file=sys.stderr)
    elapsed = time.perf_counter() - started
    if failed:
        print(f"model-check FAILED: {failed} run(s) found an error or did not finish ({elapsed:.1f} s)")
        return 1
    print(f"model-check passed: every run exhaustive with 0 errors ({elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
