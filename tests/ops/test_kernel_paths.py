"""Kernel variants that ordinary shapes never reach, forced on small shapes and checked against float64.

- bias_act forward and backward in 64-bit index math (chosen by the launchers only past 2^31 elements): the
  planners' ``needs_int64`` is patched to say yes, and a spy on their ``Launch`` confirms ``INT64=True`` ran.
- the reduction's rows kernel with two kept axis groups (``HAS_I``: kept axes whose strides do not merge).
"""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab.ops import opdef
from fuselab.ops.bias_act import launch as bias_kernels
from fuselab.ops.reduce import plan as planner
from fuselab.reference import bias_act as ref
from fuselab.testing import assert_close


@pytest.fixture
def launches(monkeypatch):
    """Every bias_act launch in 64-bit index math, on fresh plan caches; yields the list of (kernel name,
    constexprs) of the launches planned."""
    seen: list[tuple[str, dict]] = []
    real = bias_kernels.Launch

    def spy(kernel, grid, scalars, constexprs):
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), dict(constexprs)))
        return real(kernel, grid, scalars, constexprs)

    monkeypatch.setattr(bias_kernels, "needs_int64", lambda *tensors: True)
    monkeypatch.setattr(bias_kernels, "Launch", spy)
    opdef.clear()  # no plan cached by an earlier test: every call plans (and so reaches the spy)
    yield seen
    opdef.clear()  # nor a cached 64-bit plan for later tests


@pytest.mark.parametrize("activation", ["gelu_tanh", "sigmoid"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["flat", "tiles"])
def test_bias_act_int64_forward_and_backward(triton_backend, device, launches, activation, contiguous):
    m, n = 9, 37
    x = torch.randn(m, n, device=device) if contiguous else torch.randn(n, m, device=device).t()
    bias, res = torch.randn(n, device=device), torch.randn(m, n, device=device)
    leaves = [t.clone().requires_grad_(True) for t in (x, bias, res)]
    y = fuselab.bias_act(leaves[0], leaves[1], residual=leaves[2], alpha=0.5, activation=activation)
    leaves64 = [t.double().requires_grad_(True) for t in (x, bias, res)]
    y64 = ref.bias_act(leaves64[0], leaves64[1], leaves64[2], 0.5, activation)
    assert_close(y, y64, torch.float32, "y (int64 indices)")
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    for name, t, t64 in zip(("grad_x", "grad_bias", "grad_residual"), leaves, leaves64):
        assert_close(t.grad, t64.grad, torch.float32, f"{name} (int64 indices)", chained=True)
    names = {name for name, c in launches if c.get("INT64")}
    assert {"_bias_act_fwd_kernel", "_bias_act_bwd_kernel"} <= names, launches


@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reduce_rows_kernel_two_kept_groups(triton_backend, device, op, dtype):
    base = torch.randn(4, 6, 37, device=device).to(dtype)
    x = base.permute(1, 0, 2)  # (6, 4, 37), strides (37, 222, 1): the kept axes do not merge
    src, kept, red = planner.prepare(x, (2,))
    plan = planner.plan_reduction(src, kept, red)
    assert src.data_ptr() == x.data_ptr() and len(kept) == 2, (kept, red)
    assert plan.kind == "rows", plan
    for keepdim in (False, True):
        got = getattr(fuselab, op)(x, 2, keepdim)
        want = getattr(torch, op)(x.double(), dim=2, keepdim=keepdim)
        assert_close(got, want, dtype, f"{op} rows kernel, two kept groups", atol=1e-5 * 37)
