"""Order probes: swamping inputs designed from the expected order, so that ``exact`` fails any other order.

Random inputs often round the same way in two orders at small ``N`` and
``M``, so ``exact`` adds these deterministic probes to every run (clause
``difftest-order-probes``).  For an element whose expected tree is ``T`` and
an addition ``v`` of ``T`` adding subtrees ``L`` and ``R``, worker ``min L``
holds ``+B``, worker ``min R`` holds ``-B``, and every other worker ``w`` the
small value ``2^(s + w)``; ``B = 2^(s + N + p + 1)`` swamps any sum of small
values added to it (reveal's probes, clause ``reveal-probes``).  Under any
binary tree of additions in the dtype the output is exactly the sum of the
small values of the workers outside the subtree where ``+B`` meets ``-B``;
under ``T`` that subtree is ``v``'s.  A tree that gives ``T``'s answer for
every addition of ``T`` therefore has every subtree (cluster) of ``T`` and is
``T``, since a rooted tree is fixed by its clusters; an output that is no such
sum (a wider accumulator, a fused addition) differs too.  Elements are
independent, so each call asks every element about one addition of its own
tree: ``N - 1`` calls per ``N``, ``M`` and dtype, at sizes that tell the expected layout from the
others (:meth:`ExactOrder.probe_sizes`).

>>> from ring_ref.difftest._oracles import SPEC_ORDER
>>> [c.values for c in probe_cases(SPEC_ORDER, 2, [torch.float32])]
[(134217728.0, 134217728.0, 134217728.0, 134217728.0, -134217728.0, -134217728.0, -134217728.0, -134217728.0)]
>>> [(c.n, c.m) for c in probe_cases(SPEC_ORDER, 3, [torch.float16])]
[(2, 4), (3, 6), (3, 6), (3, 9), (3, 9)]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ring_ref._dtypes import dtype_name, format_of
from ring_ref._order import Tree, leaves
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._oracles import ExactOrder
from ring_ref.difftest._vocabulary import Collective

__all__ = ["ProbeRun", "additions", "first_failing_probe", "probe_cases", "probe_limit", "size_form"]


def probe_limit(dtype: torch.dtype) -> int:
    """The largest ``N`` the probes serve in ``dtype``.

    The ``N`` small values must add exactly (``N <= p``), and ``B`` must be
    finite while the smallest small value is at least the smallest subnormal
    (``N <= emax - emin - 2``).

    >>> [probe_limit(d) for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16)]
    [24, 53, 11, 8]
    """
    fmt = format_of(dtype)
    return min(fmt.precision, fmt.emax - fmt.emin - 2)


def _scales(n: int, dtype: torch.dtype) -> tuple[float, float]:
    """``(2^s, B)``: the smallest small value and the swamping magnitude ``2^(s + N + p + 1)``."""
    fmt = format_of(dtype)
    s = min(0, fmt.emax - (n + fmt.precision + 1))
    return 2.0**s, 2.0 ** (s + n + fmt.precision + 1)


@functools.lru_cache(maxsize=4096)
def additions(tree: Tree) -> tuple[tuple[int, int], ...]:
    """Each addition of ``tree`` (post-order) as the pair ``(min L, min R)`` of its operands' first workers;
    a multiway node of ``k`` terms as ``k - 1`` pairs, its first term with each other.

    >>> additions(((0, 2), 1)), additions(((0, 2), 1, 3))
    (((0, 2), (0, 1)), ((0, 2), (0, 1), (0, 3)))
    """
    if isinstance(tree, int):
        return ()
    first = min(leaves(tree[0]))
    inner = [pair for child in tree for pair in additions(child)]
    return (*inner, *((first, min(leaves(child))) for child in tree[1:]))


def _values(n: int, dtype: torch.dtype, pairs: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Worker-major values: element ``e`` has ``+B`` and ``-B`` at ``pairs[e]``, small values elsewhere."""
    unit, big = _scales(n, dtype)
    rows = [[unit * 2.0**w] * len(pairs) for w in range(n)]
    for e, (plus, minus) in enumerate(pairs):
        rows[plus][e], rows[minus][e] = big, -big
    return tuple(v for row in rows for v in row)


def probe_cases(
    order: ExactOrder,
    max_workers: int,
    dtypes: Sequence[torch.dtype],
    collective: Collective = Collective.ALL_REDUCE,
) -> Iterator[Case]:
    """The probes, smallest ``N`` first: per ``N``, dtype and ``M`` of :meth:`ExactOrder.probe_sizes`,
    ``N - 1`` calls, call ``k`` asking each element about the ``k``-th addition of its expected tree.

    ``N`` runs from 2 to ``max_workers`` in ``dtypes``; an order file's trees
    (``order.saved``) are probed at their own ``N`` and dtype only.  A
    ``reduce-scatter``'s probes carry it, at the sizes whose shards are the
    order's chunks (``M = 2N``): the shards in rank order are the elements probed.
    """
    workers, dtypes = range(2, max_workers + 1), tuple(dtypes)
    if order.saved is not None:
        workers, dtypes = range(order.saved.n, order.saved.n + 1), (order.saved.dtype,)
    for n in workers:
        for dtype in dtypes:
            if n > probe_limit(dtype):
                continue
            for m in order.probe_sizes(n):
                trees = order.trees(n, m, dtype) if m == 2 * n or not collective.scatters else None
                if trees:  # None: not known, or a size this collective is not probed at
                    yield from _asking(n, m, dtype, trees, collective)


def _asking(
    n: int, m: int, dtype: torch.dtype, trees: Sequence[Tree], collective: Collective
) -> Iterator[Case]:
    """The ``N - 1`` probes at one ``M``: call ``k`` asks each element about its tree's ``k``-th addition."""
    asked = [additions(tree) for tree in trees]
    for k in range(n - 1):
        values = _values(n, dtype, [pairs[k] for pairs in asked])
        yield Case(n, m, (), dtype, "contiguous", values, collective=collective)


def size_form(m: int, n: int) -> str:
    """``M`` as ``aN + k`` (``a`` 2, 1, 3 or 4 in that order of preference, ``|k| <= 1``), else its value.

    >>> [size_form(m, 4) for m in (8, 7, 9, 3, 12, 30)]
    ['2N', '2N-1', '2N+1', 'N-1', '3N', '30']
    """
    for a in (2, 1, 3, 4):
        if abs(k := m - a * n) <= 1:
            return f"{'' if a == 1 else a}N{'' if k == 0 else f'{k:+d}'}"
    return str(m)


def _spans(keys: Sequence[int]) -> str:
    """Consecutive ``N`` as ``2..8``, the others listed: ``2..4, 6``."""
    runs: list[list[int]] = []
    for k in keys:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


@dataclass
class ProbeRun:
    """What the order probes covered: calls, per dtype the ``N`` probed (consecutive, ascending), and per
    ``N`` the ``M`` probed (in any dtype, in the order probed)."""

    calls: int = 0
    workers: dict[str, list[int]] = field(default_factory=dict)
    sizes: dict[int, list[int]] = field(default_factory=dict)

    def describe(self) -> str:
        """``order probes: 84 calls at N = 2..8 (float32, float64), N = 2..3 (float16); M = 2N (N = 2..8)``:
        each ``M`` probed as ``aN + k`` (:func:`size_form`), for the ``N`` that probed the same sizes."""
        if not self.calls:
            return "no order probes"
        by_span: dict[str, list[str]] = {}
        for name, ns in self.workers.items():
            span = f"{ns[0]}..{ns[-1]}" if len(ns) > 1 else str(ns[0])  # consecutive: N ascends, stops
            by_span.setdefault(span, []).append(name)
        where = ", ".join(f"N = {span} ({', '.join(names)})" for span, names in by_span.items())
        by_forms: dict[str, list[int]] = {}
        for n, ms in sorted(self.sizes.items()):
            by_forms.setdefault(", ".join(size_form(m, n) for m in sorted(ms)), []).append(n)
        sizes = "; ".join(f"M = {forms} (N = {_spans(ns)})" for forms, ns in by_forms.items())
        return f"order probes: {self.calls} calls at {where}" + (f"; {sizes}" if sizes else "")


def first_failing_probe(
    order: ExactOrder,
    max_workers: int,
    dtypes: Sequence[torch.dtype],
    fails: Callable[[Case], bool],
    *,
    collective: Collective = Collective.ALL_REDUCE,
    min_workers: int = 1,
) -> tuple[Case | None, ProbeRun]:
    """Run the probes (of ``N`` from ``min_workers``) until one ``fails``; that probe (``None``: all pass)
    and what ran."""
    run = ProbeRun()
    for case in (c for c in probe_cases(order, max_workers, dtypes, collective) if c.n >= min_workers):
        run.calls += 1
        ns = run.workers.setdefault(dtype_name(case.dtype), [])
        if not ns or ns[-1] != case.n:
            ns.append(case.n)
        if case.m not in (ms := run.sizes.setdefault(case.n, [])):
            ms.append(case.m)
        if fails(case):
            return case, run
    return None, run
