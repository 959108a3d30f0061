"""A training step timed on every rank of a process group (or alone): windows of steps timed with CUDA events,
the slowest rank's time, NCCL's share from a profile, peak memory, a digest of the weights, and the pipelined
call order. Used by ``dlrm_scaling.py``."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from fuselab.profile import kernel_table


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_window(step, batches, steps: int, device: torch.device) -> float:
    """Milliseconds per step over ``steps`` steps (CUDA events, or the host clock on a CPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for s in range(steps):
            step(*batches[s % len(batches)])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / steps
    t0 = time.perf_counter()
    for s in range(steps):
        step(*batches[s % len(batches)])
    return 1e3 * (time.perf_counter() - t0) / steps


def _slowest(value: float, device: torch.device) -> float:
    """The largest ``value`` over the ranks (one all-reduce; the value itself without a process group)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def comm_profile(step, batches, device: torch.device, steps: int = 5) -> dict[str, float]:
    """Device time per step of NCCL all_to_all / all_reduce kernels and of every kernel, and kernels per step."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _barrier()
    with profile(activities=activities) as prof:
        for s in range(steps):
            step(*batches[s % len(batches)])
        _sync(device)
    rows = kernel_table(prof, device=device.type == "cuda")

    def total(*keys: str) -> float:
        return sum(r.total_us for r in rows if any(k in r.name.lower() for k in keys)) / steps
    top = [{"name": r.name[:120], "us": r.total_us / steps, "calls": r.calls / steps} for r in rows[:25]]
    return {"all_to_all_us": total("alltoall", "all_to_all", "sendrecv"), "all_reduce_us": total("allreduce"),
            "kernel_us": sum(r.total_us for r in rows) / steps, "kernels": sum(r.calls for r in rows) / steps,
            "top_kernels": top}


def measure(step, batches, device: torch.device, steps: int, windows: int) -> dict[str, Any]:
    for k in range(3):  # warm-up (capture in graph mode)
        step(*batches[k % len(batches)])
    _sync(device)
    times = []
    for _ in range(windows):
        _barrier()
        times.append(_slowest(_timed_window(step, batches, steps, device), device))
    return {"step_ms": statistics.median(times), "window_ms": times}


def peak_gb(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return _slowest(torch.cuda.max_memory_allocated(device) / 1e9, device)


@torch.no_grad()
def digest(model: torch.nn.Module, device: torch.device) -> float:
    """Sum over the ranks of every float tensor's sum and sum of squares, in float64: two runs of the same steps
    from the same start give the same digest when their weights are bit for bit the same (one rounding apart
    moves it)."""
    pieces = [p for t in model.state_dict().values() if t.is_floating_point() and t.numel()
              for p in t.reshape(-1).split(1 << 26)]  # in pieces: a whole MLPerf table in float64 would not fit
    value = torch.zeros(1, dtype=torch.float64, device=device)
    for p in pieces:
        value += (p.double().sum() + p.double().square().sum()).to(device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
    return float(value)


class Pipelined:
    """A pipelined step (``--pipeline``): each call runs the next of ``batches`` in a cycle of its own, whatever
    batch the caller names, and names the one after it, so that every batch's ids were sent by the call before."""

    def __init__(self, step, batches):
        self.step, self.batches, self.calls = step, batches, 0

    def __call__(self, *_ignored):
        n = len(self.batches)
        batch, after = self.batches[self.calls % n], self.batches[(self.calls + 1) % n]
        self.calls += 1
        return self.step(*batch, next_sparse=after[1])

    def __getattr__(self, name: str):  # side_stream, release
        return getattr(self.step, name)
