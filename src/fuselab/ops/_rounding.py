"""The one store-side cast of every kernel: a float32 value rounded to nearest-even into the output's dtype.

On GPUs ``x.to(tl.bfloat16)`` / ``x.to(tl.float16)`` already round to nearest even. The Triton interpreter casts
fp32 -> bf16 by dropping the low 16 bits (truncation), so under it the bf16 value is rounded with integer
arithmetic on the fp32 bits (NaN kept NaN): CPU and GPU give the same bits. (Triton's ``fp_downcast_rounding=
"rtne"`` is no fix there: the interpreter's version drops the carry into the exponent.) The interpreter's fp16
cast goes through numpy, which rounds to nearest even already.

Whether the interpreter runs is fixed when Triton is imported (``TRITON_INTERPRET``), so it is read once here.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.backend import interpreter_enabled

#: True when kernels run under the Triton interpreter (read once: Triton itself reads it at import)
INTERPRETED: tl.constexpr = tl.constexpr(interpreter_enabled())


@triton.jit
def rounded(v, DTYPE: tl.constexpr):
    """``v`` (float32 or float64) in ``DTYPE`` (e.g. ``out_ptr.dtype.element_ty``), rounded to nearest even."""
    if INTERPRETED and tl.bfloat16 == DTYPE:
        f = v.to(tl.float32)
        bits = f.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        r = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(f != f, f.to(tl.bfloat16), r)
    else:
        return v.to(DTYPE)


@triton.jit
def stochastically_rounded(v, DTYPE: tl.constexpr, seed, offsets):
    """float32 ``v`` in ``DTYPE`` (bfloat16 or float16) rounded to one of its two neighbours at random: up with
    probability equal to the distance from the lower one in units of the last place, so E[result] = v (FBGEMM's
    stochastic rounding of half-precision tables). The random bits are Philox's at (``seed``, ``offsets``): a
    seeded run gives the same bits on every run. NaN and infinities are kept; float32 ``DTYPE``: ``v`` itself."""
    if tl.float32 == DTYPE:
        return v
    else:
        bits = v.to(tl.uint32, bitcast=True)
        finite = (bits & 0x7F800000) != 0x7F800000
        if tl.bfloat16 == DTYPE:  # bf16 keeps fp32's exponent: add 16 random low bits, cut them (sign-magnitude)
            noise = tl.randint(seed, offsets).to(tl.uint32, bitcast=True) & 0xFFFF
            cut = ((bits + noise) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            return tl.where(finite, cut, rounded(v, DTYPE))
        else:  # fp16: the last place is 2^(max(e, -14) - 10), e the binary exponent (subnormals included)
            e = ((bits >> 23) & 0xFF).to(tl.int32) - 127
            ulp = ((tl.maximum(e, -14) + 117) << 23).to(tl.uint32).to(tl.float32, bitcast=True)
            low = tl.floor(v / ulp) * ulp
            up = tl.where(tl.rand(seed, offsets) * ulp < v - low, low + ulp, low)
            return tl.where(finite, up, v).to(DTYPE)
