"""Which tilings of the lab's stream bound (fuselab.bench.stream) move a case's bytes fastest, under the lab's timer.

    python3 benchmarks/sweeps/stream_variants.py [--persistent]

Question (session 22): the stream bound's first version (runtime loops, one step in flight per program) ran below the
row reductions it should bound (8192² bf16: 0.80 of copy bandwidth against `mean(dim=-1)` at 0.89 on the H100).
With unrolled steps, which step size x warps x steps per program x read hint is best for reads only, for copies and
for read-2-write-1, at the lab's sizes? The lab keeps the few that are best or near it everywhere.
``--persistent``: do grids of 1-4 looping programs per SM (no waves, no tail of short programs) move the same bytes
faster than one program per chunk?
Every variant and a reference op per case run in alternating rounds, timed by the lab's CudaTimer (do_bench, L2 flush).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys

import torch

import fuselab
from fuselab.bench import stream
from fuselab.bench.ceilings import measure as measure_ceilings
from fuselab.bench.timing import CudaTimer, TimingJob

ROUNDS = 2
TILES = ((4096, 4), (8192, 8), (16384, 8), (16384, 16))
STEPS = (4, 8, 16)
HINTS = ("", "evict_first")
#: first run: every tiling; --persistent: the lab's four, and each with 1, 2 or 4 looping programs per SM
GRID = [stream.Variant(b, w, h, s) for (b, w), s, h in itertools.product(TILES, STEPS, HINTS)]
PERSISTENT = [*stream.VARIANTS, *(dataclasses.replace(v, per_sm=k) for v in stream.VARIANTS for k in (1, 2, 4))]
VARIANTS = PERSISTENT if "--persistent" in sys.argv else GRID
BF16, FP32 = torch.bfloat16, torch.float32
#: (name, dtype, read elements, write elements, reference op builder or None)
CASES = (
    ("read 8192x8192 bf16 (mean dim=-1)", BF16, 8192 * 8192, 0, lambda d: _mean_rows(8192, 8192, d)),
    ("read 65536x512 bf16 (mean dim=-1)", BF16, 65536 * 512, 0, lambda d: _mean_rows(65536, 512, d)),
    ("read 10000x10000 fp32 (mean dim=-1)", FP32, 10**8, 0, lambda d: _mean_rows(10000, 10000, d, FP32)),
    ("copy rope 8x4096x40x128 bf16 (copy_)", BF16, 8 * 4096 * 40 * 128, 8 * 4096 * 40 * 128, lambda d: _copy(
        8 * 4096 * 40 * 128, d)),
    ("copy rope 16x2048x32x64 bf16 (copy_)", BF16, 16 * 2048 * 32 * 64, 16 * 2048 * 32 * 64, lambda d: _copy(
        16 * 2048 * 32 * 64, d)),
    ("read 2 write 1, 65536x512 bf16 (add)", BF16, 2 * 65536 * 512, 65536 * 512, lambda d: _add(65536 * 512, d)),
    ("read 2 write 1, 16384x4096 fp32 (add)", FP32, 2 * 16384 * 4096, 16384 * 4096, lambda d: _add(
        16384 * 4096, d, FP32)),
)


def _mean_rows(m, n, device, dtype=BF16):
    x = torch.randn(m, n, device=device, dtype=dtype)
    return lambda: fuselab.mean(x, dim=-1)


def _copy(n, device):
    x, y = torch.randn(n, device=device, dtype=BF16), torch.empty(n, device=device, dtype=BF16)
    return lambda: y.copy_(x)


def _add(n, device, dtype=BF16):
    x, r, y = (torch.randn(n, device=device, dtype=dtype) for _ in range(3))
    return lambda: torch.add(x, r, alpha=0.5, out=y)


def main() -> None:
    device = torch.device("cuda")
    timer = CudaTimer()
    copy_gbps = measure_ceilings(device, timer).copy_gbps
    print(f"# {torch.cuda.get_device_name()}  copy {copy_gbps:.0f} GB/s; fractions of it, median of {ROUNDS} "
          f"alternating rounds, the lab's timer (do_bench, L2 flush)")
    summary: dict[stream.Variant, list[float]] = {v: [] for v in VARIANTS}
    for name, dtype, reads, writes, reference in CASES:
        nbytes = (reads + writes) * dtype.itemsize
        entries = [(v.describe(), stream.stream(reads, writes, dtype, device, v).launch, v) for v in VARIANTS]
        entries.append(("reference op", reference(device), None))
        times: dict[str, list[float]] = {label: [] for label, _, _ in entries}
        for _ in range(ROUNDS):
            for label, fn, _ in entries:
                times[label].append(timer.measure(TimingJob(steps=[fn])).median_ms)
        print(f"\n{name}: {nbytes / 1e6:.0f} MB")
        rows = []
        for label, _, variant in entries:
            frac = nbytes / (statistics.median(times[label]) * 1e-3) / 1e9 / copy_gbps
            rows.append((frac, label))
            if variant is not None:
                summary[variant].append(frac)
        best = max(f for f, label in rows if label != "reference op")
        for frac, label in sorted(rows, reverse=True):
            print(f"  {frac:.3f}  {label}")
        for v in VARIANTS:
            summary[v][-1] /= best
        del entries
        torch.cuda.empty_cache()
    print("\nvariants by their worst fraction of each case's best variant:")
    for v, rel in sorted(summary.items(), key=lambda kv: -min(kv[1])):
        print(f"  worst {min(rel):.3f}  mean {statistics.mean(rel):.3f}  {v.describe()}")


if __name__ == "__main__":
    main()
