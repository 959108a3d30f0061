"""All-element ``mean``: the stealing plan's knobs against a flat read of the same bytes.

    python3 benchmarks/sweeps/reduce_steal_knobs.py

Question (session 20): ``stream_bound.py`` (``results/h200/probes/stream_bound.txt``) timed a flat Triton read
(16 KiB per program, fully unrolled 4 KiB steps, 8 warps, one fp32 partial per program and no final sum) at 0.960 of
copy bandwidth over 10000x10000 fp32 (CUDA graph 1.076) against 0.909 (0.991) for ``fuselab.mean`` over all of it,
and at 0.826 (1.025) against 0.774 (0.879) over 8192x8192 bf16. The shipped plan steals 32 KiB items with two
resident 16-warp programs per SM (session 17, H100). Hypothesis: it has too few bytes in flight per SM on the H200
(two programs' tiles, each item ending in a cross-warp reduction with a barrier), where the flat read keeps up to 8
short programs per SM loading. Prediction: more resident programs (32-64 warps per SM in 8-warp programs) or
larger steps close most of the gap: 0.93-0.95 at 10000x10000 fp32.

Variants rebuild the shipped plan with the knobs patched (``_reduce_plan`` constants; the register cap follows
``steal_maxnreg``); each is checked against ``torch.mean`` first; alternating rounds, dirty flush and CUDA graph.
"""

from __future__ import annotations

import itertools

import torch
from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py
from reduce_sweep import plan_call
from stream_bound import read_launch

from fuselab.ops import _reduce_plan as P

CASES = (((10000, 10000), torch.float32), ((2**28,), torch.float32), ((8192, 8192), torch.bfloat16))
ROUNDS = 2
KNOBS = ("TILE_BYTES", "STEAL_ITEM_BYTES", "STEAL_WARPS_PER_SM")


def plan_with(x: torch.Tensor, tile: int | None, item: int | None, warps_per_sm: int | None,
              warps: int | None) -> P.ReducePlan:
    """The all-element plan of ``x`` with the given knobs (None: shipped)."""
    saved = {k: getattr(P, k) for k in KNOBS}
    try:
        if tile is not None:
            P.TILE_BYTES = dict.fromkeys((2, 4, 8), tile)
        if item is not None:
            P.STEAL_ITEM_BYTES = dict.fromkeys((2, 4, 8), item)
        if warps_per_sm is not None:
            P.STEAL_WARPS_PER_SM = warps_per_sm
        P._plan.cache_clear()
        src, kept, red = P.prepare(x, tuple(range(x.dim())))
        plan = P.plan_reduction(src, kept, red)
        if warps is not None and plan.steal:
            sms = plan.steal // max(1, P.STEAL_WARPS_PER_SM // plan.num_warps)
            plan = P.dataclasses.replace(plan, num_warps=warps, steal=max(1, P.STEAL_WARPS_PER_SM // warps) * sms)
        return plan
    finally:
        for k, v in saved.items():
            setattr(P, k, v)
        P._plan.cache_clear()


def main() -> None:
    bw = copy_gbps()
    ab_header(bw, ROUNDS)
    for shape, dtype in CASES:
        run_case(torch.randn(shape, device="cuda", dtype=dtype), bw)
        torch.cuda.empty_cache()


def run_case(x: torch.Tensor, bw: float) -> None:
    nbytes = x.numel() * x.element_size()

    def fraction(ms: float) -> float:
        return nbytes / ms / 1e6 / bw

    want = x.float().mean()
    el = x.element_size()
    plans = {"shipped": plan_with(x, None, None, None, None)}
    tiles = (16384, 32768) if el == 4 else (8192, 16384)
    for tile, item, per_sm, warps in itertools.product(tiles, (16384, 32768, 65536), (32, 48, 64), (8, 16)):
        if item < tile:
            continue
        plan = plan_with(x, tile, item, per_sm, warps)
        name = (f"tile {tile // 1024} KiB, items {item // 1024} KiB, {per_sm} warps/SM in {warps}-warp programs "
                f"({plan.steal} programs)")
        plans[name] = plan
    calls = {}
    for name, plan in plans.items():
        out, fn = plan_call(x.view(-1), (0,), plan)
        fn()
        torch.testing.assert_close(out.float().reshape(()), want, rtol=1e-2 if el == 2 else 1e-5, atol=1e-4)
        calls[name] = (fn, fraction)
    for evict in ("", "evict_first"):
        _, fn = read_launch(x.view(-1), 16384, 4096, 8, evict)
        calls[f"flat read (no final sum), 16 KiB per program, 8 warps, {evict or 'default'}"] = (fn, fraction)
    print(f"\nall of {'x'.join(map(str, x.shape))} {str(x.dtype)[6:]} ({nbytes / 1e6:.0f} MB): shipped "
          f"{plans['shipped']}", flush=True)
    results = alternate(calls, ROUNDS)
    for name, (dirty, graph) in sorted(results.items(), key=lambda kv: -max(kv[1][0])):
        print(f"  {spread(dirty, graph)}  {name}", flush=True)


if __name__ == "__main__":
    main()
