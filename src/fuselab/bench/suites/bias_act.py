"""Benchmark suite: the fused epilogue ``act(x + alpha·residual + bias)`` (fuselab.bias_act).

Providers: the formula in eager PyTorch (``x + alpha * residual + bias`` then ``torch.relu`` /
``F.gelu(approximate="tanh")``: 4 kernels), torch.compile and TorchScript of it, Thunder (``thunder.jit``, when
installed), fuselab (Triton) and the CUDA C++ backend (``fuselab.cuda.bias_act``).

Cost model per case, ``M×N`` elements of itemsize ``s`` (each input read once, each output written once):

* ``fwd``: read x, residual (``2·M·N·s``) and bias (``N·s``), write y (``M·N·s``): ``(3·M·N + N)·s``;
* ``bwd``: read grad_y and the saved tensor (``2·M·N·s``), write grad_x and grad_residual (``2·M·N·s``) and
  grad_bias (``N·s``): ``(4·M·N + N)·s``;
* ``fwd+bwd``: both, plus ``M·N·s`` for activations whose backward needs the pre-activation
  ``z = x + alpha·r + b`` (gelu_tanh): with a residual, z must be written in the forward (or x and the residual
  re-read in the backward): no algorithm moves less. relu saves its output y, already counted.

Flops: 3 per element for ``x + alpha·r + b`` plus the activation (relu 1, gelu_tanh 9); backward 3 plus the
derivative (relu 1, gelu_tanh 14).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fuselab.bench import providers
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider
from fuselab.bench.suites._sizes import L2_COLD_BELOW
from fuselab.reference import bias_act as ref

GPU_SHAPES: tuple[tuple[int, int], ...] = ((65536, 512), (16384, 4096), (262144, 1024))
GPU_QUICK: tuple[tuple[int, int], ...] = ((16384, 4096),)
CPU_SHAPES: tuple[tuple[int, int], ...] = ((64, 256), (33, 1000))
CPU_QUICK: tuple[tuple[int, int], ...] = ((64, 256),)
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu_tanh")
DEFAULT_DTYPES = (torch.float32, torch.bfloat16)
QUICK_DTYPES = (torch.bfloat16,)
DEFAULT_MODES = ("fwd", "fwd+bwd")
ALPHA = 0.5  # a LoRA-like scale: the eager formula needs its multiply
_FLOPS_FWD = {"relu": 4, "gelu_tanh": 12}
_FLOPS_BWD = {"relu": 4, "gelu_tanh": 17}


def read_bytes(m: int, n: int, itemsize: int, mode: str) -> int:
    """The part of :func:`case_bytes` that is read: x, residual, bias forward; grad_y and the saved tensor backward."""
    fwd, bwd = 2 * m * n + n, 2 * m * n
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode] * itemsize


def case_bytes(m: int, n: int, itemsize: int, activation: str, mode: str) -> int:
    """Forward: read x, residual, bias, write y; backward: read grad_y, the saved tensor, write grad_x, grad_residual,
    grad_bias; forward+backward also writes the pre-activation where the activation's backward needs it."""
    fwd = (3 * m * n + n) * itemsize
    bwd = (4 * m * n + n) * itemsize
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return bwd
    saves_pre = ref.SAVED[activation] == "pre"
    return fwd + bwd + (m * n * itemsize if saves_pre else 0)


def cases(query: CaseQuery) -> list[BenchCase]:
    if query.device_type == "cuda":
        shapes = GPU_QUICK if query.quick else GPU_SHAPES
    else:
        shapes = CPU_QUICK if query.quick else CPU_SHAPES
    out = []
    for dtype, mode in query.combinations(QUICK_DTYPES if query.quick else DEFAULT_DTYPES, DEFAULT_MODES):
        for m, n in shapes:
            for act in ACTIVATIONS:
                nbytes = case_bytes(m, n, dtype.itemsize, act, mode)
                flops = m * n * {"fwd": _FLOPS_FWD[act], "bwd": _FLOPS_BWD[act],
                                 "fwd+bwd": _FLOPS_FWD[act] + _FLOPS_BWD[act]}[mode]
                out.append(BenchCase(op="bias_act", label=f"{m}x{n}-{act}", dtype=dtype, mode=mode,
                                     bytes=nbytes, flops=flops, numel=m * n,
                                     params={"shape": (m, n), "activation": act, "alpha": ALPHA},
                                     l2_cold=nbytes < L2_COLD_BELOW,
                                     read_bytes=read_bytes(m, n, dtype.itemsize, mode)))
    return out


#: relu's kink: pre-activations closer to 0 than this are moved away from it, per dtype
KINK_MARGIN = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float64: 0.0}


def make_inputs(case: BenchCase, device: torch.device) -> tuple:
    """(x, residual, bias, alpha, activation): fresh normal tensors (non-zero, spanning GELU's curve).

    For relu, elements whose pre-activation z = x + alpha·residual + bias lies within the dtype's rounding
    of 0 get x moved by twice that margin, away from 0: there, rounding z in the input dtype (as every
    provider does, eager included) legitimately flips relu's mask against the float64 reference, and a few
    flipped gradients out of 10^8 would exceed the tolerance while every provider is right.
    """
    m, n = case.params["shape"]
    alpha = float(case.params["alpha"])
    x = torch.randn(m, n, dtype=case.dtype, device=device)
    residual = torch.randn(m, n, dtype=case.dtype, device=device)
    bias = torch.randn(n, dtype=case.dtype, device=device)
    margin = KINK_MARGIN.get(case.dtype, 0.0)
    if case.params["activation"] == "relu" and margin:
        z = x.double() + alpha * residual.double() + bias.double()
        near = z.abs() < margin
        x = torch.where(near, x + torch.where(z >= 0, 2 * margin, -2 * margin).to(x.dtype), x)
        del z, near
    return x, residual, bias, alpha, str(case.params["activation"])


def eager_bias_act(x: torch.Tensor, residual: torch.Tensor, bias: torch.Tensor, alpha: float,
                   activation: str) -> torch.Tensor:
    """The epilogue as a user writes it in eager PyTorch (also what torch.compile/TorchScript/Thunder get)."""
    z = x + alpha * residual + bias
    if activation == "relu":
        return torch.relu(z)
    return F.gelu(z, approximate="tanh")


def reference(x, residual, bias, alpha, activation):
    return ref.bias_act(x, bias, residual, alpha, activation)


def fuselab_bias_act(x, residual, bias, alpha, activation):
    from fuselab.ops.bias_act import bias_act

    return bias_act(x, bias, residual=residual, alpha=alpha, activation=activation)


def _build_cuda(case: BenchCase):
    from fuselab.cuda import bias_act  # compiles with nvcc on first use

    def run(x, residual, bias, alpha, activation):
        return bias_act(x, bias, residual=residual, alpha=alpha, activation=activation)

    return run


def _build_thunder(case: BenchCase):
    import thunder

    return thunder.jit(eager_bias_act)


SPEC = OpSpec(
    name="bias_act",
    summary="act(x + alpha*residual + bias): eager vs torch.compile vs TorchScript vs Thunder vs fuselab vs CUDA",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        providers.eager(eager_bias_act, description="x + alpha*residual + bias, then relu / F.gelu (4 kernels)"),
        providers.compiled(eager_bias_act),
        providers.scripted(eager_bias_act),
        Provider(name="thunder", build=_build_thunder, requires=("thunder",),
                 description="thunder.jit of the eager code"),
        providers.fuselab(fuselab_bias_act, description="fuselab.bias_act (Triton, fused bias grad)"),
        Provider(name="cuda", build=_build_cuda, cuda_only=True,
                 description="fuselab.cuda.bias_act (CUDA C++, load_inline, 16-byte vectors)"),
    ),
    grad_args=lambda case: (0, 1, 2),
)
