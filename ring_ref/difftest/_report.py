"""The report: per-mode verdicts, the text rendering and the JSON object (clause ``difftest-report``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from ring_ref._dtypes import dtype_name
from ring_ref.difftest._diagnosis import ROUNDS_ONCE, Finding
from ring_ref.difftest._inputs import LAYOUTS, Case
from ring_ref.difftest._oracles import ExactOrder
from ring_ref.difftest._probes import ProbeRun
from ring_ref.difftest._vocabulary import CODES, DTYPES, Collective, Mode, Op

__all__ = ["Coverage", "ModeResult", "Report", "untried"]


def _spans(ns: Sequence[int]) -> str:
    """``1..4, 6``: ascending integers, consecutive runs as spans."""
    runs: list[list[int]] = []
    for n in sorted(ns):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


@dataclass
class Coverage:
    """What one mode's calls tried (clause ``difftest-coverage``): the ``N``, ``M`` (and whether some
    ``M`` was not a multiple of ``N``), layouts, dtypes and op, and what it never tried, each with the
    option that would try it (:func:`untried`)."""

    n: set[int] = field(default_factory=set)
    m: set[int] = field(default_factory=set)
    remainder: bool = False
    layouts: dict[str, None] = field(default_factory=dict)
    dtypes: dict[str, None] = field(default_factory=dict)
    op: str = "sum"
    untried: list[tuple[str, str]] = field(default_factory=list)
    """``(what, the option that tries it)``."""

    def add(self, case: Case) -> None:
        """Count one call's input."""
        self.n.add(case.n)
        self.m.add(case.m)
        self.remainder |= case.m % case.n != 0
        self.layouts[case.layout] = None
        self.dtypes[dtype_name(case.dtype)] = None
        self.op = case.reduction

    def to_json(self) -> dict[str, Any]:
        """This mode's ``coverage`` in the JSON report."""
        return {
            "n": sorted(self.n),
            "m": sorted(self.m),
            "m_not_multiple_of_n": self.remainder,
            "layouts": list(self.layouts),
            "dtypes": list(self.dtypes),
            "op": self.op,
            "untried": [{"what": what, "option": option} for what, option in self.untried],
        }

    def describe(self, passed: bool) -> str:
        """``tried N = 1..4, M = 1..12 (each a multiple of N), ...; never tried: ...`` (that on a PASS)."""
        if not self.n:
            return "tried no input"
        each = "some not a multiple of N" if self.remainder else "each a multiple of N"
        text = (
            f"tried N = {_spans(sorted(self.n))}, M = {min(self.m)}..{max(self.m)} ({each}), "
            f"{'every layout' if len(self.layouts) == len(LAYOUTS) else '/'.join(self.layouts)}, "
            f"{'every dtype' if len(self.dtypes) == len(DTYPES) else '/'.join(self.dtypes)}, {self.op}"
        )
        if passed and self.untried:
            text += "; never tried: " + ", ".join(f"{what} ({option})" for what, option in self.untried)
        return text


def untried(
    coverage: Coverage,
    *,
    allowed: Sequence[torch.dtype],
    min_workers: int,
    op: Op | None,
    collective: Collective,
) -> list[tuple[str, str]]:
    """What a mode never tried that an option would try: ``M`` not a multiple of ``N`` (an all-reduce:
    ``--schedule openmpi-ring``, whose blocks take any ``M``), ``N`` below a job's size
    (``--subgroups``), the dtypes it could take (``--dtypes``), and other ops (``--op``).

    >>> c = Coverage(n={4}, m={4, 8}, dtypes={"float32": None})
    >>> untried(c, allowed=[torch.float32], min_workers=4, op=None, collective=Collective.ALL_REDUCE)[:2]
    [('M not a multiple of N', '--schedule openmpi-ring'), ('N = 1..3', '--subgroups')]
    """
    out = []
    if not collective.alone and coverage.n and not coverage.remainder:
        out.append(("M not a multiple of N", "--schedule openmpi-ring"))
    if min_workers > 1:
        out.append((f"N = {_spans(range(1, min_workers))}", "--subgroups"))
    other = [name for name in map(dtype_name, allowed) if name not in coverage.dtypes]
    if other:
        out.append(("/".join(other), "--dtypes"))
    if op is None and collective.reduces:
        out.append(("ops other than sum", "--op prod/max/min/avg"))
    return out


VALUE_CODES: Final = frozenset(CODES[CODES.index("ranks-disagree") :]) - {"not-ring-order", "signed-zero"}
"""The codes of a wrong value (not a fault of the call's form, and not ``exact``'s order alone)."""

SEES: Final[dict[str, str]] = {
    "exact": "every bit, against the expected order",
    "order-free": "only inputs whose every partial sum (or product) is exact, so that every order gives "
    "the same bits",
    "bound": "any finite input, within the error any order of additions may make",
}
"""What each mode's oracle can see, for a PASS beside another mode's FAIL."""


@dataclass
class ModeResult:
    """One mode's verdict."""

    mode: Mode
    verdict: str
    examples: int
    overflow_skipped: int = 0
    finding: Finding | None = None
    counterexample: Case | None = None
    output: str = ""
    underflow_skipped: int = 0
    """``prod``'s bound: elements accepted where some order could underflow (the bound does not hold)."""
    probes: ProbeRun | None = None
    """``exact``'s order probes, where they ran (clause ``difftest-order-probes``)."""
    coverage: Coverage | None = None
    """What its calls tried (clause ``difftest-coverage``)."""

    def to_json(self, seed: int) -> dict[str, Any]:
        """This mode's part of the JSON report."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "examples": self.examples,
            "overflow_skipped": self.overflow_skipped,
            "underflow_skipped": self.underflow_skipped,
        }
        if self.probes is not None:
            out["order_probes"] = {
                "calls": self.probes.calls,
                "n": self.probes.workers,
                "m": {str(n): ms for n, ms in sorted(self.probes.sizes.items())},
            }
        if self.coverage is not None:
            out["coverage"] = self.coverage.to_json()
        if self.finding is not None and self.counterexample is not None:
            out["diagnoses"] = self.finding.codes
            out["explanation"] = self.finding.explanation
            cex = {**self.counterexample.to_json(), "seed": seed}
            m = self.finding.mismatch
            if m is not None:
                cex["element"] = {
                    "index": list(m.index),
                    "chunk": m.chunk,
                    "expected": _json_float(m.expected),
                    "actual": _json_float(m.actual),
                }
            if self.finding.ranks:
                cex["ranks"] = self.finding.ranks
                if "element" in cex:
                    cex["element"]["rank"] = self.finding.ranks[0]
            if self.finding.stack:
                cex["stack"] = self.finding.stack
            if self.finding.raised_at is not None:
                cex["raised_at"] = self.finding.raised_at.to_json()
            if self.output:
                cex["output"] = self.output
            out["counterexample"] = cex
        return out


def _json_float(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


_COLLECTIVE_WORDS: Final = {
    Collective.REDUCE_SCATTER: "reduce-scatter: (N, M, ...) -> (N, M/N, ...), rank r holding chunk r of "
    "the reduction; per rank TARGET(output, input)",
    Collective.ALL_GATHER: "all-gather: (N, S, ...) -> (N*S, ...), rank r's shard in slot r, every bit "
    "copied; per rank TARGET(output, input)",
}
"""What a reduce-scatter or an all-gather target was checked as, in words."""

_GROUPS: Final = {
    "gloo": "a gloo process group",
    "mpi": "an MPI job",
    "job": "the job's own process group",
    "mpi-job": "the MPI job's own COMM_WORLD",
    "jax": "a jax.distributed group over gloo",
    "mlx": "an MLX ring group on 127.0.0.1",
}
"""What a per-rank target's ranks were, in words, by ``--ranks``."""


@dataclass
class Report:
    """The result of :func:`difftest` over one or more modes."""

    target: str
    seed: int
    replay: str
    modes: dict[str, ModeResult] = field(default_factory=dict)
    isolated: bool = False
    ranks: str | None = None
    timeout_s: float | None = None
    output_bytes: int = 0
    output: str = ""
    op: Op | None = None
    """The op asked for (``--op``); ``None``: none given, the target summed without ``op=``."""
    collective: Collective = Collective.ALL_REDUCE
    """The collective the target was checked as (its name read as the value)."""
    exact_against: ExactOrder | None = None
    """What ``exact`` checked against (``None`` when ``exact`` did not run)."""
    tested_n: list[int] | None = None
    """``--ranks job`` / ``mpi-job``: the ``N`` that were called (the world size; with ``--subgroups``
    the smaller ones too); ``None`` for the other launchers."""

    def __post_init__(self) -> None:
        self.collective = Collective(self.collective)

    @property
    def verdict(self) -> str:
        """``"pass"`` when every mode passed."""
        return "pass" if all(r.verdict == "pass" for r in self.modes.values()) else "fail"

    @property
    def diagnoses(self) -> list[str]:
        """The union of every mode's codes, in vocabulary order."""
        found = {c for r in self.modes.values() if r.finding is not None for c in r.finding.codes}
        return [c for c in CODES if c in found]

    @property
    def only_ring_order(self) -> bool:
        """True when the sole failure is ``exact`` with ``not-ring-order`` while the others pass.

        For ``max`` and ``min``, whose order shows only in the sign of zeros, also ``signed-zero``; and
        for ``sum`` and ``avg``, whose fold from ``+0.0`` shows only there (clause ``difftest-oracles``).
        """
        failed = {name: r for name, r in self.modes.items() if r.verdict == "fail"}
        others_ran = {"order-free", "bound"} <= set(self.modes)
        orders = [["not-ring-order"], ["signed-zero"]] if self.op != "prod" else [["not-ring-order"]]
        return (
            others_ran
            and set(failed) == {"exact"}
            and failed["exact"].finding is not None
            and failed["exact"].finding.codes in orders
        )

    def summary(self) -> str:
        """One sentence: the verdict in plain words."""
        op = f" (op {self.op})" if self.op is not None else ""
        op += f" as {self.collective}" if self.collective.alone else ""
        if self.verdict == "pass":
            return (
                f"PASS: {self.target}{op} matches the reference in every mode run ({', '.join(self.modes)})."
            )
        if self.only_ring_order:
            exact = self.modes["exact"].finding
            if exact is not None and exact.codes == ["signed-zero"] and self.op not in ("max", "min"):
                return (
                    f"FAIL (exact only): {self.target}{op} computes a correct all-reduce - it passes "
                    "order-free and bound - but gives +0.0 where every worker holds -0.0 (its fold starts "
                    "from +0.0; signed-zero), so it is not bitwise the reference. Only an implementation "
                    "of this exact schedule must pass exact."
                )
            if exact is not None and exact.codes == ["signed-zero"]:
                return (
                    f"FAIL (exact only): {self.target} computes a correct {self.op} - it passes order-free "
                    "and bound - but keeps another zero than the ring where -0 and +0 tie (signed-zero), "
                    "so it is not bitwise the reference. Only an implementation of this exact schedule "
                    "must pass exact."
                )
            what = self.collective if self.op in (None, "sum") else f"{self.op} {self.collective}"
            verb = "sums" if self.op in (None, "sum", "avg") else "combines"
            how = f"{verb} in a different order than the ring"
            if exact is not None and ROUNDS_ONCE in exact.explanation:
                how = "does not round after every addition (higher precision, or a fused or compensated sum)"
            return (
                f"FAIL (exact only): {self.target}{op} computes a correct {what} - it passes order-free "
                f"and bound - but {how}, so it is not bitwise the "
                "reference (not-ring-order). Only an implementation of this exact schedule must pass exact."
            )
        return f"FAIL: {self.target}{op}: {', '.join(self.diagnoses)}."

    def to_json(self) -> dict[str, Any]:
        """The JSON report (schema: ``spec/difftest_report.schema.json``)."""
        return {
            "target": self.target,
            "collective": str(self.collective),
            "verdict": self.verdict,
            "seed": self.seed,
            "replay": self.replay,
            "diagnoses": self.diagnoses,
            "summary": self.summary(),
            "isolated": self.isolated,
            "ranks": self.ranks,
            "op": self.op or "sum",
            "timeout_s": self.timeout_s,
            "exact_against": None if self.exact_against is None else self.exact_against.to_json(),
            "output": {"bytes": self.output_bytes, "text": self.output},
            "modes": {name: self._mode_json(name, r) for name, r in self.modes.items()},
        } | ({} if self.tested_n is None else {"tested_n": self.tested_n})

    def seen_elsewhere(self, name: str) -> tuple[list[str], list[str]]:
        """For a mode that passed: the other modes that found a value bug (:data:`VALUE_CODES`), and their
        codes (clause ``difftest-every-n``); empty where none did (``exact``'s order alone,
        ``not-ring-order`` or ``signed-zero``, the other modes cannot see by design)."""
        if self.modes[name].verdict != "pass" or self.only_ring_order:
            return [], []
        found = {
            other: r.finding.codes
            for other, r in self.modes.items()
            if other != name and r.finding is not None and set(r.finding.codes) & VALUE_CODES
        }
        codes = {c for cs in found.values() for c in cs}
        return list(found), [c for c in CODES if c in codes]

    def _mode_json(self, name: str, result: ModeResult) -> dict[str, Any]:
        modes, codes = self.seen_elsewhere(name)
        out = result.to_json(self.seed)
        if modes:
            out["seen_elsewhere"] = {"modes": modes, "codes": codes, "sees": SEES[name]}
        return out

    def _mode_lines(self) -> list[tuple[str, ModeResult]]:
        """The modes as the text report prints them: an all-gather's three modes, one check, as one."""
        if self.collective.gathers and len(self.modes) > 1:
            return [(", ".join(self.modes), next(iter(self.modes.values())))]
        return list(self.modes.items())

    def _verdict_lines(self, name: str, r: ModeResult) -> list[str]:
        """A mode's verdict line (what it tried, an all-gather's modes as one, a PASS beside another
        mode's FAIL said as such) and its coverage line."""
        skip = f", {r.overflow_skipped} overflowing element(s) accepted" if r.overflow_skipped else ""
        if r.underflow_skipped:
            skip += f", {r.underflow_skipped} element(s) that could underflow accepted"
        probed = f"; {r.probes.describe()}" if r.probes is not None else ""
        one = " (one check for an all-gather: a bitwise copy)" if "," in name else ""
        verdict = r.verdict.upper()
        elsewhere, codes = self.seen_elsewhere(name) if "," not in name else ([], [])
        if elsewhere:
            verdict = (
                f"PASS on its own inputs, but {' and '.join(elsewhere)} found {', '.join(codes)}: "
                f"{name} sees {SEES[name]}"
            )
        lines = [f"  {name}: {verdict}{one} ({r.examples} inputs tried{skip}{probed})"]
        if r.coverage is not None:
            lines.append(f"    {r.coverage.describe(r.verdict == 'pass' and not elsewhere)}")
        return lines

    def render(self) -> str:
        """The human-readable report."""
        lines = [self.summary()]
        if self.op is not None:
            lines.append(
                f"  (op {self.op}: the target was called with op= too, and checked with {self.op}'s oracles)"
            )
        if self.collective.alone:
            lines.append(f"  ({_COLLECTIVE_WORDS[self.collective]})")
        if self.ranks:
            tested = "" if self.tested_n is None else f"; N tested: {', '.join(map(str, self.tested_n))}"
            lines.append(
                f"  (per rank: the target ran on every rank of {_GROUPS.get(self.ranks, self.ranks)} "
                "of N processes, "
                f"at most {self.timeout_s:g} s per call{tested})"
            )
        elif self.isolated:
            lines.append(
                f"  (isolated: the target ran in a worker process, at most {self.timeout_s:g} s per call)"
            )
        else:
            lines.append("  (not isolated: the target ran in the tester's own process, with no time limit)")
        if self.exact_against is not None:
            lines.append(f"  ({_against(self.exact_against)})")
        for name, r in self._mode_lines():
            lines.extend(self._verdict_lines(name, r))
            if r.finding is not None and r.counterexample is not None:
                c = r.counterexample
                lines.append(f"    diagnosis: {', '.join(r.finding.codes)}")
                lines.append(f"    {r.finding.explanation}")
                where = f"; rank(s) {r.finding.ranks}" if r.finding.ranks else ""
                lines.append(
                    f"    counterexample: N = {c.n}, M = {c.m}, shape {c.shape}, {dtype_name(c.dtype)}, "
                    f"{c.layout} layout{where}"
                )
                lines.append(f"    input = {_abbrev(json.dumps(c.to_json()['input']))}")
                if r.finding.stack:
                    lines.append("    the target's Python stack (every thread, most recent call first):")
                    lines.extend(_indented(r.finding.stack))
                if r.output:
                    lines.append("    the target's output on this input:")
                    lines.extend(_indented(r.output))
        if self.output_bytes:
            lines.append(
                f"The target wrote {self.output_bytes} byte(s) to stdout/stderr in all (text in --json)."
            )
        lines.append(f"Replay: {self.replay}")
        return "\n".join(lines)

    def to_json_text(self) -> str:
        """The JSON report as one line of strict JSON."""
        return json.dumps(self.to_json(), allow_nan=False)


def _against(order: ExactOrder) -> str:
    """What ``exact`` checked against, in words, for the text report."""
    text = f"exact checks against {order.name}"
    if order.revealed:
        text += f", which --schedule auto found in the target ({order.revealed})"
    if order.inputs is not None:
        n, m, dtype = order.inputs
        text += (
            f"; exact's inputs are all N = {n}, M = {m}, {dtype}, the file's (--max-workers and --dtypes "
            "apply to the other modes)"
        )
    return text


def _indented(text: str, max_lines: int = 24) -> list[str]:
    """``text`` as report lines, indented, at most ``max_lines`` of them (the first ones)."""
    lines = text.rstrip("\n").splitlines()
    shown = [f"      {line}" for line in lines[:max_lines]]
    if len(lines) > max_lines:
        shown.append(f"      ... ({len(lines) - max_lines} more line(s) in --json)")
    return shown


def _abbrev(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + " ... (full input in --json)"
