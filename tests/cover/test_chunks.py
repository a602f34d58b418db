"""Chunk views (clause ``chunk-layout``) against numpy's and torch's own splitting.

``N`` chunks of ``M / N`` consecutive rows, trailing dimensions whole, each a
view of the buffer (nothing copied), for tensors and arrays alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ring_ref._chunks import chunk_bounds, chunk_of_elements, chunk_rows, chunk_views, layout_views
from tests.common.oracles import blocks_bounds, gloo_bounds

pytestmark = pytest.mark.clause("chunk-layout")

SIZES = [(n, k) for n in range(1, 7) for k in (1, 2, 3)]


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_rows_are_numpys_equal_split_of_the_leading_axis(n: int, k: int) -> None:
    m = n * k
    want = [(int(part[0]), int(part[-1]) + 1) for part in np.split(np.arange(m), n)]
    assert chunk_rows(m, n) == want


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_views_are_torch_split_and_share_the_buffer(n: int, k: int) -> None:
    tensor = torch.arange(n * k * 6, dtype=torch.float32).reshape(n * k, 2, 3)
    chunks = chunk_views(tensor, n)
    assert type(chunks) is tuple and len(chunks) == n
    for got, want in zip(chunks, torch.split(tensor, k), strict=True):
        assert got.shape == (k, 2, 3) and torch.equal(got, want)
        assert got.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_views_are_numpy_split_and_share_the_buffer(n: int, k: int) -> None:
    array = np.arange(n * k * 6, dtype=np.float32).reshape(n * k, 2, 3)
    chunks = chunk_views(array, n)
    assert type(chunks) is tuple and len(chunks) == n
    for got, want in zip(chunks, np.split(array, n), strict=True):
        assert got.shape == (k, 2, 3) and np.array_equal(got, want)
        assert np.shares_memory(got, array)


# --- the schedule family's layouts (clause schedule-layouts), against tests/common/oracles.py -----------

BIG = [  # (n, s, itemsize): past gloo's 1 MiB segment limit, where the element size matters
    (2, 2**20, 4),
    (3, 3 * 2**20 + 5, 4),
    (2, 2**19 + 3, 8),
    (4, 2**21 + 1, 2),
    (5, 5 * 2**20 - 1, 8),
]


@pytest.mark.clause("schedule-layouts")
@pytest.mark.parametrize(("n", "s", "itemsize"), BIG)
def test_gloo_chunks_of_large_buffers_are_gloos_byte_segments(n: int, s: int, itemsize: int) -> None:
    bounds = chunk_bounds("gloo", n, s, itemsize=itemsize)
    assert bounds == gloo_bounds(n, s, itemsize)
    assert all(type(v) is int for pair in bounds for v in pair)
    if itemsize == 4:  # the default element size is float32's
        assert chunk_bounds("gloo", n, s) == bounds


SIZE_MATTERS = 3 * 2**18 + 1
"""Elements of a buffer that gloo cuts differently for 8-byte and 4-byte elements (N = 2)."""


def _owners(bounds: list[tuple[int, int]]) -> list[int]:
    return [c for c, (lo, hi) in enumerate(bounds) for _ in range(lo, hi)]


@pytest.mark.clause("schedule-layouts")
def test_each_element_is_in_the_chunk_its_layout_gives_it() -> None:
    assert chunk_of_elements("blocks", 3, 7) == _owners(blocks_bounds(3, 7))
    assert chunk_of_elements("gloo", 3, 7) == _owners(gloo_bounds(3, 7, 4))
    assert chunk_of_elements("even", 3, 6) == [0, 0, 1, 1, 2, 2]
    s = SIZE_MATTERS
    assert gloo_bounds(2, s, 8) != gloo_bounds(2, s, 4)
    assert chunk_of_elements("gloo", 2, s, itemsize=8) == _owners(gloo_bounds(2, s, 8))
    assert chunk_of_elements("gloo", 2, 2**20) == _owners(gloo_bounds(2, 2**20, 4))


@pytest.mark.clause("schedule-layouts")
def test_layout_views_of_a_large_float64_buffer_use_its_element_size() -> None:
    n, s = 2, SIZE_MATTERS
    flat = torch.arange(s, dtype=torch.float64)
    views = layout_views(flat, "gloo", n, itemsize=flat.element_size())
    assert [(int(v[0]), int(v[-1]) + 1) for v in views] == gloo_bounds(n, s, 8)
    assert all(v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for v in views)
