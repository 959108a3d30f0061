"""Benchmark suite: one training step of a 4-layer MLP (DLRM's bottom MLP 13-512-256-64-16, relu after each layer).

Providers: eager (``F.linear`` = ``nn.Linear``, then ``torch.relu``), torch.compile of that code, fuselab
(``fuselab.nn.fused_linear``, the functional ``FusedLinear``: cuBLAS matmul without bias + one fused
bias/relu kernel forward, and one fused kernel backward that also reduces the bias gradient), and cuda
(``FusedLinear(backend="cuda")``: the same steps as one C++ autograd node per layer, with the CUDA C++ kernels).

Inputs: ``(x, W1, b1, W2, b2, W3, b3, W4, b4)``, gradients for the weights and biases (``x`` is data).
Outputs: the four layers' outputs, the three hidden ones detached (no upstream gradient, nothing extra to time:
they show the check which relu branch the provider took); the step's loss gradient enters at the last one.

Reference (:func:`mlp_reference`): the eager code in float64 that, given a provider's outputs (``follow``, see
:mod:`fuselab.bench.check`), takes the provider's relu branch where a pre-activation lies within rounding of
zero, and its own everywhere else. Without it, a mask flipped by the last bit of a bf16 rounding moves a whole row
of a weight gradient: an exact provider measured 5e-2 to 1.4e-1 from float64 depending on the seed, and failed
at random. Check: within the dtype tolerance or twice the distance of the eager code run in the case dtype, with
its own branches (``tolerance_vs_eager``). Mode ``fwd+bwd`` (a training step) by default; ``fwd`` on request.

Cost model (batch B, layers (i, o), itemsize s): flops ``2·B·Σ i·o`` forward, 3× that for fwd+bwd.
Bytes: forward reads x and the parameters and writes each layer's output once: ``s·(B·13 + B·Σo + P)``;
the backward reads each output's gradient and each layer's input (weight grad) and writes the input gradients
of layers 2-4 and the parameter gradients: ``s·(B·Σo + B·Σi + B·Σ_{l≥2} i + P)`` (P parameters).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from fuselab.bench import providers
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider

LAYERS: tuple[int, ...] = (13, 512, 256, 64, 16)
GPU_BATCH = 65536
CPU_BATCH = 256
DEFAULT_DTYPES = (torch.bfloat16, torch.float32)
DEFAULT_MODES = ("fwd+bwd",)


def _pairs(layers: tuple[int, ...] = LAYERS) -> list[tuple[int, int]]:
    return list(itertools.pairwise(layers))


def case_cost(batch: int, itemsize: int, mode: str) -> tuple[int, int]:
    """(bytes, flops) of one step."""
    pairs = _pairs()
    params = sum(i * o + o for i, o in pairs)
    outs = sum(o for _, o in pairs)
    ins = sum(i for i, _ in pairs)
    fwd_bytes = itemsize * (batch * LAYERS[0] + batch * outs + params)
    bwd_bytes = itemsize * (batch * outs + batch * ins + batch * sum(i for i, _ in pairs[1:]) + params)
    fwd_flops = 2 * batch * sum(i * o for i, o in pairs)
    if mode == "fwd":
        return fwd_bytes, fwd_flops
    if mode == "bwd":
        return bwd_bytes, 2 * fwd_flops
    return fwd_bytes + bwd_bytes, 3 * fwd_flops


def cases(query: CaseQuery) -> list[BenchCase]:
    batch = GPU_BATCH if query.device_type == "cuda" else CPU_BATCH
    out = []
    for dtype, mode in query.combinations(DEFAULT_DTYPES, DEFAULT_MODES):
        nbytes, flops = case_cost(batch, dtype.itemsize, mode)
        label = f"B={batch}-" + "-".join(map(str, LAYERS))
        out.append(BenchCase(op="mlp", label=label, dtype=dtype, mode=mode, bytes=nbytes, flops=flops,
                             numel=batch * LAYERS[0], params={"batch": batch, "layers": LAYERS}))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple[torch.Tensor, ...]:
    """x ~ N(0, 1) of shape (B, 13) and nn.Linear-style uniform(±1/√in) weights and biases (non-zero)."""
    batch = case.params["batch"]
    args = [torch.randn(batch, LAYERS[0], dtype=case.dtype, device=device)]
    for i, o in _pairs(case.params["layers"]):
        bound = 1.0 / math.sqrt(i)
        args.append((torch.rand(o, i, device=device) * 2 - 1).mul_(bound).to(case.dtype))
        args.append((torch.rand(o, device=device) * 2 - 1).mul_(bound).to(case.dtype))
    return tuple(args)


Outputs = tuple[torch.Tensor, ...]

#: a pre-activation within this many units of roundoff (of the provider's dtype) times the magnitude of its dot
#: product (``Σ|w·a| + |b|``) of zero has no well-defined relu branch: there the reference follows the provider
BRANCH_BAND = 4.0


def _outputs(acts: list[torch.Tensor]) -> Outputs:
    """The layers' outputs: the hidden ones detached (compared in the forward, no upstream gradient: they show the
    check which relu branches the provider took), the last one the step's output."""
    return (*(a.detach() for a in acts[:-1]), acts[-1])


def mlp_eager(x: torch.Tensor, *params: torch.Tensor) -> Outputs:
    """nn.Linear + relu per layer, in eager PyTorch."""
    acts = []
    for k in range(0, len(params), 2):
        x = torch.relu(F.linear(x, params[k], params[k + 1]))
        acts.append(x)
    return _outputs(acts)


def _roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff of a provider's matmul in ``dtype``: TF32's 2^-10 for float32 unless matmuls run at the
    "highest" precision."""
    eps = torch.finfo(dtype).eps
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        eps = max(eps, 2.0**-10)
    return eps


def mlp_reference(x: torch.Tensor, *params: torch.Tensor, follow: Outputs | None = None) -> Outputs:
    """The float64 reference: nn.Linear + relu per layer. With ``follow`` (a provider's outputs, one per layer),
    a pre-activation within rounding of zero (:data:`BRANCH_BAND`) takes the provider's relu branch: there the
    branch, and with it a full row of the weight gradients, depends on the last bit of the provider's rounding.
    Away from zero the reference keeps its own branch, so a provider with a wrong mask still fails."""
    acts = []
    for layer, k in enumerate(range(0, len(params), 2)):
        w, b = params[k], params[k + 1]
        z = F.linear(x, w, b)
        positive = z > 0
        if follow is not None:
            with torch.no_grad():
                eps = _roundoff(follow[layer].dtype)
                band = BRANCH_BAND * eps * F.linear(x.abs(), w.abs(), b.abs())
                provider = follow[layer].to(z.device) > 0
                positive = torch.where(z.abs() <= band, provider, positive)
        x = z * positive
        acts.append(x)
    return _outputs(acts)


def mlp_fuselab(x: torch.Tensor, *params: torch.Tensor) -> Outputs:
    from fuselab.nn import fused_linear

    acts = []
    for k in range(0, len(params), 2):
        x = fused_linear(x, params[k], params[k + 1], "relu")
        acts.append(x)
    return _outputs(acts)


def mlp_cuda(x: torch.Tensor, *params: torch.Tensor) -> Outputs:
    from fuselab.cuda import fused_linear  # compiles with nvcc on first use

    acts = []
    for k in range(0, len(params), 2):
        x = fused_linear(x, params[k], params[k + 1], "relu")
        acts.append(x)
    return _outputs(acts)


SPEC = OpSpec(
    name="mlp",
    summary="training step of the 13-512-256-64-16 relu MLP: eager vs torch.compile vs fuselab FusedLinear",
    cases=cases,
    make_inputs=make_inputs,
    reference=mlp_reference,
    providers=(
        providers.eager(mlp_eager, description="nn.Linear (F.linear) + torch.relu per layer"),
        providers.compiled(mlp_eager),
        providers.fuselab(mlp_fuselab, description="fuselab.nn.FusedLinear: matmul + fused bias/relu (fwd, bwd)"),
        Provider(name="cuda", build=lambda case: mlp_cuda, cuda_only=True,
                 description='FusedLinear(backend="cuda"): one C++ autograd node per layer, CUDA C++ epilogue'),
    ),
    grad_args=lambda case: tuple(range(1, 1 + 2 * (len(case.params["layers"]) - 1))),
    tolerance_vs_eager=True,
)
