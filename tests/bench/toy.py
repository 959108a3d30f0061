"""A toy op for the harness tests: providers that are right, wrong, raising, missing, GPU-only, Triton."""

from __future__ import annotations

import os

import torch

from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider

N = 1000
BYTES = 8_000_000  # deliberately round numbers so the expected figures are easy to write down
FLOPS = 1_000_000
seen_backend: list[str | None] = []


def cases(query: CaseQuery) -> list[BenchCase]:
    modes = query.modes or ("fwd",)
    return [BenchCase(op="toy", label=f"n={N}", dtype=torch.float32, mode=m, bytes=BYTES, flops=FLOPS, numel=N,
                      params={"n": N}) for m in modes if query.wants(torch.float32, m)]


def make_inputs(case: BenchCase, device: torch.device) -> tuple[torch.Tensor]:
    return (torch.randn(case.params["n"], dtype=case.dtype, device=device),)


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2


def wrong(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2.2


def raises_on_call(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel exploded")


def raises_on_build(case: BenchCase):
    raise ImportError("cannot build this provider")


def triton_like(x: torch.Tensor) -> torch.Tensor:
    seen_backend.append(os.environ.get("FUSELAB_BACKEND"))
    return reference(x)


SPEC = OpSpec(
    name="toy",
    summary="toy op for tests",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        Provider("eager", build=lambda case: reference),
        Provider("fast", build=lambda case: reference),
        Provider("torch.compile", build=lambda case: reference),
        Provider("wrong", build=lambda case: wrong),
        Provider("boom", build=lambda case: raises_on_call),
        Provider("broken-build", build=raises_on_build),
        Provider("peer", build=lambda case: reference, requires=("no_such_module_fuselab_xyz",)),
        Provider("gpu", build=lambda case: reference, cuda_only=True),
        Provider("tri", build=lambda case: triton_like, triton=True),
    ),
)

#: the fake timer's clock: median ms per provider
TIMES_MS = {"eager": 2.0, "fast": 1.0, "torch.compile": 4.0, "wrong": 0.5, "boom": 0.1, "tri": 0.1, "gpu": 0.1}
