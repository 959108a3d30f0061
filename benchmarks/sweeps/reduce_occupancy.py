"""Registers, resident programs and time of fuselab's reductions per ptxas, programs per SM and register cap (GPU).

    python3 benchmarks/sweeps/reduce_occupancy.py
    TRITON_PTXAS_PATH=<torch>/bin/ptxas TRITON_CACHE_DIR=/tmp/tc python3 benchmarks/sweeps/reduce_occupancy.py

torch.compile points ``TRITON_PTXAS_PATH`` at PyTorch's ptxas (CUDA 13.0 in torch 2.11+cu130); Triton 3.6 ships
12.8. Compiled by 13.0, ``mean`` over all of 10000x10000 fp32 took 162 µs instead of 148 µs, every other case the
same (probes/ptxas_ab.txt). The suspect: the split plan launches ~8 programs of 8 warps per SM in one wave, which
needs ≤ 32 registers per thread; a kernel that needs more fits fewer per SM and runs a second, short wave. This
prints each compiled kernel's registers and spills and times the cases for programs-per-SM 4 and 8 (both kernels),
with and without ``maxnreg=32``. (Measured before the planner took its answer: rows kernel 8 per SM with a
32-register cap, cols kernel 4 per SM, uncapped.)
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton.testing import do_bench

import fuselab
from fuselab.ops import _launch, _reduce_plan, _reduce_triton
from fuselab.ops import reduce as reduce_ops

CASES = (((10000, 10000), torch.float32, None), ((2**28,), torch.float32, None), ((8192, 8192), torch.bfloat16, None),
         ((10000, 10000), torch.float32, -1), ((8192, 8192), torch.bfloat16, -1), ((65536, 512), torch.bfloat16, -1),
         ((10000, 10000), torch.float32, 0), ((8192, 8192), torch.bfloat16, 0), ((65536, 512), torch.bfloat16, 0))
_LAUNCH = _reduce_triton.launch_kernel


def with_maxnreg(maxnreg: int | None):
    """``_reduce_triton``'s launch with the register cap ``maxnreg`` (None: none) in the compile options of both
    kernels (and in the cache key)."""

    def launch(kernel, key, grid, tensors, scalars, constexprs, **kw):
        def options():
            opts = {k: v for k, v in constexprs().items() if k != "maxnreg"}
            return opts if maxnreg is None else {**opts, "maxnreg": maxnreg}

        return _LAUNCH(kernel, (key, maxnreg), grid, tensors, scalars, options, **kw)

    return launch


def mean(x, dim):
    return fuselab.mean(x) if dim is None else fuselab.mean(x, dim)


def main() -> None:
    ptxas = os.environ.get("TRITON_PTXAS_PATH", "triton's bundled ptxas")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  ptxas: {ptxas}")
    inputs = [(torch.randn(shape, device="cuda").add_(1.0).to(dtype), dim) for shape, dtype, dim in CASES]
    for per_sm in (8, 4):
        for maxnreg in (None, 32):
            _reduce_plan.PROGRAMS_PER_SM = _reduce_plan.COLS_PROGRAMS_PER_SM = per_sm
            _reduce_triton.launch_kernel = with_maxnreg(maxnreg)
            _launch._COMPILED.clear()
            reduce_ops._PLANNED.clear()  # plans are cached per shape: replan with this PROGRAMS_PER_SM
            for (shape, dtype, dim), (x, _) in zip(CASES, inputs):
                t = do_bench(functools.partial(mean, x, dim), return_mode="median") * 1e3
                compiled = [entry[0] for entry in _launch._COMPILED.values()][-1]
                plan = _reduce_plan.plan_reduction(*_plan_args(x, dim))
                gbps = x.numel() * x.element_size() / t / 1e6
                print(f"per_sm={per_sm} maxnreg={maxnreg or '-':<3} mean {'all' if dim is None else dim:>3} "
                      f"{shape!s:14s} {str(dtype)[6:]:8s} {t:7.1f} us  {gbps:6.0f} "
                      f"GB/s  grid={plan.grid} warps={plan.num_warps} regs={compiled.n_regs} "
                      f"spills={compiled.n_spills}", flush=True)
    _reduce_triton.launch_kernel = _LAUNCH


def _plan_args(x, dim):
    dims = tuple(range(x.dim())) if dim is None else (dim % x.dim(),)
    x2, kept, red = _reduce_plan.prepare(x, dims)
    return x2, kept, red


if __name__ == "__main__":
    main()
