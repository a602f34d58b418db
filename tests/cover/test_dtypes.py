"""The formats table against torch's and numpy's own description of each format.

Each fact of ``ring_ref._dtypes`` is compared with an independent source:
``torch.finfo`` / ``numpy.finfo``, a tensor's bytes read back through
``struct``, and the rounding of the conversion itself.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from ring_ref._dtypes import (
    FORMATS,
    NUMPY_DTYPES,
    TORCH_DTYPES,
    FloatFormat,
    bits,
    dtype_name,
    format_of,
    to_hex,
)
from tests.common.oracles import DTYPES, INT_OF_BITS

pytestmark = pytest.mark.clause("supported-dtypes")


def _from_pattern(pattern: int, dtype: torch.dtype) -> float:
    """The value whose bit pattern is the (non-negative) integer ``pattern``."""
    width = torch.finfo(dtype).bits
    signed = pattern - (1 << width) if pattern >= 1 << (width - 1) else pattern
    return float(torch.tensor([signed], dtype=INT_OF_BITS[width]).view(dtype)[0])


def test_the_table_lists_the_spec_dtypes_in_the_spec_order() -> None:
    assert list(FORMATS) == list(DTYPES)
    assert tuple(DTYPES.values()) == TORCH_DTYPES
    assert (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)) == NUMPY_DTYPES
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert fmt.torch_dtype == DTYPES[name]
        want_numpy = None if name == "bfloat16" else np.dtype(name)
        assert fmt.numpy_dtype == want_numpy if want_numpy is not None else fmt.numpy_dtype is None


@pytest.mark.parametrize("name", list(DTYPES))
def test_each_format_agrees_with_finfo_and_with_its_bit_patterns(name: str) -> None:
    fmt = FORMATS[name]
    info = torch.finfo(DTYPES[name])
    assert fmt.bits == info.bits
    assert fmt.precision == 1 - math.log2(info.eps)
    assert fmt.max_finite == info.max
    assert fmt.smallest_normal == info.smallest_normal
    assert (fmt.emax, fmt.emin) == (math.frexp(info.max)[1] - 1, math.frexp(info.smallest_normal)[1] - 1)
    width, dtype = info.bits, DTYPES[name]
    infinity_pattern = (1 << (width - 1)) - (1 << (fmt.precision - 1))
    assert _from_pattern(infinity_pattern, dtype) == math.inf
    assert _from_pattern(infinity_pattern - 1, dtype) == info.max
    assert fmt.ulp_of_max == info.max - _from_pattern(infinity_pattern - 2, dtype)
    assert fmt.min_subnormal == _from_pattern(1, dtype)
    assert fmt.unit_roundoff == Fraction(info.eps) / 2
    if fmt.numpy_dtype is not None:
        assert fmt.min_subnormal == float(np.finfo(fmt.numpy_dtype).smallest_subnormal)
    int_info = torch.iinfo(fmt.int_dtype)
    assert (int_info.bits, int_info.min < 0) == (width, True)


@pytest.mark.parametrize("name", list(DTYPES))
def test_gamma_is_k_u_over_1_minus_k_u_until_k_u_reaches_1(name: str) -> None:
    fmt = FORMATS[name]
    u = Fraction(torch.finfo(DTYPES[name]).eps) / 2
    for k in (0, 1, 2, 7, 100):
        assert fmt.gamma(k) == k * u / (1 - k * u)
    last = 2**fmt.precision - 1
    assert fmt.gamma(last) == last * u / (1 - last * u)
    for k in (2**fmt.precision, 2**fmt.precision + 1):
        with pytest.raises(ValueError, match=rf"gamma_{k} is undefined for {name}: k u >= 1"):
            fmt.gamma(k)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_overflow_threshold_is_where_conversion_starts_giving_infinity(name: str) -> None:
    """Converted from a wider format that holds the threshold exactly.

    (torch converts float64 to float16 and bfloat16 through float32, rounding
    twice, so those two are converted from float32.)
    """
    fmt = FORMATS[name]
    wider = torch.float64 if name == "float32" else torch.float32
    threshold = torch.tensor(float(fmt.overflow_threshold), dtype=wider)
    assert Fraction(float(threshold)) == fmt.overflow_threshold  # exact in the wider format
    just_below = torch.nextafter(threshold, torch.zeros((), dtype=wider))
    assert float(threshold.to(DTYPES[name])) == math.inf
    assert float(just_below.to(DTYPES[name])) == fmt.max_finite
    assert float((-threshold).to(DTYPES[name])) == -math.inf


def test_float64_overflow_threshold_by_python_rounding() -> None:
    """Python's int / int is correctly rounded: the threshold overflows, anything below it does not."""
    threshold = FORMATS["float64"].overflow_threshold
    with pytest.raises(OverflowError):
        float(threshold)
    assert float(threshold - 1) == torch.finfo(torch.float64).max


def test_format_of_finds_every_supported_dtype_and_refuses_the_rest() -> None:
    for fmt in FORMATS.values():
        assert format_of(fmt.torch_dtype) is fmt
        if fmt.numpy_dtype is not None:
            assert format_of(np.dtype(fmt.name)) is fmt
    for refused in (torch.int32, torch.complex64, np.dtype(np.int64), np.dtype(">f4"), np.dtype(">f8")):
        with pytest.raises(KeyError, match="unsupported dtype"):
            format_of(refused)


def test_dtype_names_are_the_spec_names() -> None:
    for name, dtype in DTYPES.items():
        assert dtype_name(dtype) == name
        if name != "bfloat16":
            assert dtype_name(np.dtype(name)) == name
            assert dtype_name(np.dtype(name).newbyteorder(">")) == name  # by name, not by its str (">f4")


_STRUCT = {"float16": "<e", "float32": "<f", "float64": "<d"}


@pytest.mark.parametrize("name", list(DTYPES))
def test_bits_and_hex_are_the_bytes_struct_packs(name: str) -> None:
    fmt = FORMATS[name]
    tiny = fmt.min_subnormal
    values = [1.0, -0.0, tiny, -tiny, -fmt.max_finite, math.inf, -math.inf, -1.5, 3.0]
    t = torch.tensor(values, dtype=fmt.torch_dtype)
    if name == "bfloat16":  # bfloat16 is the top half of float32
        packed = [struct.pack(">f", v)[:2] for v in values]
    else:
        packed = [struct.pack(_STRUCT[name], v)[::-1] for v in values]
    assert to_hex(t) == [p.hex() for p in packed]
    patterns = bits(t)
    assert patterns.dtype == INT_OF_BITS[fmt.bits] and patterns.shape == t.shape
    assert [v & ((1 << fmt.bits) - 1) for v in patterns.tolist()] == [int(p.hex(), 16) for p in packed]
    assert to_hex(t.reshape(3, 3).t()) == [packed[j * 3 + i].hex() for i in range(3) for j in range(3)]


def test_a_format_is_a_plain_record() -> None:
    fmt = FloatFormat("float16", 16, 11, 15, -14, torch.float16, np.dtype(np.float16))
    assert fmt == FORMATS["float16"]
