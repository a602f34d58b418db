"""Input checks shared by the array adapters (``spec/ring_all_reduce.md``, table ``bad-input``)."""

from __future__ import annotations

from collections.abc import Sequence


def expected_type_error(got: object) -> TypeError:
    """The error for an argument that is neither a torch tensor nor a numpy array."""
    kind = type(got).__name__
    hint = (
        " Stack the per-worker tensors first, e.g. torch.stack(tensors)."
        if isinstance(got, (list, tuple))
        else ""
    )
    return TypeError(
        "ring_all_reduce expects worker_tensors as one torch.Tensor or numpy.ndarray of shape "
        f"(N, M, ...); got {kind}.{hint}"
    )


def check_layout(shape: Sequence[int]) -> tuple[int, int]:
    """Return ``(N, M)`` for a valid ``(N, M, ...)`` shape, else raise ``ValueError``."""
    if len(shape) < 2:
        raise ValueError(
            f"worker_tensors must have shape (N, M, ...) with at least 2 dimensions; got shape "
            f"{tuple(shape)}. Add a worker axis (x.unsqueeze(0) / x[None]) or a data axis."
        )
    n, m = shape[0], shape[1]
    if n == 0:
        raise ValueError(f"N = 0 workers (shape {tuple(shape)}); the ring needs at least one worker.")
    if m == 0:
        raise ValueError(f"M = 0 elements per worker (shape {tuple(shape)}); M must be positive.")
    if any(d == 0 for d in shape[2:]):
        raise ValueError(
            f"trailing dimensions must be positive; got shape {tuple(shape)}. Drop the empty dimension."
        )
    if m % n:
        raise ValueError(
            f"M = {m} is not divisible by N = {n} workers, so the {n} chunks cannot be equal. "
            f"Pad M to a multiple of {n} (e.g. {m + (-m) % n})."
        )
    return n, m


def unsupported_dtype(dtype: object, supported: str) -> TypeError:
    """The error for a dtype the ring does not reduce."""
    return TypeError(
        f"unsupported dtype {dtype}; ring_all_reduce sums floating-point values only "
        f"({supported}). Cast first, e.g. x.to(torch.float32) or x.astype(numpy.float32); "
        "for complex inputs reduce the real and imaginary parts as a trailing axis of size 2."
    )


def non_finite(count: int, index: Sequence[int]) -> ValueError:
    """The error for inputs holding NaN or infinity."""
    return ValueError(
        f"inputs must be finite: {count} element(s) are NaN or infinite, the first at index "
        f"{tuple(index)}. Clean or mask them before the all-reduce."
    )
