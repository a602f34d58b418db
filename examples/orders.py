"""Summation orders to reveal (``docs/guide/reveal.md``).

ring-ref reveal examples/orders.py:torch_sum -n 8 -m 40
ring-ref reveal examples/orders.py:wider_accumulator -n 8 -m 4
"""

from __future__ import annotations

import torch


def torch_sum(x: torch.Tensor) -> torch.Tensor:
    """``torch.sum`` over the worker axis: vectorised columns and the tail columns sum in different orders."""
    return torch.sum(x, 0)


def wider_accumulator(x: torch.Tensor) -> torch.Tensor:
    """Accumulate in float64 and round once: no tree of additions in the input dtype gives these bits."""
    return x.to(torch.float64).sum(0).to(x.dtype)
