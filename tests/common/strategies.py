"""Hypothesis strategies shared by the test modules."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st

from ring_ref.difftest._inputs import LAYOUTS, lay_out

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)
"""The dtypes numpy has (no bfloat16), as torch dtypes."""
FEW = settings(max_examples=max(4, settings().max_examples // 15))
"""Examples for the tests whose inputs have up to 64 workers (reference runs of seconds): 4 by default,
more under soak."""

_WIDTH = {torch.float16: 16, torch.bfloat16: 32, torch.float32: 32, torch.float64: 64}


def finite_values(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """Finite floats representable in ``dtype`` (bfloat16: float32 values rounded on conversion)."""
    return st.floats(allow_nan=False, allow_infinity=False, width=_WIDTH[dtype])  # type: ignore[arg-type]


@st.composite
def shapes(
    draw: st.DrawFn, max_n: int = 16, max_chunk: int = 3, max_trailing_rank: int = 3, max_numel: int = 256
) -> tuple[int, ...]:
    """A valid ``(N, M, ...)`` shape: ``M`` a multiple of ``N``, trailing rank 0..3, bounded size."""
    n = draw(st.integers(1, max_n))
    m = n * draw(st.integers(1, max_chunk))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=max_trailing_rank)))
    shape = (n, m, *trailing)
    numel = 1
    for d in shape:
        numel *= d
    if numel > max_numel:
        shape = (n, m)
    return shape


@st.composite
def worker_tensors(
    draw: st.DrawFn,
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES,
    max_n: int = 16,
    layouts: tuple[str, ...] = LAYOUTS,
    values: st.SearchStrategy[float] | None = None,
) -> torch.Tensor:
    """A valid ring input: any supported dtype, shape and memory layout."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes(max_n=max_n))
    numel = 1
    for d in shape:
        numel *= d
    elements = draw(
        st.lists(values if values is not None else finite_values(dtype), min_size=numel, max_size=numel)
    )
    dense = torch.tensor(elements, dtype=torch.float64).to(dtype).reshape(shape)
    if not bool(torch.isfinite(dense).all()):
        dense = torch.where(torch.isfinite(dense), dense, torch.zeros((), dtype=dtype))
    return lay_out(dense, draw(st.sampled_from(layouts)))
