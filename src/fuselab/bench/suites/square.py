"""Benchmark suite: elementwise square, the lab's smallest example.

``torch.square`` vs ``x * x`` vs ``x ** 2`` (three spellings of one eager kernel) and a CUDA C++
kernel with 16-byte vectorized loads (``fuselab.cuda.square``). Forward only.

Cost model per case: read N elements, write N elements (``2·N·itemsize`` bytes); N flops.
Speedups are measured against ``torch.square``.
"""

from __future__ import annotations

import torch

from fuselab.bench import providers
from fuselab.bench.spec import DTYPES, BenchCase, CaseQuery, OpSpec, Provider
from fuselab.bench.suites._sizes import L2_COLD_BELOW, size_label, sizes

DEFAULT_DTYPES = (torch.float32, torch.bfloat16)
QUICK_DTYPES = (torch.float32,)
MODES = ("fwd",)


def cases(query: CaseQuery) -> list[BenchCase]:
    dtypes = query.dtypes or (QUICK_DTYPES if query.quick else DEFAULT_DTYPES)
    out = []
    for dtype in dtypes:
        if dtype not in DTYPES.values():
            continue
        for mode in MODES:
            if not query.wants(dtype, mode):
                continue
            for n in sizes(query.device_type, query.quick):
                size = dtype.itemsize
                nbytes = 2 * n * size  # read x, write y
                out.append(BenchCase(op="square", label=size_label(n), dtype=dtype, mode=mode, bytes=nbytes,
                                     flops=n, numel=n, params={"n": n}, l2_cold=nbytes < L2_COLD_BELOW,
                                     read_bytes=n * size))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple[torch.Tensor]:
    """One fresh random vector (normal, so non-zero) of ``case.params['n']`` elements."""
    return (torch.randn(case.params["n"], dtype=case.dtype, device=device),)


def _mul(x: torch.Tensor) -> torch.Tensor:
    return x * x


def _pow(x: torch.Tensor) -> torch.Tensor:
    return x**2


def _build_cuda(case: BenchCase):
    from fuselab.cuda import square  # imported on use: compiles with nvcc on first call

    return square


SPEC = OpSpec(
    name="square",
    summary="elementwise x*x: torch.square vs x*x vs x**2 vs a CUDA C++ kernel",
    cases=cases,
    make_inputs=make_inputs,
    reference=torch.square,
    providers=(
        providers.eager(torch.square, name="torch.square", description="torch.square"),
        providers.eager(_mul, name="mul", description="x * x"),
        providers.eager(_pow, name="pow", description="x ** 2"),
        Provider(name="cuda", build=_build_cuda, modes=("fwd",), cuda_only=True,
                 description="CUDA C++ (load_inline), 16-byte vectorized loads"),
    ),
    baseline="torch.square",
)
