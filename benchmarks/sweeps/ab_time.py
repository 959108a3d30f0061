"""Time fuselab's reductions and bias_act forward+backward as the lab does (do_bench, dirty flush), one line each.

    PYTHONPATH=OTHER/src python3 benchmarks/sweeps/ab_time.py   # the fuselab found first on the path

Run it alternately against two source trees (A/B) in one session: the host of the GPU machine drifts by tens of
percent between minutes, so only interleaved repeats separate a code change from the noise.
"""

# every closure is timed within the loop iteration that defines it
# ruff: noqa: B023
from __future__ import annotations

import torch
from triton.testing import do_bench

import fuselab


def ms(fn, grad_to_none=None) -> float:
    return do_bench(fn, grad_to_none=grad_to_none, return_mode="median")


def main() -> None:
    where = fuselab.__file__.split("/src/")[0]
    for shape, dtype, dim in (((10000, 10000), torch.float32, None), ((2**28,), torch.float32, None),
                              ((8192, 8192), torch.bfloat16, None), ((10000, 10000), torch.float32, 0),
                              ((8192, 8192), torch.bfloat16, 0), ((65536, 512), torch.bfloat16, 0)):
        x = torch.randn(shape, dtype=dtype, device="cuda") + 1
        t = ms(lambda: fuselab.mean(x) if dim is None else fuselab.mean(x, dim))
        print(f"{where:24s} mean {'all' if dim is None else dim} {shape} {str(dtype)[6:]}: {t * 1e3:8.1f} us "
              f"{x.numel() * x.element_size() / t / 1e9:.3f} TB/s", flush=True)
        del x
    for (m, n), dtype in (((65536, 512), torch.float32), ((16384, 4096), torch.bfloat16),
                          ((262144, 1024), torch.bfloat16), ((65536, 512), torch.bfloat16)):
        x, r = (torch.randn(m, n, dtype=dtype, device="cuda", requires_grad=True) for _ in range(2))
        b = torch.randn(n, dtype=dtype, device="cuda", requires_grad=True)
        g = torch.randn(m, n, dtype=dtype, device="cuda")

        def step():
            torch.autograd.backward([fuselab.bias_act(x, b, residual=r, activation="gelu_tanh")], [g])

        t = ms(step, grad_to_none=[x, r, b])
        print(f"{where:24s} bias_act fwd+bwd {m}x{n} {str(dtype)[6:]}: {t * 1e3:8.1f} us "
              f"{8 * m * n * x.element_size() / t / 1e9:.3f} TB/s", flush=True)


if __name__ == "__main__":
    main()
