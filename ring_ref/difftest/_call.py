"""Calling a target on one case, and recording what it did (result, exception, mutation, aliasing)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ring_ref._dtypes import bits
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._vocabulary import Target

__all__ = ["Outcome", "call_target", "well_formed"]


@dataclass
class Outcome:
    """What one call of the target did on one case."""

    case: Case
    result: object = None
    error: BaseException | None = None
    input_modified: str = ""
    aliases_input: bool = False


def call_target(fn: Target, case: Case) -> Outcome:
    """Run ``fn`` on a fresh tensor for ``case``; record its result or exception, mutation and aliasing."""
    x = case.tensor()
    before, shape, stride, dtype = bits(x).clone(), tuple(x.shape), x.stride(), x.dtype
    outcome = Outcome(case)
    try:
        outcome.result = fn(x)
    except Exception as exc:
        outcome.error = exc
    if (tuple(x.shape), x.stride(), x.dtype) != (shape, stride, dtype):
        outcome.input_modified = (
            f"the input's shape/stride/dtype changed from {shape}/{stride}/{dtype} "
            f"to {tuple(x.shape)}/{x.stride()}/{x.dtype}"
        )
    elif not torch.equal(bits(x), before):
        where = tuple(int(v) for v in (bits(x) != before).nonzero()[0])
        outcome.input_modified = (
            f"the input was modified: element {where} was {before.view(dtype)[where].item()!r}, "
            f"is now {x[where].item()!r}"
        )
    result = outcome.result
    if isinstance(result, torch.Tensor) and result.untyped_storage().data_ptr() == (
        x.untyped_storage().data_ptr()
    ):
        outcome.aliases_input = True
    return outcome


def well_formed(outcome: Outcome) -> torch.Tensor | None:
    r, case = outcome.result, outcome.case
    if (
        outcome.error is None
        and isinstance(r, torch.Tensor)
        and tuple(r.shape) == (case.m, *case.trailing)
        and r.dtype == case.dtype
        and r.device == torch.device("cpu")
    ):
        return r
    return None
