"""What the forward's masks cost: bias_act forward with unmasked tiles (M, N multiples of the tile) vs masked ones,
beside torch.compile and the CUDA C++ backend, interleaved in one process, on the GPU machine.

    python3 benchmarks/sweeps/bias_act_even.py

Question: the Triton forward ran 1-3% behind torch.compile in fp32 (Inductor's kernel: 1-D, no masks when the size
divides its block), while the CUDA C++ forward (no masks, 16-byte vectors, 4 rows per thread) ran 1-2% ahead of it.
Timing as the lab's (do_bench median, its L2 flush); three interleaved rounds, the best median of each.
"""

from __future__ import annotations

import functools

import torch
from triton.testing import do_bench

import fuselab
from fuselab.cuda.bias_act import bias_act as cuda_bias_act
from fuselab.ops import _bias_act_triton as kernels

SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
ROUNDS = 3


def copy_gbps() -> float:
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / do_bench(lambda: b.copy_(a)) / 1e6


def eager(x, b, r, activation):
    z = x + r + b
    return torch.nn.functional.gelu(z, approximate="tanh") if activation == "gelu_tanh" else torch.relu(z)


def main() -> None:
    copy = copy_gbps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy {copy:.0f} GB/s", flush=True)
    compiled = torch.compile(eager, dynamic=False)

    def triton(even: bool):
        def run(x, b, r, activation):
            kernels.EVEN_TILES = even
            return fuselab.bias_act(x, b, residual=r, activation=activation)
        return run

    def cuda(x, b, r, activation):
        return cuda_bias_act(x, b, residual=r, activation=activation)

    providers = {"unmasked": triton(True), "masked": triton(False), "torch.compile": compiled, "cuda": cuda}
    for dtype in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            for activation in ("relu", "gelu_tanh"):
                x, r = (torch.randn(m, n, dtype=dtype, device="cuda") for _ in range(2))
                b = torch.randn(n, dtype=dtype, device="cuda")
                nbytes = 3 * m * n * dtype.itemsize + n * dtype.itemsize
                expected = eager(x.float(), b.float(), r.float(), activation)
                best = dict.fromkeys(providers, float("inf"))
                for _ in range(ROUNDS):
                    for name, fn in providers.items():
                        err = (fn(x, b, r, activation).float() - expected).abs().max().item()
                        assert err < 0.1, (name, err)
                        best[name] = min(best[name], do_bench(functools.partial(fn, x, b, r, activation)))
                row = "  ".join(f"{name} {nbytes / t / 1e6 / copy:.3f}" for name, t in best.items())
                print(f"{m}x{n} {activation:9s} {str(dtype)[6:]:8s} {row}", flush=True)
                del x, r, b, expected
    kernels.EVEN_TILES = True


if __name__ == "__main__":
    main()
