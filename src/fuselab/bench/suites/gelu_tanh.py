"""Benchmark suite: tanh-approximated GELU, ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``.

The eager formula (one kernel per operator, each a round trip to memory) vs ``torch.compile``
of it (Inductor fuses it into one kernel) vs ``F.gelu(approximate="tanh")`` (PyTorch's own
fused kernel) vs TorchScript of the formula. Modes ``fwd`` and ``fwd+bwd``.

Cost model per case (N elements, itemsize s): fwd reads x and writes y: ``2·N·s`` bytes;
bwd reads x and grad_out, writes grad_in: ``3·N·s``; fwd+bwd: ``5·N·s``. Flops: 9 per element
forward (tanh counted as one), 14 backward. Memory-bound: the fused versions should reach the
same fraction of copy bandwidth as a copy; the eager formula moves ~10x the minimum bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fuselab.bench import providers
from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec
from fuselab.bench.suites._sizes import L2_COLD_BELOW, size_label, sizes

DEFAULT_DTYPES = (torch.float32, torch.bfloat16)
QUICK_DTYPES = (torch.float32,)
MODES = ("fwd", "fwd+bwd")
_BYTES_PER_ELEMENT = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}  # elements moved per element of x
_READ_PER_ELEMENT = {"fwd": 1, "bwd": 2, "fwd+bwd": 3}  # of those, elements read
_FLOPS_PER_ELEMENT = {"fwd": 9, "bwd": 14, "fwd+bwd": 23}


def gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    """The formula as a user writes it in eager PyTorch (also what torch.compile and TorchScript get)."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3))))


def gelu_tanh_builtin(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def cases(query: CaseQuery) -> list[BenchCase]:
    out = []
    for dtype, mode in query.combinations(QUICK_DTYPES if query.quick else DEFAULT_DTYPES, MODES):
        for n in sizes(query.device_type, query.quick):
            nbytes = _BYTES_PER_ELEMENT[mode] * n * dtype.itemsize
            out.append(BenchCase(op="gelu_tanh", label=size_label(n), dtype=dtype, mode=mode, bytes=nbytes,
                                 flops=_FLOPS_PER_ELEMENT[mode] * n, numel=n, params={"n": n},
                                 l2_cold=nbytes < L2_COLD_BELOW,
                                 read_bytes=_READ_PER_ELEMENT[mode] * n * dtype.itemsize))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple[torch.Tensor]:
    """One fresh random vector (normal, so non-zero, spanning GELU's curved region)."""
    return (torch.randn(case.params["n"], dtype=case.dtype, device=device),)


SPEC = OpSpec(
    name="gelu_tanh",
    summary="tanh-GELU: eager formula vs torch.compile vs F.gelu(approximate='tanh') vs TorchScript",
    cases=cases,
    make_inputs=make_inputs,
    reference=gelu_tanh_formula,
    providers=(
        providers.eager(gelu_tanh_formula, description="the formula in eager PyTorch (one kernel per operator)"),
        providers.compiled(gelu_tanh_formula),
        providers.eager(gelu_tanh_builtin, name="F.gelu", description="F.gelu(x, approximate='tanh')"),
        providers.scripted(gelu_tanh_formula),
    ),
)
