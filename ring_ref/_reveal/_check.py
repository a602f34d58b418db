"""The random-input check: every revealed tree, evaluated on random inputs, must give the target's bits.

Answers to the probes can fit a tree that the target does not follow (a wider
accumulator rounds once, and its probe sums are exact all the same); those
elements lose their tree here (clause ``reveal-trees``).  The inputs and the
target's outputs are kept, to tell presets apart by their bits, and so is the
generator's state before each input, which makes it again when asked for
(:class:`Replay`) instead of holding ``checks`` inputs of ``N x M``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS, bits
from ring_ref._names import REVEAL_CHECKS
from ring_ref._order import Fold, Tree, evaluate, format_tree
from ring_ref._reveal._probe import Verdict
from ring_ref._reveal._target import REVEAL_DTYPES, call_target

__all__ = ["CHECKS", "Replay", "binary_steps", "check_on_random_inputs", "evaluate_all"]

CHECKS: Final = REVEAL_CHECKS
"""Random-input bitwise checks after the trees are found (calls)."""


def _random_inputs(n: int, m: int, dtype_name: str, rng: np.random.Generator) -> torch.Tensor:
    """Finite values of both signs with full significands over 2^16 of magnitude (fewer binades in
    float16, so that no sum of ``N`` of them overflows): additions round."""
    top = min(8, int(np.log2(FORMATS[dtype_name].max_finite / n)) - 2)
    dtype = REVEAL_DTYPES[dtype_name]
    # Made a draw at a time, each kept in its narrowest type: (1 + r) * 2^e * sign, rounded to the
    # dtype once (the significand is rounded, then scaled by a power of two within the normal
    # range, which is exact), so that no more than a few bytes per element are ever held.
    exponent = torch.from_numpy(rng.integers(-8, top + 1, (n, m)).astype(np.int8))
    significand = rng.random((n, m))
    significand += 1.0
    values = torch.from_numpy(significand).to(dtype)
    del significand
    values.mul_(torch.exp2(exponent.to(dtype)))
    del exponent
    negative = torch.from_numpy(rng.random((n, m)) < 0.5)
    return torch.where(negative, values.neg(), values)


def _binary_steps(tree: Tree, n: int) -> npt.NDArray[np.int32] | None:
    """A binary tree's ``N - 1`` additions in post-order as ``(a, b)`` slot pairs (workers are slots
    ``0 .. N - 1``, addition ``t`` fills slot ``N + t``); ``None`` for a tree with a multiway node."""
    if isinstance(tree, Fold):  # addition t > 0 adds the next worker to addition t - 1's slot
        order = tree.order
        fold = np.empty((len(order) - 1, 2), dtype=np.int32)
        fold[0] = order[:2]
        fold[1:, 0] = np.arange(n, n + len(order) - 2, dtype=np.int32)
        fold[1:, 1] = order[2:]
        return fold
    steps: list[tuple[int, int]] = []
    slots: list[int] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, ready = stack.pop()
        if isinstance(node, int):
            slots.append(node)
        elif len(node) != 2:
            return None
        elif not ready:
            stack += [(node, True), (node[1], False), (node[0], False)]
        else:
            b, a = slots.pop(), slots.pop()
            slots.append(n + len(steps))
            steps.append((a, b))
    return np.array(steps, dtype=np.int32).reshape(-1, 2)


Steps = tuple[npt.NDArray[np.int32], npt.NDArray[np.bool_]]
"""Per verdict its binary tree's additions (:func:`_binary_steps`; zeros where it has none), and
whether it has one."""


def binary_steps(verdicts: list[Verdict], n: int) -> Steps:
    """Each verdict's additions as :func:`evaluate_all` takes them, in one table (no tree, or a tree
    with a multiway node: not binary)."""
    table = np.zeros((len(verdicts), max(n - 1, 0), 2), dtype=np.int32)
    binary = np.zeros(len(verdicts), dtype=bool)
    for v, (tree, _) in enumerate(verdicts):
        steps = None if tree is None or n < 2 else _binary_steps(tree, n)
        if steps is not None:
            table[v], binary[v] = steps, True
    return table, binary


def evaluate_all(
    verdicts: list[Verdict], of: npt.NDArray[np.int64], x: torch.Tensor, steps: Steps
) -> torch.Tensor:
    """Every element's tree evaluated on its column of ``x`` (NaN where it has none).

    Binary trees (``steps``, from :func:`binary_steps`; verdicts added since
    have no tree) go in one pass of ``N - 1`` steps over all their elements
    (each element gathers its own operands), so distinct trees cost no more
    than one; a tree with a multiway node is evaluated on its own.
    """
    n, m = x.shape
    table, known = steps
    binary = np.zeros(len(verdicts), dtype=bool)
    binary[: len(known)] = known
    want = torch.full((m,), torch.nan, dtype=x.dtype)
    for v, (tree, _) in enumerate(verdicts):
        if tree is not None and not binary[v] and len(cols := np.flatnonzero(of == v)):
            want[cols] = evaluate(tree, x[:, cols])
    cols = np.flatnonzero(binary[of])
    if not len(cols):
        return want
    ids = of[cols]
    slots = torch.empty((2 * n - 1, len(cols)), dtype=x.dtype)
    slots[:n] = x[:, cols]
    flat, across = slots.view(-1), torch.arange(len(cols))
    for t in range(n - 1):
        a = torch.from_numpy(table[:, t, 0][ids].astype(np.int64)) * len(cols) + across
        b = torch.from_numpy(table[:, t, 1][ids].astype(np.int64)) * len(cols) + across
        slots[n + t] = flat[a] + flat[b]
    want[cols] = slots[2 * n - 2]
    return want


class Replay(Sequence[torch.Tensor]):
    """The checking inputs, each made again from the generator's state before it when asked for."""

    def __init__(self, n: int, m: int, dtype_name: str, states: list[dict[str, Any]]) -> None:
        self.n, self.m, self.dtype_name, self.states = n, m, dtype_name, states

    def __len__(self) -> int:
        return len(self.states)

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[torch.Tensor]: ...
    def __getitem__(self, index: int | slice) -> torch.Tensor | Sequence[torch.Tensor]:
        if isinstance(index, slice):
            return [self[k] for k in range(len(self))[index]]
        rng = np.random.default_rng()
        rng.bit_generator.state = self.states[index]
        return _random_inputs(self.n, self.m, self.dtype_name, rng)


def check_on_random_inputs(
    target: Callable[[torch.Tensor], object],
    verdicts: list[Verdict],
    of: npt.NDArray[np.int64],
    n: int,
    dtype_name: str,
    *,
    checks: int,
    seed: int,
) -> tuple[Replay, list[torch.Tensor]]:
    """Evaluate every tree on random inputs; elements whose bits differ move to a verdict without tree.

    ``verdicts`` and ``of`` (each element's verdict) are updated in place.
    """
    m = len(of)
    rng = np.random.default_rng(seed)
    states: list[dict[str, Any]] = []
    outputs = []
    steps = binary_steps(verdicts, n)
    for k in range(checks):
        states.append(copy.deepcopy(dict(rng.bit_generator.state)))
        x = _random_inputs(n, m, dtype_name, rng)
        out = call_target(target, x, m)
        outputs.append(out)
        want = evaluate_all(verdicts, of, x, steps)
        has = torch.from_numpy(np.array([tree is not None for tree, _ in verdicts], dtype=bool)[of])
        wrong = (has & (bits(want) != bits(out))).numpy()
        for v in np.unique(of[wrong]).tolist():
            tree = verdicts[v][0]
            assert tree is not None
            bad = np.flatnonzero(wrong & (of == v))
            e = int(bad[0])
            reason = (
                f"its answers fit the tree {format_tree(tree)}, but on random input {k} the target "
                f"gives {float(out[e])!r} where that tree gives {float(want[e])!r} (element {e})"
            )
            verdicts.append((None, reason))
            of[bad] = len(verdicts) - 1
    return Replay(n, m, dtype_name, states), outputs
