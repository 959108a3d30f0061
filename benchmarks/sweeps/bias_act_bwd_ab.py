"""bias_act backward launch plan (tile bytes, programs per SM, column block), alternating variants in rounds.

    python3 benchmarks/sweeps/bias_act_bwd_ab.py [--rounds 3]

Question (session 18): in a CUDA graph the H200 runs the bf16 forward+backward at 65536x512 at 0.81-0.82 of copy
bandwidth (the H100: 0.86-0.87), and RoPE and the one-row reductions both wanted smaller steps per program on that
GPU. Does the backward kernel's plan (``BWD_TILE_BYTES``, ``BWD_PROGRAMS_PER_SM``, ``BWD_COL_BYTES``), chosen on the
H100, hold there? The launcher ``bias_act_bwd_`` is timed alone (relu: read grad and the saved output, write
grad_x and grad_residual, bias gradient fused), CUDA events after a dirty flush (the lab's method) and per call of
10 calls in a CUDA graph; each variant once per round, variants alternating.
"""

from __future__ import annotations

import argparse

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch

from fuselab.ops import _bias_act_triton as ba

SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
KNOBS = ("BWD_TILE_BYTES", "BWD_PROGRAMS_PER_SM", "BWD_COL_BYTES")
VARIANTS = {  # name: knobs over the shipped ones
    "shipped": {},
    "4 KiB tiles": dict(BWD_TILE_BYTES=4096),
    "16 KiB tiles": dict(BWD_TILE_BYTES=16384),
    "2 programs per SM": dict(BWD_PROGRAMS_PER_SM=2),
    "8 programs per SM": dict(BWD_PROGRAMS_PER_SM=8),
    "128 B columns": dict(BWD_COL_BYTES=128),
    "512 B columns": dict(BWD_COL_BYTES=512),  # shipped until session 18 (the probes' "shipped")
    "1 KiB columns": dict(BWD_COL_BYTES=1024),
}


def prepared(grad, saved, knobs: dict, defaults: dict):
    """A call of the backward launcher planned under ``knobs`` (its outputs allocated once), and its plan."""
    for name, value in {**defaults, **knobs}.items():
        setattr(ba, name, value)
    ba._bwd_plan.cache_clear()
    M, N = grad.shape
    plan = ba._bwd_plan(M, N, grad.element_size(), ba.sm_count(grad.device))
    grad_x, grad_r = torch.empty_like(grad), torch.empty_like(grad)
    partial = torch.empty(plan[0][0], N, dtype=torch.float32, device=grad.device)
    grad_b = torch.empty(N, dtype=grad.dtype, device=grad.device)
    record = ba.bias_act_bwd_(grad, saved, None, 1.0, "relu", grad_x, grad_r, partial, grad_b)
    for name, value in defaults.items():
        setattr(ba, name, value)
    ba._bwd_plan.cache_clear()

    def call():
        ba.bias_act_bwd_again(record, grad, saved, None, 1.0, grad_x, grad_r, grad_b)
        return grad_b

    return call, plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bw = timing.copy_gbps()
    timing.ab_header(bw, args.rounds)
    defaults = {name: getattr(ba, name) for name in KNOBS}
    for dtype in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            grad = torch.randn(m, n, device="cuda", dtype=dtype)
            saved = torch.relu(torch.randn(m, n, device="cuda", dtype=dtype))
            nbytes = 4 * m * n * dtype.itemsize  # read grad, saved; write grad_x, grad_residual
            expected = (grad.double() * (saved > 0)).sum(0)
            calls, plans = {}, {}
            for name, knobs in VARIANTS.items():
                fn, plans[name] = prepared(grad, saved, knobs, defaults)
                got = fn().double()
                assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2 * m**0.5), name
                calls[name] = (fn, lambda ms, nbytes=nbytes: nbytes / ms / 1e6 / bw)
            times = timing.alternate(calls, args.rounds)
            print(f"\n{m}x{n} {str(dtype)[6:]} relu backward ({nbytes / 1e6:.0f} MB)")
            for name, (grid, block_m, block_n, warps, _) in plans.items():
                print(f"  {timing.spread(*times[name])}  {name:18s} grid {grid} block {block_m}x{block_n} "
                      f"warps {warps}", flush=True)
            del grad, saved, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
