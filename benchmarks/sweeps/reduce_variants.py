"""Which kernel structure closes the gap to Inductor's bf16 reductions (device time, CUDA graph), on the GPU.

    python3 benchmarks/sweeps/reduce_variants.py

The l2_probe found Inductor's bf16 mean 5-11% faster than ours in device time (CUDA-graph replay) with the
planner's knobs ruled out. This script prints the launch config Inductor's autotuner chose for each case
(block sizes, warps, stages, registers, spills) and times a bare experimental row-reduction kernel over the
structural choices that differ between the two: tile bytes, warps, loop unrolling, a runtime row mask, the
eviction hint, programs per SM. Exact shapes only (no tails): an experiment, not a library kernel.
"""

# ruff: noqa: B023
from __future__ import annotations

import gc
import itertools

import torch
import triton
import triton.language as tl
from _timing import copy_gbps, dirty_flush, events_ms, graph_ms  # benchmarks/sweeps/_timing.py

import fuselab


@triton.jit
def _rows_variant(
    x_ptr,  # [K, R] contiguous input
    out_ptr,  # [SPLIT, K] fp32 partial sums
    K, R, r_per_split,
    ROWS: tl.constexpr, BLOCK_R: tl.constexpr, UNROLL: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid * ROWS + tl.arange(0, ROWS)
    base = x_ptr + rows[:, None] * R + split * r_per_split + tl.arange(0, BLOCK_R)[None, :]
    acc = tl.zeros([ROWS, BLOCK_R], dtype=tl.float32)
    for b in tl.range(0, r_per_split // BLOCK_R, loop_unroll_factor=UNROLL):
        if MASKED:
            v = tl.load(base + b * BLOCK_R, mask=(rows < K)[:, None], other=0.0, eviction_policy=EVICT)
        else:
            v = tl.load(base + b * BLOCK_R, eviction_policy=EVICT)
        acc += v.to(tl.float32)
    tl.store(out_ptr + split * K + rows, tl.sum(acc, axis=1))


def inductor_configs() -> list[str]:
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    lines = []
    for obj in gc.get_objects():
        try:
            found = isinstance(obj, CachingAutotuner)
        except ReferenceError:  # a dead weak proxy
            continue
        if found:
            for launcher in getattr(obj, "launchers", []):
                cfg = launcher.config
                lines.append(f"{obj.fn.__name__}: {cfg.kwargs} warps={cfg.num_warps} stages={cfg.num_stages} "
                             f"regs={getattr(launcher, 'n_regs', '?')} spills={getattr(launcher, 'n_spills', '?')}")
    return lines


def main() -> None:
    copy = copy_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"copy {copy:.0f} GB/s", flush=True)
    cases = (("all 8192^2", (8192 * 8192 // 65536, 65536), None), ("dim=-1 8192^2", (8192, 8192), -1),
             ("dim=-1 65536x512", (65536, 512), -1))
    for label, (k, r), dim in cases:
        x = torch.randn(k, r, device="cuda", dtype=torch.bfloat16)
        nbytes = x.numel() * 2
        frac = lambda ms: nbytes / ms / 1e6 / copy
        ref = x.double().sum() if dim is None else x.double().sum(-1)
        mean = (lambda: torch.mean(x)) if dim is None else (lambda: torch.mean(x, -1))
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: torch.mean(t) if dim is None else torch.mean(t, -1), dynamic=False)
        compiled(x)
        for line in inductor_configs():
            print(f"{label:18s} inductor {line}")
        for name, fn in (("torch", mean), ("torch.compile", lambda: compiled(x)),
                         ("fuselab", lambda: fuselab.mean(x) if dim is None else fuselab.mean(x, -1))):
            print(f"{label:18s} {name:46s} dirty {frac(events_ms(fn, dirty_flush)):.3f}  graph "
                  f"{frac(graph_ms(fn)):.3f}", flush=True)
        for tile, warps, unroll, masked, evict, per_sm in itertools.product(
                (4096, 8192, 16384), (4, 8), (1, 4), (False, True), ("evict_first",), (4, 8)):
            block_r = min(r, tile // 2)
            rows = max(1, tile // 2 // block_r)
            if dim is None:  # one output: split the (k*r)-long row over the programs
                xs = x.view(1, -1)
                split = sms * per_sm
                while (xs.shape[1] // split) % block_r:
                    split += 1
                grid, kk, rr, rps = (1, split), 1, xs.shape[1], xs.shape[1] // split
                rows = 1
            else:
                if per_sm == 8:
                    continue
                xs, grid, kk, rr, rps = x, (k // rows, 1), k, r, r
            part = torch.empty(grid[1], kk, device="cuda")

            def fn():
                _rows_variant[grid](xs, part, kk, rr, rps, ROWS=rows, BLOCK_R=block_r, UNROLL=unroll, MASKED=masked,
                                    EVICT=evict, num_warps=warps)
                return part.sum(0)

            got = fn().double()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            variant = f"tile={tile} warps={warps} unroll={unroll} masked={int(masked)} per_sm={per_sm}"
            print(f"{label:18s} {variant:46s} dirty {frac(events_ms(fn, dirty_flush)):.3f}  graph "
                  f"{frac(graph_ms(fn)):.3f}  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
