"""RoPE forward: tile size and warps of the launch plan vs a copy of the same bytes, on the GPU.

    python3 benchmarks/sweeps/rope_tiles.py

The forward sits at 0.92-0.95 of the 1 GiB copy bandwidth at the four large bshd shapes (target 0.95). This
asks two questions, each case in one process:
1. what a plain copy of the same bytes reaches under the same timing (do_bench's dirty L2 flush, and a
   CUDA-graph replay after a clean flush): the ceiling for a kernel that reads q, k once and writes them once;
2. whether another tile (elements per loop step: ``rope_kernel.tile_elements``) or warp count moves the kernel.
"""

from __future__ import annotations

import itertools

import torch
import triton
from _timing import clean_flush, copy_gbps, dirty_flush, events_ms, graph_ms  # benchmarks/sweeps/_timing.py

import fuselab
from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import rope as suite
from fuselab.ops import _launch, rope, rope_kernel

TILES = (2048, 4096, 8192, 16384)
WARPS = (None, 4, 8)  # None: the planner's choice


def set_config(tile: int, warps: int | None) -> None:
    """Point the planner at ``tile``/``warps`` (on every device); drop every cached plan and compiled launch."""
    rope_kernel.TILE_ELEMENTS = rope_kernel.FAST_MEMORY_TILE_ELEMENTS = tile
    rope_kernel._config = _config_with(warps)
    forget_launches()


def forget_launches() -> None:
    """Drop every plan, compiled launch and launch kept by eager calls (they hold the plan they were made with)."""
    rope_kernel._PLANS.clear()
    _launch._COMPILED.clear()
    rope._CALLS.clear()
    rope._PREPARED.clear()


_ORIGINAL = rope_kernel._config
_SHIPPED_TILES = rope_kernel.TILE_ELEMENTS, rope_kernel.FAST_MEMORY_TILE_ELEMENTS


def restore() -> None:
    rope_kernel.TILE_ELEMENTS, rope_kernel.FAST_MEMORY_TILE_ELEMENTS = _SHIPPED_TILES
    rope_kernel._config = _ORIGINAL
    forget_launches()


def _config_with(warps: int | None):
    def config(*args):
        _ORIGINAL.cache_clear()
        cfg = _ORIGINAL(*args)
        return cfg if warps is None else (*cfg[:-1], warps)

    return config


def main() -> None:
    bw = copy_gbps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"copy {bw:.0f} GB/s (1 GiB, do_bench)")
    query = CaseQuery(device_type="cuda", dtypes=(torch.bfloat16,), modes=("fwd",))
    cases = [c for c in suite.cases(query) if c.params["kind"] != "decode"]
    for case in cases:
        sweep_case(case, bw)
        torch.cuda.empty_cache()


def sweep_case(case, bw: float) -> None:
    """The same-size copy, the shipped plan, then every (tile, warps) on one case."""
    q, k, cos, sin, layout, offsets, cu, max_seqlen = suite.make_inputs(case, torch.device("cuda"))
    nbytes = case.bytes

    def frac(ms: float) -> float:
        return nbytes / ms / 1e6 / bw

    flat = torch.randn((q.numel() + k.numel(),), device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(flat)
    copy = lambda: dst.copy_(flat)
    copy_bytes = 2 * flat.numel() * flat.element_size()  # read + write q, k (the case adds its cos/sin rows)
    cfrac = lambda ms: copy_bytes / ms / 1e6 / bw
    print(f"{case.label:22s} same-size copy ({copy_bytes / 1e6:.0f} MB)   "
          f"dirty {cfrac(events_ms(copy, dirty_flush)):.3f}  clean {cfrac(events_ms(copy, clean_flush)):.3f}  "
          f"graph {cfrac(graph_ms(copy)):.3f}")

    def rope() -> None:
        fuselab.apply_rope(q, k, cos, sin, layout=layout, seqlen_offsets=offsets, cu_seqlens=cu,
                           max_seqlen=max_seqlen)

    with torch.no_grad():
        ref_q, ref_k = fuselab.apply_rope(q, k, cos, sin, layout=layout, seqlen_offsets=offsets,
                                          cu_seqlens=cu, max_seqlen=max_seqlen)
        print(f"{case.label:22s} fuselab (shipped)          dirty {frac(events_ms(rope, dirty_flush)):.3f}  "
              f"graph {frac(graph_ms(rope)):.3f}")
        for tile, warps in itertools.product(TILES, WARPS):
            set_config(tile, warps)
            got_q, got_k = fuselab.apply_rope(q, k, cos, sin, layout=layout, seqlen_offsets=offsets,
                                              cu_seqlens=cu, max_seqlen=max_seqlen)
            same = torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k)
            plan = next(iter(rope_kernel._PLANS.values()))
            print(f"{case.label:22s} tile={tile:<5d} warps={warps or 'auto':<4} grid={plan[0]} "
                  f"T,HQ,HK={plan[2]['BLOCK_T']},{plan[2]['BLOCK_HQ']},{plan[2]['BLOCK_HK']} "
                  f"w={plan[2]['num_warps']}  dirty {frac(events_ms(rope, dirty_flush)):.3f}  "
                  f"graph {frac(graph_ms(rope)):.3f}{'' if same else '  MISMATCH'}", flush=True)
        restore()


if __name__ == "__main__":
    main()
