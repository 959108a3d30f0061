"""The rows kernel (``mean`` over ``dim=-1`` and over all elements) against torch.compile: register cap, warps,
tile and eviction hint, timed in one process.

    python3 benchmarks/sweeps/reduce_rows_probe.py

Question: ``dim=-1`` of 10000² fp32 and of 8192² bf16 trail Inductor's reduction by 1.5-2% under the lab's dirty
L2 flush. The sweep of the planner's knobs (``reduce_sweep.py``) found the defaults best, but it never lifted the
``maxnreg=32`` cap that the rows kernel carries for the split (all-element) plans' occupancy. With 16 fp32 values
per thread per tile, 32 registers may force the loads of one tile into two batches (fewer bytes in flight).
Each variant: median of CUDA events after a dirty flush (the lab's method) and the per-call time of 10 calls
in a CUDA graph (clean L2 before the replay).
"""

from __future__ import annotations

import itertools

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from reduce_sweep import case_input, run_once  # benchmarks/sweeps/reduce_sweep.py: a case's input; a fixed plan

from fuselab.ops import _launch
from fuselab.ops import _reduce_plan as P
from fuselab.ops import _reduce_triton as K

CASES = [  # label, shape, dtype, dim
    ("dim=-1/10000x10000", (10000, 10000), torch.float32, -1),
    ("dim=-1/8192x8192", (8192, 8192), torch.bfloat16, -1),
    ("dim=-1/65536x512", (65536, 512), torch.bfloat16, -1),
    ("all/8192x8192", (8192, 8192), torch.bfloat16, None),
    ("all/10000x10000", (10000, 10000), torch.float32, None),
    ("all/n=2^28", (2**28,), torch.float32, None),
]


def _variant(x, dims, maxnreg, warps, tile, evict, per_sm, row_tile):
    K.ROWS_MAXNREG = maxnreg
    P.PROGRAMS_PER_SM = per_sm
    P.TILE_BYTES = dict.fromkeys((2, 4, 8), tile)
    P.ROW_TILE_BYTES = row_tile
    P.FAST_MEMORY_ROW_TILE_BYTES = {}  # row_tile on every GPU (the H200's own step: reduce_rowtile_ab.py)
    K.STREAM_EVICTION = dict.fromkeys((2, 4, 8), evict)
    P._plan.cache_clear()
    _launch._COMPILED.clear()
    plan, fn = run_once(x, dims, warps)
    fn()
    torch.cuda.synchronize()
    return plan, fn


def probe(label: str, shape: tuple, dtype: torch.dtype, dim: int | None, copy: float, defaults: tuple) -> None:
    x, dims, frac = case_input(shape, dtype, dim, copy)

    compiled = torch.compile(lambda t: torch.mean(t) if dim is None else torch.mean(t, dim))
    compiled(x)
    rows = [("torch.compile", frac(timing.events_ms(lambda: compiled(x), timing.dirty_flush)),
             frac(timing.graph_ms(lambda: compiled(x))))]
    default_tile = defaults[1][x.element_size()]
    default_evict = defaults[2][x.element_size()]
    plan, fn = _variant(x, dims, defaults[0], None, default_tile, default_evict, defaults[3], defaults[4])
    rows.append((f"shipped (H100 rules): grid {plan.grid} warps {plan.num_warps} block_r {plan.block_r}",
                 frac(timing.events_ms(fn, timing.dirty_flush)), frac(timing.graph_ms(fn))))
    grid = itertools.product((32, 64, 255), (None, 8, 16), (default_tile // 2, default_tile),
                             (default_evict, "" if default_evict else "evict_first"),
                             (defaults[3], defaults[3] // 2) if dim is None else (defaults[3],))
    for maxnreg, warps, tile, evict, per_sm in grid:
        plan, fn = _variant(x, dims, maxnreg, warps, tile, evict, per_sm, tile)
        if warps is not None and warps == P.plan_reduction(*P.prepare(x, dims)).num_warps:
            continue  # the planner's own choice, timed as warps None
        name = (f"maxnreg {maxnreg:3d} warps {plan.num_warps:2d} tile {tile:5d} evict {evict or '-':11s} "
                f"per_sm {per_sm} grid {plan.grid}")
        rows.append((name, frac(timing.events_ms(fn, timing.dirty_flush)), frac(timing.graph_ms(fn))))
    K.ROWS_MAXNREG, P.TILE_BYTES, K.STREAM_EVICTION = defaults[0], dict(defaults[1]), dict(defaults[2])
    P.PROGRAMS_PER_SM, P.ROW_TILE_BYTES, P.FAST_MEMORY_ROW_TILE_BYTES = defaults[3], defaults[4], dict(defaults[5])
    P._plan.cache_clear()
    _launch._COMPILED.clear()
    print(f"\n{label} {str(dtype)[6:]} ({x.numel() * x.element_size() / 1e6:.0f} MB)")
    for name, dirty, graph in sorted(rows, key=lambda r: -r[1])[:12]:
        print(f"  {dirty:.3f} | {graph:.3f}  {name}")
    shipped = next(r for r in rows if r[0].startswith("shipped"))
    print(f"  {shipped[0]}: {shipped[1]:.3f} | {shipped[2]:.3f}", flush=True)


def main() -> None:
    copy = timing.copy_gbps()
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; fractions of it (dirty flush | CUDA graph)")
    defaults = (K.ROWS_MAXNREG, dict(P.TILE_BYTES), dict(K.STREAM_EVICTION), P.PROGRAMS_PER_SM, P.ROW_TILE_BYTES,
                dict(P.FAST_MEMORY_ROW_TILE_BYTES))
    for case in CASES:
        probe(*case, copy, defaults)


if __name__ == "__main__":
    main()
