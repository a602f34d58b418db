"""Count probes (clause ``reveal-counts``): FPRev's counting question, every element its own, at any ``N``.

Summand ``i`` holds ``+B``, summand ``j`` holds ``-B`` and every other summand
the unit ``u``; ``B`` swamps ``N u`` and counts of ``u`` are exact in the dtype.
In a tree of additions the ``u`` below the node where ``+B`` meets ``-B`` are
swamped and the rest survive, so ``L(i, j) = N - output / u`` is the number
of leaves under that node; at a multiway node (``k >= 3`` terms rounded once)
only the two terms holding ``i`` and ``j`` are swamped, so ``L(i, j)`` is
their leaves together.

The search is FPRev's recursion (Xie et al., USENIX ATC 2025): a pivot ``i``
asks every other ``j`` of its subtree; the ``j`` grouped by ``L`` are the
subtrees hanging off the path from ``i`` to the root, in order, and each group
is searched the same way.  A group of ``g`` leaves at ``L = base + d`` with
``d < g`` is ``g / d`` sibling terms of ``d`` leaves each at one multiway
node.  Every pair is asked at most once (``N (N - 1) / 2`` calls at most);
the first pivot is chosen from two questions, ``(0, 1)`` and ``(1, 2)`` (and
``(2, 3)`` where both directions fit them), so that a fold of any ring of the
family starts at its first worker and costs at most ``N + 2`` calls.
Elements whose answers agree so far share one search, and every search asks
its next question in the same call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS
from ring_ref._order import Fold, Tree, canonical
from ring_ref._reveal._target import call_target

__all__ = ["CountSearch", "count_rounds", "count_values"]

_NONE: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
_NONE.flags.writeable = False

_HINTS = ((0, 1), (1, 2))
"""The two questions asked before the first pivot is chosen (``N >= 4``)."""


def count_values(n: int, dtype_name: str) -> tuple[float, float]:
    """The unit ``u`` and the swamping magnitude ``B`` of count probes in ``dtype_name``.

    ``u`` is 1 where ``B = 2^(p + ceil(log2 N) + 1)`` fits the dtype, else its
    smallest normal number (float16, bfloat16): ``B``'s half spacing then exceeds
    ``N u``, and sums of up to ``N`` units are exact.

    >>> count_values(4096, "float32"), count_values(1000, "float16")
    ((1.0, 137438953472.0), (6.103515625e-05, 256.0))
    """
    fmt = FORMATS[dtype_name]
    scale = fmt.precision + max(n - 1, 1).bit_length() + 1
    unit = 1.0 if scale <= fmt.emax else fmt.smallest_normal
    return unit, float(unit * 2.0**scale)


@dataclass(frozen=True)
class _Problem:
    """Leaves known to form one subtree (``size == 0``) or sibling terms of ``size`` leaves each."""

    pid: int
    members: tuple[int, ...]
    size: int


@dataclass
class CountSearch:
    """One group's search: problems to solve, the current pivot's answers, and what is built.

    Results name sub-problems by ``-1 - pid``; a sub-problem of sibling terms
    (a forest) is spliced into its parent's children.
    """

    n: int
    pending: list[_Problem] = field(default_factory=list)
    current: _Problem | None = None
    pivot: int = -1
    asking: npt.NDArray[np.int32] = field(default_factory=lambda: _NONE)
    """The pivot's sweep: the workers it asks, ascending (shared by copies: never written)."""
    answers: npt.NDArray[np.int32] = field(default_factory=lambda: _NONE)
    """``L`` for ``asking[:asked_here]``."""
    asked_here: int = 0
    counts: dict[int, int] = field(default_factory=dict)
    """Answers for the pivot known before its sweep (the hints')."""
    built: dict[int, Tree] = field(default_factory=dict)
    forests: dict[int, tuple[Tree, ...]] = field(default_factory=dict)
    known: dict[tuple[int, int], int] = field(default_factory=dict)
    hints: list[tuple[int, int]] = field(default_factory=list)
    next_pid: int = 1
    failure: str | None = None
    spliced: bool = False

    @classmethod
    def start(cls, n: int) -> CountSearch:
        search = cls(n, pending=[_Problem(0, tuple(range(n)), 0)])
        search.hints = list(_HINTS) if n >= 4 else []
        return search

    def copy(self) -> CountSearch:
        """A search that goes on apart: its own containers; ``asking`` and ``answers`` are shared (only
        ever replaced, never written into)."""
        return replace(
            self,
            pending=list(self.pending),
            counts=dict(self.counts),
            built=dict(self.built),
            forests=dict(self.forests),
            known=dict(self.known),
            hints=list(self.hints),
        )

    def question(self) -> tuple[int, int] | None:
        """The next pair to ask (``None``: done or failed), taking in answers already known.  A pair of
        a pivot's sweep starts the sweep, which :func:`count_rounds` then runs in bulk (:class:`_Sweeps`)."""
        while self.failure is None:
            if self.hints:
                return self.hints[0]
            if self.current is None:
                if not self.pending:
                    return None
                if (
                    self.pending[-1].pid == 0
                    and self.n >= 5
                    and len(self.known) == 2
                    and len(self._folds()) > 1
                ):
                    self.hints.append((2, 3))  # both directions fit: one more hint tells them apart
                    continue
                self._begin(self.pending.pop())
                continue
            if self.asked_here < len(self.asking):
                return self.pivot, int(self.asking[self.asked_here])
            self._finish()
        return None

    def learn(self, pair: tuple[int, int], swamped: int) -> None:
        """Take in ``L`` for a hint just asked, or an answer that fails the search (``-1``: the output
        was not a count); a sweep's good answers go into :class:`_Sweeps` instead."""
        if swamped < 2:
            what = "is not a count of surviving units" if swamped < 0 else "counts more units than the others"
            self.failure = (
                f"with +B at worker {pair[0]} and -B at worker {pair[1]} the output {what} "
                "(no tree of additions in the dtype gives that)"
            )
            return
        assert self.hints, "a sweep's answers are taken in bulk by _Sweeps"
        self.known[(min(pair), max(pair))] = swamped
        self.hints.pop(0)

    def _new(self, members: list[int], size: int) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        self.pending.append(_Problem(pid, tuple(members), size))
        return -1 - pid

    def _begin(self, problem: _Problem) -> None:
        members = problem.members
        if problem.size == 0 and len(members) <= 2:
            self.built[problem.pid] = members[0] if len(members) == 1 else (members[0], members[1])
            return
        self.current, self.pivot = problem, self._pivot(problem)
        self.counts = {}
        for (a, b), swamped in self.known.items():  # the hints' answers for this pivot, known already
            other = b if a == self.pivot else a if b == self.pivot else -1
            if other in members:
                self.counts[other] = swamped
        self.asking = np.array(
            sorted(w for w in members if w != self.pivot and w not in self.counts), dtype=np.int32
        )
        self.answers, self.asked_here = np.zeros(len(self.asking), dtype=np.int32), 0

    def _folds(self) -> list[int]:
        """The first workers of the folds of the ring family (step +1, then -1) that fit the hints."""
        n, s = self.n, np.arange(self.n)
        starts = []
        for step in (1, -1):
            fits = np.ones(n, dtype=bool)
            for (a, b), swamped in self.known.items():
                fits &= np.maximum((step * (a - s)) % n, (step * (b - s)) % n) + 1 == swamped
            starts += np.flatnonzero(fits).tolist()
        return starts

    def _pivot(self, problem: _Problem) -> int:
        """The first worker of a fold of the ring family that fits the hints, else the smallest."""
        if problem.pid != 0 or self.n < 4:
            return min(problem.members)
        starts = self._folds()
        return starts[0] if starts else 0

    def _finish(self) -> None:
        problem, pivot = self.current, self.pivot
        counts = dict(
            sorted([*self.counts.items(), *zip(self.asking.tolist(), self.answers.tolist(), strict=True)])
        )
        self.asking = self.answers = _NONE
        assert problem is not None
        self.current = None
        if problem.size == 0:
            self._subtree(problem.pid, [pivot, *counts], pivot, counts)
            return
        d = problem.size
        first = [pivot, *(j for j, c in counts.items() if c <= d)]
        rest = [j for j, c in counts.items() if c == 2 * d]
        if len(first) != d or len(first) + len(rest) != len(problem.members):
            self._fail(pivot, counts, f" with terms of {d} leaves each")
            return
        sub, self.next_pid = self.next_pid, self.next_pid + 1
        self._subtree(sub, first, pivot, {j: counts[j] for j in first[1:]})
        self.forests[problem.pid] = (-1 - sub, self._new(rest, 0 if len(rest) == d else d))

    def _subtree(self, pid: int, members: list[int], pivot: int, counts: dict[int, int]) -> None:
        """The path from ``pivot`` up through ``members``: levels of groups by ``L``, each searched later.

        Nodes are built in canonical order: every child's leaves and smallest leaf are known here.
        A path of one worker per level is a fold, kept as a :class:`Fold`.
        """
        if len(members) >= 3 and sorted(counts.values()) == list(range(2, len(members) + 1)):
            order = sorted(counts, key=counts.__getitem__)
            self.built[pid] = Fold([*sorted((pivot, order[0])), *order[1:]])
            return
        by_count: dict[int, list[int]] = {}
        for j in sorted(counts):
            by_count.setdefault(counts[j], []).append(j)
        levels: list[tuple[int, list[tuple[Tree, int, int]]]] = []
        size = 1
        for c in sorted(by_count):
            group = by_count[c]
            if c > len(members):
                self._fail(pivot, counts, f" with one subtree of {len(members)} leaves")
                return
            # Its terms hang off a new node on the path (L = size + d) or off the last one (L = base + d);
            # one term before several (a subtree before a multiway node's terms), a new node first.
            new, last = c - size, c - levels[-1][0] if levels else 0
            readings = [(new, True), (last, False)]
            fitting = [(d, fresh) for d, fresh in readings if d >= 1 and len(group) % d == 0]
            if not fitting:
                self._fail(pivot, counts, "")
                return
            d, fresh = min(fitting, key=lambda r: (r[0] != len(group), not r[1]))
            if fresh:
                levels.append((size, self._terms(group, d)))
            else:
                levels[-1][1].extend(self._terms(group, d))
            size += len(group)
        node: tuple[Tree, int, int] = (pivot, 1, pivot)
        for _, children in levels:
            terms = sorted([node, *children], key=lambda t: (-t[1], t[2]))
            node = (tuple(t[0] for t in terms), sum(t[1] for t in terms), min(t[2] for t in terms))
        self.built[pid] = node[0]

    def _terms(self, group: list[int], d: int) -> list[tuple[Tree, int, int]]:
        """``group`` as terms of ``d`` leaves each: ``(tree or reference, leaves, smallest leaf)``."""
        if d == 1:
            return [(w, 1, w) for w in group]
        if d == len(group) == 2:
            return [((group[0], group[1]), 2, group[0])]
        if d < len(group):
            self.spliced = True
        return [(self._new(group, 0 if d == len(group) else d), d, group[0])]

    def _fail(self, pivot: int, counts: dict[int, int], what: str) -> None:
        shown = ", ".join(f"{j}: {c}" for j, c in sorted(counts.items())[:8])
        self.failure = (
            f"the counts with +B at worker {pivot} ({shown}{', ...' if len(counts) > 8 else ''}) "
            f"fit no tree of additions{what}"
        )

    def tree(self) -> Tree:
        """The tree found, canonical (every problem solved)."""

        def resolve(node: Tree) -> list[Tree]:
            if isinstance(node, Fold):  # workers only
                return [node]
            if isinstance(node, int) and node < 0:
                pid = -1 - node
                if pid in self.forests:
                    return [t for part in self.forests[pid] for t in resolve(part)]
                return resolve(self.built[pid])
            if isinstance(node, int):
                return [node]
            return [tuple(t for child in node for t in resolve(child))]

        if self.next_pid == 1:
            return self.built[0]
        tree = resolve(self.built[0])[0]
        return canonical(tree) if self.spliced else tree


Counter = Callable[[torch.Tensor], object]


class _Sweeps:
    """The pivot sweeps under way, run in bulk: per group being swept, a row of two tables holding
    the workers its pivot asks and the answers so far, its position, its end and its pivot.

    While a search's sweep runs here its own ``asking``, ``answers`` and ``asked_here`` are stale;
    they are written back when the sweep ends (or an answer fails it).  Each call then costs a few
    array operations, not a method call per group.
    """

    def __init__(self, n: int, groups: int) -> None:
        self.n = n
        self.ask = np.zeros((0, n), dtype=np.int32)
        self.ans = np.zeros((0, n), dtype=np.int32)
        self.free: list[int] = []
        self.row = np.full(groups, -1, dtype=np.int64)
        self.pos = np.zeros(groups, dtype=np.int64)
        self.end = np.zeros(groups, dtype=np.int64)
        self.pivot = np.zeros(groups, dtype=np.int64)

    def _rows(self, count: int) -> list[int]:
        while len(self.free) < count:
            grow = max(len(self.ask), 16)
            self.ask = np.concatenate([self.ask, np.zeros((grow, self.n), dtype=np.int32)])
            self.ans = np.concatenate([self.ans, np.zeros((grow, self.n), dtype=np.int32)])
            self.free += range(len(self.ask) - 1, len(self.ask) - grow - 1, -1)
        taken, self.free = self.free[len(self.free) - count :], self.free[: len(self.free) - count]
        return taken

    def join(self, g: int, search: CountSearch) -> None:
        """Group ``g``'s search has just begun a sweep: it runs here from now on."""
        (row,) = self._rows(1)
        k, end = search.asked_here, len(search.asking)
        self.ask[row, :end], self.ans[row, :k] = search.asking, search.answers[:k]
        self.row[g], self.pos[g], self.end[g], self.pivot[g] = row, k, end, search.pivot

    def questions(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Per group, the pair it asks (``-1, -1`` for groups not swept here)."""
        swept = self.row >= 0
        plus, minus = np.full(len(self.row), -1, np.int64), np.full(len(self.row), -1, np.int64)
        plus[swept] = self.pivot[swept]
        minus[swept] = self.ask[self.row[swept], self.pos[swept]]
        return plus, minus

    def write_back(self, g: int, search: CountSearch) -> None:
        """Group ``g``'s sweep into its search (done, or failed by an answer); its row is freed."""
        row, end = int(self.row[g]), int(self.end[g])
        search.asking, search.answers = self.ask[row, :end].copy(), self.ans[row, :end].copy()
        search.asked_here = int(self.pos[g])
        self.free.append(row)
        self.row[g] = -1

    def regroup(self, group_of: npt.NDArray[np.int64], first: npt.NDArray[np.bool_]) -> None:
        """The groups are now one per key, key ``k`` of old group ``group_of[k]`` (``first`` for the
        first key of each): a split sweep's further keys get rows of their own, copies."""
        alive = np.zeros(len(self.row), dtype=bool)
        alive[group_of] = True
        self.free += self.row[~alive & (self.row >= 0)].tolist()
        row, pos, end, pivot = (a[group_of] for a in (self.row, self.pos, self.end, self.pivot))
        again = np.flatnonzero(~first & (row >= 0))
        if len(again):
            fresh = np.array(self._rows(len(again)), dtype=np.int64)
            self.ask[fresh], self.ans[fresh] = self.ask[row[again]], self.ans[row[again]]
            row[again] = fresh
        self.row, self.pos, self.end, self.pivot = row, pos, end, pivot


def count_rounds(
    target: Counter,
    searches: list[CountSearch | None],
    member: npt.NDArray[np.int64],
    n: int,
    dtype_name: str,
) -> tuple[list[CountSearch | None], npt.NDArray[np.int64], int]:
    """Ask until no search has a question; elements split as their answers differ.

    ``searches[member[e]]`` is element ``e``'s search (``None``: it takes no
    part and gets the units alone).  Returns the final searches, each
    element's, and the number of calls.  Pivot sweeps run in bulk (:class:`_Sweeps`).
    """
    unit, big = count_values(n, dtype_name)
    dtype = FORMATS[dtype_name].torch_dtype
    m, calls = len(member), 0
    # One buffer for every call's input, refilled whole each time (so a target that writes into
    # its input changes nothing that follows).
    values = np.empty((n, m), dtype=np.float32 if dtype != torch.float64 else np.float64)
    filled = torch.from_numpy(values)  # the same memory: torch fills it on all its threads
    sweeps = _Sweeps(n, len(searches))
    while True:
        pairs: dict[int, tuple[int, int]] = {}  # the questions of groups not being swept
        for g in np.flatnonzero(sweeps.row < 0).tolist():
            search = searches[g]
            pair = None if search is None else search.question()
            if search is not None and pair is not None and search.asked_here < len(search.asking):
                sweeps.join(g, search)  # the question just asked is the sweep's first
            elif pair is not None:
                pairs[g] = pair
        plus, minus = sweeps.questions()
        for g, (i, j) in pairs.items():
            plus[g], minus[g] = i, j
        if not (plus >= 0).any():
            return searches, member, calls
        plus, minus = plus[member], minus[member]
        cols = np.flatnonzero(plus >= 0)
        filled.fill_(unit)
        values[plus[cols], cols], values[minus[cols], cols] = big, -big
        x = torch.from_numpy(values).to(dtype)
        out = call_target(target, x, m).to(torch.float64).numpy() / unit
        calls += 1
        whole = np.isfinite(out) & (out == np.round(out)) & (out >= 0) & (out <= n)
        swamped = np.where(whole, n - np.where(whole, out, 0), -1).astype(np.int64)
        swamped[plus < 0] = 0
        keys, inverse = np.unique(member * (n + 2) + swamped + 1, return_inverse=True)
        group_of, answer = keys // (n + 2), keys % (n + 2) - 1
        searches = _learn(searches, pairs, sweeps, group_of, answer)
        member = inverse.reshape(-1).astype(np.int64)


def _learn(
    searches: list[CountSearch | None],
    pairs: dict[int, tuple[int, int]],
    sweeps: _Sweeps,
    group_of: npt.NDArray[np.int64],
    answer: npt.NDArray[np.int64],
) -> list[CountSearch | None]:
    """One search per key (old group ``group_of[k]``, which got ``answer[k]``): copies where a group
    split, every answer taken in (in bulk for the sweeps)."""
    first = np.ones(len(group_of), dtype=bool)
    first[1:] = group_of[1:] != group_of[:-1]  # keys are sorted: a group's keys are adjacent
    was_swept = sweeps.row[group_of] >= 0
    regrouped = [searches[g] for g in group_of.tolist()]
    for k in np.flatnonzero(~first).tolist():  # a group whose elements answered apart
        old = regrouped[k]
        regrouped[k] = None if old is None else old.copy()
    sweeps.regroup(group_of, first)
    swept = np.flatnonzero(was_swept & (answer >= 2))
    sweeps.ans[sweeps.row[swept], sweeps.pos[swept]] = answer[swept]
    sweeps.pos[swept] += 1
    for k in np.flatnonzero(was_swept & (answer < 2)).tolist():  # a failed answer: learnt one by one
        search = regrouped[k]
        assert search is not None
        pair = (int(sweeps.pivot[k]), int(sweeps.ask[sweeps.row[k], sweeps.pos[k]]))
        sweeps.write_back(k, search)
        search.learn(pair, int(answer[k]))
    for k in swept[sweeps.pos[swept] == sweeps.end[swept]].tolist():  # a sweep done
        search = regrouped[k]
        assert search is not None
        sweeps.write_back(k, search)
    for k in np.flatnonzero(~was_swept).tolist():
        search, asked = regrouped[k], pairs.get(int(group_of[k]))
        if search is not None and asked is not None:
            search.learn(asked, int(answer[k]))
    return regrouped
