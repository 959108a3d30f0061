"""Why some forward+backward medians in the lab sit far above their p20: every sample, in order, and what the host
called in a step.

    python3 benchmarks/sweeps/step_noise.py

For each (op, case, provider) the lab's own step is built (``fuselab.bench.runner.time_provider``, the same inputs,
upstream gradients and grad reset) and timed by do_bench three ways: as the lab does; with Python's garbage
collector off; and with the collector off after ``gc.freeze()``. It prints median / p20 / p80, the share of samples
over 1.25x p20, the first samples in order, the caching allocator's device mallocs and frees during the timing, and
the CUDA runtime calls of 10 profiled steps (a synchronization or a ``cudaMalloc`` inside a step shows here).
"""

from __future__ import annotations

import gc
import statistics
from collections import Counter

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from fuselab.bench.options import BenchOptions
from fuselab.bench.runner import time_provider
from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import get_spec
from fuselab.bench.timing import TimingStats

CASES = [  # op, case label, dtype, providers
    ("rope", "4x4096x32/32x128", torch.bfloat16, ("fuselab", "fuselab-angles", "liger", "torch.compile")),
    ("rope", "16x2048x16/16x64", torch.bfloat16, ("fuselab", "fuselab-angles", "liger")),
    ("rope", "1x16384x64/8x128", torch.bfloat16, ("fuselab", "fuselab-angles")),
    ("bias_act", "65536x512-relu", torch.bfloat16, ("fuselab", "eager", "torch.compile")),
    ("bias_act", "65536x512-gelu_tanh", torch.bfloat16, ("fuselab", "eager")),
]
RUNTIME_CALLS = ("cudaMalloc", "cudaFree", "Synchronize", "cudaMemcpy", "cudaMemset", "cudaLaunchKernel",
                 "cuLaunchKernel", "cudaStreamWaitEvent", "cudaEventRecord", "cudaHostAlloc")


def _mallocs() -> tuple[int, int]:
    s = torch.cuda.memory_stats()
    return s.get("num_device_alloc", 0), s.get("num_device_free", 0)


class ProbeTimer:
    kind = "cuda"

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _bench(self, fn, grads, label: str) -> list[float]:
        m0 = _mallocs()
        times = do_bench(fn, warmup=25, rep=100, grad_to_none=grads, return_mode="all")
        m1 = _mallocs()
        p20 = statistics.quantiles(times, n=10)[1]
        slow = sum(t > 1.25 * p20 for t in times) / len(times)
        self.lines.append(f"    {label:<16} {timing.samples_line(times, first=24)}")
        self.lines.append(f"      slow (> 1.25 p20) {slow:4.0%}  mallocs +{m1[0] - m0[0]} frees +{m1[1] - m0[1]}")
        return times

    def measure(self, job) -> TimingStats:
        fn = job.steps[0]
        grads = list(job.grad_to_none) or None
        times = self._bench(fn, grads, "lab (gc on)")
        gc.disable()
        try:
            self._bench(fn, grads, "gc off")
            gc.collect()
            gc.freeze()
            self._bench(fn, grads, "gc frozen")
            gc.unfreeze()
        finally:
            gc.enable()
        for t in job.grad_to_none:
            t.grad = None
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                for t in job.grad_to_none:
                    t.grad = None
                fn()
            torch.cuda.synchronize()
        calls = Counter()
        for ev in prof.events():
            if any(name in ev.name for name in RUNTIME_CALLS):
                calls[ev.name] += 1
        self.lines.append("    runtime calls per step: " + ", ".join(
            f"{name} {n / 10:g}" for name, n in sorted(calls.items())))
        med = statistics.median(times)
        return TimingStats(med, med, med, len(times))


def main() -> None:
    device = torch.device("cuda")
    options = BenchOptions(write=False)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; gc thresholds {gc.get_threshold()}")
    for op, label, dtype, providers in CASES:
        spec = get_spec(op)
        cases = [c for c in spec.cases(CaseQuery(device_type="cuda", dtypes=(dtype,), modes=("fwd+bwd",)))
                 if c.label == label]
        if not cases:
            print(f"{op} {label}: no such case")
            continue
        case = cases[0]
        for name in providers:
            provider = spec.provider(name)
            if provider.missing() or provider.skip_reason(case):
                print(f"{op} {label} {name}: skipped ({provider.missing() or provider.skip_reason(case)})")
                continue
            timer = ProbeTimer()
            try:
                time_provider(spec, case, provider.build(case), device, timer, options, name)
            except Exception as e:  # a probe: report and go on
                print(f"{op} {label} {name}: failed: {type(e).__name__}: {e}")
                continue
            print(f"{op} {label} {name} ({case.bytes / 1e6:.0f} MB)")
            print("\n".join(timer.lines), flush=True)


if __name__ == "__main__":
    main()
