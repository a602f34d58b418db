"""``ring-ref reveal``: the summation tree of every result element, found from the target's outputs alone.

The idea is FPRev's (Xie et al., "Revealing the Order of Floating-Point
Summation by Numerical Testing", USENIX ATC 2025): give two workers ``+M`` and
``-M``, so large that adding anything small to them changes nothing, and the
rest small values.  Inside the subtree where ``+M`` meets ``-M`` every small
value is swamped; the two then cancel exactly, and every small value added
later survives.  FPRev gives the others the value 1 and reads *how many*
survived, one pair of workers per call (``N^2`` calls).  Here:

* **Distinct powers of two.**  Worker ``w`` holds ``2**w``, so the output is the
  bit set of the survivors and names *which* workers the subtree holds: the
  lowest common ancestor of the two, as a set of leaves (clause ``reveal-probes``).
* **Every element at once.**  Each element of the result is its own sum over
  the workers, so one call carries a different pattern per element; elements
  whose answers agree so far share one state.  The number of calls depends on
  ``N`` and the trees, not on ``M``.
* **Top-down, several questions per call.**  Each element keeps the subtrees it
  knows; every maximal subtree whose children are not yet known gets one
  question per call (they are disjoint, so their answers do not mix).  An
  answer is a new subtree, or the whole subtree again, which says the two
  workers lie on different sides of its root; once those "different sides"
  facts connect all parts of a subtree they fix its split without a call.
  Pairs of workers adjacent on the ring are asked first, which is what
  makes a ring fold cost about ``N`` calls.
* **Checked.**  A subtree that was inferred rather than seen is asked once
  more (its two sides must swamp everything else in it), and the trees are then
  evaluated on random inputs and compared with the target bit for bit.  An
  element whose answers fit no binary tree of additions in the dtype -- a
  wider accumulator rounding once, a fused or compensated sum -- gets no
  tree (``None``), never a wrong one.

Limits: the small values must add exactly (``N`` bits of the significand), so
``N <= 24`` in float32 and ``N <= 53`` in float64 (clause ``reveal-limits``).

>>> import torch
>>> found = reveal(lambda x: (x[0] + x[1]) + x[2], 3, 6)
>>> found.trees[0], found.classification, found.calls
(((0, 1), 2), 'folds', 6)
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._dtypes import FORMATS, bits
from ring_ref.schedule import LAYOUTS, PRESETS, Layout, RingSchedule

__all__ = [
    "LIMITS",
    "REVEAL_FORMAT",
    "REVEAL_VERSION",
    "RevealError",
    "Revealed",
    "Tree",
    "canonical",
    "evaluate",
    "fold_tree",
    "format_tree",
    "render_svg",
    "reveal",
    "tree_from_json",
    "tree_ids",
    "tree_to_json",
]

Tree = int | tuple["Tree", "Tree"]
"""A summation tree: a worker id, or ``(left, right)`` meaning ``left + right``."""

Leaves = frozenset[int]

REVEAL_FORMAT: Final = "ring-ref-reveal"
REVEAL_VERSION: Final = 1

LIMITS: Final[dict[str, int]] = {
    "float32": FORMATS["float32"].precision,
    "float64": FORMATS["float64"].precision,
}
"""The largest ``N`` per dtype: the ``N`` small probe values must add exactly."""

DTYPES: Final[dict[str, torch.dtype]] = {name: FORMATS[name].torch_dtype for name in LIMITS}

CHECKS: Final = 4
"""Random-input bitwise checks after the trees are found (calls)."""

Classification = Literal["ring", "folds", "trees", "partly-trees", "no-tree"]


class RevealError(ValueError):
    """The reveal cannot run: a size beyond the limits, or a target that misbehaves on valid input."""


# --- trees ------------------------------------------------------------------------------------------


def tree_ids(trees: Sequence[Tree | None]) -> tuple[npt.NDArray[np.int64], list[Tree]]:
    """Each element's tree as an index into the distinct trees (``-1`` for ``None``), and those trees.

    Equal trees are usually the same object, so most elements cost one ``id`` lookup.

    >>> tree_ids([(0, 1), None, (0, 1)])
    (array([ 0, -1,  0]), [(0, 1)])
    """
    by_object: dict[int, int] = {}
    by_value: dict[Tree, int] = {}
    out = np.empty(len(trees), dtype=np.int64)
    for e, tree in enumerate(trees):
        if tree is None:
            out[e] = -1
            continue
        k = by_object.get(id(tree))
        if k is None:
            k = by_object[id(tree)] = by_value.setdefault(tree, len(by_value))
        out[e] = k
    return out, list(by_value)


def leaves(tree: Tree) -> Leaves:
    """The workers a tree adds.

    >>> sorted(leaves(((2, 0), 1)))
    [0, 1, 2]
    """
    if isinstance(tree, int):
        return frozenset((tree,))
    return leaves(tree[0]) | leaves(tree[1])


def _size_and_min(tree: Tree) -> tuple[int, int]:
    found = leaves(tree)
    return len(found), min(found)


def canonical(tree: Tree) -> Tree:
    """The one spelling of a tree: in every node the child with more leaves first, ties by smallest leaf.

    Addition is commutative, so ``(a, b)`` and ``(b, a)`` give the same bits and
    no output can tell them apart; this picks one.

    >>> canonical((3, (1, (2, 0))))
    (((0, 2), 1), 3)
    """
    if isinstance(tree, int):
        return tree
    a, b = canonical(tree[0]), canonical(tree[1])
    sa, sb = _size_and_min(a), _size_and_min(b)
    return (a, b) if (-sa[0], sa[1]) <= (-sb[0], sb[1]) else (b, a)


def fold_tree(order: Sequence[int]) -> Tree:
    """The left fold ``((w0 + w1) + w2) + ...`` of ``order``, canonical.

    >>> fold_tree([3, 2, 1, 0])
    (((2, 3), 1), 0)
    """
    tree: Tree = order[0]
    for w in order[1:]:
        tree = (tree, w)
    return canonical(tree)


def chain_order(tree: Tree) -> list[int] | None:
    """The workers in the order a fold adds them, if ``tree`` is a fold (the first two in canonical order).

    >>> chain_order((((0, 3), 1), 2)), chain_order(((0, 1), (2, 3)))
    ([0, 3, 1, 2], None)
    """
    tail: list[int] = []
    while not isinstance(tree, int):
        a, b = tree
        if isinstance(b, int):
            tail.append(b)
            tree = a
        elif isinstance(a, int):
            tail.append(a)
            tree = b
        else:
            return None
    return [tree, *reversed(tail)]


def format_tree(tree: Tree, order: Sequence[int] | None = None) -> str:
    """``fold 3,0,1,2`` for a fold (in ``order`` when given and it spells the same tree), else parentheses.

    >>> format_tree((((0, 3), 1), 2)), format_tree((((0, 3), 1), 2), [3, 0, 1, 2])
    ('fold 0,3,1,2', 'fold 3,0,1,2')
    >>> format_tree(((0, 1), (2, 3)))
    '((0+1)+(2+3))'
    """
    if order is not None and fold_tree(order) == canonical(tree):
        return "fold " + ",".join(map(str, order))
    chain = chain_order(tree)
    if chain is not None and len(chain) > 1:
        return "fold " + ",".join(map(str, chain))
    return _parenthesised(tree)


def _parenthesised(tree: Tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    return f"({_parenthesised(tree[0])}+{_parenthesised(tree[1])})"


def tree_to_json(tree: Tree | None) -> Any:
    """A leaf as its worker id, an inner node as ``[left, right]``; ``None`` as ``null``."""
    if tree is None or isinstance(tree, int):
        return tree
    return [tree_to_json(tree[0]), tree_to_json(tree[1])]


def tree_from_json(doc: Any, n: int) -> Tree:
    """The tree a ``reveal --json`` entry spells, checked: every worker ``0 .. n - 1`` exactly once.

    >>> tree_from_json([[0, 1], 2], 3)
    ((0, 1), 2)
    """
    tree = _parse(doc, n)
    got = sorted(_leaf_list(tree))
    if got != list(range(n)):
        raise ValueError(f"a tree must add every worker 0 .. {n - 1} exactly once; this one adds {got}")
    return tree


def _parse(doc: Any, n: int) -> Tree:
    if isinstance(doc, int) and not isinstance(doc, bool) and 0 <= doc < n:
        return doc
    if isinstance(doc, list) and len(doc) == 2:
        return (_parse(doc[0], n), _parse(doc[1], n))
    raise ValueError(f"a tree node must be a worker id in 0 .. {n - 1} or a [left, right] pair; got {doc!r}")


def _leaf_list(tree: Tree) -> list[int]:
    return [tree] if isinstance(tree, int) else _leaf_list(tree[0]) + _leaf_list(tree[1])


def evaluate(tree: Tree, x: torch.Tensor) -> torch.Tensor:
    """The tree's additions on ``x`` of shape ``(N, ...)``, each rounded to ``x``'s dtype."""
    if isinstance(tree, int):
        return x[tree].clone()
    return torch.add(evaluate(tree[0], x), evaluate(tree[1], x))


# --- the state of one group of elements -----------------------------------------------------------


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


# --- probes ---------------------------------------------------------------------------------------


def _probe_values(n: int, dtype_name: str) -> tuple[npt.NDArray[np.float64], float]:
    """The small values ``2**w`` per worker and the swamping magnitude ``2**(n + p + 1)``."""
    small = np.exp2(np.arange(n, dtype=np.float64))
    return small, float(2.0 ** (n + FORMATS[dtype_name].precision + 1))


def _call(target: Callable[[torch.Tensor], object], x: torch.Tensor, m: int) -> torch.Tensor:
    try:
        out = target(x)
    except Exception as exc:
        raise RevealError(f"the target raised {type(exc).__name__}: {exc} (on a valid input)") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (m,) or out.dtype != x.dtype:
        got = (
            f"{type(out).__name__} {tuple(out.shape)} {out.dtype}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise RevealError(f"the target must return a ({m},) tensor of {x.dtype}; it returned {got}")
    return out.detach().cpu()


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
    x = torch.from_numpy(np.ascontiguousarray(patterns[groups.member].T)).to(DTYPES[dtype_name])
    return _answers(_call(target, x, len(groups.member)), n)


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


def _probe(
    target: Callable[[torch.Tensor], object], n: int, m: int, dtype_name: str, seed: int
) -> tuple[list[Verdict], npt.NDArray[np.int64], int, int]:
    """The probing and confirming calls: the distinct verdicts, each element's, and the two call counts."""
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
    index: dict[Verdict, int] = {}
    of_group = [
        index.setdefault((None, s.failure) if s.failure is not None else (s.tree(), None), len(index))
        for s in groups.states
    ]
    return list(index), np.array(of_group, dtype=np.int64)[groups.member], probe_calls, confirm_calls


# --- the result ------------------------------------------------------------------------------------


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

    def tree_index(self) -> tuple[npt.NDArray[np.int64], list[Tree]]:
        """Each element's tree as an index into the distinct trees (``-1``: none), and those trees."""
        distinct: dict[Tree, int] = {}
        per = [-1 if tree is None else distinct.setdefault(tree, len(distinct)) for tree, _ in self.verdicts]
        return np.array(per, dtype=np.int64)[self.of], list(distinct)

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
        if all(chain_order(t) is not None for t in found):
            return "folds"
        return "trees"

    def chunks(self) -> list[int] | None:
        """Each element's chunk under the fitted ring's layout."""
        if self.ring is None:
            return None
        chunk: list[int] = _chunk_index(self.ring.layout, self.n, self.m, self.dtype).tolist()
        return chunk

    def runs(self) -> list[tuple[int, int, Tree | None]]:
        """Maximal runs ``(first, last, tree)`` of consecutive elements with the same tree (and chunk)."""
        chunk = self.chunks()
        key = self.of * (self.n + 1) + (np.array(chunk) if chunk is not None else 0)
        starts = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), self.m]
        tree = [t for t, _ in self.verdicts]
        return [(a, b - 1, tree[int(self.of[a])]) for a, b in itertools.pairwise(starts)]

    def describe(self, tree: Tree, element: int) -> str:
        """``tree`` as the summary prints it: a fold in the fitted ring's order where one fits."""
        chunk = self.chunks()
        order = list(self.ring.fold_order(chunk[element], self.n)) if self.ring and chunk else None
        return format_tree(tree, order)

    def distinct(self) -> list[Tree]:
        """The distinct trees."""
        return self.tree_index()[1]

    def summary(self) -> str:
        """The human report: runs of elements sharing a tree, the classification, calls and time."""
        chunk = self.chunks()
        lines = [f"ring-ref reveal {self.target}  (N = {self.n}, M = {self.m}, {self.dtype})"]
        reasons = [reason for _, reason in self.verdicts]
        for first, last, tree in self.runs():
            span = f"element {first}" if first == last else f"elements {first}..{last}"
            if chunk is not None:
                span += f" (chunk {chunk[first]})"
            if tree is None:
                why = reasons[int(self.of[first])]
                lines.append(f"  {span}: no tree of {self.dtype} additions explains it ({why})")
            else:
                lines.append(f"  {span}: {self.describe(tree, first)}")
        ring = (
            f" (direction {self.ring.direction:+d}, offset {self.ring.offset}, layout {self.ring.layout})"
            if self.ring
            else ""
        )
        lines.append(f"classification: {self.classification}{ring}")
        lines.append(f"matches presets: {', '.join(self.matches) if self.matches else 'none'}")
        lines.append(
            f"calls: {self.calls} ({self.probe_calls} probing, {self.confirm_calls} confirming, "
            f"{self.check_calls} checking on random inputs); time {self.seconds:.2f} s"
        )
        return "\n".join(lines)

    def json_trees(self) -> list[Any]:
        """``trees`` as ``--json`` spells them (each distinct tree converted once)."""
        spelt = [tree_to_json(tree) for tree, _ in self.verdicts]
        return [spelt[v] for v in self.of.tolist()]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (schema ``spec/reveal.schema.json``)."""
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
            "trees": self.json_trees(),
            "ring": ring,
            "matches": list(self.matches),
            "classification": self.classification,
            "calls": self.calls,
            "callsBy": {"probe": self.probe_calls, "confirm": self.confirm_calls, "check": self.check_calls},
            "seconds": round(self.seconds, 4),
        }


def _itemsize(dtype_name: str) -> int:
    return FORMATS[dtype_name].bits // 8


# --- fitting rings and presets --------------------------------------------------------------------


def _chunk_index(layout: Layout, n: int, m: int, dtype_name: str) -> npt.NDArray[np.int64]:
    bounds = chunk_bounds(layout, n, m, itemsize=_itemsize(dtype_name))
    return np.repeat(np.arange(n, dtype=np.int64), [hi - lo for lo, hi in bounds])


def ring_trees(ring: RingSchedule, n: int, m: int, dtype_name: str) -> list[Tree] | None:
    """The tree of every element under ``ring`` (``None`` when its layout cannot cut ``M``)."""
    if ring.layout == "even" and m % n:
        return None
    per_chunk = [fold_tree(ring.fold_order(c, n)) for c in range(n)]
    return [per_chunk[c] for c in _chunk_index(ring.layout, n, m, dtype_name).tolist()]


class _Fit:
    """Each element's tree as an id (``-1``: none), to test whole rings against them in one comparison."""

    def __init__(self, ids: npt.NDArray[np.int64], distinct: Sequence[Tree], n: int, dtype_name: str) -> None:
        self.n, self.m, self.dtype = n, len(ids), dtype_name
        self.found = ids
        self.ids = {t: k for k, t in enumerate(distinct)}
        self.chunk_of: dict[Layout, npt.NDArray[np.int64]] = {}

    @classmethod
    def of_verdicts(
        cls, verdicts: Sequence[Verdict], of: npt.NDArray[np.int64], n: int, dtype_name: str
    ) -> _Fit:
        distinct: dict[Tree, int] = {}
        per = [-1 if tree is None else distinct.setdefault(tree, len(distinct)) for tree, _ in verdicts]
        return cls(np.array(per, dtype=np.int64)[of], list(distinct), n, dtype_name)

    def fits(self, ring: RingSchedule) -> bool:
        """Whether every element's tree is its chunk's fold under ``ring``."""
        if (self.found < 0).any() or (ring.layout == "even" and self.m % self.n):
            return False
        if ring.layout not in self.chunk_of:
            self.chunk_of[ring.layout] = _chunk_index(ring.layout, self.n, self.m, self.dtype)
        per_chunk = [self.ids.get(fold_tree(ring.fold_order(c, self.n)), -1) for c in range(self.n)]
        return bool(np.array_equal(np.array(per_chunk)[self.chunk_of[ring.layout]], self.found))

    def first_ring(self) -> RingSchedule | None:
        """The first ring of the family that fits: presets, then ``d = +1, -1``, ``k = 0 .. N - 1``,
        layouts ``even``, ``blocks``, ``gloo`` (small rings fit several; for ``N <= 2`` all are one)."""
        candidates = [p.normalized(self.n) for p in PRESETS.values()]
        candidates += [RingSchedule(d, k, lay) for d in (1, -1) for k in range(self.n) for lay in LAYOUTS]
        return next((ring for ring in dict.fromkeys(candidates) if self.fits(ring)), None)


def fit_ring(trees: Sequence[Tree | None], n: int, dtype_name: str) -> RingSchedule | None:
    """The first ring of the family whose fold of each element's chunk is exactly ``trees``."""
    ids, distinct = tree_ids(trees)
    return _Fit(ids, distinct, n, dtype_name).first_ring()


def _random_inputs(n: int, m: int, dtype_name: str, rng: np.random.Generator) -> torch.Tensor:
    """Finite values of both signs with full significands over 2^16 of magnitude: additions round."""
    scale = np.ldexp(1.0, rng.integers(-8, 9, (n, m)))
    values = (1.0 + rng.random((n, m))) * np.where(rng.random((n, m)) < 0.5, -scale, scale)
    return torch.from_numpy(values).to(DTYPES[dtype_name])


def _check(
    target: Callable[[torch.Tensor], object],
    verdicts: list[Verdict],
    of: npt.NDArray[np.int64],
    n: int,
    dtype_name: str,
    *,
    checks: int,
    seed: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Evaluate every tree on random inputs; elements whose bits differ move to a verdict without tree.

    ``verdicts`` and ``of`` (each element's verdict) are updated in place.
    """
    m = len(of)
    rng = np.random.default_rng(seed)
    inputs, outputs = [], []
    for k in range(checks):
        x = _random_inputs(n, m, dtype_name, rng)
        out = _call(target, x, m)
        inputs.append(x)
        outputs.append(out)
        for v, (tree, _) in enumerate(list(verdicts)):
            cols = torch.from_numpy(np.flatnonzero(of == v))
            if tree is None or not len(cols):
                continue
            want = evaluate(tree, x[:, cols])
            bad = (bits(want) != bits(out[cols])).nonzero().reshape(-1)
            if len(bad):
                e = int(cols[int(bad[0])])
                reason = (
                    f"its answers fit the tree {format_tree(tree)}, but on random input {k} the target "
                    f"gives {float(out[e])!r} where that tree gives {float(want[int(bad[0])])!r} "
                    f"(element {e})"
                )
                verdicts.append((None, reason))
                of[cols[bad].numpy()] = len(verdicts) - 1
    return inputs, outputs


def _matches(fit: _Fit, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[str]:
    """The presets whose tree is every element's revealed tree and whose bits equal the target's on every
    checking input (random inputs alone tell small trees apart only now and then)."""
    from ring_ref._dispatch import ring_all_reduce

    return [
        name
        for name, ring in PRESETS.items()
        if fit.fits(ring)
        and all(
            torch.equal(bits(ring_all_reduce(x, "fast", schedule=name)), bits(out))
            for x, out in zip(inputs, outputs, strict=True)
        )
    ]


# --- the entry point --------------------------------------------------------------------------------


def check_size(n: int, m: int, dtype_name: str) -> None:
    """Refuse sizes the probes cannot serve (clause ``reveal-limits``)."""
    if dtype_name not in LIMITS:
        raise RevealError(f"reveal supports dtype float32 or float64; got {dtype_name!r}")
    if n < 1 or m < 1:
        raise RevealError(f"N = {n} and M = {m} must both be at least 1")
    limit = LIMITS[dtype_name]
    if n > limit:
        other = " (float64 reaches N = 53)" if dtype_name == "float32" else ""
        raise RevealError(
            f"N = {n} is beyond reveal's limit for {dtype_name}: N <= {limit}, because the {n} small probe "
            f"values 2^0 .. 2^{n - 1} must add exactly in the {limit}-bit significand{other}"
        )


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

    ``target`` takes a ``(n, m)`` tensor of ``dtype`` (``"float32"`` or
    ``"float64"``) and returns the ``(m,)`` sum over workers, like
    :func:`ring_ref.ring_all_reduce`.  Raises :class:`RevealError` beyond the
    limits or when the target raises or returns the wrong shape or dtype.
    """
    check_size(n, m, dtype)
    start = time.perf_counter()
    verdicts, of, probe_calls, confirm_calls = _probe(target, n, m, dtype, seed)
    inputs, outputs = _check(target, verdicts, of, n, dtype, checks=checks, seed=seed)
    fit = _Fit.of_verdicts(verdicts, of, n, dtype)
    return Revealed(
        target=name,
        n=n,
        m=m,
        dtype=dtype,
        verdicts=verdicts,
        of=of,
        ring=fit.first_ring(),
        matches=_matches(fit, inputs, outputs),
        probe_calls=probe_calls,
        confirm_calls=confirm_calls,
        check_calls=len(inputs),
        seconds=time.perf_counter() - start,
    )


# --- the picture ------------------------------------------------------------------------------------

_LEAF_GAP: Final = 30
_LEVEL: Final = 26
_PAD: Final = 16
_TITLE: Final = 20


def _layout(
    tree: Tree, x0: float
) -> tuple[dict[int, tuple[float, int]], list[tuple[float, int, float, int]], float, int]:
    """Leaf and inner-node positions: ``(leaves, edges, x, height)`` of ``tree`` drawn from ``x0``."""
    if isinstance(tree, int):
        return {tree: (x0, 0)}, [], x0, 0
    left, e1, xl, hl = _layout(tree[0], x0)
    right, e2, xr, hr = _layout(tree[1], max(x for x, _ in left.values()) + _LEAF_GAP)
    height = 1 + max(hl, hr)
    x = (xl + xr) / 2
    return {**left, **right}, [*e1, *e2, (x, height, xl, hl), (x, height, xr, hr)], x, height


def render_svg(found: Revealed) -> str:
    """An SVG of the distinct trees, one panel each, titled with the elements that have it.

    Leaves are workers (bottom row); every inner node is one addition in the
    dtype, drawn above its two operands.  Each panel is a ``<g class="tree">``
    with ``data-tree`` (the ``--json`` spelling).

    >>> svg = render_svg(reveal(lambda x: (x[0] + x[1]) + x[2], 3, 2, checks=1))
    >>> svg.startswith("<svg") and svg.count('class="tree"')
    1
    """
    import json
    from xml.sax.saxutils import escape

    panels = []
    y_top = 0.0
    width = 2 * _PAD + _LEAF_GAP * max(found.n - 1, 1) + 40
    runs = found.runs()
    for tree in found.distinct():
        mine = [(a, b) for a, b, t in runs if t == tree]
        spans = [f"{a}..{b}" if a != b else f"{a}" for a, b in mine]
        title = "elements " + ", ".join(spans[:6]) + (", ..." if len(spans) > 6 else "")
        title += ": " + found.describe(tree, mine[0][0])
        width = max(width, int(7 * len(title)) + 2 * _PAD)
        pos, edges, _, height = _layout(tree, _PAD + 20)
        base = y_top + _TITLE + _PAD + height * _LEVEL
        parts = [
            f'<g class="tree" data-tree="{escape(json.dumps(tree_to_json(tree)))}">',
            f'<text x="{_PAD}" y="{y_top + 14:.0f}" font-size="12">{escape(title)}</text>',
        ]
        for x1, h1, x2, h2 in edges:
            parts.append(
                f'<line x1="{x1:.1f}" y1="{base - h1 * _LEVEL:.1f}" '
                f'x2="{x2:.1f}" y2="{base - h2 * _LEVEL:.1f}" stroke="#444" stroke-width="1.5"/>'
            )
        for x1, h1, _, _ in edges[1::2]:
            parts.append(f'<circle cx="{x1:.1f}" cy="{base - h1 * _LEVEL:.1f}" r="4" fill="#2c7fb8"/>')
        for w, (x, _) in pos.items():
            parts.append(f'<circle cx="{x:.1f}" cy="{base:.1f}" r="9" fill="#ffffcc" stroke="#444"/>')
            parts.append(
                f'<text x="{x:.1f}" y="{base + 4:.1f}" font-size="11" text-anchor="middle">{w}</text>'
            )
        parts.append("</g>")
        panels.append("\n".join(parts))
        y_top = base + _PAD + 12
    if not panels:
        panels.append(f'<text x="{_PAD}" y="14" font-size="12">no element has a tree</text>')
        y_top = 30
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y_top:.0f}" '
        f'font-family="sans-serif">\n' + "\n".join(panels) + "\n</svg>\n"
    )
