"""The reference engine's warning before a ring of ``N >= 256`` workers, without running that ring.

A ``showwarning`` hook records the warning and raises, so the ring stops
right after the warning is given; the check costs milliseconds, not the
seconds the ring would take.
"""

from __future__ import annotations

import linecache
import os
import warnings
from typing import TextIO

import numpy as np
import pytest
import torch

from ring_ref import SlowReferenceWarning, ring_all_reduce
from ring_ref._cost import warn_if_slow


class _Stopped(Exception):
    """Raised by the hook: the warning was given, the ring need not run."""


def _first_warning(x: object) -> tuple[type[Warning], str, str, str]:
    seen: list[tuple[type[Warning], str, str, str]] = []

    def stop(  # noqa: PLR0917 (warnings.showwarning's signature)
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        seen.append((category, str(message), filename, linecache.getline(filename, lineno).strip()))
        raise _Stopped

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = stop
        with pytest.raises(_Stopped):
            ring_all_reduce(x)  # type: ignore[call-overload]  # the line the warning names
    return seen[0]


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_256_workers_get_the_warning_naming_the_rounds_and_the_fix_at_the_callers_line(kind: str) -> None:
    x = torch.zeros(256, 256) if kind == "torch" else np.zeros((256, 256), dtype=np.float32)
    category, message, filename, line = _first_warning(x)
    assert category is SlowReferenceWarning
    assert message.startswith("N = 256 workers: ")
    assert "after each of the 510 rounds" in message
    assert message.endswith("engine='fast' gives the same bits much sooner.")
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add frames between warn and caller
        assert filename == __file__  # the warning points at the call, not into ring_ref
        assert line.endswith("# the line the warning names")


def test_fewer_workers_get_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_slow(255)
        ring_all_reduce(torch.ones(4, 4))
        ring_all_reduce(np.ones((4, 4)))
