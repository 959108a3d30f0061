"""``mean(dim=0)``: column tiles wider than the planner allows (up to 8 KiB of each row) vs the shipped plans.

    python3 benchmarks/sweeps/reduce_cols_wide.py

Question (session 20): the cols kernel reads ``[BLOCK_R, BLOCK_I]`` tiles, one strip of ``BLOCK_I`` columns per
program. The planner caps the strip at 1 KiB (``MAX_COL_FRACTION``) and the H100 A/B of session 16 found fp32
0.851 -> 0.888 of copy bandwidth going from 512 B to 1 KiB strips (10000² fp32): wider was better and the sweep
stopped at the cap. Prediction: 2-4 KiB strips (longer contiguous runs per row, fewer programs touching each DRAM
page) lift ``dim=0`` of 10000² fp32 by 1-3% on the H200 (0.88 in its lab), as long as the split stays small enough
for the last program's sum of the partials (``_tickets.sum_partials``) to stay short. bf16 wanted 128 B strips on
the H100 (0.785 vs 0.59-0.62 at 1 KiB); its cases are here to see whether that holds on the H200.

Every variant is checked against ``torch.mean`` (fp32 math) before it is timed; alternating rounds, dirty flush (the
lab's method) and CUDA graph, as ``_timing.alternate``.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from _timing import ab_header, alternate, copy_gbps, print_ranked  # benchmarks/sweeps/_timing.py
from reduce_sweep import plan_call

from fuselab.ops import _reduce_plan as P
from fuselab.ops._launch import sm_count

CASES = (((10000, 10000), torch.float32), ((8192, 8192), torch.bfloat16), ((65536, 512), torch.bfloat16))
ROUNDS = 3
#: (bytes per step, warps): 16-64 bytes per thread per step
TILE_WARPS = ((8192, 8), (16384, 8), (16384, 16))


def shipped(x: torch.Tensor) -> P.ReducePlan:
    src, kept, red = P.prepare(x, (0,))
    return P.plan_reduction(src, kept, red)


def variant(plan: P.ReducePlan, block_i: int, tile: int, per_sm: int, warps: int, sms: int) -> P.ReducePlan | None:
    """``plan`` with ``block_i`` columns per strip, ``tile // block_i`` rows per step, a split for ``per_sm``
    programs per SM (the planner's rule, :func:`_reduce_plan._split`; the caller picks the read order)."""
    if block_i > P.next_power_of_2(plan.I) or tile < block_i:
        return None
    block_r = min(tile // block_i, P.next_power_of_2(plan.R))
    tiles = plan.O * P.cdiv(plan.I, block_i)
    split, r_per_split, interleave = P._split(plan.R, block_r, tiles, sms * per_sm, "cols")
    return dataclasses.replace(plan, block_i=block_i, block_r=block_r, split=split, r_per_split=r_per_split,
                               num_warps=warps, interleave=interleave)


def dim0_cases(cases, rounds: int):
    """After the A/B header: for each (shape, dtype) of ``cases``, ``(x, want, fraction, nbytes)``: a fresh random
    input, its fp32 mean over dim 0, ms -> fraction of the copy bandwidth for its bytes, and those bytes. Each input
    is freed after its case."""
    bw = copy_gbps()
    ab_header(bw, rounds)
    for shape, dtype in cases:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        nbytes = x.numel() * x.element_size()
        yield x, x.float().mean(0), (lambda ms, n=nbytes: n / ms / 1e6 / bw), nbytes
        del x
        torch.cuda.empty_cache()


def main() -> None:
    sms = sm_count(torch.device("cuda"))
    for x, want, fraction, nbytes in dim0_cases(CASES, ROUNDS):
        shape, dtype = tuple(x.shape), x.dtype
        base = shipped(x)
        plans = {f"shipped: {base.block_i} cols x {base.block_r} rows, split {base.split}, {base.num_warps} warps":
                 base}
        el = x.element_size()
        strips = (512, 2048, 4096, 8192) if el == 4 else (256, 512, 1024, 2048)
        for strip_bytes, (tile_bytes, warps), per_sm, order in itertools.product(strips, TILE_WARPS, (2, 4),
                                                                                 ("chunked", "interleaved")):
            plan = variant(base, strip_bytes // el, tile_bytes // el, per_sm, warps, sms)
            if plan is None or (plan.split == 1 and order == "interleaved"):
                continue
            plan = dataclasses.replace(plan, interleave=order == "interleaved")
            if plan == base:
                continue
            plans[f"{plan.block_i} cols x {plan.block_r} rows, split {plan.split} {order}, {per_sm}/SM, "
                  f"{warps} warps"] = plan
        calls = {}
        for name, plan in plans.items():
            out, fn = plan_call(x, (0,), plan)
            fn()
            torch.testing.assert_close(out.float(), want, rtol=1e-2 if el == 2 else 1e-5, atol=1e-3)
            calls[name] = (fn, fraction)
        print(f"\ndim=0 of {shape[0]}x{shape[1]} {str(dtype)[6:]} ({nbytes / 1e6:.0f} MB), {len(calls)} plans",
              flush=True)
        print_ranked(alternate(calls, ROUNDS))


if __name__ == "__main__":
    main()
