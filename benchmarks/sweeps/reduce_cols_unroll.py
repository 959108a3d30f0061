"""``mean(dim=0)``: the cols kernel with its loop unrolled (several tiles' loads in flight per program) vs shipped.

    python3 benchmarks/sweeps/reduce_cols_unroll.py

Question (session 23): ``dim=0`` of 8192² bf16 runs at 0.88 of the lab's stream bound on the H100 (57-58 µs against
51 µs). The stream kernel's own history says where such a gap can come from: with a runtime loop it read the same
bytes at 0.80 of copy bandwidth, with its steps unrolled (all of a chunk's loads issued before the first is used) at
0.87-0.90. The cols kernel still loops at runtime over ``[BLOCK_R, BLOCK_I]`` tiles, one tile (8 KiB) in flight per
program. Tile shapes, strip widths, read orders and grids were swept in sessions 16-20 (``reduce_cols_wide.py``,
``reduce_split_ab.py``); unrolling was not. Prediction: 2-4 tiles in flight lift 8192² bf16 by 5-8% (to ~0.83 of
copy bandwidth, ≥ 0.95 of the bound) and 65536x512 bf16 by a few percent, as long as the programs stay resident.

Prototype: ``_cols_unroll_kernel`` is ``_reduce_triton._cols_kernel`` with ``UNROLL`` full tiles per loop iteration
(``tl.static_range``: loads issued together, then summed), the leftover full tiles and the ragged tail after it.
Every variant is checked against ``torch.mean`` before it is timed; alternating rounds as ``_timing.alternate``; the
stream bound of the same bytes (``fuselab.bench.stream``, best of its variants) is timed in the same rounds.

Outcome: the prototype's 4 tiles per step with 4 warps ran 2-10% ahead of the shipped plan at most of the six
shapes on both GPUs. Put into ``_cols_kernel`` (commits e1134aa-b8b0ee5) it did not carry over: with 32-bit offsets
it ran 11-30% *slower* (8192² bf16 0.571 vs 0.760 on the H200), and with 64-bit offsets -7% to +9% against the plan
before it (65536x512 0.559 vs 0.601), behind the prototype by up to 10% at three shapes, although the two kernels'
PTX loops are the same (results/h200/probes/reduce_cols_unroll_shipped*.txt, written by a ``--shipped`` mode of
that commit). Reverted; ``notes/reduce.md``, session 23.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import triton
import triton.language as tl
from _timing import alternate, print_ranked  # benchmarks/sweeps/_timing.py
from reduce_cols_wide import dim0_cases

from fuselab.bench import stream as S
from fuselab.ops import _reduce_plan as P
from fuselab.ops._launch import sm_count
from fuselab.ops._reduce_triton import STREAM_EVICTION, _chunk, _store_result
from fuselab.ops._tickets import final_sum_rows, ticket_counters

#: the lab's two bf16 dim=0 cases, then other shapes of the same size class, so that a rule is not fit to one case
CASES = (((8192, 8192), torch.bfloat16), ((65536, 512), torch.bfloat16), ((16384, 4096), torch.bfloat16),
         ((4096, 16384), torch.bfloat16), ((8192, 8192), torch.float16), ((32768, 2048), torch.bfloat16))
ROUNDS = 3
#: (unroll, programs per SM, warps) tried per case (the first sweep's: unroll 1-8 x 2-4 per SM x 4-8 warps, and
#: 10000² fp32, in results/h100/probes/reduce_cols_unroll.txt)
VARIANTS = tuple(itertools.product((1, 4, 8), (2, 3, 4), (4, 8)))


@triton.jit
def _cols_unroll_kernel(
    x_ptr,  # [R, I] input, row stride s_r, contiguous columns (O == 1 plans only)
    out_ptr,  # [I] result
    part_ptr,  # [SPLIT, I] fp32 partials; only if SPLIT_R
    count_ptr,  # [cdiv(I, BLOCK_I)] int32 tickets; only if SPLIT_R
    I, R, s_r, r_per_split, n_reduced,
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, UNROLL: tl.constexpr, SPLIT_R: tl.constexpr,
    HAS_TAIL: tl.constexpr, BLOCK_S: tl.constexpr, OUT_BF16: tl.constexpr, EVICT: tl.constexpr,
    INTERLEAVE: tl.constexpr,
):
    # bytes: read R*I elements, write I (+ SPLIT*I fp32 partials, written once and read once)
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1).to(tl.int64)
    n_split = tl.num_programs(1)
    cols = pid * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < I
    r_start, step, n_full, tail_start, r_end = _chunk(split, n_split, R, r_per_split, BLOCK_R, SPLIT_R, INTERLEAVE)
    rr = tl.arange(0, BLOCK_R).to(tl.int64)
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    n_groups = n_full // UNROLL
    for g in range(0, n_groups):
        for u in tl.static_range(UNROLL):
            r = r_start + (g * UNROLL + u) * step + rr
            acc += tl.load(x_ptr + r[:, None] * s_r + cols[None, :], mask=col_mask[None, :], other=0.0,
                           eviction_policy=EVICT).to(tl.float32)
    for b in range(n_groups * UNROLL, n_full):
        r = r_start + b * step + rr
        acc += tl.load(x_ptr + r[:, None] * s_r + cols[None, :], mask=col_mask[None, :], other=0.0,
                       eviction_policy=EVICT).to(tl.float32)
    if HAS_TAIL:
        r = tail_start + rr
        mask = (r < r_end)[:, None] & col_mask[None, :]
        acc += tl.load(x_ptr + r[:, None] * s_r + cols[None, :], mask=mask, other=0.0,
                       eviction_policy=EVICT).to(tl.float32)
    _store_result(tl.sum(acc, axis=0), cols, col_mask, out_ptr, part_ptr, count_ptr, pid, split, n_split, I,
                  n_reduced, BLOCK_I, SPLIT_R, BLOCK_S, tl.float32, True, OUT_BF16)


def shipped(x: torch.Tensor) -> P.ReducePlan:
    src, kept, red = P.prepare(x, (0,))
    plan = P.plan_reduction(src, kept, red)
    return dataclasses.replace(plan, stages=0)  # pointers, as the prototype (fp32 ships TMA at this size)


def regrid(plan: P.ReducePlan, per_sm: int, sms: int) -> P.ReducePlan:
    split, r_per_split, interleave = P._split(plan.R, plan.block_r, plan.tiles, sms * per_sm, "cols")
    return dataclasses.replace(plan, split=split, r_per_split=r_per_split, interleave=interleave)


def unrolled_call(x: torch.Tensor, plan: P.ReducePlan, unroll: int, warps: int):
    out = torch.empty(plan.I, dtype=x.dtype, device=x.device)
    split = plan.split > 1
    part = torch.empty(max(1, P.workspace_numel(plan)), dtype=torch.float32, device=x.device)
    counters = ticket_counters(x.device, plan.tiles) if split else out
    kwargs = dict(BLOCK_R=plan.block_r, BLOCK_I=plan.block_i, UNROLL=unroll, SPLIT_R=split,
                  HAS_TAIL=plan.R % plan.block_r != 0,
                  BLOCK_S=final_sum_rows(plan.split, plan.block_i) if split else 1,
                  OUT_BF16=x.dtype == torch.bfloat16, EVICT=STREAM_EVICTION[x.element_size()],
                  INTERLEAVE=plan.interleave, num_warps=warps)

    def fn():
        _cols_unroll_kernel[plan.grid](x, out, part, counters, plan.I, plan.R, plan.s_r, plan.r_per_split, plan.R,
                                       **kwargs)
        return out
    return out, fn


def shipped_call(x: torch.Tensor, plan: P.ReducePlan):
    from reduce_sweep import plan_call
    return plan_call(x, (0,), plan)


def main() -> None:
    sms = sm_count(torch.device("cuda"))
    for x, want, fraction, nbytes in dim0_cases(CASES, ROUNDS):
        shape, dtype = tuple(x.shape), x.dtype
        base = shipped(x)
        calls = {}
        fn = shipped_call(x, base)[1]
        calls[f"shipped: {base.block_i} cols x {base.block_r} rows, grid {base.grid}, {base.num_warps} warps"] = fn
        for unroll, per_sm, warps in VARIANTS:
            plan = regrid(base, per_sm, sms)
            if unroll * plan.block_r > plan.r_per_split and unroll > 1:
                continue
            calls[f"unroll {unroll}, {per_sm}/SM, {warps} warps, grid {plan.grid}"] = unrolled_call(x, plan, unroll,
                                                                                                 warps)[1]
        tol = dict(rtol=1e-2, atol=1e-3) if x.element_size() == 2 else dict(rtol=1e-5, atol=1e-5)
        checked = {}
        for name, fn in calls.items():
            torch.testing.assert_close(fn().float(), want, **tol, msg=lambda m, n=name: f"{n}: {m}")
            checked[name] = (fn, fraction)
        for variant in S.VARIANTS:
            st = S.stream(x.numel(), base.I, dtype, x.device, variant)
            checked[f"stream bound: {variant.describe()}"] = (st.launch, fraction)
        print(f"\ndim=0 of {shape[0]}x{shape[1]} {str(dtype)[6:]} ({nbytes / 1e6:.0f} MB), {len(checked)} calls",
              flush=True)
        print_ranked(alternate(checked, ROUNDS))


if __name__ == "__main__":
    main()
