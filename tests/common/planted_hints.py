"""Targets that raise at a known line, and targets of the wrong kind or signature, for difftest's and
reveal's hints (clauses ``difftest-raised-at`` and ``difftest-hints``).

Each raising target marks the line the report must name with a ``# raises here: NAME`` comment;
:func:`marked_line` finds it by reading this file (the tests' oracle, independent of ``ring_ref``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FILE = str(Path(__file__).resolve())


def marked_line(name: str) -> tuple[int, str]:
    """The line number and stripped source of the line marked ``# raises here: name``."""
    for number, line in enumerate(Path(FILE).read_text(encoding="utf-8").splitlines(), start=1):
        if line.rstrip().endswith(f"# raises here: {name}"):
            return number, line.strip()
    raise LookupError(name)


def _pick(rows: list[torch.Tensor]) -> torch.Tensor:
    return rows[len(rows)]  # raises here: helper


def raises_in_a_helper(x: torch.Tensor) -> torch.Tensor:
    """Stacked: a list index past the end, in a helper it calls (the innermost frame is the helper's)."""
    return _pick(list(x.unbind(0)))


def raises_inside_torch(x: torch.Tensor) -> torch.Tensor:
    """Stacked: ``einsum`` refuses the equation inside ``torch``: the target's own line is named."""
    return torch.functional.einsum("ij->k", x)  # raises here: torch


def rank_raises(tensor: torch.Tensor) -> None:
    """Per rank (``--ranks gloo``): every rank raises after the all-reduce."""
    dist.all_reduce(tensor)
    raise ValueError("planted")  # raises here: rank


def mpi_raises(comm: Any, array: Any) -> None:
    """Per rank (``--ranks mpi``): every rank raises."""
    raise ValueError(f"planted on rank {comm.Get_rank()} of {array.shape}")  # raises here: mpi


def two_arguments(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two tensors: no launcher's all-reduce call fits it (``--ranks mpi`` passes a comm and an array)."""
    return a + b


def _passthrough(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


@_passthrough
def decorated_two(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Decorated: its signature is not read from the source (a decorator may change it)."""
    return a + b


def stacked_sum(x: torch.Tensor) -> torch.Tensor:
    """A stacked all-reduce (the sum over workers), right when called stacked."""
    return x.sum(0)


def stacked_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """A stacked reduce-scatter: ``(N, M)`` to ``(N, M/N)``, row ``r`` rank ``r``'s shard."""
    n, m = int(x.shape[0]), int(x.shape[1])
    return x.sum(0).reshape(n, m // n)


def per_rank_all_reduce(tensor: torch.Tensor) -> None:
    """A per-rank all-reduce over the default group (no group when called stacked)."""
    dist.all_reduce(tensor)
