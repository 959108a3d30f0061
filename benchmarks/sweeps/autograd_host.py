"""Where the host time of a forward+backward through a Python ``autograd.Function`` goes, on the GPU machine.

    python3 benchmarks/sweeps/autograd_host.py

Question: on the H100 machine ``fuselab.bias_act`` forward+backward cost ~490 µs of host time per call against
~200 µs for eager ``relu(x + r + b)``, although its Python work measured on a CPU-only machine (launches
stubbed) is level with eager. Tiny tensors (the GPU never falls behind), wall time of back-to-back calls:

  * eager ops, and a do-nothing ``autograd.Function`` (one ATen op each way): the engine's own cost and
    that of calling a Python backward on the autograd device thread;
  * fuselab's forward alone (with grad) and its backward called directly on the main thread;
  * the whole forward+backward, with the time spent inside the Python backward measured on the engine thread.
"""

from __future__ import annotations

import sys
import threading
import time

import torch
from _timing import host_us, print_profile  # benchmarks/sweeps/_timing.py


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.clone()


def main() -> None:
    import fuselab
    from fuselab.ops import bias_act as ba

    print(f"python {sys.version.split()[0]} torch {torch.__version__}; threads {threading.active_count()}; "
          f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms", flush=True)
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    xg, rg, bg = (t.clone().requires_grad_(True) for t in (x, torch.randn_like(x), torch.randn(512, device="cuda",
                                                                                                dtype=x.dtype)))
    g = torch.randn_like(x)
    leaves = (xg, rg, bg)

    def reset() -> None:
        for t in leaves:
            t.grad = None

    def eager() -> None:
        reset()
        torch.autograd.backward([torch.relu(xg + rg + bg)], [g])

    def identity() -> None:
        reset()
        torch.autograd.backward([_Identity.apply(xg)], [g])

    def clone_only() -> None:
        reset()
        torch.autograd.backward([xg.clone()], [g])

    def fused_fwd() -> None:
        fuselab.bias_act(xg, bg, residual=rg, activation="relu")

    def fused() -> None:
        reset()
        torch.autograd.backward([fuselab.bias_act(xg, bg, residual=rg, activation="relu")], [g])

    y = torch.relu(x)

    def direct_backward() -> None:
        ba._backward(g, y, None, 1.0, "relu", x.dtype, x.dtype, x.dtype, True, True, True)

    inside = [0.0, 0]
    original = ba._BiasActFunction.backward

    def timed_backward(ctx, grad_y):
        t0 = time.perf_counter()
        out = original(ctx, grad_y)
        inside[0] += time.perf_counter() - t0
        inside[1] += 1
        return out

    rows = [("eager relu(x+r+b) fwd+bwd", host_us(eager, n=200)),
            ("autograd: clone fwd+bwd (ATen only)", host_us(clone_only, n=200)),
            ("autograd.Function identity fwd+bwd", host_us(identity, n=200)),
            ("fuselab bias_act fwd (grad on)", host_us(fused_fwd, n=200)),
            ("fuselab _backward direct (main thread)", host_us(direct_backward, n=200)),
            ("fuselab bias_act fwd+bwd", host_us(fused, n=200))]
    ba._BiasActFunction.backward = staticmethod(timed_backward)
    inside[:] = [0.0, 0]
    rows.append(("fuselab fwd+bwd (backward timed)", host_us(fused, n=200)))
    rows.append(("  of which inside Python backward", inside[0] / max(inside[1], 1) * 1e6))
    ba._BiasActFunction.backward = staticmethod(original)
    q = torch.randn(2, 16, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 16, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = fuselab.rope_cos_sin(64, 64, device="cuda")
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def rope() -> None:
        q.grad = k.grad = None
        torch.autograd.backward(list(fuselab.apply_rope(q, k, cos, sin)), [gq, gk])

    rows.append(("fuselab apply_rope fwd+bwd", host_us(rope, n=200)))
    for name, us in rows:
        print(f"{name:42s} {us:8.1f} us/call", flush=True)
    if "--profile" in sys.argv:  # function by function, main thread only (cProfile adds its own cost)
        for name, fn in (("bias_act fwd (grad on)", fused_fwd), ("_backward direct", direct_backward)):
            print_profile(name, fn, top=16)


if __name__ == "__main__":
    main()
