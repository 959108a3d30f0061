"""Benchmark suite: ``mean`` over all elements, the last axis (``dim=-1``) and the first (``dim=0``).

Providers: ``torch`` (``torch.mean``, the baseline), ``torch.compile`` of it, ``fuselab``
(:func:`fuselab.mean`) and ``naive``, the reference material's teaching kernel
(:mod:`fuselab.bench.baselines.naive_mean`, all-element cases only).

Cost model per case (fwd): read the input once, write the output once:
``M·N·itemsize + out_numel·itemsize`` bytes; ``M·N`` flops (one add per element). The backward
(``bwd``/``fwd+bwd``, on request) reads the output gradient and writes the input gradient.
Inputs are ``(x, dim)``: ``dim`` is a plain value (``None``, ``-1`` or ``0``) read from ``params``.
"""

from __future__ import annotations

import math

import torch

import fuselab
from fuselab.bench import providers
from fuselab.bench.spec import DTYPES, BenchCase, CaseQuery, OpSpec, Provider
from fuselab.bench.suites._sizes import L2_COLD_BELOW
from fuselab.reference import reduce as ref

FP32, BF16 = torch.float32, torch.bfloat16
DEFAULT_MODES = ("fwd",)

#: (shape, dtype, dim) on GPUs: the issue's cases (sizes that fill the chip)
GPU_CASES: tuple[tuple[tuple[int, ...], torch.dtype, int | None], ...] = (
    ((10000, 10000), FP32, None), ((2**28,), FP32, None), ((8192, 8192), BF16, None),
    ((10000, 10000), FP32, -1), ((8192, 8192), BF16, -1), ((65536, 512), BF16, -1),
    ((10000, 10000), FP32, 0), ((8192, 8192), BF16, 0), ((65536, 512), BF16, 0),
)
GPU_QUICK = (((8192, 8192), BF16, None), ((8192, 8192), BF16, -1), ((65536, 512), BF16, 0))
#: small shapes for CPUs (the Triton providers run there once, under the interpreter)
CPU_CASES = tuple((shape, dtype, dim) for shape in ((31, 129), (523, 11)) for dtype in (FP32, BF16)
                  for dim in (None, -1, 0))
CPU_QUICK = (((31, 129), FP32, None), ((31, 129), FP32, -1), ((31, 129), FP32, 0))


def _label(shape: tuple[int, ...], dim: int | None) -> str:
    dims = "all" if dim is None else f"dim={dim}"
    if len(shape) == 1 and shape[0] & (shape[0] - 1) == 0:
        return f"{dims}/n=2^{shape[0].bit_length() - 1}"
    return f"{dims}/{'x'.join(map(str, shape))}"


def _case(shape: tuple[int, ...], dtype: torch.dtype, dim: int | None, mode: str) -> BenchCase:
    numel = math.prod(shape)
    out_numel = 1 if dim is None else numel // shape[dim]
    size = dtype.itemsize
    fwd_bytes = (numel + out_numel) * size  # read x, write the mean
    bwd_bytes = (out_numel + numel) * size  # read grad_out, write grad_x
    nbytes = {"fwd": fwd_bytes, "bwd": bwd_bytes, "fwd+bwd": fwd_bytes + bwd_bytes}[mode]
    read = {"fwd": numel, "bwd": out_numel, "fwd+bwd": numel + out_numel}[mode] * size
    return BenchCase(op="reduce", label=_label(shape, dim), dtype=dtype, mode=mode, bytes=nbytes, flops=numel,
                     numel=numel, params={"shape": shape, "dim": dim}, l2_cold=fwd_bytes < L2_COLD_BELOW,
                     read_bytes=read)


def cases(query: CaseQuery) -> list[BenchCase]:
    if query.device_type == "cuda":
        table = GPU_QUICK if query.quick else GPU_CASES
    else:
        table = CPU_QUICK if query.quick else CPU_CASES
    modes = query.modes or DEFAULT_MODES
    out = []
    for shape, dtype, dim in table:
        if dtype not in DTYPES.values():
            continue
        for mode in modes:
            if query.wants(dtype, mode):
                out.append(_case(shape, dtype, dim, mode))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple[torch.Tensor, int | None]:
    """A fresh random tensor of ``params['shape']`` drawn from N(1, 1), and ``params['dim']``.

    Signed values with a mean away from zero: the check compares ``‖out − ref‖ / ‖ref‖``, and the mean of
    zero-mean data is ≈ 0 (|mean| ~ 6e-5 at 2^28 elements, ‖x‖₁/|Σx| ~ 10⁴), so that ratio would measure
    the draw's cancellation rather than the kernel's rounding (a correct fp32 result can then read as 1.5e-5 off)."""
    x = torch.randn(case.params["shape"], dtype=torch.float32, device=device).add_(1.0)
    return x.to(case.dtype), case.params["dim"]


def reference(x: torch.Tensor, dim: int | None) -> torch.Tensor:
    return ref.mean(x, dim)


def torch_mean(x: torch.Tensor, dim: int | None) -> torch.Tensor:
    return torch.mean(x) if dim is None else torch.mean(x, dim)


def fuselab_mean(x: torch.Tensor, dim: int | None) -> torch.Tensor:
    return fuselab.mean(x, dim)


def _build_naive(case: BenchCase):
    from fuselab.bench.baselines.naive_mean import naive_mean  # imports triton: only when used

    return lambda x, dim: naive_mean(x)


def _naive_supports(case: BenchCase) -> str | None:
    return None if case.params["dim"] is None else "the teaching kernel reduces all elements only"


SPEC = OpSpec(
    name="reduce",
    summary="mean over all elements / dim=-1 / dim=0: torch vs torch.compile vs fuselab vs a naive Triton kernel",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        providers.eager(torch_mean, name="torch", description="torch.mean"),
        providers.compiled(torch_mean),
        providers.fuselab(fuselab_mean, description="fuselab.mean: deterministic two-stage Triton reduction"),
        Provider(name="naive", build=_build_naive, modes=("fwd",), triton=True, supports=_naive_supports,
                 description="teaching kernel: serial loop per program, host-launched sum of partials"),
    ),
    grad_args=lambda case: (0,),
    baseline="torch",
)
