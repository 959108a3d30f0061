"""Why ``fuselab.mean`` over all of 8192² bf16 measured 130-180 µs per call in one lab run and 54 µs in the probe.

    python3 benchmarks/sweeps/reduce_lab_gap.py

One process: do_bench of ``fuselab.mean(x)`` (the public call, as the lab times it) and of ``reduce_into`` with a
fixed plan and workspace (as ``reduce_rows_probe.py`` times it), before and after torch.compile has run; then the
kernel durations and the launch gaps of 20 public calls from the profiler.
"""

from __future__ import annotations

import itertools
import statistics

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import fuselab
from fuselab.ops import _reduce_plan as P
from fuselab.ops import _reduce_triton as K
from fuselab.reference import reduce as ref


def summary(label: str, fn) -> None:
    times = do_bench(fn, warmup=25, rep=100, return_mode="all")
    print(f"{label:34s} {timing.samples_line(times)}", flush=True)


def probe(shape: tuple[int, int], dim: int | None) -> None:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16 if shape[0] != 10000 else torch.float32)
    dims = ref.normalize_dims(x, dim)
    src, kept, red = P.prepare(x, dims)
    plan = P.plan_reduction(src, kept, red)
    out = torch.empty(plan.K, dtype=x.dtype, device="cuda")
    n = P.workspace_numel(plan)
    ws = torch.empty(n, dtype=torch.float32, device="cuda") if n else None
    public = (lambda: fuselab.mean(x)) if dim is None else (lambda: fuselab.mean(x, dim))
    print(f"\n{shape} dim={dim}: plan grid {plan.grid} warps {plan.num_warps} block_r {plan.block_r}")
    summary("fuselab.mean", public)
    summary("reduce_into (fixed plan, workspace)", lambda: K.reduce_into(src, dims, out, ws, plan=plan,
                                                                           is_mean=True))
    compiled = torch.compile(lambda t: torch.mean(t) if dim is None else torch.mean(t, dim))
    compiled(x)
    summary("torch.compile", lambda: compiled(x))
    summary("fuselab.mean after compile", public)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            public()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    durs = [e.time_range.elapsed_us() for e in kernels]
    gaps = [b.time_range.start - a.time_range.end for a, b in itertools.pairwise(kernels)]
    names = sorted({e.name[:40] for e in kernels})
    print(f"  profiler: {len(kernels)} kernels {names}; duration median {statistics.median(durs):.1f} µs "
          f"max {max(durs):.1f}; gap median {statistics.median(gaps):.1f} µs")



def main() -> None:
    for shape, dim in (((8192, 8192), None), ((65536, 512), 0), ((10000, 10000), -1)):
        probe(shape, dim)


if __name__ == "__main__":
    main()
