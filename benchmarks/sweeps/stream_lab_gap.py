"""Why the lab's stream bound read 400 MB of fp32 at 0.92 of copy bandwidth where stream_variants.py measured 0.96.

    python3 benchmarks/sweeps/stream_lab_gap.py

Suspects, timed in alternating rounds in one process: the case's few written elements (the lab streams the 40 KB
output of ``mean(dim=-1)`` too: one masked write step per chunk), and the process state after torch.compile ran.
Found (H100, results/h100/probes/stream_lab_gap.txt): the write step. With 10000 written elements every variant read
3-6% slower (0.95 -> 0.89 with default reads), before and after torch.compile alike; the kernel now branches past
the stores of chunks beyond the output and gives such small outputs one step after a full chunk of reads.
"""

from __future__ import annotations

import functools
import statistics

import torch

import fuselab
from fuselab.bench import stream
from fuselab.bench.ceilings import measure as measure_ceilings
from fuselab.bench.timing import CudaTimer, TimingJob

N = 10**8


def main() -> None:
    device = torch.device("cuda")
    timer = CudaTimer()
    copy = measure_ceilings(device, timer).copy_gbps
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; 10000x10000 fp32 read (400 MB), 3 rounds")
    x = torch.randn(10000, 10000, device=device)
    entries = {"fuselab.mean(dim=-1)": lambda: fuselab.mean(x, dim=-1)}
    for v in stream.VARIANTS:
        for writes in (0, 10000):
            s = stream.stream(N, writes, torch.float32, device, v)
            entries[f"{v.describe()}, writes {writes}"] = s.launch
    for phase in ("before torch.compile", "after torch.compile"):
        if phase.startswith("after"):
            compiled = torch.compile(lambda t: t.mean(dim=-1))
            compiled(x)
            entries["torch.compile mean"] = functools.partial(compiled, x)
        times = {k: [] for k in entries}
        for _ in range(3):
            for k, fn in entries.items():
                times[k].append(timer.measure(TimingJob(steps=[fn])).median_ms)
        print(f"\n{phase}")
        for k, t in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            print(f"  {4 * N / (statistics.median(t) * 1e-3) / 1e9 / copy:.3f}  {k}")


if __name__ == "__main__":
    main()
