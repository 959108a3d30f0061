"""Host (CPU) time per call of fuselab's eager paths and of bare Triton launches, on the GPU machine.

    python3 benchmarks/sweeps/host_overhead.py

Host time = wall time of N back-to-back calls without synchronizing, divided by N, on tensors small
enough that the GPU never falls behind (so the CPU is what is measured). This is what decides whether
a mid-sized fwd+bwd is bound by launch overhead rather than by memory bandwidth.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from _timing import host_us, print_profile  # benchmarks/sweeps/_timing.py


@triton.jit
def _empty4(a, b, n, m, BLOCK: tl.constexpr):
    pass


@triton.jit
def _empty24(a0, a1, a2, a3, a4, a5, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, f0,
             C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr):
    pass


def main() -> None:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    print(f"cpu {cpu}; python {platform.python_version()}; torch {torch.__version__}; triton {triton.__version__}")
    x = torch.randn(64, 512, device="cuda")
    y = torch.empty_like(x)
    rows = []
    rows.append(("triton launch, 4 args", host_us(lambda: _empty4[(1,)](x, y, 64, 512, BLOCK=128))))
    args24 = (x, y, x, y, x, y, *range(7, 19), 1.5)
    rows.append(("triton launch, 24 args", host_us(lambda: _empty24[(1,)](*args24, C0=1, C1=2, C2=3, C3=4, C4=5))))
    k = _empty24[(1,)](*args24, C0=1, C1=2, C2=3, C3=4, C4=5)
    from triton.runtime import driver

    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    all_args = (*args24, 1, 2, 3, 4, 5)

    def direct() -> None:
        k.run(1, 1, 1, stream, k.function, k.packed_metadata, None, None, None, *all_args)

    try:
        rows.append(("CompiledKernel.run direct, 24 args", host_us(direct)))
    except Exception as exc:  # the launcher's calling convention differs between Triton versions
        print("direct launch failed:", exc)
    rows.append(("torch.add (one ATen kernel)", host_us(lambda: torch.add(x, y))))

    import fuselab

    xb = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    rb = torch.randn_like(xb)
    bb = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    rows.append(("bias_act fwd no grad", host_us(lambda: fuselab.bias_act(xb, bb, residual=rb, activation="relu"))))
    xg, rg, bg = (t.clone().requires_grad_(True) for t in (xb, rb, bb))
    g = torch.randn_like(xb)

    def fwd_bwd() -> None:
        out = fuselab.bias_act(xg, bg, residual=rg, activation="relu")
        torch.autograd.backward([out], [g])

    rows.append(("bias_act fwd+bwd (autograd)", host_us(fwd_bwd, 500)))

    def eager_fwd_bwd() -> None:
        out = torch.relu(xg + rg + bg)
        torch.autograd.backward([out], [g])

    rows.append(("eager relu(x+r+b) fwd+bwd", host_us(eager_fwd_bwd, 500)))
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kk = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(4096, 128, device="cuda")
    offs = torch.randint(0, 4000, (64,), device="cuda", dtype=torch.int32)
    rows.append(("rope decode (tensor offsets)", host_us(lambda: fuselab.apply_rope(q, kk, cos, sin,
                                                                                      seqlen_offsets=offs))))
    m = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16)
    rows.append(("mean dim=0 (one launch, split)", host_us(lambda: fuselab.mean(m, 0))))
    rows.append(("mean dim=-1 (one launch)", host_us(lambda: fuselab.mean(m, -1))))
    rows.append(("torch.mean dim=0", host_us(lambda: torch.mean(m, 0))))
    from fuselab.ops import _launch

    rows.append(("fuselab _launch.launch, 24 args", host_us(lambda: _launch.launch(
        _empty24, "probe", (1,), args24[:6], args24[6:], dict(C0=1, C1=2, C2=3, C3=4, C4=5)))))
    for name, us in rows:
        print(f"{name:40s} {us:8.1f} us/call", flush=True)
    knobs = _launch._runtime_knobs()
    print(f"launch enter hook: {getattr(knobs, 'launch_enter_hook', None)}; cached launches: {len(_launch._COMPILED)}")
    if "--profile" in sys.argv:  # where the host time goes, function by function (cProfile adds its own cost)
        for name, fn in (("bias_act fwd+bwd", fwd_bwd),
                         ("rope decode", lambda: fuselab.apply_rope(q, kk, cos, sin, seqlen_offsets=offs)),
                         ("mean dim=0", lambda: fuselab.mean(m, 0))):
            print_profile(name, fn, top=14)


if __name__ == "__main__":
    main()
