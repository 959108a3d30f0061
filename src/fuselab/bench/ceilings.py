"""The device's measured ceilings, once per run: copy bandwidth and matmul rate.

Copy bandwidth is THE reference of the lab: every provider's GB/s is reported as a fraction of
it. On a GPU it is a device-to-device copy of 1 GiB (read + write bytes counted, 2 GiB moved)
timed by ``do_bench``, and cross-checked by a plain ``torch`` copy timed with CUDA events in a
simple loop (both recorded; they should agree within 10%). The compute ceiling is a bf16
8192³ matmul. On a CPU the same copy (smaller) and an fp32 matmul are timed with the host clock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from .timing import HostTimer, Timer, TimingJob


@dataclass(frozen=True)
class Ceilings:
    device_type: str
    copy_gbps: float  # the lab's figure (read + write bytes / median time)
    copy_bytes: int  # bytes moved per copy (read + write)
    copy_method: str
    copy_check_gbps: float | None = None  # cross-check: plain copy timed with events / host clock in a loop
    matmul_tflops: float | None = None
    matmul_method: str | None = None

    @property
    def copy_agreement(self) -> float | None:
        """Lab figure / cross-check figure (1.0 = identical)."""
        if not self.copy_check_gbps:
            return None
        return self.copy_gbps / self.copy_check_gbps

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["copy_agreement"] = self.copy_agreement
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        fields = {k: d.get(k) for k in cls.__dataclass_fields__}
        return cls(**fields)


def _event_loop_ms(fn, iters: int = 20, warmup: int = 3) -> float:
    """Per-call time of ``fn`` from two CUDA events around a plain loop (the cross-check)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _host_loop_ms(fn, iters: int = 5, warmup: int = 1) -> float:
    import time

    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters


def measure_gpu(device: torch.device, timer: Timer, copy_gib: float = 1.0, matmul_n: int = 8192) -> Ceilings:
    numel = int(copy_gib * 2**30) // 4
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    moved = 2 * numel * 4  # read src + write dst
    stats = timer.measure(TimingJob(steps=[lambda: dst.copy_(src)], provider="copy"))
    check_ms = _event_loop_ms(lambda: dst.copy_(src))
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    mm = timer.measure(TimingJob(steps=[lambda: a @ b], provider="matmul"))
    flops = 2 * matmul_n**3
    return Ceilings(
        device_type="cuda",
        copy_gbps=moved / (stats.median_ms * 1e-3) / 1e9,
        copy_bytes=moved,
        copy_method=f"D2D copy of {copy_gib:g} GiB (read+write counted), do_bench median",
        copy_check_gbps=moved / (check_ms * 1e-3) / 1e9,
        matmul_tflops=flops / (mm.median_ms * 1e-3) / 1e12,
        matmul_method=f"bf16 matmul {matmul_n}^3, do_bench median",
    )


def measure_cpu(timer: Timer | None = None, copy_mib: int = 128, matmul_n: int = 1024) -> Ceilings:
    timer = timer or HostTimer(samples=7, budget_s=0.5)
    numel = copy_mib * 2**20 // 4
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    moved = 2 * numel * 4
    stats = timer.measure(TimingJob(steps=[lambda: dst.copy_(src)], provider="copy"))
    check_ms = _host_loop_ms(lambda: dst.copy_(src))
    a = torch.randn(matmul_n, matmul_n)
    b = torch.randn(matmul_n, matmul_n)
    mm = timer.measure(TimingJob(steps=[lambda: a @ b], provider="matmul"))
    return Ceilings(
        device_type="cpu",
        copy_gbps=moved / (stats.median_ms * 1e-3) / 1e9,
        copy_bytes=moved,
        copy_method=f"CPU memcpy of {copy_mib} MiB (read+write counted), host clock median",
        copy_check_gbps=moved / (check_ms * 1e-3) / 1e9,
        matmul_tflops=2 * matmul_n**3 / (mm.median_ms * 1e-3) / 1e12,
        matmul_method=f"fp32 matmul {matmul_n}^3 on CPU, host clock median",
    )


def measure(device: torch.device, timer: Timer, quick: bool = False) -> Ceilings:
    """Measure the ceilings of ``device`` (a GPU: 1 GiB copy + bf16 matmul; a CPU: smaller, fp32)."""
    if device.type == "cuda":
        return measure_gpu(device, timer)
    return measure_cpu(copy_mib=32 if quick else 128)
