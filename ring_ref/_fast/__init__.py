"""The fast engine: the spec's additions, without the spec's bookkeeping.

It performs exactly the additions the reference core (:mod:`ring_ref.core`)
performs, with the same operands in the same order and dtype, so its result is
bitwise identical (clause ``fold-order``); only the bookkeeping differs.  The
other reductions (clauses ``op-*``) run the same plan with their own combine
in place of the addition (``incoming * own``; ``own`` if ``own > incoming``
else ``incoming`` for ``max``, ``<`` for ``min``, as :mod:`ring_ref._ops`
defines them), and ``avg`` divides the sum once by ``N`` with
:func:`ring_ref._ops.finish_torch` (``finish_numpy``), as the reference does.

Its rooms, each importing only the ones listed after it:

* :mod:`ring_ref._fast._forward`: the front ends (``ring_all_reduce_torch``,
  ``ring_all_reduce_numpy``, reduce-scatter, all-gather, autograd) and the one
  forward pass both array types share, parameterised by their array
  operations (:class:`Arrays`).  float32 and float64 on the CPU, in every
  layout whose ``(M, ...)`` part is one stride apart per element
  (:func:`element_stride`), go to the compiled kernel in one call.
* :mod:`ring_ref._fast._run`: everything else runs the plan as a few batched
  array operations per round, tile by tile; and whether a result proves the
  input finite.
* :mod:`ring_ref._fast._plan`: the plan, compiled from the schedule's sends and
  checked (:func:`plan`; :func:`chain_fold_order` for the chain).  One
  running partial per chunk: worker ``i``'s slot ``c`` is only ever read as
  the sender's partial sum, so the engine keeps one result-sized buffer and
  never materialises the other ``N^2 - N`` slots; all-gather only copies
  completed chunks, so each is returned once, in place.
* :mod:`ring_ref._fast._kernel`: the fused fold kernel, LLVM IR compiled with
  llvmlite on first use and cached on disk (imported when first needed).

>>> import torch
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "max")
tensor([3., 4.])
"""

from ring_ref._fast._forward import (
    DIFFERENTIABLE_OPS,
    KERNEL_DTYPES,
    NUMPY,
    TORCH,
    Arrays,
    element_stride,
    forward,
    not_differentiable,
    ring_all_gather_numpy,
    ring_all_gather_torch,
    ring_all_reduce_numpy,
    ring_all_reduce_torch,
    ring_reduce_scatter_numpy,
    ring_reduce_scatter_torch,
)
from ring_ref._fast._plan import Add, Cycle, Plan, Rounds, Sends, chain_fold_order, plan

__all__ = [
    "DIFFERENTIABLE_OPS",
    "KERNEL_DTYPES",
    "NUMPY",
    "TORCH",
    "Add",
    "Arrays",
    "Cycle",
    "Plan",
    "Rounds",
    "Sends",
    "chain_fold_order",
    "element_stride",
    "forward",
    "not_differentiable",
    "plan",
    "ring_all_gather_numpy",
    "ring_all_gather_torch",
    "ring_all_reduce_numpy",
    "ring_all_reduce_torch",
    "ring_reduce_scatter_numpy",
    "ring_reduce_scatter_torch",
]
