"""The probing search: each element's summation tree, asked of the target a few subtrees per call.

Worker ``w`` holds ``2**w``, except that two workers of one known subtree hold
``+M`` and ``-M``, so large that they swamp every small value added to them
before they meet (clause ``reveal-probes``).  The output is then the bit set of
the workers that survived, which names the subtree where ``+M`` met ``-M``.
Elements whose answers agree so far share one :class:`_Knowledge`; each asks
one question per maximal subtree whose split is not yet known, pairs of ring
neighbours first.  Splits inferred rather than seen are asked once more
(confirming).  Answers that fit no binary tree give a verdict without a tree.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS
from ring_ref._order import Leaves, Tree, canonical
from ring_ref._reveal._count import CountSearch, count_rounds
from ring_ref._reveal._target import REVEAL_DTYPES, SET_LIMITS, call_target

__all__ = ["Verdict", "probe"]


class _Failed(Exception):
    """The answers so far fit no binary tree; the message says which answer."""


Query = tuple[Leaves, int, int]
"""One question: inside known subtree ``S``, ``+M`` at worker ``x`` and ``-M`` at worker ``y``."""


@dataclass
class _Knowledge:
    """What one group of elements has learnt: known subtrees, and pairs known to be split at a root."""

    n: int
    nodes: set[Leaves] = field(default_factory=set)
    seen: set[Leaves] = field(default_factory=set)
    apart: set[tuple[Leaves, int, int]] = field(default_factory=set)
    failure: str | None = None
    unconfirmed: list[Leaves] | None = None

    def copy(self) -> _Knowledge:
        unconfirmed = None if self.unconfirmed is None else list(self.unconfirmed)
        return _Knowledge(self.n, set(self.nodes), set(self.seen), set(self.apart), self.failure, unconfirmed)

    def children(self) -> dict[Leaves, list[Leaves]]:
        """Each known subtree's parts: its largest known proper subtrees and its other workers, one each."""
        ordered = sorted(self.nodes, key=len)
        parts: dict[Leaves, list[Leaves]] = {}
        for k, node in enumerate(ordered):
            inner = [t for t in ordered[:k] if t < node]
            tops = [t for t in inner if not any(t < u for u in inner)]
            covered = frozenset().union(*tops) if tops else frozenset()
            parts[node] = tops + [frozenset((w,)) for w in sorted(node - covered)]
        return parts

    def _colours(self, node: Leaves, parts: list[Leaves]) -> tuple[list[int], list[int]]:
        """Two-colour ``node``'s parts by the known splits; ``(component, colour)`` per part."""
        index = {w: k for k, part in enumerate(parts) for w in part}
        edges: dict[int, list[int]] = {k: [] for k in range(len(parts))}
        for at, x, y in self.apart:
            if at == node:
                edges[index[x]].append(index[y])
                edges[index[y]].append(index[x])
        component, colour = [-1] * len(parts), [0] * len(parts)
        for start in range(len(parts)):
            if component[start] >= 0:
                continue
            component[start], stack = start, [start]
            while stack:
                u = stack.pop()
                for v in edges[u]:
                    if component[v] < 0:
                        component[v], colour[v] = start, 1 - colour[u]
                        stack.append(v)
                    elif colour[v] == colour[u]:
                        raise _Failed(
                            f"the answers put workers of {sorted(parts[u])} and {sorted(parts[v])} on "
                            f"different sides of the addition that makes {sorted(node)}, and on the same side"
                        )
        return component, colour

    def derive(self) -> None:
        """Add the two sides of every subtree whose known splits connect all its parts."""
        changed = True
        while changed:
            changed = False
            for node, parts in self.children().items():
                if len(parts) <= 2:
                    continue
                component, colour = self._colours(node, parts)
                if len(set(component)) == 1:
                    for side in (0, 1):
                        half = frozenset().union(
                            *(p for p, c in zip(parts, colour, strict=True) if c == side)
                        )
                        if len(half) >= 2 and half not in self.nodes:
                            self.nodes.add(half)
                            changed = True
                    break

    def questions(self, rng: random.Random) -> list[Query]:
        """One question for each maximal subtree whose split is not yet known."""
        parts = self.children()
        open_nodes = [s for s, p in parts.items() if len(p) > 2]
        tops = [s for s in open_nodes if not any(s < t for t in open_nodes)]
        return [self._question(s, parts[s], rng) for s in sorted(tops, key=sorted)]

    def _question(self, node: Leaves, parts: list[Leaves], rng: random.Random) -> Query:
        component, colour = self._colours(node, parts)
        best: tuple[tuple[bool, bool, int, float], int, int] | None = None
        for i, j in itertools.combinations(range(len(parts)), 2):
            same_part = component[i] == component[j]
            if same_part and colour[i] != colour[j]:
                continue
            adjacent = any((u - v) % self.n in (1, self.n - 1) for u in parts[i] for v in parts[j])
            score = (not same_part, not adjacent, -max(len(parts[i]), len(parts[j])), rng.random())
            if best is None or score < best[0]:
                best = (score, i, j)
        assert best is not None, "a subtree with three or more parts always has an open pair"
        return node, min(parts[best[1]]), min(parts[best[2]])

    def learn(self, questions: Sequence[Query], answer: int) -> None:
        """Take in the output (the surviving small workers as a bit set) of one call."""
        if answer < 0:
            raise _Failed("the output is not a sum of the small probe values (no swamping pattern)")
        big = {w for _, x, y in questions for w in (x, y)}
        inside = frozenset().union(*(node for node, _, _ in questions))
        survivors = {w for w in range(self.n) if answer >> w & 1}
        if survivors & big or answer >> self.n:
            raise _Failed("the output holds more than the small probe values")
        if set(range(self.n)) - inside - big - survivors:
            raise _Failed(
                f"workers {sorted(set(range(self.n)) - inside - survivors)} were swamped outside every "
                "subtree holding the large probe values"
            )
        parts = self.children()
        for node, x, y in questions:
            lost = frozenset(w for w in node if w not in survivors)
            cut = [part for part in parts[node] if part & lost and not part <= lost]
            if cut:
                raise _Failed(
                    f"with +M at worker {x} and -M at worker {y} exactly workers {sorted(lost)} were "
                    f"swamped, which splits workers {sorted(cut[0])} that an earlier answer showed are "
                    "added together first"
                )
            self.seen.add(lost)
            if lost == node:
                self.apart.add((node, x, y))
            else:
                self.nodes.add(lost)

    def tree(self) -> Tree:
        parts = self.children()

        def build(node: Leaves) -> Tree:
            if len(node) == 1:
                return next(iter(node))
            a, b = parts[node]
            return (build(a), build(b))

        return canonical(build(frozenset(range(self.n))))

    def unseen(self) -> list[Leaves]:
        """Subtrees of three or more workers that were inferred, never answered directly."""
        return [s for s in self.nodes if len(s) >= 3 and s not in self.seen]


def _probe_values(n: int, dtype_name: str) -> tuple[npt.NDArray[np.float64], float]:
    """The small values ``2**w`` per worker and the swamping magnitude ``2**(n + p + 1)``."""
    small = np.exp2(np.arange(n, dtype=np.float64))
    return small, float(2.0 ** (n + FORMATS[dtype_name].precision + 1))


def _answers(out: torch.Tensor, n: int) -> npt.NDArray[np.int64]:
    """Each output as the integer bit set it spells, or ``-1`` where it is not one."""
    values = out.to(torch.float64).numpy()
    whole = np.isfinite(values) & (values >= 0) & (values < 2.0**n) & (np.floor(values) == values)
    return np.where(whole, values, -1).astype(np.int64)


@dataclass
class _Groups:
    """Elements grouped by what they have answered so far; ``member[e]`` is element ``e``'s group."""

    states: list[_Knowledge]
    member: npt.NDArray[np.int64]

    def split(self, answers: npt.NDArray[np.int64], learn: Callable[[int, int], _Knowledge]) -> None:
        """Regroup by ``(group, answer)``; ``learn(group, answer)`` is the state of each new group."""
        values, answer_index = np.unique(answers, return_inverse=True)
        keys, inverse = np.unique(self.member * len(values) + answer_index.reshape(-1), return_inverse=True)
        self.states = [learn(int(k) // len(values), int(values[int(k) % len(values)])) for k in keys]
        self.member = inverse.reshape(-1).astype(np.int64)


def _ask(
    target: Callable[[torch.Tensor], object],
    groups: _Groups,
    plans: list[list[Query]],
    n: int,
    dtype_name: str,
) -> npt.NDArray[np.int64]:
    """One call: per element its group's questions (``+M``/``-M`` pairs, small values elsewhere)."""
    small, big = _probe_values(n, dtype_name)
    patterns = np.tile(small, (len(plans), 1))
    for g, plan in enumerate(plans):
        for _, plus, minus in plan:
            patterns[g, plus], patterns[g, minus] = big, -big
    x = torch.from_numpy(np.ascontiguousarray(patterns[groups.member].T)).to(REVEAL_DTYPES[dtype_name])
    return _answers(call_target(target, x, len(groups.member)), n)


Planner = Callable[[_Knowledge], list[Query]]
Learner = Callable[[_Knowledge, list[Query], int], None]


def _rounds(
    target: Callable[[torch.Tensor], object],
    groups: _Groups,
    n: int,
    dtype_name: str,
    *,
    plan: Planner,
    learn: Learner,
    limit: int,
) -> int:
    """Ask until no group has a question (or ``limit`` calls); return the number of calls."""
    calls = 0
    while True:
        plans = [plan(state) if state.failure is None else [] for state in groups.states]
        if not any(plans):
            return calls
        if calls >= limit:
            for state, questions in zip(groups.states, plans, strict=True):
                if questions:
                    state.failure = f"no tree after {limit} calls"
            return calls
        answers = _ask(target, groups, plans, n, dtype_name)
        calls += 1
        asked = np.array([bool(q) for q in plans])[groups.member]

        def regroup(g: int, answer: int, plans: list[list[Query]] = plans) -> _Knowledge:
            old = groups.states[g]
            if not plans[g]:
                return old
            new = old.copy()
            try:
                learn(new, plans[g], answer)
            except _Failed as exc:
                new.failure = str(exc)
            return new

        groups.split(np.where(asked, answers, 0), regroup)


def _plan_probe(seed: int) -> Planner:
    def plan(state: _Knowledge) -> list[Query]:
        try:
            state.derive()
            return state.questions(random.Random(f"{seed}:{sorted(map(sorted, state.nodes))}"))
        except _Failed as exc:
            state.failure = str(exc)
            return []

    return plan


def _learn_probe(state: _Knowledge, questions: list[Query], answer: int) -> None:
    state.learn(questions, answer)


def _plan_confirm(state: _Knowledge) -> list[Query]:
    """Disjoint inferred subtrees, largest first, each asked with one worker from each side."""
    if state.unconfirmed is None:
        state.unconfirmed = sorted(state.unseen(), key=lambda s: (-len(s), sorted(s)))
    parts = state.children()
    chosen: list[Leaves] = []
    for node in state.unconfirmed:
        if all(not node & other for other in chosen):
            chosen.append(node)
    return [(node, min(parts[node][0]), min(parts[node][1])) for node in chosen]


def _learn_confirm(state: _Knowledge, questions: list[Query], answer: int) -> None:
    survivors = {w for w in range(state.n) if answer >= 0 and answer >> w & 1}
    for node, x, y in questions:
        if answer < 0 or any(w in survivors for w in node):
            raise _Failed(
                f"the inferred subtree {sorted(node)} did not swamp when asked directly (+M at worker {x}, "
                f"-M at worker {y})"
            )
        assert state.unconfirmed is not None
        state.unconfirmed.remove(node)


Verdict = tuple[Tree | None, str | None]
"""An element's tree, or ``None`` and the reason why none."""


def _set_probe(
    target: Callable[[torch.Tensor], object], n: int, m: int, dtype_name: str, seed: int
) -> tuple[_Groups, int, int]:
    """The set probes and their confirming calls: the final groups and the two call counts."""
    first = _Knowledge(n)
    if n >= 2:
        first.nodes.add(frozenset(range(n)))
    groups = _Groups([first], np.zeros(m, np.int64))
    probe_calls = _rounds(
        target, groups, n, dtype_name, plan=_plan_probe(seed), learn=_learn_probe, limit=4 * n + 8
    )
    confirm_calls = _rounds(
        target, groups, n, dtype_name, plan=_plan_confirm, learn=_learn_confirm, limit=4 * n + 8
    )
    return groups, probe_calls, confirm_calls


def probe(
    target: Callable[[torch.Tensor], object], n: int, m: int, dtype_name: str, seed: int
) -> tuple[list[Verdict], npt.NDArray[np.int64], int, int, int]:
    """The probing and confirming calls: the distinct verdicts, each element's, and the call counts
    (probing, of which counting, and confirming).

    Set probes where ``N`` fits the significand (clause ``reveal-probes``);
    count probes (clause ``reveal-counts``) beyond, and for the elements whose
    set-probe answers fit no binary tree (a multiway node, an exact sum).
    """
    index: dict[Verdict, int] = {}
    if n <= SET_LIMITS.get(dtype_name, 0):
        groups, probe_calls, confirm_calls = _set_probe(target, n, m, dtype_name, seed)
        of_group = [
            index.setdefault((None, s.failure) if s.failure is not None else (s.tree(), None), len(index))
            for s in groups.states
        ]
        of = np.array(of_group, dtype=np.int64)[groups.member]
        failed = np.array([tree is None for tree, _ in index], dtype=bool)[of]
    else:
        probe_calls = confirm_calls = 0
        of, failed = np.zeros(m, dtype=np.int64), np.ones(m, dtype=bool)
    if not failed.any():
        return list(index), of, probe_calls, 0, confirm_calls
    searches, member, count_calls = count_rounds(
        target, [None, CountSearch.start(n)], failed.astype(np.int64), n, dtype_name
    )
    by_search = [
        -1
        if search is None
        else index.setdefault(
            (None, search.failure) if search.failure is not None else (search.tree(), None), len(index)
        )
        for search in searches
    ]
    found = np.array(by_search, dtype=np.int64)[member]
    of = np.where(failed, found, of)
    return list(index), of, probe_calls + count_calls, count_calls, confirm_calls
