"""Where an A/B difference of two fuselab trees comes from: for RoPE and bias_act fwd+bwd at the lab's shapes, the
eager step's device time per iteration (CUDA events), its host time (submission of the loop, before the sync), the
replay time of one step captured in a CUDA graph (device only), and the kernels of one step (profiler: name,
launches, µs). Run it once per tree (PYTHONPATH=<tree>/src python3 benchmarks/gpu_checks/ab_probe.py TAG) and
compare the lines.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch

import fuselab

ITERS = 40


def _rope_step(device: torch.device):
    q = torch.randn(8, 4096, 32, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(8, 4096, 8, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = fuselab.rope_cos_sin(4096, 128, device=device)
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def step():
        oq, ok = fuselab.apply_rope(q, k, cos, sin, layout="bshd")
        torch.autograd.backward((oq, ok), (gq, gk))
    # bytes of one step: fwd reads q, k and writes both; bwd reads both grads and writes both (tables are small)
    return step, 4 * (q.numel() + k.numel()) * 2, (q, k)


def _bias_act_step(activation: str, device: torch.device):
    x = torch.randn(16384, 4096, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4096, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)

    def step():
        y = fuselab.bias_act(x, b, activation=activation)
        torch.autograd.backward(y, g)
    # fwd reads x, writes y; bwd reads g and the saved tensor (y or x), writes dx
    return step, 5 * x.numel() * 2, (x, b)


def _measure(tag: str, name: str, step, nbytes: int, leaves) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        step()
    host_us = (time.perf_counter() - t0) / ITERS * 1e6
    end.record()
    torch.cuda.synchronize()
    eager_us = start.elapsed_time(end) / ITERS * 1e3
    for leaf in leaves:
        leaf.grad = None
    graph_us = float("nan")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(ITERS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        graph_us = start.elapsed_time(end) / ITERS * 1e3
    except Exception as error:
        print(f"{tag} {name}: graph capture failed: {type(error).__name__}: {error}"[:300])
    kernels: dict[str, list[float]] = defaultdict(list)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name[:60]].append(event.device_time)
    print(f"{tag} {name}: eager {eager_us:.1f} us ({nbytes / eager_us / 1e3:.0f} GB/s), host {host_us:.1f} us, "
          f"graph {graph_us:.1f} us ({nbytes / graph_us / 1e3:.0f} GB/s)")
    for kname, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
        print(f"{tag} {name}:   {len(times) / 3:.0f}x {sum(times) / 3:8.1f} us  {kname}")


def main() -> None:
    tag = sys.argv[1] if len(sys.argv) > 1 else "tree"
    device = torch.device("cuda")
    _measure(tag, "rope bshd fwd+bwd", *_rope_step(device))
    for activation in ("relu", "gelu_tanh"):
        _measure(tag, f"bias_act {activation} fwd+bwd", *_bias_act_step(activation, device))


if __name__ == "__main__":
    main()
