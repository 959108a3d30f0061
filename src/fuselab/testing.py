"""Numerical comparison used by the tests *and* by the benchmark's correctness check.

One tolerance per dtype, on the norm-relative error ``‖out − ref‖ / ‖ref‖`` against a
float64 reference computed from the same (already rounded) inputs.
"""

from __future__ import annotations

import torch

#: the one tolerance table: relative error (norm-wise) allowed per dtype
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def tolerance(dtype: torch.dtype) -> float:
    try:
        return TOLERANCE[dtype]
    except KeyError:
        raise TypeError(f"no tolerance for dtype {dtype}; known: {list(TOLERANCE)}") from None


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float64; inf on shape mismatch or non-finite output."""
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    out64 = out.detach().to(device=ref.device, dtype=torch.float64)
    ref64 = ref.detach().to(torch.float64)
    if out64.numel() == 0:
        return 0.0
    # non-finite where the reference is finite (e.g. an unwritten poisoned slot) fails
    if not torch.equal(torch.isfinite(out64), torch.isfinite(ref64)):
        return float("inf")
    finite = torch.isfinite(ref64)
    if not torch.equal(out64[~finite], ref64[~finite]):
        return float("inf")
    diff = torch.linalg.vector_norm((out64 - ref64)[finite]).item()
    scale = torch.linalg.vector_norm(ref64[finite]).item()
    if scale == 0.0:
        return diff
    return diff / scale


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, what: str = "") -> None:
    """Assert ``rel_error(out, ref) <= tolerance(dtype or out.dtype)`` with a useful message."""
    dtype = dtype or out.dtype
    err = rel_error(out, ref)
    tol = tolerance(dtype)
    shape = tuple(out.shape)
    assert err <= tol, f"{what or 'output'}: relative error {err:.3e} > {tol:.0e} for {dtype} (shape {shape})"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (floats) so an element a kernel forgot to write fails the comparison."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-(2**30))
    return t
