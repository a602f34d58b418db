"""Chunk views (clause ``chunk-layout``) against numpy's and torch's own splitting.

``N`` chunks of ``M / N`` consecutive rows, trailing dimensions whole, each a
view of the buffer (nothing copied), for tensors and arrays alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ring_ref._chunks import chunk_rows, chunk_views

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
