"""``mean(dim=0)`` of fp32 inputs: the cols plan read through TMA (with the knobs of either device kind, ``COLS_TMA``
and ``FAST_MEMORY_COLS_TMA``) vs the same input planned without it (the cols kernel's synchronous pointer loads),
in alternating rounds.

    python3 benchmarks/sweeps/reduce_tma_ab.py

Prediction (session 21, from ``reduce_tma_proto.py`` on the H100: 0.887 -> 0.929 at 10000² fp32): TMA plans gain
3-5% under the lab's dirty flush and ~6% in a CUDA graph at every fp32 ``dim=0`` of ≥ 64 MB, on both GPUs. Each
plan is checked against ``torch.mean`` before it is timed.
"""

from __future__ import annotations

import torch
from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py
from reduce_sweep import plan_call

from fuselab.ops import _reduce_plan as P

SHAPES = ((10000, 10000), (16384, 4096), (4096, 16384), (65536, 1024), (8192, 8192), (2048, 10000))
ROUNDS = 3


def plans(x: torch.Tensor) -> dict[str, P.ReducePlan]:
    """The cols plans of ``x.mean(0)`` through TMA with each device's knobs, and through pointers."""
    _, kept, red = P.prepare(x, (0,))
    args = (tuple(kept), tuple(red), x.element_size(), True, P.sm_count(x.device), P.PROGRAMS_PER_SM,
            P.COLS_PROGRAMS_PER_SM, P.row_tile_bytes(x))
    out = {}
    for label, tma in (("TMA, COLS_TMA", P.COLS_TMA[4]), ("TMA, FAST_MEMORY_COLS_TMA", P.FAST_MEMORY_COLS_TMA[4]),
                       ("pointers", None)):
        plan = P._plan(*args, tma)
        out[f"{label}: [{plan.block_r}x{plan.block_i}] x{plan.stages} stages, split {plan.split} "
            f"{plan.num_warps} warps"] = plan
    return out


def main() -> None:
    bw = copy_gbps()
    ab_header(bw, ROUNDS)
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda")
        want = x.double().mean(0).float()
        nbytes = x.numel() * 4
        calls = {}
        for name, plan in plans(x).items():
            out, fn = plan_call(x, (0,), plan)
            fn()
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
            calls[name] = (fn, lambda ms, n=nbytes: n / ms / 1e6 / bw)
        print(f"\ndim=0 of {shape[0]}x{shape[1]} fp32 ({nbytes / 1e6:.0f} MB)", flush=True)
        for name, (dirty, graph) in alternate(calls, ROUNDS).items():
            print(f"  {spread(dirty, graph)}  {name}", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
