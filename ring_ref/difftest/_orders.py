"""Exact checks against any order: a schedule of the family, a saved ``reveal --json``, or one revealed now.

``ring-ref difftest`` checks ``exact`` against the spec's ring by default.
This module builds the other references it can check against (clause
``difftest-exact-orders``), each an :class:`~ring_ref.difftest._oracles.ExactOrder`:

* :func:`schedule_order`: ``--schedule NAME`` -- the bits of
  ``ring_all_reduce(x, schedule=NAME)``;
* :func:`file_order`: ``--order FILE`` -- the trees a ``reveal --json`` saved,
  evaluated on each input; the search then draws inputs of exactly the file's
  ``N``, ``M`` and dtype, so a team can record its library's order once and
  catch a changed order after an upgrade;
* :func:`auto_order`: ``--schedule auto`` -- reveal first, then check against
  the ring that fits (a preset by name when one matches), or say which
  elements are not ring folds.

:func:`exact_order` picks one from ``difftest``'s ``schedule=`` and ``order=``
(the command line's ``--schedule`` and ``--order``).

:func:`explain_element` names the revealed order of one element, for the
``not-ring-order`` explanation.

>>> order = schedule_order("gloo")
>>> order.name, order.option
("the gloo schedule's order", '--schedule gloo')
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, NamedTuple, cast

import torch
from hypothesis import strategies as st

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, bits, dtype_name
from ring_ref._hints import ORDER_FILE, shape_hint
from ring_ref._ops import OPS
from ring_ref._order import (
    Tree,
    evaluate,
    fold_order_of,
    format_tree,
    reveal_document,
    ring_trees,
    tree_from_json,
)
from ring_ref._reveal import REVEAL_FORMAT, REVEAL_VERSION, RevealError, reveal
from ring_ref._validate import schedule_of
from ring_ref.difftest._call import Answer, kind_hint, well_formed
from ring_ref.difftest._inputs import LAYOUTS, Case
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._loading import with_framework
from ring_ref.difftest._oracles import ExactOrder, SavedOrder, reduce_scatter_reference
from ring_ref.difftest._rules import Spawn
from ring_ref.difftest._vocabulary import Collective, Framework
from ring_ref.schedule import (
    BELOW_N,
    PRESETS,
    ChainSchedule,
    DoublingSchedule,
    Layout,
    RingSchedule,
    Schedule,
    reduce_scatter_ring,
)
from ring_ref.schedule import LAYOUTS as LAYOUT_NAMES

__all__ = [
    "Explained",
    "OrderError",
    "auto_order",
    "auto_order_isolated",
    "exact_order",
    "explain_element",
    "file_order",
    "parse_schedule",
    "per_rank_target",
    "read_order",
    "reduce_scatter_order",
    "schedule_order",
    "schedule_ring",
    "shard_orders",
    "stacked_reduce_scatter",
]

AUTO_M_FACTOR: Final = 2
"""``--schedule auto`` reveals first on ``M = 2 N`` elements, a shape every layout accepts (and cuts
alike), then on ``M = 2 N + 1``, where the layouts differ, to tell them apart."""


SCHEDULE_TEXT: Final = (
    "as text (the command line's --schedule): a preset name or DIRECTION,OFFSET,LAYOUT, written "
    "--schedule=-1,2,blocks on the command line (with '=': argparse reads a value that starts with '-' "
    "as an option), or for difftest auto"
)
"""How a schedule is written as text, for the errors about one."""


class OrderError(ValueError):
    """An order that cannot be used: an unknown schedule, an unreadable or invalid order file."""


def schedule_order(schedule: str | Schedule) -> ExactOrder:
    """``exact`` against ``ring_all_reduce(x, schedule=schedule, op=...)``, for every op.

    ``schedule`` is a preset name, a :class:`RingSchedule` or its text
    ``DIRECTION,OFFSET,LAYOUT`` (:func:`parse_schedule`).  A preset named runs what its library
    runs below ``N`` elements (clause ``schedule-below-n``); a ring given as a value or as text does not.
    """
    ring = schedule_ring(schedule)
    # a ring given as a value is a preset's only where the name means that ring at every size
    names = (key for key, p in PRESETS.items() if p == ring and (key not in BELOW_N or key == schedule))
    name = next(names, None)
    if name is not None:
        label, option = f"the {name} schedule's order", f"--schedule {name}"
    elif isinstance(ring, ChainSchedule | DoublingSchedule):
        preset = "chain" if isinstance(ring, ChainSchedule) else "recursive-doubling"
        raise OrderError(
            f"difftest checks against the {preset} preset only ('--schedule {preset}'); got {ring}"
        )
    else:
        label = f"the order of the ring with {ring.describe()}"
        # with '=': argparse would read "-1,2,blocks" after a space as an option of its own
        option = f"--schedule={ring.direction},{ring.offset},{ring.layout}"
    named = name or ring  # by name: the library's order below N elements too
    return ExactOrder(
        label,
        lambda case: ring_all_reduce(case.tensor(), "fast", schedule=named, op=case.reduction),
        option,
        ops=OPS,
        source="schedule",
        ring=ring,
        preset=name,
    )


def reduce_scatter_order(schedule: str | Schedule | None, max_workers: int) -> ExactOrder:
    """``exact`` for ``--collective reduce-scatter``: rank ``r``'s shard is chunk ``r`` of the ring that
    finishes chunk ``r`` at rank ``r`` (:func:`~ring_ref.difftest._oracles.reduce_scatter_reference`).

    ``schedule`` as for all-reduce, resolved by :func:`ring_ref.schedule.reduce_scatter_ring` (a preset
    name takes ``k := d``; a ring must have ``k = d`` at every ``N`` up to ``max_workers``).

    >>> reduce_scatter_order("gloo", 4).option, reduce_scatter_order(None, 4).ring
    ('--schedule gloo', RingSchedule(direction=1, offset=1, layout='even'))
    """
    named = parse_schedule(schedule) if isinstance(schedule, str) else schedule
    if named is not None:
        schedule_ring(named)  # an unknown preset or an invalid ring: the usual message
    try:
        ring = [reduce_scatter_ring(named, n) for n in range(1, max_workers + 1)][-1]
    except ValueError as exc:
        raise OrderError(str(exc)) from exc
    if isinstance(named, RingSchedule):
        label = f"the reduce-scatter of the ring with {ring.describe()}"
        option = f"--schedule={ring.direction},{ring.offset},{ring.layout}"
    else:
        label = f"the {named or 'spec'} reduce-scatter ring ({ring.describe()})"
        option = f"--schedule {named}" if named else ""
    return ExactOrder(
        label,
        lambda case: reduce_scatter_reference(case.tensor(), op=case.reduction, schedule=named).reshape(
            case.m, *case.trailing
        ),
        option,
        ops=OPS,
        source="schedule" if named else "spec",
        ring=ring,
    )


def schedule_ring(schedule: str | Schedule) -> Schedule:
    """The schedule ``schedule`` names: a preset name (``chain`` too), a :class:`RingSchedule` or its text
    (``-1,2,blocks``).

    >>> schedule_ring("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ring_ref.difftest._orders.OrderError: unknown schedule 'nope'; ...; as text (...--schedule): a preset ...
    """
    try:
        return schedule_of(parse_schedule(schedule) if isinstance(schedule, str) else schedule)
    except (TypeError, ValueError) as exc:
        raise OrderError(f"{str(exc).rstrip('.')}; {SCHEDULE_TEXT}") from exc


def _load(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            doc = reveal_document(file)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OrderError(f"cannot read the order file {str(path)!r}: {exc}; {ORDER_FILE}") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != REVEAL_FORMAT
        or doc.get("version") not in range(1, REVEAL_VERSION + 1)
    ):
        raise OrderError(
            f"{str(path)!r} is not a `ring-ref reveal --json` file (format {REVEAL_FORMAT!r}, "
            f"version 1 .. {REVEAL_VERSION})"
        )
    return doc


def read_order(path: Path) -> tuple[int, int, str, list[Tree], Layout]:
    """``(n, m, dtype, trees, layout)`` of a saved reveal; every element must have a tree.

    ``layout`` is the fitted ring's; a file that names no ring cuts its
    elements as the spec does when ``N`` divides ``M``, else as OpenMPI's
    ``blocks`` (so that chunk labels stay within ``0 .. N - 1``).  An element
    of kind ``exact`` (versions 2 and 3) is checked against the exact sum rounded once:
    one multiway node of every worker.
    """
    doc = _load(path)
    n, m, dtype, trees = doc.get("n"), doc.get("m"), doc.get("dtype"), doc.get("trees")
    if not (isinstance(n, int) and isinstance(m, int) and n >= 1 and m >= 1 and dtype in FORMATS):
        raise OrderError(f"{str(path)!r}: n, m and dtype must be positive integers and a dtype name")
    if not isinstance(trees, list) or len(trees) != m:
        raise OrderError(f"{str(path)!r}: trees must list one tree per element (m = {m})")
    kinds = doc.get("kinds", ["tree"] * m)
    if not isinstance(kinds, list) or len(kinds) != m:
        raise OrderError(f"{str(path)!r}: kinds must list one kind per element (m = {m})")
    trees = [
        list(range(n)) if kind == "exact" and n >= 3 else t for t, kind in zip(trees, kinds, strict=True)
    ]
    missing = [e for e, t in enumerate(trees) if t is None]
    if missing:
        raise OrderError(
            f"{str(path)!r}: element(s) {missing[:8]} have no tree (reveal found none), so exact has no "
            "order to check them against; reveal again once every element has one"
        )
    try:
        parsed = [tree_from_json(t, n) for t in trees]
    except ValueError as exc:
        raise OrderError(f"{str(path)!r}: {exc}") from exc
    ring = doc.get("ring")
    if isinstance(ring, dict) and ring.get("layout") in LAYOUT_NAMES:
        layout: Layout = ring["layout"]
    else:
        layout = "even" if m % n == 0 else "blocks"
    return n, m, dtype, parsed, layout


def _evaluate_trees(trees: list[Tree], x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[1:], dtype=x.dtype)
    distinct: dict[Tree, list[int]] = {}
    for e, tree in enumerate(trees):
        distinct.setdefault(tree, []).append(e)
    for tree, elements in distinct.items():
        cols = torch.tensor(elements)
        out[cols] = evaluate(tree, x[:, cols])
    return out


@st.composite
def _cases_of(draw: st.DrawFn, n: int, m: int, dtype: torch.dtype) -> Case:
    """Inputs of exactly ``(n, m)`` in ``dtype``: random finite values over 2^16 of magnitude, any layout."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    raw = [rng.choice((-1.0, 1.0)) * (1 + rng.random()) * 2.0 ** rng.randint(-8, 8) for _ in range(n * m)]
    element = st.floats(-1e4, 1e4, allow_nan=False, width=32 if dtype != torch.float64 else 64)
    for index, value in draw(st.lists(st.tuples(st.integers(0, n * m - 1), element), max_size=4)):
        raw[index] = value
    values = torch.tensor(raw, dtype=torch.float64).to(dtype).to(torch.float64).tolist()
    return Case(n, m, (), dtype, draw(st.sampled_from(LAYOUTS)), tuple(values))


def file_order(path: str | Path) -> ExactOrder:
    """``exact`` against the trees of a saved ``ring-ref reveal --json``, on inputs of its ``N``, ``M``
    and dtype."""
    n, m, dtype_name, trees, layout = read_order(Path(path))
    dtype = FORMATS[dtype_name].torch_dtype

    def expected(case: Case) -> torch.Tensor:
        if (case.n, case.m, case.trailing, case.dtype) != (n, m, (), dtype):
            raise AssertionError(f"--order {path} covers (N, M) = ({n}, {m}) {dtype_name} inputs only")
        return _evaluate_trees(trees, case.tensor())

    return ExactOrder(
        f"the order saved in {path} (N = {n}, M = {m}, {dtype_name})",
        expected,
        f"--order {shlex.quote(str(path))}",  # a path with spaces or quotes replays as it was given
        _cases_of(n, m, dtype),
        source="order",
        saved=SavedOrder(n, m, dtype, trees, layout),
    )


def auto_order(target: Callable[[torch.Tensor], object], max_workers: int) -> ExactOrder:
    """:func:`auto_order_isolated` in this process, for a callable: the fitted order (``revealed`` says
    where it was revealed).  Raises :class:`OrderError` when no ring fits."""

    def reveal_at(n: int, m: int) -> dict[str, Any] | str:
        try:
            return reveal(target, n, m, "float32", name="the target").to_json()
        except RevealError as exc:
            return str(exc)

    return _auto_fit(reveal_at, max_workers)


def _auto_n(max_workers: int) -> int:
    return max(1, min(max_workers, 8))


def _fitted(ring: RingSchedule | None, matches: list[str], n: int) -> ExactOrder | None:
    if matches:
        return schedule_order(matches[0])
    if ring is None:
        return None
    k = ring.offset
    return schedule_order(ring._replace(offset=k - n if k > n // 2 else k))


def _fit_of(doc: dict[str, Any], n: int, *, even_only: bool = False) -> ExactOrder | None:
    """The order of the preset a reveal's JSON matched, else of the ring it fitted (``even_only``: that
    ring on the even layout); the chain, no ring, comes only as a matched preset."""
    ring = None if doc["ring"] is None else RingSchedule(**doc["ring"])
    matches = list(doc["matches"])
    if even_only:
        ring = None if ring is None else ring._replace(layout="even")
        # the chain's and recursive doubling's orders do not depend on their layout
        matches = [
            name
            for name in matches
            if PRESETS[name].layout == "even" or isinstance(PRESETS[name], ChainSchedule | DoublingSchedule)
        ]
    return _fitted(ring, matches, n)


def _not_one_ring(doc: dict[str, Any], n: int) -> OrderError:
    """The error of a reveal whose trees no ring explains, naming the elements and printing the trees."""
    trees = [None if t is None else tree_from_json(t, n) for t in doc["trees"]]
    lines = [f"  element {e}: {'no tree' if t is None else format_tree(t)}" for e, t in enumerate(trees)]
    odd = [e for e, t in enumerate(trees) if t is None or fold_order_of(t) is None]
    what = (
        f"elements {odd} are not folds at all"
        if odd
        else "every element is a fold, but of no one ring (another start or direction per chunk)"
    )
    return OrderError(
        f"--schedule auto: the target's order is not one ring's fold at N = {n}, M = {doc['m']}: {what}\n"
        + "\n".join(lines)
    )


def _auto_fit(reveal_at: Callable[[int, int], dict[str, Any] | str], max_workers: int) -> ExactOrder:
    """Reveal at ``M = 2N`` (every layout takes it), then at ``M = 2N + 1`` to tell the layouts apart.

    ``reveal_at(n, m)`` is the reveal's JSON, or the error that stopped it.  A
    target that refuses ``M = 2N + 1``, or whose order there is no ring's, is
    checked as the ring fitted at ``M = 2N`` on the even layout: ``exact``
    then draws only ``M`` divisible by ``N``, as that layout demands.
    """
    n = _auto_n(max_workers)
    even_m, uneven_m = AUTO_M_FACTOR * n, AUTO_M_FACTOR * n + 1
    even = reveal_at(n, even_m)
    fitted = None if isinstance(even, str) else _fit_of(even, n, even_only=True)
    if fitted is None and not isinstance(even, str):
        raise _not_one_ring(even, n)
    uneven = reveal_at(n, uneven_m)
    fitted_uneven = None if isinstance(uneven, str) else _fit_of(uneven, n)
    if fitted_uneven is not None and not isinstance(uneven, str):
        calls = uneven["calls"]
        return replace(
            fitted_uneven, source="auto", revealed=f"revealed at N = {n}, M = {uneven_m} in {calls} calls"
        )
    if fitted is None or isinstance(even, str):
        raise OrderError(f"--schedule auto: {even}")
    if isinstance(uneven, str):
        first = uneven.removeprefix("ring-ref reveal: error: ").split(". ")[0]
        why = f"refuses M = {uneven_m} ({first})"
    else:
        why = f"sums M = {uneven_m} as no ring's fold"
    return replace(
        fitted,
        source="auto",
        revealed=(
            f"revealed at N = {n}, M = {even_m} in {even['calls']} calls; the target {why}, so its layout "
            "is even and only M divisible by N are searched"
        ),
    )


def auto_order_isolated(
    target: str,
    max_workers: int,
    timeout: float = 600.0,
    *,
    ranks: str | None = None,
    framework: Framework = "torch",
    spawn: Spawn | None = None,
) -> ExactOrder:
    """:func:`auto_order` for a ``TARGET`` name, revealed by ``ring-ref reveal --json`` in its own process.

    So nothing the target leaves behind (process groups, threads, module state) is in the tester's
    process when difftest forks its workers.  ``spawn``: how ``--ranks mpi`` starts its jobs (``--mca``,
    ``--env``, ``--mpiexec``), handed to reveal, so that it reveals the algorithm they choose.
    """

    def reveal_at(n: int, m: int) -> dict[str, Any] | str:
        argv = [sys.executable, "-m", "ring_ref", "reveal", target, "-n", str(n), "-m", str(m), "--json"]
        if ranks is not None:
            argv += ["--ranks", ranks, *spawn_options(spawn)]
        if framework != "torch":
            argv += ["--framework", framework]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return f"revealing {target} at N = {n}, M = {m} took more than {timeout:g} s"
        if done.returncode != 0:
            return done.stderr.strip() or "ring-ref reveal failed"
        return cast(dict[str, Any], json.loads(done.stdout))

    return _auto_fit(reveal_at, max_workers)


class Explained(NamedTuple):
    """What reveal found for one element: its tree (``None``: no tree explains it) and in how many calls."""

    tree: Tree | None
    text: str


def explain_element(call: Callable[[torch.Tensor], torch.Tensor], case: Case, flat: int) -> Explained | None:
    """``the target sums that element as fold 2,1,0``: the revealed order of one element of ``case``'s shape.

    Reveals on ``(N, S)`` inputs, ``S`` the elements per worker, in the case's own dtype (a target's
    order may depend on it: OpenMPI 5's default all-reduce runs another algorithm in float16); ``None``
    when the sizes are beyond reveal's limits or the target misbehaves on the probes.
    """
    dtype = dtype_name(case.dtype)
    per_worker = len(case.values) // case.n
    try:
        found = reveal(lambda x: call(x.reshape(case.shape)).reshape(-1), case.n, per_worker, dtype, checks=2)
    except (RevealError, RuntimeError, ValueError):
        return None
    tree = found.trees[flat]
    if tree is None:
        return Explained(None, f"no tree of {dtype} additions explains that element ({found.reasons[flat]})")
    text = f"the target sums that element as {format_tree(tree)} (revealed in {found.calls} calls)"
    return Explained(tree, text)


def parse_schedule(text: str) -> str | RingSchedule:
    """A ``--schedule`` value: a preset name, or ``DIRECTION,OFFSET,LAYOUT`` such as ``-1,-1,gloo``.

    >>> parse_schedule("gloo"), parse_schedule("-1,2,blocks")
    ('gloo', RingSchedule(direction=-1, offset=2, layout='blocks'))
    """
    parts = text.split(",")
    if len(parts) != 3:
        return text
    try:
        direction, offset = int(parts[0]), int(parts[1])
    except ValueError as exc:
        raise OrderError(
            f"--schedule {text!r}: DIRECTION,OFFSET,LAYOUT needs two integers and a layout"
        ) from exc
    return RingSchedule(direction, offset, parts[2])  # type: ignore[arg-type]  # schedule_of checks it


def spawn_options(spawn: Spawn | None) -> list[str]:
    """``spawn`` as the command line's options (``--mca``, ``--env``, ``--mpiexec``), in that order.

    >>> spawn_options(Spawn({"btl": "self"}, {"I_MPI_ADJUST_ALLREDUCE": "8"}, "/opt/bin/mpiexec"))
    ['--mca', 'btl=self', '--env', 'I_MPI_ADJUST_ALLREDUCE=8', '--mpiexec', '/opt/bin/mpiexec']
    """
    if spawn is None:
        return []
    out = [item for key, value in spawn.mca.items() for item in ("--mca", f"{key}={value}")]
    out += [item for key, value in spawn.env.items() for item in ("--env", f"{key}={value}")]
    return out + (["--mpiexec", spawn.mpiexec] if spawn.mpiexec else [])


def exact_order(
    schedule: str | Schedule | None,
    order: str | Path | None,
    target: Callable[[torch.Tensor], object] | str,
    max_workers: int,
    ranks: str | None = None,
    *,
    framework: Framework = "torch",
    spawn: Spawn | None = None,
) -> ExactOrder | None:
    """What ``exact`` checks against for ``difftest(schedule=..., order=...)`` (``None``: the spec's ring).

    ``schedule="auto"`` reveals ``target`` first: a ``TARGET`` name in a
    process of its own (:func:`auto_order_isolated`), a function in this one.
    Raises :class:`OrderError` for an unusable option and when ``auto``
    finds no ring (its message says which elements are not ring folds).
    """
    if schedule is not None and order is not None:
        raise OrderError(
            f"schedule (--schedule) and order (--order) name two orders for exact; give one, "
            f"got schedule={schedule!r} and order={str(order)!r}"
        )
    if order is not None:
        return file_order(order)
    if schedule is None:
        return None
    if schedule != "auto":
        return schedule_order(schedule)
    if isinstance(target, str):
        return auto_order_isolated(target, max_workers, ranks=ranks, framework=framework, spawn=spawn)
    return auto_order(with_framework(target, framework), max_workers)


def per_rank_target(
    launcher: Launcher, collective: Collective = Collective.ALL_REDUCE
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A stacked target for :func:`ring_ref._reveal.reveal` over a per-rank launcher (``--ranks``).

    Rank ``i`` gets ``x[i]``; every rank must end with the same bits (one
    all-reduce), and rank 0's result is the answer.  A rank that fails, hangs
    or disagrees raises :class:`ring_ref._reveal.RevealError` naming it.  A
    ``reduce-scatter`` (``TARGET(output, input)`` on every rank) answers with
    the ranks' shards in rank order, the reduction they are the chunks of.
    """

    def call(x: torch.Tensor) -> torch.Tensor:
        values = tuple(x.to(torch.float64).reshape(-1).tolist())
        shape = (int(x.shape[0]), int(x.shape[1]), tuple(x.shape[2:]))
        case = Case(*shape, x.dtype, "contiguous", values, collective=collective)
        outcome = launcher.call(case)
        if outcome.failure is not None:
            raise RevealError(f"the target {outcome.failure.code}: {outcome.failure.text}")
        ranks = [None] if collective.scatters else range(case.n)
        results = [well_formed(outcome, rank) for rank in ranks]
        missing = [rank for rank, got in enumerate(results) if got is None]
        if missing:
            said: dict[str, list[int]] = {}
            for a in outcome.answers:
                if a.rank in missing:
                    text = (
                        f"raised {a.raised}{kind_hint(a)}" if a.raised else f"returned {_returned(a, case)}"
                    )
                    said.setdefault(text, []).append(a.rank)
            why = "; ".join(
                f"{f'rank {r[0]}' if len(r) == 1 else f'ranks {r}'} {text}" for text, r in said.items()
            )
            what = case.result_shape(0)
            raise RevealError(f"rank(s) {missing} gave no well-formed {what} {x.dtype} result: {why}")
        first = cast(torch.Tensor, results[0])
        for rank, other in enumerate(results[1:], start=1):
            if not torch.equal(bits(cast(torch.Tensor, other)), bits(first)):
                raise RevealError(f"rank {rank} ended with other bits than rank 0: not one all-reduce")
        return first

    return call


def _returned(answer: Answer, case: Case) -> str:
    """``a () torch.float32 tensor; this looks like a stacked target ...``: what a rank returned instead of
    its result, with the hint its shape gives (:func:`ring_ref._hints.shape_hint`)."""
    got = answer.result
    if got is None:
        return f"{answer.type_name}, not a tensor"
    hint = shape_hint(
        got.shape, case.result_shape(answer.rank), n=case.n, per_rank=True, collective=case.collective
    )
    return f"a {got.shape} {got.dtype} tensor{hint}"


def stacked_reduce_scatter(fn: Callable[[torch.Tensor], object]) -> Callable[[torch.Tensor], object]:
    """A stacked reduce-scatter target as :func:`ring_ref._reveal.reveal` calls one: its ``(N, M/N)``
    shards, in rank order, as the ``(M,)`` reduction they are the chunks of (anything else unchanged,
    for reveal to name).

    >>> stacked_reduce_scatter(lambda x: x.sum(0).reshape(2, 1))(torch.ones(2, 2)).tolist()
    [2.0, 2.0]
    """

    def call(x: torch.Tensor) -> object:
        got = fn(x)
        n, m = int(x.shape[0]), int(x.shape[1])
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (n, m // n) and m % n == 0:
            return got.reshape(m)
        return got

    return call


def shard_orders(
    trees: list[Tree | None], n: int, ring: RingSchedule | None = None, dtype_name: str = "float32"
) -> list[str]:
    """``shard r (rank r): fold 1,2,0``: each shard's order, from the trees of the ``M`` elements a
    reduce-scatter's shards make in rank order (``reveal --collective reduce-scatter``); with the
    fitted ``ring``, the presets whose reduce-scatter ring it is (:func:`reduce_scatter_ring`).

    >>> shard_orders([((1, 2), 0), ((2, 0), 1), ((0, 1), 2)], 3)[1:]
    ['shard 1 (rank 1): fold 2,0,1', 'shard 2 (rank 2): fold 0,1,2']
    """
    rows = len(trees) // n
    lines = []
    for r in range(n):
        shard = trees[r * rows : (r + 1) * rows]
        own = {format_tree(t) if t is not None else "no tree of additions" for t in shard}
        lines.append(f"shard {r} (rank {r}): {' / '.join(sorted(own))}")
    if ring is not None:  # a preset is named by the trees its reduce-scatter ring makes at this M, so
        # that two layouts that cut M alike (even and ceil where N divides M) both name theirs
        fitted = ring_trees(ring, n, len(trees), dtype_name)
        named = [
            p
            for p, preset in PRESETS.items()
            if isinstance(preset, RingSchedule)
            and ring_trees(reduce_scatter_ring(p, n), n, len(trees), dtype_name) == fitted
        ]
        lines.append(f"the reduce-scatter ring of preset(s): {', '.join(named) if named else 'none'}")
    return lines
