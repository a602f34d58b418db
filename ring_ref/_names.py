"""The names and defaults that the tools share with the command line, importable without torch or numpy.

``ring-ref --help`` and every usage error are answered from these alone
(clause ``cli-arguments-first``): the modules that compute with them import
them from here.

>>> OPS, DTYPE_NAMES
(('sum', 'prod', 'max', 'min', 'avg'), ('float16', 'bfloat16', 'float32', 'float64'))
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "DTYPE_NAMES",
    "INVARIANCE_DRAWS",
    "INVARIANCE_PROBE",
    "OPS",
    "REVEAL_CHECKS",
    "Op",
]

Op = Literal["sum", "prod", "max", "min", "avg"]
OPS: Final[tuple[Op, ...]] = ("sum", "prod", "max", "min", "avg")
"""The reduction operations (:mod:`ring_ref._ops`), in the spec's order."""

DTYPE_NAMES: Final = ("float16", "bfloat16", "float32", "float64")
"""The supported formats by name, in the order the spec lists them (:data:`ring_ref._dtypes.FORMATS`)."""

REVEAL_CHECKS: Final = 4
"""How many random inputs reveal checks its trees on by default (``--checks``)."""

INVARIANCE_PROBE: Final = 32
"""How many elements invariance probes by default (``--probe``)."""

INVARIANCE_DRAWS: Final = 4
"""How many random inputs ``invariance --by-bits`` tries by default (``--draws``)."""
