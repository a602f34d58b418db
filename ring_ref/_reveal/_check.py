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
from ring_ref._reveal._trees import evaluate, format_tree

__all__ = ["CHECKS", "check_on_random_inputs"]

CHECKS: Final = 4
"""Random-input bitwise checks after the trees are found (calls)."""


def _random_inputs(n: int, m: int, dtype_name: str, rng: np.random.Generator) -> torch.Tensor:
    """Finite values of both signs with full significands over 2^16 of magnitude (fewer binades in
    float16, so that no sum of ``N`` of them overflows): additions round."""
    top = min(8, int(np.log2(FORMATS[dtype_name].max_finite / n)) - 2)
    scale = np.ldexp(1.0, rng.integers(-8, top + 1, (n, m)))
    values = (1.0 + rng.random((n, m))) * np.where(rng.random((n, m)) < 0.5, -scale, scale)
    return torch.from_numpy(values).to(DTYPES[dtype_name])


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
    for k in range(checks):
        x = _random_inputs(n, m, dtype_name, rng)
        out = call_target(target, x, m)
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
