"""The rope benchmark suite: cases, cost model, and its providers through fuselab.bench.check on CPU cases."""

from __future__ import annotations

import pytest
import torch

from fuselab.bench.check import check
from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import get_spec

SPEC = get_spec("rope")


def test_gpu_cases_cost_model():
    cases = {c.key: c for c in SPEC.cases(CaseQuery("cuda"))}
    c = cases["rope/8x4096x32/8x128/bf16/fwd"]
    elems = 8 * 4096 * (32 + 8) * 128
    assert c.bytes == 2 * elems * 2 + 2 * 4096 * 64 * 4  # q,k read + written (bf16) + fp32 cos/sin rows
    assert cases["rope/8x4096x32/8x128/bf16/fwd+bwd"].bytes == 2 * c.bytes
    assert cases["rope/decode64x1x32/8x128/bf16/fwd"].l2_cold
    kinds = {x.params["kind"] for x in cases.values()}
    assert kinds == {"bshd", "thd", "decode"} and len(cases) == 12


def test_thd_inputs_are_uneven():
    case = next(c for c in SPEC.cases(CaseQuery("cpu")) if c.params["kind"] == "thd")
    q, _k, _cos, _sin, layout, _offsets, cu, max_seqlen = SPEC.make_inputs(case, torch.device("cpu"))
    lengths = cu.diff()
    assert layout == "thd" and int(cu[-1]) == q.shape[0] and lengths.min() < lengths.max() == max_seqlen


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", ["fuselab", "fuselab-inplace", "fuselab-angles", "eager"])
def test_providers_check_small_cases(triton_backend, device, provider, mode):
    """The CPU suite's small cases, on the test device (the interpreter on CPU, compiled kernels on a GPU)."""
    p = SPEC.provider(provider)
    for case in SPEC.cases(CaseQuery("cpu", modes=(mode,))):
        if p.skip_reason(case):
            continue
        result = check(SPEC, case, p.build(case), device=device)
        assert result.ok, f"{provider} {case.key}: {result}"
        assert (result.grad_error is None) == (mode == "fwd")
