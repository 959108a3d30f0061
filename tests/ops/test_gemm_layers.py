"""fuselab.nn.FusedLinear / LoRALinear on the fused GEMM: the shape rules (LinearRules) pick fuselab.gemm or the
cuBLAS + epilogue path, and both give the float64 reference's values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fuselab.nn import FusedLinear, LoRALinear
from fuselab.nn.linear import LINEAR, LinearRules
from fuselab.ops.gemm.op import FORWARD
from fuselab.ops.tuning import override
from fuselab.reference import gemm as ref
from fuselab.reference.gemm import LoRA
from fuselab.testing import assert_close

#: rules that send every shape of these tests to fuselab.gemm
ALWAYS = LinearRules(dtypes=(torch.float32, torch.bfloat16), min_rows=1, min_out=1, min_in=1)
GEMM_NODE = FORWARD.function.__name__ + "Backward"
EPILOGUE_NODE = LINEAR.function.__name__ + "Backward"


def test_rules():
    rules = LinearRules()
    assert rules.fused(65536, 512, 256, torch.bfloat16)
    assert not rules.fused(65536, 1, 256, torch.bfloat16)  # N = 1: cuBLAS
    assert not rules.fused(65536, 512, 256, torch.float32)  # fp32: cuBLAS
    assert not rules.fused(64, 512, 256, torch.bfloat16)  # few rows: launch-bound, cuBLAS
    assert not rules.fused(65536, 512, 256, torch.bfloat16, rank=128)
    assert not rules.fused(65536, 128, 256, torch.bfloat16)  # 128 outputs: cuBLAS (notes, section "Rules")
    assert rules.fused(65536, 1024, 479, torch.bfloat16, aligned=False)  # unaligned rows: ahead of cuBLAS still
    assert rules.fused(65536, 512, 13, torch.bfloat16, aligned=False)
    assert rules.keep("relu") == "mask" and rules.keep("gelu") == "auto"


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_fused_linear_takes_the_gemm_where_the_rules_say(triton_backend, activation):
    layer = FusedLinear(24, 40, activation=activation, dtype=torch.bfloat16)
    x = torch.randn(3, 11, 24).to(torch.bfloat16).requires_grad_()
    y_small = layer(x)
    assert EPILOGUE_NODE in y_small.grad_fn.name()  # default rules: 33 rows are below min_rows
    with override(ALWAYS):
        y = layer(x)
    assert GEMM_NODE in y.grad_fn.name()
    x64 = x.detach().double().requires_grad_()
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_()
    y64 = ref.linear(x64, w64, b64, activation=activation)
    assert_close(y, y64, torch.bfloat16, "y", chained=True)
    assert_close(y, y_small, torch.bfloat16, "y vs the epilogue path", chained=True)
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    for name, t, t64 in (("x", x, x64), ("weight", layer.weight, w64), ("bias", layer.bias, b64)):
        atol = 2e-2 * t64.grad.abs().max().item()  # summed over 33 rows of bf16-rounded terms
        assert_close(t.grad, t64.grad, torch.bfloat16, f"grad_{name}", chained=True, atol=atol)


def test_lora_linear_takes_the_gemm(triton_backend):
    base = nn.Linear(32, 24, dtype=torch.bfloat16)
    lora = LoRALinear(copy.deepcopy(base), rank=4, alpha=8.0, activation="relu")
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(21, 32).to(torch.bfloat16).requires_grad_()
    with override(ALWAYS):
        y = lora(x)
    assert GEMM_NODE in y.grad_fn.name()
    p64 = [t.detach().double().requires_grad_() for t in (lora.lora_A, lora.lora_B)]
    x64 = x.detach().double().requires_grad_()
    y64 = ref.linear(x64, base.weight.double(), base.bias.double(), activation="relu",
                     lora=LoRA(p64[0], p64[1], lora.scaling))
    assert_close(y, y64, torch.bfloat16, "y", chained=True)
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    assert lora.base.weight.grad is None  # frozen base
    for name, t, t64 in (("x", x, x64), ("A", lora.lora_A, p64[0]), ("B", lora.lora_B, p64[1])):
        atol = 2e-2 * t64.grad.abs().max().item()
        assert_close(t.grad, t64.grad, torch.bfloat16, f"grad_{name}", chained=True, atol=atol)


def test_lora_linear_fp32_keeps_the_epilogue_path(triton_backend):
    lora = LoRALinear(nn.Linear(8, 6), rank=2)
    y = lora(torch.randn(5, 8, requires_grad=True))
    assert GEMM_NODE not in y.grad_fn.name()


@pytest.mark.slow
def test_lora_linear_compiles_fullgraph(triton_backend):
    """torch.compile(fullgraph=True) of a LoRALinear on the fused GEMM (the LoRA record and the rules' alignment test
    trace without a graph break) gives the eager gradients."""
    from fuselab.core.compile import compile_quietly

    lora = LoRALinear(nn.Linear(32, 24), rank=4, activation="relu")
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(21, 32, requires_grad=True)
    with override(ALWAYS):
        compile_quietly(lambda t: lora(t).square().sum(), fullgraph=True)(x).backward()
        compiled = lora.lora_A.grad.clone()
        lora.lora_A.grad = None
        lora(x).square().sum().backward()
    torch.testing.assert_close(compiled, lora.lora_A.grad)
