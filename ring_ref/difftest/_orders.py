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

:func:`explain_element` names the revealed order of one element, for the
``not-ring-order`` explanation.

>>> order = schedule_order("gloo")
>>> order.name, order.option
("the gloo schedule's order", '--schedule gloo')
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple, cast

import torch
from hypothesis import strategies as st

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, bits
from ring_ref._ops import OPS
from ring_ref._reveal import (
    REVEAL_FORMAT,
    REVEAL_VERSION,
    Revealed,
    RevealError,
    Tree,
    chain_order,
    evaluate,
    format_tree,
    reveal,
    tree_from_json,
)
from ring_ref._validate import schedule_of
from ring_ref.difftest._call import well_formed
from ring_ref.difftest._inputs import LAYOUTS, Case
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._oracles import EXACT_ORDER, ExactOrder
from ring_ref.schedule import PRESETS, RingSchedule

__all__ = [
    "Explained",
    "OrderError",
    "auto_order",
    "auto_order_isolated",
    "checking_against",
    "command_line_order",
    "explain_element",
    "file_order",
    "mark_replay",
    "parse_schedule",
    "per_rank_target",
    "rank_launcher",
    "read_order",
    "schedule_order",
]

AUTO_M_EXTRA: Final = 1
"""``--schedule auto`` reveals on ``M = 2 N + 1`` elements: not a multiple of ``N``, so layouts differ."""


class OrderError(ValueError):
    """An order that cannot be used: an unknown schedule, an unreadable or invalid order file."""


def schedule_order(schedule: str | RingSchedule) -> ExactOrder:
    """``exact`` against ``ring_all_reduce(x, schedule=schedule, op=...)``, for every op."""
    try:
        ring = schedule_of(schedule)
    except (TypeError, ValueError) as exc:
        raise OrderError(str(exc)) from exc
    name = next((key for key, preset in PRESETS.items() if preset == ring), None)
    if name is not None:
        label, option = f"the {name} schedule's order", f"--schedule {name}"
    else:
        label = f"the order of the ring with {ring.describe()}"
        option = f"--schedule {ring.direction},{ring.offset},{ring.layout}"
    return ExactOrder(
        label,
        lambda case: ring_all_reduce(case.tensor(), "fast", schedule=ring, op=case.reduction),
        option,
        ops=OPS,
        ring=ring,
    )


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OrderError(f"cannot read the order file {str(path)!r}: {exc}") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != REVEAL_FORMAT
        or doc.get("version") != REVEAL_VERSION
    ):
        raise OrderError(
            f"{str(path)!r} is not a `ring-ref reveal --json` file (format {REVEAL_FORMAT!r}, "
            f"version {REVEAL_VERSION})"
        )
    return doc


def read_order(path: Path) -> tuple[int, int, str, list[Tree]]:
    """``(n, m, dtype, trees)`` of a saved reveal; every element must have a tree."""
    doc = _load(path)
    n, m, dtype, trees = doc.get("n"), doc.get("m"), doc.get("dtype"), doc.get("trees")
    if not (isinstance(n, int) and isinstance(m, int) and n >= 1 and m >= 1 and dtype in FORMATS):
        raise OrderError(f"{str(path)!r}: n, m and dtype must be positive integers and a dtype name")
    if not isinstance(trees, list) or len(trees) != m:
        raise OrderError(f"{str(path)!r}: trees must list one tree per element (m = {m})")
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
    return n, m, dtype, parsed


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
    n, m, dtype_name, trees = read_order(Path(path))
    dtype = FORMATS[dtype_name].torch_dtype

    def expected(case: Case) -> torch.Tensor:
        if (case.n, case.m, case.trailing, case.dtype) != (n, m, (), dtype):
            raise AssertionError(f"--order {path} covers (N, M) = ({n}, {m}) {dtype_name} inputs only")
        return _evaluate_trees(trees, case.tensor())

    return ExactOrder(
        f"the order saved in {path} (N = {n}, M = {m}, {dtype_name})",
        expected,
        f"--order {path}",
        _cases_of(n, m, dtype),
        saved=(n, m, dtype, trees),
    )


def auto_order(
    target: Callable[[torch.Tensor], object], max_workers: int
) -> tuple[ExactOrder | None, Revealed]:
    """Reveal ``target`` at ``N = min(max_workers, 8)``, ``M = 2N + 1``; the fitted ring's order, if any.

    A preset that matches is used by name (it is defined for every ``N``).
    Another fitted ring keeps its direction and layout, with the offset taken
    as the one of ``k`` and ``k - N`` nearer to zero (gloo's ``-1`` reads ``N - 1``
    at any one ``N``); ``exact`` then tells whether that holds at the other ``N``.
    """
    n = _auto_n(max_workers)
    found = reveal(target, n, 2 * n + AUTO_M_EXTRA, "float32", name="the target")
    return _fitted(found.ring, found.matches, n), found


def _auto_n(max_workers: int) -> int:
    return max(1, min(max_workers, 8))


def _fitted(ring: RingSchedule | None, matches: list[str], n: int) -> ExactOrder | None:
    if matches:
        return schedule_order(matches[0])
    if ring is None:
        return None
    k = ring.offset
    return schedule_order(ring._replace(offset=k - n if k > n // 2 else k))


def auto_order_isolated(
    target: str, max_workers: int, timeout: float = 600.0, ranks: str | None = None
) -> tuple[ExactOrder, str]:
    """:func:`auto_order` for a ``TARGET`` name, revealed by ``ring-ref reveal --json`` in its own process.

    So nothing the target leaves behind (process groups, threads, module state) is in the tester's
    process when difftest forks its workers.  Returns the order and a line saying what was revealed;
    raises :class:`OrderError` when no ring fits, naming the elements that are not one ring's fold.
    """
    n = _auto_n(max_workers)
    m = 2 * n + AUTO_M_EXTRA
    argv = [sys.executable, "-m", "ring_ref", "reveal", target, "-n", str(n), "-m", str(m), "--json"]
    if ranks is not None:
        argv += ["--ranks", ranks]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OrderError(f"--schedule auto: revealing {target} took more than {timeout:g} s") from exc
    if done.returncode != 0:
        raise OrderError(f"--schedule auto: {done.stderr.strip() or 'ring-ref reveal failed'}")
    doc = json.loads(done.stdout)
    ring = None if doc["ring"] is None else RingSchedule(**doc["ring"])
    fitted = _fitted(ring, list(doc["matches"]), n)
    if fitted is None:
        trees = [None if t is None else tree_from_json(t, n) for t in doc["trees"]]
        lines = [f"  element {e}: {'no tree' if t is None else format_tree(t)}" for e, t in enumerate(trees)]
        odd = [e for e, t in enumerate(trees) if t is None or chain_order(t) is None]
        what = (
            f"elements {odd} are not folds at all"
            if odd
            else "every element is a fold, but of no one ring (another start or direction per chunk)"
        )
        raise OrderError(
            f"--schedule auto: the target's order is not one ring's fold at N = {n}, M = {m}: {what}\n"
            + "\n".join(lines)
        )
    return fitted, f"revealed at N = {n}, M = {m} in {doc['calls']} calls; exact checks {fitted.name}"


class Explained(NamedTuple):
    """What reveal found for one element: its tree (``None``: no tree explains it) and in how many calls."""

    tree: Tree | None
    text: str


def explain_element(call: Callable[[torch.Tensor], torch.Tensor], case: Case, flat: int) -> Explained | None:
    """``the target sums that element as fold 2,1,0``: the revealed order of one element of ``case``'s shape.

    Reveals on ``(N, S)`` inputs, ``S`` the elements per worker, in float32 (or
    float64 for a float64 case); ``None`` when the sizes are beyond reveal's
    limits or the target misbehaves on the probes.
    """
    dtype = "float64" if case.dtype == torch.float64 else "float32"
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


@contextlib.contextmanager
def checking_against(order: ExactOrder | None) -> Iterator[None]:
    """Within the block, ``exact`` checks against ``order`` (the spec's ring when ``None``)."""
    if order is None:
        yield
        return
    token = EXACT_ORDER.set(order)
    try:
        yield
    finally:
        EXACT_ORDER.reset(token)


def command_line_order(
    schedule: str | None, order_file: str | None, target: str, max_workers: int, ranks: str | None = None
) -> tuple[ExactOrder | None, str]:
    """The order of ``difftest --schedule`` / ``--order``, and a line saying what was revealed (``auto``).

    Raises :class:`OrderError` for an unusable option and when ``auto``
    finds no ring (its message says which elements are not ring folds).
    """
    if order_file is not None:
        return file_order(order_file), ""
    if schedule is None:
        return None, ""
    if schedule != "auto":
        return schedule_order(parse_schedule(schedule)), ""
    return auto_order_isolated(target, max_workers, ranks=ranks)


def mark_replay(replay: str, order: ExactOrder | None) -> str:
    """``replay`` with the option that names ``order`` (difftest builds the line without it)."""
    if order is None or not order.option or order.option in replay:
        return replay
    return f"{replay} {order.option}"


def per_rank_target(launcher: Launcher) -> Callable[[torch.Tensor], torch.Tensor]:
    """A stacked target for :func:`ring_ref._reveal.reveal` over a per-rank launcher (``--ranks``).

    Rank ``i`` gets ``x[i]``; every rank must end with the same bits (one
    all-reduce), and rank 0's result is the answer.  A rank that fails, hangs
    or disagrees raises :class:`ring_ref._reveal.RevealError` naming it.
    """

    def call(x: torch.Tensor) -> torch.Tensor:
        values = tuple(x.to(torch.float64).reshape(-1).tolist())
        case = Case(int(x.shape[0]), int(x.shape[1]), tuple(x.shape[2:]), x.dtype, "contiguous", values)
        outcome = launcher.call(case)
        if outcome.failure is not None:
            raise RevealError(f"the target {outcome.failure.code}: {outcome.failure.text}")
        results = [well_formed(outcome, rank) for rank in range(case.n)]
        missing = [rank for rank, got in enumerate(results) if got is None]
        if missing:
            raise RevealError(f"rank(s) {missing} gave no well-formed ({case.m},) {x.dtype} result")
        first = cast(torch.Tensor, results[0])
        for rank, other in enumerate(results[1:], start=1):
            if not torch.equal(bits(cast(torch.Tensor, other)), bits(first)):
                raise RevealError(f"rank {rank} ended with other bits than rank 0: not one all-reduce")
        return first

    return call


def rank_launcher(ranks: str, target: str, timeout: float) -> Launcher:
    """The difftest launcher that runs ``TARGET`` on every rank of a gloo group or an MPI job."""
    if ranks == "mpi":
        from ring_ref.difftest._mpi import MpiRanks

        return MpiRanks(target, timeout)
    from ring_ref.difftest._ranks import GlooRanks

    return GlooRanks(target, timeout)
