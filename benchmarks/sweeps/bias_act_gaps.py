"""When does the GPU wait for the host in an eager-autograd ``bias_act`` forward+backward? On the GPU machine.

    python3 benchmarks/sweeps/bias_act_gaps.py

Question: at 16384x4096 bf16 the lab's eager-autograd forward+backward of the CUDA C++ backend runs at its
CUDA-graph time (343 vs 340 µs), the Triton path ~150 µs above it (490 vs 334 µs), although both are a Python
``autograd.Function`` around two launches. Which window is the host's: before the forward launch (do_bench's
L2 flush, a 256 MB memset, hides the first ~85 µs), or between the forward and the backward launch (the
forward kernel hides that one)?

Each timed step repeats do_bench's loop by hand: flush, start event, reset grads, forward, ``backward``, end
event. The launchers are wrapped to stamp the host clock when they are called (Triton: ``launch`` and, for a
prepared launch, ``relaunch``). Per provider and case: median
host µs from the step's start to the forward launch, to the backward launch, to the end of ``backward``, and the
GPU µs between the events.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from fuselab.bench.suites.bias_act import ALPHA

CASES = (((16384, 4096), "relu"), ((65536, 512), "gelu_tanh"), ((256, 512), "relu"))
STEPS = 60
STAMPS: list[int] = []


def _stamp(fn):
    def wrapped(*args, **kwargs):
        STAMPS.append(time.perf_counter_ns())
        return fn(*args, **kwargs)

    return wrapped


def _wrap_launchers() -> None:
    """Stamp the host clock at each launch: the Triton launcher and the CUDA extension's two entry points."""
    from fuselab.cuda import _bias_act as cuda_mod
    from fuselab.ops import _bias_act_triton as bt

    bt.launch = _stamp(bt.launch)
    bt.relaunch = _stamp(bt.relaunch)  # prepared launches (bias_act_fwd_again, bias_act_bwd_again)
    ext = cuda_mod._extension()

    class Stamped:
        bias_act_forward = staticmethod(_stamp(ext.bias_act_forward))
        bias_act_backward = staticmethod(_stamp(ext.bias_act_backward))

    cuda_mod._extension = lambda: Stamped


def providers():
    import fuselab
    import fuselab.cuda._bias_act as cuda_mod

    return {
        "fuselab": lambda x, r, b, act: fuselab.bias_act(x, b, residual=r, alpha=ALPHA, activation=act),
        "cuda": lambda x, r, b, act: cuda_mod.bias_act(x, b, residual=r, alpha=ALPHA, activation=act),
    }


def run_case(name: str, fn, shape, act: str, flush: torch.Tensor) -> str:
    m, n = shape
    x, r = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        x.grad = r.grad = b.grad = None
        fn(x, r, b, act).backward(g)

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    rows = []
    for _ in range(STEPS):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        STAMPS.clear()
        t0 = time.perf_counter_ns()
        step()
        t1 = time.perf_counter_ns()
        end.record()
        stamps = list(STAMPS)
        torch.cuda.synchronize()
        if len(stamps) != 2:
            return f"{name:8} {m}x{n}-{act}: {len(stamps)} launches stamped, expected 2"
        rows.append(((stamps[0] - t0) / 1e3, (stamps[1] - t0) / 1e3, (t1 - t0) / 1e3, start.elapsed_time(end) * 1e3))
    med = [statistics.median(c) for c in zip(*rows)]
    return (f"{name:8} {m:>6}x{n:<5} {act:9} fwd launch {med[0]:7.1f}  bwd launch {med[1]:7.1f}  "
            f"backward returns {med[2]:7.1f}  GPU {med[3]:7.1f} us")


def main() -> None:
    print(f"python {sys.version.split()[0]} torch {torch.__version__}; {torch.cuda.get_device_name()}", flush=True)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    memset = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        flush.zero_()
        e.record()
        torch.cuda.synchronize()
        memset.append(s.elapsed_time(e) * 1e3)
    print(f"the 256 MB flush alone: {statistics.median(memset):.1f} us of GPU time", flush=True)
    _wrap_launchers()
    table = providers()
    for _round in range(2):  # twice: the host drifts
        for shape, act in CASES:
            for name, fn in table.items():
                print(run_case(name, fn, shape, act, flush), flush=True)


if __name__ == "__main__":
    main()
