"""Host time of one MLP training step per provider, and where it goes, on the GPU machine.

    python3 benchmarks/sweeps/mlp_host.py

Question: through eager autograd the 13-512-256-64-16 bf16 MLP step (batch 65536) of fuselab's FusedLinear
runs slower than eager PyTorch, although captured in a CUDA graph it is faster; FusedLinear(backend="cuda")
has no Python in its backward. For eager, the Triton FusedLinear and the C++ node:

  * host µs per step at batch 256 (the GPU never falls behind): wall time of back-to-back steps;
  * GPU time per step at batch 65536 (CUDA graph replay) and wall time per step at 65536 without a graph;
  * the profiler's CPU table of the C++-node step (where the host time goes).
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading

import torch
from _timing import host_us  # benchmarks/sweeps/_timing.py
from triton.testing import do_bench, do_bench_cudagraph

# the lab's MLP suite: its layers and its three step functions (eager, Triton FusedLinear, C++ node)
from fuselab.bench.suites.mlp import LAYERS, mlp_cuda, mlp_eager, mlp_fuselab

PROVIDERS = {"eager": mlp_eager, "fuselab": mlp_fuselab, "cuda": mlp_cuda}


def params(dtype: torch.dtype) -> list[torch.Tensor]:
    out = []
    for i, o in itertools.pairwise(LAYERS):
        out.append((torch.randn(o, i, device="cuda") / i**0.5).to(dtype).requires_grad_(True))
        out.append((torch.randn(o, device="cuda") * 0.1).to(dtype).requires_grad_(True))
    return out


def step_fn(mlp, batch: int, dtype: torch.dtype):
    p = params(dtype)
    x = torch.randn(batch, LAYERS[0], device="cuda", dtype=dtype)
    g = torch.randn(batch, LAYERS[-1], device="cuda", dtype=dtype)

    def step():
        for t in p:
            t.grad = None
        mlp(x, *p).backward(g)

    return step, p


def replay_step(mlp, x: torch.Tensor, p: list[torch.Tensor], g: torch.Tensor) -> None:
    mlp(x, *p).backward(g)


def main() -> None:
    print(f"python {sys.version.split()[0]} torch {torch.__version__}; threads {threading.active_count()}",
          flush=True)
    dtype = torch.bfloat16
    print(f"{'provider':10} {'host us/step (B=256)':>22} {'wall us (B=65536)':>18} {'graph us (B=65536)':>19}")
    for name, mlp in PROVIDERS.items():
        small, _ = step_fn(mlp, 256, dtype)
        host = host_us(small, n=200)
        big, p = step_fn(mlp, 65536, dtype)
        wall = do_bench(big, warmup=50, rep=300) * 1e3
        # the graph replays the step into the same grad buffers: keep them allocated (no reset to None)
        x = torch.randn(65536, LAYERS[0], device="cuda", dtype=dtype)
        g = torch.randn(65536, LAYERS[-1], device="cuda", dtype=dtype)
        big_graph = functools.partial(replay_step, mlp, x, p, g)
        try:
            graph = do_bench_cudagraph(big_graph, rep=300) * 1e3
        except RuntimeError as exc:  # report, keep the other numbers
            print(f"  {name}: graph capture failed: {exc}", flush=True)
            graph = float("nan")
        print(f"{name:10} {host:22.1f} {wall:18.1f} {graph:19.1f}", flush=True)
    for label, name in (("C++-node", "cuda"), ("eager", "eager")):
        profile_steps(label, PROVIDERS[name], dtype)


def profile_steps(label: str, mlp, dtype: torch.dtype) -> None:
    """The profiler's CPU table of 50 host-bound steps (batch 256): where the host time goes."""
    small, _ = step_fn(mlp, 256, dtype)
    for _ in range(20):
        small()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            small()
        torch.cuda.synchronize()
    print(f"\n--- {label} step, 50 steps, CPU ops by self time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))

if __name__ == "__main__":
    main()
