"""Sweep the reduction planner's knobs on the GPU; print the best settings per benchmark case.

    python3 benchmarks/sweeps/reduce_sweep.py [--out FILE.json]

For each case of the ``reduce`` suite (mean over all / dim=-1 / dim=0) and each setting of (TILE_BYTES,
programs per SM (PROGRAMS_PER_SM and COLS_PROGRAMS_PER_SM alike), MIN_COL_BYTES, num_warps), the planner's constants
are patched, the plan is rebuilt, and ``fuselab.mean`` is timed (the shipped plan first) with CUDA events after
do_bench's kind of L2 flush
(median; ``_timing.py``).
``--cases`` keeps the cases whose label contains one of the given strings. Fractions are of the
D2D copy bandwidth measured in the same run (read + write counted). This is an exploration tool: the
numbers it prints decide the planner's defaults (see benchmarks/notes/reduce.md), the lab measures them.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
from _timing import copy_gbps, dirty_flush, events_ms

from fuselab.ops import _reduce_plan as P
from fuselab.ops import _reduce_triton as K
from fuselab.reference import reduce as ref

CASES = [  # (label, shape, dtype, dim)
    ("all/10000x10000", (10000, 10000), torch.float32, None),
    ("all/n=2^28", (2**28,), torch.float32, None),
    ("all/8192x8192", (8192, 8192), torch.bfloat16, None),
    ("dim=-1/10000x10000", (10000, 10000), torch.float32, -1),
    ("dim=-1/8192x8192", (8192, 8192), torch.bfloat16, -1),
    ("dim=-1/65536x512", (65536, 512), torch.bfloat16, -1),
    ("dim=0/10000x10000", (10000, 10000), torch.float32, 0),
    ("dim=0/8192x8192", (8192, 8192), torch.bfloat16, 0),
    ("dim=0/65536x512", (65536, 512), torch.bfloat16, 0),
]


def case_input(shape: tuple, dtype: torch.dtype, dim: int | None, copy: float):
    """A reduce case's fresh random input, its reduced dims, and ms -> fraction of ``copy`` GB/s for its bytes."""
    x = torch.randn(shape, device="cuda", dtype=dtype)
    nbytes = x.numel() * x.element_size()
    return x, ref.normalize_dims(x, dim), lambda ms: nbytes / ms / 1e6 / copy


def run_once(x: torch.Tensor, dims: tuple[int, ...], warps: int | None):
    src, kept, red = P.prepare(x, dims)
    plan = P.plan_reduction(src, kept, red)
    if warps is not None:
        plan = dataclasses.replace(plan, num_warps=warps)
    return plan, plan_call(src, dims, plan)[1]


def plan_call(src: torch.Tensor, dims: tuple[int, ...], plan: P.ReducePlan):
    """``(out, fn)``: a mean of ``src`` (laid out by ``prepare``) run by ``plan`` into ``out``, with a workspace of
    its own for the partials; ``fn()`` launches and returns ``out``."""
    out = torch.empty(plan.K, dtype=src.dtype, device=src.device)
    n = P.workspace_numel(plan)
    ws = torch.empty(n, dtype=torch.float32, device=src.device) if n else None
    return out, lambda: (K.reduce_into(src, dims, out, ws, plan=plan, is_mean=True), out)[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--cases", nargs="*", default=None)
    args = parser.parse_args()
    copy = copy_gbps()
    print(f"device {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s", flush=True)
    defaults = (dict(P.TILE_BYTES), P.PROGRAMS_PER_SM, P.COLS_PROGRAMS_PER_SM, dict(P.MIN_COL_BYTES), P.ROW_TILE_BYTES,
                dict(P.FAST_MEMORY_ROW_TILE_BYTES))
    rows = []
    for label, shape, dtype, dim in CASES:
        if args.cases and not any(c in f"{label} {str(dtype)[6:]}" for c in args.cases):
            continue
        x, dims, fraction = case_input(shape, dtype, dim, copy)
        cols_case = dim == 0
        grid = itertools.product((4096, 8192, 16384, 32768), (4, 8, 16), (128, 512, 1024) if cols_case else (128,),
                                 (None, 4, 8, 16))
        P._plan.cache_clear()
        plan, fn = run_once(x, dims, None)  # the shipped knobs
        ms = events_ms(fn, dirty_flush, reps=30)
        default = dict(case=label, tile=None, per_sm=None, min_col=None, warps=plan.num_warps, grid=list(plan.grid),
                       block_r=plan.block_r, block_i=plan.block_i, steal=plan.steal, us=ms * 1e3,
                       fraction=fraction(ms), default=True)
        results = [default]
        for tile, per_sm, min_col, warps in grid:
            P.TILE_BYTES, P.ROW_TILE_BYTES, P.FAST_MEMORY_ROW_TILE_BYTES = dict.fromkeys((2, 4, 8), tile), tile, {}
            P.MIN_COL_BYTES = dict.fromkeys((2, 4, 8), min_col)
            P.PROGRAMS_PER_SM = P.COLS_PROGRAMS_PER_SM = per_sm
            P._plan.cache_clear()
            plan, fn = run_once(x, dims, warps)
            if warps is not None and warps == plan.num_warps:
                continue
            ms = events_ms(fn, dirty_flush, reps=30)
            results.append(dict(case=label, tile=tile, per_sm=per_sm, min_col=min_col, warps=plan.num_warps,
                                grid=list(plan.grid), block_r=plan.block_r, block_i=plan.block_i, steal=plan.steal,
                                us=ms * 1e3, fraction=fraction(ms), default=False))
        (P.TILE_BYTES, P.PROGRAMS_PER_SM, P.COLS_PROGRAMS_PER_SM, P.MIN_COL_BYTES, P.ROW_TILE_BYTES,
         P.FAST_MEMORY_ROW_TILE_BYTES) = defaults
        P._plan.cache_clear()
        results.sort(key=lambda r: -r["fraction"])
        print(f"{label:20s} {dtype}  shipped {default['fraction']:.3f} ({default['us']:.1f} us, grid {default['grid']},"
              f" block_r {default['block_r']}, block_i {default['block_i']}, warps {default['warps']}, "
              f"steal {default['steal']})", flush=True)
        for r in results[:4]:
            knobs = "shipped knobs" if r["default"] else (f"tile {r['tile']:5d} per_sm {r['per_sm']:2d} "
                                                         f"min_col {r['min_col']:4d}")
            print(f"    best {r['fraction']:.3f} {r['us']:7.1f} us  {knobs} warps {r['warps']:2d} grid {r['grid']} "
                  f"block_r {r['block_r']} block_i {r['block_i']} steal {r['steal']}", flush=True)
        rows += results
        del x
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), copy_gbps=copy, results=rows), f, indent=1)


if __name__ == "__main__":
    main()
