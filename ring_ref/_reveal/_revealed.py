"""``reveal()`` and what it returns: probe, check on random inputs, fit a ring; the report and its JSON.

>>> found = reveal(lambda x: (x[0] + x[1]) + x[2], 3, 6)
>>> found.trees[0], found.classification, found.calls
(((0, 1), 2), 'folds', 6)
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._order import (
    RingFit,
    Tree,
    chunk_index,
    fold_order_of,
    format_tree,
    tree_ids,
    tree_json_text,
    tree_to_json,
    untold_sizes,
)
from ring_ref._reveal._check import CHECKS, check_on_random_inputs
from ring_ref._reveal._probe import Verdict, probe
from ring_ref._reveal._target import check_reveal_size
from ring_ref.schedule import PRESETS, RingSchedule

__all__ = ["REVEAL_FORMAT", "REVEAL_VERSION", "Classification", "Kind", "Revealed", "reveal"]

REVEAL_FORMAT: Final = "ring-ref-reveal"
REVEAL_VERSION: Final = 3

Classification = Literal["ring", "folds", "trees", "partly-trees", "no-tree"]

Kind = Literal["tree", "exact", "none"]
"""An element's kind: a tree of additions, the ``exact`` sum rounded once, or ``none`` (with the reason)."""


def _exact_verdicts(verdicts: list[Verdict], n: int, dtype: str, checks: int, calls: int) -> frozenset[int]:
    """Turn the verdicts whose tree is one multiway node of every worker into ``exact`` (clause
    ``reveal-exact``): no tree, the evidence as the reason; their indices."""
    exact = []
    for v, (tree, _) in enumerate(verdicts):
        if n >= 3 and isinstance(tree, tuple) and len(tree) == n:
            verdicts[v] = (
                None,
                f"on every probe ({calls} calls) and on {checks} random inputs the output is the exact sum "
                f"correctly rounded to {dtype} (a wider or compensated accumulator, or one fused "
                f"{n}-term addition)",
            )
            exact.append(v)
    return frozenset(exact)


def _element_ids(
    verdicts: list[Verdict], of: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], list[Tree]]:
    """Each element's tree as an index into the distinct trees (``-1``: none), and those trees."""
    ids, distinct = tree_ids([tree for tree, _ in verdicts])
    return ids[of], distinct


@dataclass
class Revealed:
    """What ``reveal`` found: a tree per element (``None`` where none explains it), ring, presets, cost."""

    target: str
    n: int
    m: int
    dtype: str
    verdicts: list[Verdict]
    of: npt.NDArray[np.int64]
    ring: RingSchedule | None
    matches: list[str]
    probe_calls: int
    confirm_calls: int
    check_calls: int
    seconds: float
    count_calls: int = 0
    exact: frozenset[int] = field(default_factory=frozenset)
    untold: tuple[int, ...] = ()
    """The sizes besides ``m`` that tell the matched presets' layouts from the others (clause
    ``reveal-preset-sizes``): while any remain, the presets match at ``M = m`` only."""

    @property
    def calls(self) -> int:
        """Every call of the target."""
        return self.probe_calls + self.confirm_calls + self.check_calls

    @property
    def trees(self) -> list[Tree | None]:
        """Each element's tree, ``None`` where no tree explains it."""
        per = [tree for tree, _ in self.verdicts]
        return [per[v] for v in self.of.tolist()]

    @property
    def reasons(self) -> list[str | None]:
        """Why an element has no tree (``None`` where it has one)."""
        per = [reason for _, reason in self.verdicts]
        return [per[v] for v in self.of.tolist()]

    @property
    def kinds(self) -> list[Kind]:
        """Each element's kind: ``tree``, ``exact`` (the exact sum correctly rounded) or ``none``."""
        per: list[Kind] = [
            "exact" if v in self.exact else "none" if tree is None else "tree"
            for v, (tree, _) in enumerate(self.verdicts)
        ]
        return [per[v] for v in self.of.tolist()]

    def tree_index(self) -> tuple[npt.NDArray[np.int64], list[Tree]]:
        """Each element's tree as an index into the distinct trees (``-1``: none), and those trees."""
        return _element_ids(self.verdicts, self.of)

    @property
    def classification(self) -> Classification:
        """``ring``: every element a fold of one ring; ``folds``; ``trees``; ``partly-trees``; ``no-tree``."""
        ids, found = self.tree_index()
        if not found:
            return "no-tree"
        if (ids < 0).any():
            return "partly-trees"
        if self.ring is not None:
            return "ring"
        if all(fold_order_of(t) is not None for t in found):
            return "folds"
        return "trees"

    def chunks(self) -> list[int] | None:
        """Each element's chunk under the fitted ring's layout."""
        if self.ring is None:
            return None
        chunk: list[int] = chunk_index(self.ring.layout, self.n, self.m, self.dtype).tolist()
        return chunk

    def runs(self) -> list[tuple[int, int, Tree | None]]:
        """Maximal runs ``(first, last, tree)`` of consecutive elements with the same tree (and chunk)."""
        chunk = self.chunks()
        key = self.of * (self.n + 1) + (np.array(chunk) if chunk is not None else 0)
        starts = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), self.m]
        tree = [t for t, _ in self.verdicts]
        return [(a, b - 1, tree[int(self.of[a])]) for a, b in itertools.pairwise(starts)]

    def distinct(self) -> list[Tree]:
        """The distinct trees, in the order of the first element that has each (chunk order)."""
        ids, found = self.tree_index()
        known = ids[ids >= 0]
        _, first = np.unique(known, return_index=True)
        return [found[int(known[i])] for i in sorted(first.tolist())]

    def summary(self, whole: float | None = None) -> str:
        """The human report: runs of elements sharing a tree, the classification, calls and time (with
        ``whole``, the seconds of the whole command too, start-up included: clause ``reveal-report``)."""
        chunk = self.chunks()
        lines = [f"ring-ref reveal {self.target}  (N = {self.n}, M = {self.m}, {self.dtype})"]
        reasons = [reason for _, reason in self.verdicts]
        for first, last, tree in self.runs():
            span = f"element {first}" if first == last else f"elements {first}..{last}"
            if chunk is not None:
                span += f" (chunk {chunk[first]})"
            if tree is None:
                v = int(self.of[first])
                kind = "exact: " if v in self.exact else ""
                lines.append(f"  {span}: {kind}no tree of {self.dtype} additions explains it ({reasons[v]})")
            else:
                lines.append(f"  {span}: {format_tree(tree)}")
        ring = (
            f" (direction {self.ring.direction:+d}, offset {self.ring.offset}, layout {self.ring.layout})"
            if self.ring
            else ""
        )
        lines.append(f"classification: {self.classification}{ring}")
        matches = ", ".join(self.matches) if self.matches else "none"
        if self.untold:
            told = ", ".join(map(str, self.untold))
            matches += f" (at M = {self.m} only: the layouts are told apart at M = {told})"
        lines.append(f"matches presets: {matches}")
        lines.append(
            f"calls: {self.calls} ({self.probe_calls} probing, "
            + (f"{self.count_calls} of them counting, " if self.count_calls else "")
            + f"{self.confirm_calls} confirming, "
            f"{self.check_calls} checking on random inputs); time {self.seconds:.2f} s"
            + ("" if whole is None else f" revealing, {whole:.2f} s in all (start-up included)")
        )
        return "\n".join(lines)

    def json_trees(self) -> list[Any]:
        """``trees`` as ``--json`` spells them (each distinct tree converted once)."""
        spelt = [tree_to_json(tree) for tree, _ in self.verdicts]
        return [spelt[v] for v in self.of.tolist()]

    def to_json_text(self) -> str:
        """:meth:`to_json` as text, each distinct tree spelt once (a fold flat, ``{"fold": [...]}``:
        no tree nests deeper than its structure other than folds)."""
        doc = self.to_json(trees=False)
        spelt = [tree_json_text(tree) for tree, _ in self.verdicts]
        trees = ", ".join(spelt[v] for v in self.of.tolist())
        return json.dumps(doc)[:-1] + f', "trees": [{trees}]}}'

    def to_json(self, *, trees: bool = True) -> dict[str, Any]:
        """The ``--json`` object (schema ``spec/reveal.schema.json``; ``trees=False`` leaves the trees
        out, for :meth:`to_json_text`)."""
        ring = None
        if self.ring is not None:
            ring = {"direction": self.ring.direction, "offset": self.ring.offset, "layout": self.ring.layout}
        return {
            "format": REVEAL_FORMAT,
            "version": REVEAL_VERSION,
            "target": self.target,
            "n": self.n,
            "m": self.m,
            "dtype": self.dtype,
            **({"trees": self.json_trees()} if trees else {}),
            "kinds": self.kinds,
            "notes": [
                {"first": first, "last": last, "reason": self.verdicts[int(self.of[first])][1]}
                for first, last, tree in self.runs()
                if tree is None
            ],
            "ring": ring,
            "matches": list(self.matches),
            "classification": self.classification,
            "calls": self.calls,
            "callsBy": {
                "probe": self.probe_calls,
                "count": self.count_calls,
                "confirm": self.confirm_calls,
                "check": self.check_calls,
            },
            "seconds": round(self.seconds, 4),
        }


def reveal(
    target: Callable[[torch.Tensor], object],
    n: int,
    m: int,
    dtype: str = "float32",
    *,
    checks: int = CHECKS,
    seed: int = 0,
    name: str = "<target>",
) -> Revealed:
    """The summation tree of each of the ``m`` result elements of ``target`` on ``(n, m)`` inputs.

    ``target`` takes a ``(n, m)`` tensor of ``dtype`` (``"float32"``,
    ``"float64"``, ``"float16"`` or ``"bfloat16"``) and returns the ``(m,)`` sum
    over workers, like :func:`ring_ref.ring_all_reduce`.  Raises
    :class:`RevealError` beyond the limits or when the target raises or returns
    the wrong shape or dtype.
    """
    check_reveal_size(n, m, dtype)
    # A fold of N workers is a tree N deep; comparing, hashing and printing it recurse that far.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 8 * n + 1000))
    start = time.perf_counter()
    verdicts, of, probe_calls, count_calls, confirm_calls = probe(target, n, m, dtype, seed)
    inputs, outputs = check_on_random_inputs(target, verdicts, of, n, dtype, checks=checks, seed=seed)
    exact = _exact_verdicts(verdicts, n, dtype, len(inputs), probe_calls + confirm_calls)
    fit = RingFit(*_element_ids(verdicts, of), n, dtype)
    matches = fit.matching_presets(inputs, outputs)
    return Revealed(
        target=name,
        n=n,
        m=m,
        dtype=dtype,
        verdicts=verdicts,
        of=of,
        ring=fit.first_ring(),
        matches=matches,
        probe_calls=probe_calls,
        confirm_calls=confirm_calls,
        check_calls=len(inputs),
        seconds=time.perf_counter() - start,
        count_calls=count_calls,
        exact=exact,
        untold=untold_sizes([PRESETS[name] for name in matches], n, m, dtype),
    )
