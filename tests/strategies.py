"""Hypothesis strategies shared by the test modules."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LAYOUTS = ("contiguous", "transposed", "strided", "sliced")

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


def _lay_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values in a (possibly) non-contiguous tensor."""
    if layout == "transposed":
        return values.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "strided":
        wide = torch.zeros((*values.shape[:-1], 2 * values.shape[-1]), dtype=values.dtype)
        wide[..., ::2] = values
        return wide[..., ::2]
    if layout == "sliced":
        padded = torch.zeros((values.shape[0] + 1, *values.shape[1:]), dtype=values.dtype)
        padded[1:] = values
        return padded[1:]
    return values


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
    return _lay_out(dense, draw(st.sampled_from(layouts)))
