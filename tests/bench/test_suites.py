"""The example suites (square, gelu_tanh): cost models, case lists, correct providers, CUDA square validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fuselab.bench.check import check
from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import get_spec, op_names
from fuselab.bench.suites._sizes import size_label


def test_registry_errors_list_valid_ops():
    assert {"square", "gelu_tanh"} <= set(op_names())
    with pytest.raises(ValueError, match="valid ops: square"):
        get_spec("nope")


@pytest.mark.parametrize("op", ["square", "gelu_tanh"])
def test_cases_cost_model(op):
    spec = get_spec(op)
    per_element = {"square": {"fwd": 2}, "gelu_tanh": {"fwd": 2, "fwd+bwd": 5}}[op]
    for device_type in ("cpu", "cuda"):
        cases = spec.cases(CaseQuery(device_type))
        assert cases and len({c.key for c in cases}) == len(cases)  # labels unique per dtype/mode
        for c in cases:
            assert c.bytes == per_element[c.mode] * c.numel * c.dtype.itemsize
            assert c.flops > 0 and c.numel == c.params["n"]
    gpu = spec.cases(CaseQuery("cuda"))
    assert max(c.numel for c in gpu) >= 2**28  # fills the chip
    assert any(c.l2_cold for c in gpu) and not all(c.l2_cold for c in gpu)
    quick = spec.cases(CaseQuery("cpu", quick=True))
    assert len({c.numel for c in quick}) <= 2 and {c.dtype for c in quick} == {torch.float32}
    only = spec.cases(CaseQuery("cpu", dtypes=(torch.bfloat16,), modes=("fwd",)))
    assert only and all(c.dtype == torch.bfloat16 and c.mode == "fwd" for c in only)


@pytest.mark.parametrize("op", ["square", "gelu_tanh"])
def test_inputs_fresh_and_nonzero(op):
    spec = get_spec(op)
    case = spec.cases(CaseQuery("cpu", quick=True))[0]
    (a,), (b,) = spec.make_inputs(case, torch.device("cpu")), spec.make_inputs(case, torch.device("cpu"))
    assert a.count_nonzero() == a.numel() and not torch.equal(a, b)


#: the torchscript provider measures TorchScript on purpose, a backend torch now marks deprecated
TORCHSCRIPT_DEPRECATED = r"ignore:`torch\.jit\.script(_method)?` is deprecated:DeprecationWarning"


@pytest.mark.filterwarnings(TORCHSCRIPT_DEPRECATED)
@pytest.mark.parametrize("op", ["square", "gelu_tanh"])
def test_cpu_providers_are_correct(op, device):
    """bf16 here; fp32 is checked by the CLI test (every result of `fuselab bench --quick` must be ok)."""
    spec = get_spec(op)
    for case in spec.cases(CaseQuery("cpu", quick=True, dtypes=(torch.bfloat16,))):
        for p in spec.providers:
            if (p.cuda_only and device.type != "cuda") or p.skip_reason(case):
                continue
            result = check(spec, case, p.build(case), device=device)
            assert result.ok, f"{p.name} {case.key}: {result.error:.2e}"


def test_mlp_check_is_relative_to_eager_rounding(triton_backend, device):
    """bf16 MLP step: eager and fuselab pass against the float64 reference with the eager-relative tolerance,
    which is > the bf16 constant (else the option would be moot); a provider 5% off everywhere fails."""
    spec = get_spec("mlp")
    case = spec.cases(CaseQuery(device.type, quick=True, dtypes=(torch.bfloat16,)))[0]
    for name in ("eager", "fuselab"):
        result = check(spec, case, spec.provider(name).build(case), device=device)
        assert result.ok, f"{name}: {result.error:.2e} > {result.tolerance:.2e}"
    assert result.tolerance > 1e-2

    def five_percent_off(*args):
        return tuple(o * 1.05 for o in spec.reference(*args))

    bad = check(spec, dataclasses.replace(case, mode="fwd"), five_percent_off, device=device)
    assert not bad.ok and bad.error > 4e-2


def test_size_label():
    assert size_label(2**20) == "n=2^20" and size_label(100_003) == "n=100003"


def test_cuda_square_validates_inputs(device):
    from fuselab.cuda import square

    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        square(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        square([1.0, 2.0])
    if device.type != "cuda":
        with pytest.raises(ValueError, match="CUDA tensor"):
            square(torch.ones(4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 4096 + 3, 2**20 + 1])
def test_cuda_square_matches_reference(dtype, n):
    from fuselab.cuda._square import square, square_out
    from fuselab.testing import assert_close, poison_

    x = torch.randn(n + 1, device="cuda", dtype=dtype)
    for view in (x[:n], x[1:]):  # aligned (vectorized) and misaligned (scalar path)
        out = poison_(torch.empty_like(view))
        square_out(view, out)
        assert_close(out, view.double() ** 2, dtype)
        assert_close(square(view), view.double() ** 2, dtype)
    with pytest.raises(ValueError, match="contiguous"):
        square(torch.randn(3, 5, device="cuda", dtype=dtype).t())  # (x[::2] of 2 elements is contiguous)
