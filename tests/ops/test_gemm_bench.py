"""The gemm suite of `fuselab bench`: its cases cover the DLRM and LLM shapes the issue names, its cost model, and
every CPU provider (fuselab under the interpreter) passes the harness's float64 check."""

from __future__ import annotations

import pytest

from fuselab.bench.check import check
from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import get_spec

SPEC = get_spec("gemm")


def test_gpu_cases_cover_the_shapes():
    cases = SPEC.cases(CaseQuery("cuda"))
    linear = {(c.params["m"], c.params["k"], c.params["n"]) for c in cases if c.params["kind"] == "linear"}
    for k, n in ((13, 512), (367, 512), (368, 512), (3456, 1024), (256, 1), (1024, 1024)):
        assert (65536, k, n) in linear
    assert (8192, 8192, 8192) in linear and (4096, 4096, 4096) in linear
    kinds = {c.params["kind"] for c in cases}
    assert kinds == {"linear", "lora", "qkv", "dcn"}
    qkv = next(c for c in cases if c.params["kind"] == "qkv")
    assert qkv.params["heads"] > qkv.params["kv_heads"]  # GQA
    assert {c.mode for c in cases} == {"fwd", "fwd+bwd"}
    for c in cases:
        if c.params["kind"] == "linear":
            m, k, n = c.params["m"], c.params["k"], c.params["n"]
            assert c.flops == 2 * m * n * k * (1 if c.mode == "fwd" else 3)
    assert len({c.key for c in cases}) == len(cases)


@pytest.mark.parametrize("kind", ["linear", "lora", "qkv", "dcn"])
def test_small_cases_pass_the_check(triton_backend, device, kind):
    """The small (CPU-sized) case of each kind, every provider but the compiled ones (fuselab under the interpreter on
    CPU, on the GPU where there is one)."""
    cases = [c for c in SPEC.cases(CaseQuery("cpu", modes=("fwd+bwd",))) if c.params["kind"] == kind][:1]
    assert cases
    for case in cases:
        for p in SPEC.providers:
            if (p.cuda_only and device.type != "cuda") or p.skip_reason(case) or p.name in ("torch.compile",
                                                                                             "max-autotune"):
                continue
            result = check(SPEC, case, p.build(case), device=device)
            assert result.ok, f"{p.name} {case.key}: {result.error:.2e}"
