"""The random-input check: every revealed tree, evaluated on random inputs, must give the target's bits.

Answers to the probes can fit a tree that the target does not follow (a wider
accumulator rounds once, and its probe sums are exact all the same); those
elements lose their tree here (clause ``reveal-trees``).  The inputs and the
target's outputs are kept, to tell presets apart by their bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS, bits
from ring_ref._reveal._probe import Verdict
from ring_ref._reveal._target import DTYPES, call_target
from ring_ref._reveal._trees import Tree, evaluate, format_tree

__all__ = ["CHECKS", "binary_steps", "check_on_random_inputs", "evaluate_all"]

CHECKS: Final = 4
"""Random-input bitwise checks after the trees are found (calls)."""


def _random_inputs(n: int, m: int, dtype_name: str, rng: np.random.Generator) -> torch.Tensor:
    """Finite values of both signs with full significands over 2^16 of magnitude (fewer binades in
    float16, so that no sum of ``N`` of them overflows): additions round."""
    top = min(8, int(np.log2(FORMATS[dtype_name].max_finite / n)) - 2)
    scale = np.ldexp(1.0, rng.integers(-8, top + 1, (n, m)))
    values = (1.0 + rng.random((n, m))) * np.where(rng.random((n, m)) < 0.5, -scale, scale)
    return torch.from_numpy(values).to(DTYPES[dtype_name])


def _binary_steps(tree: Tree, n: int) -> npt.NDArray[np.int32] | None:
    """A binary tree's ``N - 1`` additions in post-order as ``(a, b)`` slot pairs (workers are slots
    ``0 .. N - 1``, addition ``t`` fills slot ``N + t``); ``None`` for a tree with a multiway node."""
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


def binary_steps(verdicts: list[Verdict], n: int) -> list[npt.NDArray[np.int32] | None]:
    """Each verdict's additions as :func:`evaluate_all` takes them (``None``: no tree, or a multiway one)."""
    return [None if tree is None else _binary_steps(tree, n) for tree, _ in verdicts]


def evaluate_all(
    verdicts: list[Verdict],
    of: npt.NDArray[np.int64],
    x: torch.Tensor,
    steps: list[npt.NDArray[np.int32] | None],
) -> torch.Tensor:
    """Every element's tree evaluated on its column of ``x`` (NaN where it has none).

    Binary trees (their :func:`binary_steps`) go in one pass of ``N - 1``
    steps over all their elements (each element gathers its own operands), so
    distinct trees cost no more than one; a tree with a multiway node is
    evaluated on its own.
    """
    n, m = x.shape
    want = torch.full((m,), torch.nan, dtype=x.dtype)
    for v, (tree, _) in enumerate(verdicts):
        cols = np.flatnonzero(of == v)
        if tree is not None and (steps[v] is None or n == 1) and len(cols):
            want[cols] = evaluate(tree, x[:, cols])
    binary = np.array([s is not None and n >= 2 for s in steps], dtype=bool)
    cols = np.flatnonzero(binary[of]) if len(binary) else np.zeros(0, np.int64)
    if not len(cols):
        return want
    table = np.stack([s if s is not None and n >= 2 else np.zeros((n - 1, 2), np.int32) for s in steps])
    mine = table[of[cols]]  # (elements, N - 1, 2)
    slots = torch.empty((2 * n - 1, len(cols)), dtype=x.dtype)
    slots[:n] = x[:, cols]
    flat, across = slots.view(-1), torch.arange(len(cols))
    for t in range(n - 1):
        a = torch.from_numpy(mine[:, t, 0].astype(np.int64)) * len(cols) + across
        b = torch.from_numpy(mine[:, t, 1].astype(np.int64)) * len(cols) + across
        slots[n + t] = flat[a] + flat[b]
    want[cols] = slots[2 * n - 2]
    return want


def check_on_random_inputs(
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
    steps = binary_steps(verdicts, n)
    for k in range(checks):
        x = _random_inputs(n, m, dtype_name, rng)
        out = call_target(target, x, m)
        inputs.append(x)
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
            steps.append(None)
            of[bad] = len(verdicts) - 1
    return inputs, outputs
