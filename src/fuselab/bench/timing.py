"""Timers: CUDA events through ``triton.testing.do_bench`` on GPUs, a host clock on CPUs.

A timer takes a :class:`TimingJob` (one or more zero-argument callables, each one timed step,
and the tensors whose ``.grad`` is reset before every step) and returns :class:`TimingStats`
(per-step median, p20, p80 in milliseconds). The harness accepts any object with the same
``measure`` method and ``kind`` attribute, which is how the tests inject a fake clock.

With several callables (L2-cold rotation) one timed sample runs them all in turn and the
figures are divided by their number: each step then finds its inputs evicted from L2.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Step = Callable[[], Any]


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int = 0


@dataclass
class TimingJob:
    """What to time. ``steps``: one per input set (rotation when more than one).
    ``grad_to_none``: tensors whose gradients are reset before each step (backward modes).
    ``provider`` / ``case_key`` identify the job (for logs and fake timers)."""

    steps: Sequence[Step]
    grad_to_none: Sequence[torch.Tensor] = ()
    provider: str = ""
    case_key: str = ""
    cuda_graph: bool = False
    notes: list[str] = field(default_factory=list)


class Timer(Protocol):
    kind: str  # "cuda" (device time, CUDA events) or "cpu" (host clock)

    def measure(self, job: TimingJob) -> TimingStats: ...


def _rotation(job: TimingJob) -> Step:
    steps = list(job.steps)
    if len(steps) == 1:
        return steps[0]

    def run_all() -> None:
        for step in steps:
            step()

    return run_all


def _reset_grads(leaves: Sequence[torch.Tensor]) -> None:
    for t in leaves:
        t.grad = None


def _with_grad_reset(fn: Step, leaves: Sequence[torch.Tensor]) -> Step:
    """``fn`` preceded by resetting the gradients of ``leaves`` (``fn`` itself when there are none)."""
    leaves = list(leaves)
    if not leaves:
        return fn

    def step() -> None:
        _reset_grads(leaves)
        fn()

    return step


def _quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=10, method="inclusive")  # q[1] = p20, q[7] = p80
    return statistics.median(samples), q[1], q[7]


class CudaTimer:
    """Device time from CUDA events, via ``triton.testing.do_bench`` (warm-up, L2 flush between calls).

    ``warmup_ms`` / ``rep_ms`` are do_bench's time budgets. Gradients are reset at the start of every call
    (host work hidden behind the flush), not through do_bench's ``grad_to_none``, which skips its runtime
    estimate and warm-up: there every backward after the first accumulated into the old gradients, an extra
    kernel per leaf and a first-time ``cudaMalloc`` in the estimate, which then set too few timed samples
    (``benchmarks/notes/lab.md#what-moves-a-measurement``).
    With ``job.cuda_graph`` the rotation is captured once into a CUDA graph and the graph replay is timed:
    launch and autograd host overhead removed, which is what a training step captured in a graph (or
    ``torch.compile`` with cudagraphs) sees."""

    kind = "cuda"

    def __init__(self, warmup_ms: int = 25, rep_ms: int = 100) -> None:
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms

    def measure(self, job: TimingJob) -> TimingStats:
        from triton.testing import do_bench

        fn = _rotation(job)
        if job.cuda_graph:
            fn = self._graph(fn, job.grad_to_none)  # the replay writes the captured gradient buffers
        else:
            fn = _with_grad_reset(fn, job.grad_to_none)
        med, p20, p80 = do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, quantiles=[0.5, 0.2, 0.8])
        n = len(job.steps)
        return TimingStats(med / n, p20 / n, p80 / n)

    @staticmethod
    def _graph(fn: Step, leaves: Sequence[torch.Tensor] = ()) -> Step:
        """Capture ``fn`` (a forward, or a forward+backward through autograd) once; return the replay.

        Gradients are reset before each warm-up call and before the capture, so the captured backward
        assigns fresh gradients (as a timed step does) instead of accumulating into old ones.
        """
        fresh = _with_grad_reset(fn, leaves)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm up on a side stream, as CUDA graph capture requires
            for _ in range(3):
                fresh()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        _reset_grads(leaves)
        with torch.cuda.graph(graph):
            fn()
        return graph.replay


class HostTimer:
    """Wall-clock time on the host (CPU providers): warm-up, then ``samples`` samples of a batch of
    calls sized so one sample lasts at least ``min_sample_ms``; per-call median, p20, p80."""

    kind = "cpu"

    def __init__(self, warmup: int = 3, samples: int = 15, min_sample_ms: float = 2.0,
                 budget_s: float = 1.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.warmup = warmup
        self.samples = samples
        self.min_sample_ms = min_sample_ms
        self.budget_s = budget_s
        self.clock = clock

    def _step(self, job: TimingJob) -> Step:
        return _with_grad_reset(_rotation(job), job.grad_to_none)

    def measure(self, job: TimingJob) -> TimingStats:
        fn = self._step(job)
        start = self.clock()
        for _ in range(self.warmup):
            fn()
        per_call = max((self.clock() - start) / max(self.warmup, 1), 1e-9)
        inner = max(1, int(self.min_sample_ms / 1e3 / per_call))
        samples = max(3, min(self.samples, int(self.budget_s / (per_call * inner))))
        times = []
        for _ in range(samples):
            t0 = self.clock()
            for _ in range(inner):
                fn()
            times.append((self.clock() - t0) * 1e3 / inner)
        med, p20, p80 = _quantiles(times)
        n = len(job.steps)
        return TimingStats(med / n, p20 / n, p80 / n, samples=samples)


def default_timer(device: torch.device, quick: bool = False) -> Timer:
    """do_bench on a GPU; the host clock on a CPU (a smaller time budget per job with ``quick``)."""
    if device.type == "cuda":
        return CudaTimer()
    return HostTimer(budget_s=0.25, samples=9) if quick else HostTimer()


def peak_memory_start(device: torch.device) -> int | None:
    """Reset the peak counter; returns the bytes allocated now (None on CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_memory_delta(device: torch.device, start: int | None) -> int | None:
    """Peak bytes allocated above ``start`` since :func:`peak_memory_start` (None on CPU)."""
    if start is None or device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - start)
