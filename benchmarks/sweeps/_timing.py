"""Timing helpers of the sweeps: CUDA events around single calls after a chosen L2 flush, CUDA-graph replay.

The scripts in this folder run as ``python3 benchmarks/sweeps/NAME.py`` (this folder is then on sys.path).
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import statistics
import time

import torch
from triton.testing import do_bench

REPS = 60
GRAPH_CALLS = 10


@functools.cache
def _flush_buffer() -> torch.Tensor:
    return torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")


def dirty_flush() -> None:
    _flush_buffer().zero_()


def clean_flush() -> None:
    _flush_buffer().zero_()
    _flush_buffer().max()  # read it back: the dirty lines are written out now, L2 holds clean lines


def host_us(fn, n: int = 400, repeats: int = 5, warmup: int = 30) -> float:
    """Host µs per call: wall time of ``n`` back-to-back calls without synchronizing (on tensors small enough
    that the GPU never falls behind), least of ``repeats`` means: the host is shared, and noise only ever adds
    time. Without CUDA (a CPU check of a script) no synchronization."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    sync()
    return best


def samples_line(times_ms: list[float], first: int = 16) -> str:
    """do_bench's samples (``return_mode="all"``, ms) as one line: count, median, p20, p80 and the first
    ``first`` samples in order (µs), which show whether slow samples come in runs (a busy host) or alone."""
    q = statistics.quantiles(times_ms, n=10)  # q[1] = p20, q[7] = p80
    head = " ".join(f"{t * 1e3:.0f}" for t in times_ms[:first])
    return (f"n={len(times_ms):4d} median {statistics.median(times_ms) * 1e3:7.1f} p20 {q[1] * 1e3:7.1f} "
            f"p80 {q[7] * 1e3:7.1f} µs; first: {head}")


def events_ms(fn, flush, reps: int = REPS) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def graph_ms(fn) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return events_ms(graph.replay, clean_flush, reps=20) / GRAPH_CALLS


def alternate(calls: dict, rounds: int) -> dict:
    """Time every call (name -> (fn, ms -> fraction of copy bandwidth)) once per round, the calls alternating: after
    a dirty flush (the lab's method) and per call of a CUDA graph. Returns name -> (dirty fractions, graph ones)."""
    out = {name: ([], []) for name in calls}
    for _ in range(rounds):
        for name, (fn, fraction) in calls.items():
            out[name][0].append(fraction(events_ms(fn, dirty_flush)))
            out[name][1].append(fraction(graph_ms(fn)))
    return out


def spread(dirty: list[float], graph: list[float]) -> str:
    """``median [min-max] | graph median`` of :func:`alternate`'s fractions for one call."""
    return f"{statistics.median(dirty):.3f} [{min(dirty):.3f}-{max(dirty):.3f}] | {statistics.median(graph):.3f}"


def print_ranked(results: dict) -> None:
    """:func:`alternate`'s results, one line per call, fastest (median under the dirty flush) first."""
    for name, (dirty, graph) in sorted(results.items(), key=lambda kv: -statistics.median(kv[1][0])):
        print(f"  {spread(dirty, graph)}  {name}", flush=True)


def ab_header(copy: float, rounds: int) -> None:
    """The first line of an alternating A/B's output: device, copy bandwidth, what the columns are."""
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; fractions of it, median over {rounds} "
          "alternating rounds [min-max] (dirty flush | CUDA graph)")


def copy_gbps() -> float:
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), quantiles=[0.5])
    ms = ms[0] if isinstance(ms, (list, tuple)) else ms
    return 2 * src.numel() * 4 / ms / 1e6


def print_profile(name: str, fn, calls: int = 300, top: int = 16) -> None:
    """Where the host time of ``fn`` goes, function by function (main thread only; cProfile adds its own cost)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"--- {name}: {calls} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)
