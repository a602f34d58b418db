"""What ``invariance`` found: the placements tried, each probed element's first change, the one-line summary,
the text report and the ``--json`` object (``spec/invariance.schema.json``).

An *outcome* is what one placement gave a probed element: its summation tree
(``reveal`` mode; ``None`` where no tree explains it) or its bits (``--by-bits``).
Element ``j``'s first change (clause ``invariance-report``) is the first
placement ``b``, in the order ``(M, O)``, whose outcome differs from the first
placement's; every placement before ``b`` has the first one's outcome, and
``a`` is the one nearest ``b``: the same offset at the largest smaller ``M``,
else the same ``M`` at the nearest offset, else the one just before ``b``.

The summary tells a change of algorithm with the size from a dependence on the
position (clause ``invariance-summary``): the sizes tried are cut into runs,
each the longest that one *rule* explains at every placement of its sizes (the
same outcomes everywhere, or one ring's chunk folds); when every size falls in
such a run the order changes only where one run ends and the next begins.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final, Literal

from ring_ref._order import Tree, chunk_index, fold_tree, format_tree, ring_trees, tree_to_pairs
from ring_ref._order_stability._placement import Placement
from ring_ref.schedule import LAYOUTS, PRESETS, RingSchedule

__all__ = ["INVARIANCE_FORMAT", "INVARIANCE_VERSION", "Change", "Invariance", "Method", "first_changes"]

INVARIANCE_FORMAT: Final = "ring-ref-invariance"
INVARIANCE_VERSION: Final = 1

Method = Literal["reveal", "bits"]


@dataclass(frozen=True)
class Change:
    """Probed element ``element``: its outcome at ``a`` and the different one at ``b`` (first change)."""

    element: int
    a: Placement
    b: Placement
    was: Hashable
    now: Hashable


def _nearest_before(order: Sequence[Placement], b: int) -> int:
    """The placement before index ``b`` nearest it: same offset and largest smaller ``M``, else same ``M``
    and nearest offset, else the one just before."""
    pb = order[b]
    same_offset = [i for i in range(b) if order[i].offset == pb.offset]
    if same_offset:
        return same_offset[-1]
    same_m = [i for i in range(b) if order[i].m == pb.m]
    if same_m:
        return min(same_m, key=lambda i: abs(order[i].offset - pb.offset))
    return b - 1


def first_changes(order: Sequence[Placement], outcomes: Sequence[Sequence[Hashable]]) -> list[Change]:
    """Each probed element's first change (see the module docstring); ``outcomes[p][j]``.

    >>> ps = [Placement(4, 0), Placement(8, 0)]
    >>> first_changes(ps, [["x", "y"], ["x", "z"]])
    [Change(element=1, a=Placement(m=4, offset=0), b=Placement(m=8, offset=0), was='y', now='z')]
    """
    changes = []
    for j, first in enumerate(outcomes[0]):
        b = next((p for p in range(1, len(order)) if outcomes[p][j] != first), None)
        if b is not None:
            a = _nearest_before(order, b)
            changes.append(Change(j, order[a], order[b], outcomes[a][j], outcomes[b][j]))
    return changes


def _tree_text(tree: Hashable) -> str:
    return "no tree" if tree is None else format_tree(tree)  # type: ignore[arg-type]  # a Tree in reveal mode


def _ring_window(ring: RingSchedule, n: int, dtype: str, p: Placement, k: int) -> list[Tree] | None:
    """The trees ``ring`` gives the ``k`` elements from ``p``'s offset (``None``: its layout cannot cut M)."""
    if ring.layout == "even" and p.m % n:
        return None
    chunks = chunk_index(ring.layout, n, p.m, dtype)[p.offset : p.offset + k].tolist()
    return [fold_tree(ring.fold_order(c, n)) for c in chunks]


def _chunk_ring(
    n: int, dtype: str, order: Sequence[Placement], trees: Sequence[Sequence[Hashable]]
) -> tuple[str, RingSchedule] | None:
    """A ring of the family (presets first) whose chunk folds are the probed trees in every placement."""
    named = [(name, p.normalized(n)) for name, p in PRESETS.items() if isinstance(p, RingSchedule)]
    family = [("", RingSchedule(d, k, lay)) for d in (1, -1) for k in range(n) for lay in LAYOUTS]
    for name, ring in [*named, *family]:
        if all(
            _ring_window(ring, n, dtype, p, len(got)) == list(got)
            for p, got in zip(order, trees, strict=True)
        ):
            return name, ring
    return None


Rule = tuple[str, RingSchedule] | None
"""What explains a run of sizes: ``None`` for the same outcomes at every placement, else a ring (its preset
name, or ``""``)."""


@dataclass(frozen=True)
class _Run:
    """Sizes ``first .. last`` (of those tried), every placement of which ``rule`` explains."""

    first: int
    last: int
    rule: Rule
    one: str = ""
    """Where ``rule`` is ``None`` in reveal mode and every element has one tree: that tree, named (see
    :func:`_one_tree_label`)."""


def _ring_label(rule: tuple[str, RingSchedule]) -> str:
    """``the spec ring`` or ``the ring with ...``."""
    name, ring = rule
    return f"the {name} ring" if name else f"the ring with {ring.describe()}"


def _explain(
    method: Method, n: int, dtype: str, order: Sequence[Placement], outcomes: Sequence[Sequence[Hashable]]
) -> tuple[bool, Rule]:
    """``(explained, rule)``: the same outcomes at every placement (rule ``None``), else one ring's chunk
    folds (reveal mode only)."""
    if all(o == outcomes[0] for o in outcomes):
        return True, None
    ring = _chunk_ring(n, dtype, order, outcomes) if method == "reveal" else None
    return ring is not None, ring


def _size_runs(
    method: Method, n: int, dtype: str, order: Sequence[Placement], outcomes: Sequence[Sequence[Hashable]]
) -> list[_Run] | None:
    """The sizes tried cut into the longest runs one rule explains, smallest first (see the module docstring);
    ``None`` when some size alone has no rule (its offsets differ otherwise than a ring's chunks)."""
    sizes = sorted({p.m for p in order})

    def explain(lo: int, hi: int) -> tuple[bool, Rule]:
        picked = [i for i, p in enumerate(order) if lo <= p.m <= hi]
        return _explain(method, n, dtype, [order[i] for i in picked], [outcomes[i] for i in picked])

    runs: list[_Run] = []
    start = 0
    while start < len(sizes):
        explained, rule = explain(sizes[start], sizes[start])
        if not explained:
            return None
        stop = start + 1
        while stop < len(sizes):
            wider, wider_rule = explain(sizes[start], sizes[stop])
            if not wider:
                break
            rule, stop = wider_rule, stop + 1
        lo, hi = sizes[start], sizes[stop - 1]
        picked = {t for p, got in zip(order, outcomes, strict=True) if lo <= p.m <= hi for t in got}
        one = (
            _one_tree_label(n, picked.pop())
            if method == "reveal" and rule is None and len(picked) == 1
            else ""
        )
        runs.append(_Run(lo, hi, rule, one))
        start = stop
    return runs


def _one_tree_label(n: int, tree: Hashable) -> str:
    """``every element fold 0,1,2 (chain, recursive-doubling)``: one tree for every element, with the
    presets whose one tree it is (the schedules that are not rings: the chain, recursive doubling)."""
    if tree is None:
        return ""
    names = [
        name
        for name, schedule in PRESETS.items()
        if not isinstance(schedule, RingSchedule) and ring_trees(schedule, n, n, "float32") == [tree] * n
    ]
    return f"every element {_tree_text(tree)}" + (f" ({', '.join(names)})" if names else "")


def _switch_text(what: str, changes: str, runs: Sequence[_Run]) -> str:
    """``order changes above M = 64 (the same up to M = 64, ... from M = 4096 on)``."""
    above = " and ".join(f"above M = {run.last}" for run in runs[:-1])
    parts = []
    for i, run in enumerate(runs):
        if i == 0:
            span = f"up to M = {run.last}"
        elif i == len(runs) - 1:
            span = f"from M = {run.first} on"
        else:
            span = f"at M = {run.first}" + ("" if run.first == run.last else f" to {run.last}")
        if run.rule is not None:
            parts.append(f"each element folds its chunk of {_ring_label(run.rule)} {span}")
        elif run.one:
            parts.append(f"{run.one} {span}")
        else:
            parts.append(f"{'the same' if i == 0 else 'other'} {span}")
    return f"{what} {changes} {above} ({', '.join(parts)})"


def _moved_at_one_size(order: Sequence[Placement], outcomes: Sequence[Sequence[Hashable]]) -> str | None:
    """``at M = 64, element 3 at offset 0 vs offset 5``: the first placement whose outcomes differ from
    another offset's at its size (the nearest such offset)."""
    for i, p in enumerate(order):
        for q in reversed(range(i)):
            if order[q].m == p.m and outcomes[q] != outcomes[i]:
                j = next(j for j, (u, v) in enumerate(zip(outcomes[q], outcomes[i], strict=True)) if u != v)
                return f"at M = {p.m}, element {j} at offset {order[q].offset} vs offset {p.offset}"
    return None


@dataclass
class Invariance:
    """The result of :func:`ring_ref.invariance.invariance`: placements, outcomes, first changes, cost."""

    target: str
    n: int
    probe: int
    dtype: str
    method: Method
    placements: list[Placement]
    outcomes: list[list[Hashable]]
    """``outcomes[p][j]``: probed element ``j``'s tree (or bits) in placement ``p``."""
    calls: int
    seconds: float
    changes: list[Change] = field(init=False)
    counterexample: list[list[float]] | None = None
    """``--by-bits``: the ``(N, K)`` probe values whose bits differed (``None`` when none differed)."""

    def __post_init__(self) -> None:
        self.changes = first_changes(self.placements, self.outcomes)

    @property
    def invariant(self) -> bool:
        """Whether every probed element had one outcome in every placement tried."""
        return not self.changes

    @property
    def trees(self) -> list[list[Tree | None]]:
        """Reveal mode: ``trees[p][j]``, probed element ``j``'s tree in placement ``p``."""
        if self.method != "reveal":
            raise ValueError("a --by-bits screen reveals no trees; run invariance without by_bits for them")
        return [[tree for tree in row] for row in self.outcomes]  # type: ignore[misc]  # Trees in reveal mode

    def summary_line(self) -> str:
        """One line: invariant, or where the order changes (chunk boundaries, a size threshold, position)."""
        sizes = sorted({p.m for p in self.placements})
        offsets = sorted({p.offset for p in self.placements})
        what, changes, depends = (
            ("order", "changes", "depends") if self.method == "reveal" else ("bits", "change", "depend")
        )
        if self.invariant:
            return (
                f"{what} invariant over {len(self.placements)} placements (M = {', '.join(map(str, sizes))}; "
                f"offsets {', '.join(map(str, offsets))})"
            )
        runs = self._runs
        if runs is not None and len(runs) == 1 and runs[0].rule is not None:
            found = runs[0].rule[1]
            cut = "M/N" if found.layout == "even" else f"the {found.layout} layout's chunks"
            why = f"each element folds its chunk, {_ring_label(runs[0].rule)}"
            return f"order changes with M: at chunk boundaries, {cut} ({why})"
        if runs is not None:
            return _switch_text(what, changes, runs)
        moved = _moved_at_one_size(self.placements, self.outcomes)
        assert moved is not None  # no runs: some size has no rule, so two of its placements differ
        return f"{what} {depends} on the position (offset, or distance to the end): {moved}"

    @cached_property
    def _runs(self) -> list[_Run] | None:
        """The sizes cut into runs that one rule each explains (``None``: some size has none)."""
        return _size_runs(self.method, self.n, self.dtype, self.placements, self.outcomes)

    def _outcome_text(self, outcome: Hashable) -> str:
        return _tree_text(outcome) if self.method == "reveal" else str(outcome)

    def render(self) -> str:
        """The text report: what was tried, the summary line, each change (runs of elements grouped)."""
        how = "trees revealed" if self.method == "reveal" else "bits compared (--by-bits)"
        lines = [
            f"ring-ref invariance {self.target}  (N = {self.n}, K = {self.probe} probed elements, "
            f"{self.dtype}, {how})",
            "placements: " + "; ".join(p.text() for p in self.placements),
            ("invariant: " if self.invariant else "NOT invariant: ") + self.summary_line(),
        ]
        runs: list[list[Change]] = []
        for change in self.changes:
            last = runs[-1][-1] if runs else None
            if (
                last is not None
                and change.element == last.element + 1
                and (change.a, change.b, change.was, change.now) == (last.a, last.b, last.was, last.now)
            ):
                runs[-1].append(change)
            else:
                runs.append([change])
        for run in runs:
            c = run[0]
            span = f"element {c.element}" if len(run) == 1 else f"elements {c.element}..{run[-1].element}"
            lines.append(
                f"  {span}: {c.a.text()}: {self._outcome_text(c.was)}  ->  {c.b.text()}: "
                f"{self._outcome_text(c.now)}"
            )
        if self.counterexample is not None:
            lines.append(
                "  counterexample (probe values, worker by worker, in --json): N x K = "
                f"{self.n} x {self.probe}"
            )
        if self.method == "bits" and self.invariant:
            lines.append(
                "  (a screen: equal bits on random inputs do not prove one order; run without --by-bits to "
                "compare the trees)"
            )
        elif self.method == "bits" and self._runs is None:
            lines.append(
                "  (a screen: bits cannot tell a ring's chunks, or a change to a ring with the size, from "
                "the position; run without --by-bits to name them)"
            )
        lines.append(f"calls: {self.calls}; time {self.seconds:.2f} s")
        return "\n".join(lines)

    def _side(self, placement: Placement, outcome: Hashable) -> dict[str, Any]:
        side: dict[str, Any] = {"m": placement.m, "offset": placement.offset}
        if self.method == "reveal":
            side["tree"] = tree_to_pairs(outcome)  # type: ignore[arg-type]  # a Tree in reveal mode
        else:
            side["bits"] = outcome
        return side

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (schema ``spec/invariance.schema.json``)."""
        return {
            "format": INVARIANCE_FORMAT,
            "version": INVARIANCE_VERSION,
            "target": self.target,
            "n": self.n,
            "probe": self.probe,
            "dtype": self.dtype,
            "method": self.method,
            "invariant": self.invariant,
            "summary": self.summary_line(),
            "placements": [{"m": p.m, "offset": p.offset} for p in self.placements],
            "changes": [
                {"element": c.element, "a": self._side(c.a, c.was), "b": self._side(c.b, c.now)}
                for c in self.changes
            ],
            "counterexample": self.counterexample,
            "calls": self.calls,
            "seconds": round(self.seconds, 4),
        }
