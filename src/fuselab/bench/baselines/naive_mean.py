"""The reference material's teaching ``mean``: the baseline the reduction suite measures against.

One program per ``BLOCK`` elements loops *serially* over its block, one scalar load at a time, and
writes one fp32 partial; the per-program partials are then summed by a separate host-launched
``torch`` call and divided by ``n``. Correct, but far from the hardware: each program keeps one
4-byte load in flight, so the kernel is latency-bound (see ``benchmarks/notes/reduce.md``).
Only reductions over all elements; non-contiguous inputs are flattened with a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: elements each program sums serially
BLOCK = 1024


@triton.jit
def _naive_block_sum_kernel(
    x_ptr,  # [n] contiguous input
    partial_ptr,  # [cdiv(n, BLOCK)] fp32 per-program sums
    n,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * BLOCK
    acc = 0.0
    for i in range(0, BLOCK):  # one element per iteration: the point of the lesson
        idx = start + i
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, acc)


def naive_mean(x: torch.Tensor) -> torch.Tensor:
    """Mean of all elements of ``x`` (fp32/bf16/fp16), returned in ``x.dtype``."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError("x must be a float32, bfloat16 or float16 tensor")
    n = x.numel()
    if n == 0:
        return torch.full((), float("nan"), dtype=x.dtype, device=x.device)
    flat = x.reshape(-1)  # a copy when x is not contiguous
    partials = torch.empty(triton.cdiv(n, BLOCK), dtype=torch.float32, device=x.device)
    _naive_block_sum_kernel[(partials.numel(),)](flat, partials, n, BLOCK=BLOCK)
    return (partials.sum() / n).to(x.dtype)  # the "host-side" second stage: a separate torch call
