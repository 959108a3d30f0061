"""Numerical comparison used by the tests *and* by the benchmark's correctness check.

Every element is compared with a float64 reference computed from the same (already rounded) inputs:
``|out - ref| <= atol + rtol * |ref|``, with one ``(atol, rtol)`` per dtype from :data:`TOLERANCES`.
Non-finite values must match exactly in position (NaN where the reference has NaN, the same infinity
where it has one). :func:`assert_ulp` is the sharper bound for ops with one rounding: the error in units
of the output dtype's spacing at ``|ref|``.

:func:`rel_error` (the norm-wise relative error) and :func:`tolerance` remain for the benchmark's check,
which reports one number per provider.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Tolerance(NamedTuple):
    """Per-element bound ``atol + rtol * |ref|``."""

    atol: float
    rtol: float


#: the one per-element tolerance table: dtype -> (one rounding, several roundings).
#: "one rounding": a result computed in fp32 (or fp64) from the inputs and rounded once to the dtype is within
#: half an ulp, <= u * |ref| with u the unit roundoff (2^-53, 2^-24, 2^-11, 2^-8): rtol is u for bf16, 2u for
#: fp16 (room for the fp32 arithmetic before the rounding), 16u for fp32 (a few fp32 operations and in-kernel
#: exp/erf/cos/sin, each off by an ulp or two, before the result); atol covers results near zero that come from
#: cancellation (a rotation, a sum of signed terms), whose error scales with the operands, not with the result.
#: "several roundings": values that pass through a stored low-precision intermediate (gradients through a saved
#: activation or pre-activation, a chain of layers, a second rounding of a rounded result): a few u of the
#: operands' scale.
TOLERANCES: dict[torch.dtype, tuple[Tolerance, Tolerance]] = {
    torch.float64: (Tolerance(atol=1e-12, rtol=1e-10), Tolerance(atol=1e-10, rtol=1e-8)),
    torch.float32: (Tolerance(atol=1e-5, rtol=2.0**-20), Tolerance(atol=1e-4, rtol=2.0**-14)),
    torch.float16: (Tolerance(atol=1e-4, rtol=2.0**-10), Tolerance(atol=2e-3, rtol=2.0**-8)),
    torch.bfloat16: (Tolerance(atol=1e-3, rtol=2.0**-8), Tolerance(atol=1.6e-2, rtol=2.0**-6)),
}

#: the norm-wise relative error the benchmark's check allows per dtype (see :func:`rel_error`)
NORM_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def tolerances(dtype: torch.dtype, chained: bool = False) -> Tolerance:
    """The per-element ``(atol, rtol)`` of ``dtype`` (one rounding, or several with ``chained``); ``TypeError``
    for a dtype not in the table."""
    try:
        return TOLERANCES[dtype][1 if chained else 0]
    except KeyError:
        raise TypeError(f"no tolerance for dtype {dtype}; known: {list(TOLERANCES)}") from None


def tolerance(dtype: torch.dtype) -> float:
    """The norm-wise relative tolerance of ``dtype`` (for :func:`rel_error`); ``TypeError`` if unknown."""
    try:
        return NORM_TOLERANCE[dtype]
    except KeyError:
        raise TypeError(f"no tolerance for dtype {dtype}; known: {list(NORM_TOLERANCE)}") from None


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


def _as64(out: torch.Tensor, ref: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"{what}: out and ref must be tensors, got {type(out).__name__}, {type(ref).__name__}")
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out64 = out.detach().to(device="cpu", dtype=torch.float64)
    ref64 = ref.detach().to(device="cpu", dtype=torch.float64)
    return out64, ref64


def _check_nonfinite(out64: torch.Tensor, ref64: torch.Tensor, what: str) -> torch.Tensor:
    """Assert NaN/inf positions (and the signs of infinities) agree; return the mask of finite references."""
    finite = torch.isfinite(ref64)
    same = (torch.isnan(out64) == torch.isnan(ref64)) & (torch.isinf(out64) == torch.isinf(ref64))
    same &= finite | torch.isnan(ref64) | (out64 == ref64)
    if not bool(same.all()):
        bad = (~same).nonzero()
        idx = tuple(bad[0].tolist())
        raise AssertionError(
            f"{what}: non-finite values differ in {bad.shape[0]} of {out64.numel()} elements; first at index {idx}: "
            f"got {out64[idx].item()!r}, reference {ref64[idx].item()!r}")
    return finite


def _report(what: str, err: torch.Tensor, allowed: torch.Tensor, out64: torch.Tensor, ref64: torch.Tensor,
            bound: str) -> None:
    """Raise naming the worst element (largest error / allowed) when any element exceeds its allowance."""
    failing = err > allowed
    n_fail = int(failing.sum())
    if n_fail == 0:
        return
    ratio = torch.where(allowed > 0, err / allowed, torch.where(err > 0, math.inf, 0.0))
    flat = int(torch.argmax(ratio).item())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), out64.shape)) if out64.dim() else ()
    raise AssertionError(
        f"{what}: {n_fail} of {out64.numel()} elements outside {bound} (shape {tuple(out64.shape)}); worst at index "
        f"{idx}: got {out64[idx].item():.9g}, reference {ref64[idx].item():.9g}, error {err[idx].item():.3e} > "
        f"allowed {allowed[idx].item():.3e}")


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, what: str = "",
                 chained: bool = False, atol: float | torch.Tensor | None = None, rtol: float | None = None) -> None:
    """Assert every element of ``out`` is within ``atol + rtol * |ref|`` of ``ref`` (compared in float64).

    ``(atol, rtol)`` come from :data:`TOLERANCES` for ``dtype`` (default ``out.dtype``): the one-rounding entry,
    or with ``chained`` the several-roundings one (gradients, layer chains); passing ``atol`` or
    ``rtol`` overrides that entry (for a bound a test derives itself; ``atol`` may be a tensor broadcastable to
    ``ref``, e.g. a per-element accumulation bound of a reduction). NaN and inf must sit at the same
    positions in both (with the same sign for inf). The message names how many elements fail and the worst one:
    its index, value, reference and allowed error. Raises ``AssertionError`` on a shape mismatch,
    ``TypeError`` for a dtype without a table entry.
    """
    what = what or "output"
    tol = tolerances(dtype or out.dtype, chained)
    atol = tol.atol if atol is None else atol
    rtol = tol.rtol if rtol is None else rtol
    out64, ref64 = _as64(out, ref, what)
    if out64.numel() == 0:
        return
    finite = _check_nonfinite(out64, ref64, what)
    err = torch.where(finite, (out64 - ref64).abs(), 0.0)
    if isinstance(atol, torch.Tensor):
        atol = atol.detach().to(device="cpu", dtype=torch.float64)
        atol_text = f"atol <= {atol.max().item():.1e}"
    else:
        atol_text = f"atol {atol:.1e}"
    allowed = (atol + rtol * ref64.abs().nan_to_num(0.0, 0.0, 0.0)).expand_as(ref64)
    _report(what, err, allowed, out64, ref64, f"{atol_text} + rtol {rtol:.1e} * |ref|")


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at ``|ref|`` (float64 tensor): ``2^(floor(log2|ref|) - mantissa bits)``, never
    below the dtype's smallest subnormal spacing. ``TypeError`` for a non-floating dtype."""
    if not dtype.is_floating_point:
        raise TypeError(f"ulp needs a floating dtype, got {dtype}")
    info = torch.finfo(dtype)
    mant = round(-math.log2(info.eps))  # explicit mantissa bits: 52, 23, 10, 7
    tiny_spacing = info.tiny * info.eps  # spacing of the subnormals
    mag = ref.detach().to(torch.float64).abs().nan_to_num(0.0, 0.0, 0.0)
    _, exp = torch.frexp(mag)  # mag = m * 2^exp with m in [0.5, 1)
    spacing = torch.ldexp(torch.ones_like(mag), (exp - 1 - mant).to(torch.int32))
    return torch.where(mag > 0, spacing, 0.0).clamp(min=tiny_spacing)


def assert_ulp(out: torch.Tensor, ref64: torch.Tensor, max_ulp: float = 1.0, what: str = "",
               dtype: torch.dtype | None = None, atol: float = 0.0) -> None:
    """Assert every element of ``out`` is within ``max_ulp`` spacings of ``dtype`` (default ``out.dtype``)
    at ``|ref64|``, plus ``atol`` (the fp32 arithmetic's own error for results that cancel to near zero, where
    a low-precision spacing is tiny). A result computed in higher precision and rounded to nearest once is within
    0.5 ulp; a truncating store is up to 1 ulp off. Same non-finite rules and message as :func:`assert_close`."""
    what = what or "output"
    dtype = dtype or out.dtype
    out64, ref = _as64(out, ref64, what)
    if out64.numel() == 0:
        return
    finite = _check_nonfinite(out64, ref, what)
    err = torch.where(finite, (out64 - ref).abs(), 0.0)
    allowed = max_ulp * ulp(ref, dtype) + atol
    _report(what, err, allowed, out64, ref, f"{max_ulp} ulp of {dtype} + atol {atol:.1e}")


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (floats) so an element a kernel forgot to write fails the comparison."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-(2**30))
    return t
