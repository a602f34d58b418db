"""The one table of supported dtypes: their IEEE binary formats, error constants and bit patterns.

Every other module asks this one: which torch and numpy dtypes the ring
reduces (clause ``supported-dtypes``), each format's precision and exponent
range, its largest finite value, the spacing there, the unit roundoff
``u = 2**-p``, Higham's ``gamma_k = k u / (1 - k u)``, the overflow threshold,
and how to read a tensor's bit patterns.  ``tests/common/oracles.py`` keeps its own,
deliberately independent, copy of the few facts the tests need.

>>> FORMATS["float16"].max_finite, FORMATS["bfloat16"].precision
(65504.0, 8)
>>> FORMATS["float16"].overflow_threshold
Fraction(65520, 1)
>>> format_of(torch.float32).name, format_of(np.dtype(np.float64)).name
('float32', 'float64')
>>> bits(torch.tensor([1.0, -0.0], dtype=torch.float16)).tolist()
[15360, -32768]
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Final, NamedTuple

import numpy as np
import torch

__all__ = [
    "FORMATS",
    "INT_OF_SIZE",
    "NUMPY_DTYPES",
    "TORCH_DTYPES",
    "FloatFormat",
    "bits",
    "dtype_name",
    "format_of",
    "to_hex",
]


class FloatFormat(NamedTuple):
    """One IEEE 754 binary format as the ring uses it.

    ``precision`` counts significand bits with the hidden bit; ``emax`` and
    ``emin`` are the exponents of the largest and smallest normal numbers.
    ``numpy_dtype`` is ``None`` where numpy has no such dtype (bfloat16).
    """

    name: str
    bits: int
    precision: int
    emax: int
    emin: int
    torch_dtype: torch.dtype
    numpy_dtype: np.dtype[np.floating[Any]] | None

    @property
    def max_finite(self) -> float:
        """The largest finite value, ``(2 - 2**(1 - p)) * 2**emax``."""
        return float((2 - 2.0 ** (1 - self.precision)) * 2.0**self.emax)

    @property
    def ulp_of_max(self) -> float:
        """The spacing of values just below :attr:`max_finite`."""
        return float(2.0 ** (self.emax - self.precision + 1))

    @property
    def smallest_normal(self) -> float:
        """``2**emin``."""
        return float(2.0**self.emin)

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value, ``2**(emin - p + 1)``."""
        return float(2.0 ** (self.emin - self.precision + 1))

    @property
    def unit_roundoff(self) -> Fraction:
        """``u = 2**-p``: the largest relative error of one rounding to nearest.

        >>> FORMATS["float16"].unit_roundoff, FORMATS["bfloat16"].unit_roundoff
        (Fraction(1, 2048), Fraction(1, 256))
        """
        return Fraction(1, 2**self.precision)

    def gamma(self, k: int) -> Fraction:
        """Higham's ``gamma_k = k u / (1 - k u)``, exactly (``ValueError`` once ``k u >= 1``).

        >>> FORMATS["float32"].gamma(0), FORMATS["float16"].gamma(1)
        (Fraction(0, 1), Fraction(1, 2047))
        """
        u = self.unit_roundoff
        if k * u >= 1:
            raise ValueError(f"gamma_{k} is undefined for {self.name}: k u >= 1")
        return k * u / (1 - k * u)

    @property
    def overflow_threshold(self) -> Fraction:
        """The smallest magnitude that rounds to infinity: ``max + ulp(max) / 2``."""
        return Fraction(self.max_finite) + Fraction(self.ulp_of_max) / 2

    @property
    def int_dtype(self) -> torch.dtype:
        """The signed integer dtype of the same width, for bit patterns."""
        return INT_OF_SIZE[self.bits // 8]


INT_OF_SIZE: Final[dict[int, torch.dtype]] = {2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The signed integer dtype of each element size in bytes, for reading a float's bits."""

FORMATS: Final[dict[str, FloatFormat]] = {
    "float16": FloatFormat("float16", 16, 11, 15, -14, torch.float16, np.dtype(np.float16)),
    "bfloat16": FloatFormat("bfloat16", 16, 8, 127, -126, torch.bfloat16, None),
    "float32": FloatFormat("float32", 32, 24, 127, -126, torch.float32, np.dtype(np.float32)),
    "float64": FloatFormat("float64", 64, 53, 1023, -1022, torch.float64, np.dtype(np.float64)),
}
"""The supported formats by name, in the order the spec lists them."""

TORCH_DTYPES: Final = tuple(f.torch_dtype for f in FORMATS.values())
"""The torch dtypes the ring reduces."""

NUMPY_DTYPES: Final = tuple(f.numpy_dtype for f in FORMATS.values() if f.numpy_dtype is not None)
"""The numpy dtypes the ring reduces (numpy has no bfloat16)."""


def format_of(dtype: torch.dtype | np.dtype[np.generic]) -> FloatFormat:
    """The format of a supported torch or (native byte order) numpy dtype; ``KeyError`` otherwise."""
    for fmt in FORMATS.values():
        if isinstance(dtype, torch.dtype):
            if dtype == fmt.torch_dtype:
                return fmt
        elif fmt.numpy_dtype is not None and dtype == fmt.numpy_dtype and dtype.byteorder in "=|":
            # (A numpy dtype compares equal to None, which numpy reads as float64.)
            return fmt
    raise KeyError(f"unsupported dtype {dtype}")


def dtype_name(dtype: torch.dtype | np.dtype[np.generic]) -> str:
    """``torch.float16`` -> ``"float16"``; numpy dtypes by their name.

    >>> dtype_name(torch.bfloat16), dtype_name(np.dtype(np.float32))
    ('bfloat16', 'float32')
    """
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns: a contiguous signed-integer tensor of the same shape and width."""
    return t.detach().contiguous().view(INT_OF_SIZE[t.element_size()])


def to_hex(t: torch.Tensor) -> list[str]:
    """Each element's bit pattern as fixed-width lowercase hex, in row-major order.

    >>> to_hex(torch.tensor([1.0, -0.0], dtype=torch.float16))
    ['3c00', '8000']
    """
    width = t.element_size() * 8
    mask = (1 << width) - 1
    return [format(v & mask, f"0{width // 4}x") for v in bits(t).flatten().tolist()]
