"""The op-definition helper (``fuselab.ops.opdef``): one eager forward/backward pair -> the dispatcher-free eager
path, the custom op with its fake and autograd, one bounded launch cache per op and one ``clear()``; the tuning
context; ``torch.library.opcheck`` of every fuselab custom op (Triton kernels under the interpreter on CPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import toy_op
from torch.utils._python_dispatch import TorchDispatchMode

import fuselab
from fuselab.core.rope_math import rope_frequencies
from fuselab.nn import fused_linear
from fuselab.ops import opdef
from fuselab.ops.bias_act import op as bias_act_op
from fuselab.ops.bias_act.launch import BiasActTuning
from fuselab.ops.opdef import LaunchCache, Op
from fuselab.ops.reduce.op import REDUCE
from fuselab.ops.rope.op import ROPE, ROPE_
from fuselab.ops.tuning import current, override
from fuselab.testing import assert_close

# ---------------------------------------------------------------------------------------------- toy ops
CALLS: list[tuple] = []


@dataclass(frozen=True, slots=True, eq=False)
class FactorCall:
    factor: float
    signature: Hashable | None = None

    def arguments(self) -> tuple:
        return (self.factor,)


@dataclass(frozen=True, eq=False)
class FactorPlan:
    call: FactorCall


class Scale(Op):
    """y = factor * x in PyTorch: the helper's dispatch, cache and autograd without a kernel."""

    name = "fuselab_test::scale"
    schema = "(Tensor x, float factor) -> Tensor"

    def call_of(self, inputs, signed):
        return FactorCall(inputs[1], ("custom", inputs[1]) if signed else None)

    def plan(self, call, operands):
        CALLS.append(("plan", call.signature))
        return FactorPlan(call)

    def forward(self, plan, operands):
        CALLS.append(("forward", plan.call.signature))
        return operands[0] * plan.call.factor

    def fake(self, call, operands):
        return torch.empty_like(operands[0])

    def setup_context(self, ctx, call, operands, output):
        ctx.factor = call.factor

    def backward(self, ctx, grad):
        CALLS.append(("backward", ctx.call.signature, getattr(ctx, "eager", False)))
        return (grad * ctx.factor,)


SCALE = Scale()


@pytest.fixture(autouse=True)
def _fresh():
    CALLS.clear()
    fuselab.ops.clear()
    yield
    fuselab.ops.clear()


def test_eager_path_skips_the_dispatcher_and_caches_the_plan():
    x = torch.randn(5)
    call = FactorCall(3.0, "k")
    y = SCALE.run(call, (x,))
    assert torch.equal(y, 3 * x) and CALLS == [("plan", "k"), ("forward", "k")]
    plan = SCALE.cached("k")
    assert plan.call is call and SCALE.cached(["unhashable"]) is None and SCALE.cached(None) is None
    SCALE.run(call, (x,), plan)
    SCALE.run(call, (x,))  # looked up by the call's signature
    assert CALLS[2:] == [("forward", "k"), ("forward", "k")]  # no plan again
    SCALE.run(FactorCall(3.0, None), (x,))  # no signature: planned, not cached
    assert CALLS[-2:] == [("plan", None), ("forward", None)] and len(SCALE.plans) == 1


def test_eager_autograd_and_custom_op_share_one_backward():
    x = torch.randn(5, requires_grad=True)
    y = SCALE.run(FactorCall(2.5, "k2"), (x,))
    assert type(y.grad_fn).__name__ == "ScaleFunctionBackward"  # the eager node, not the dispatcher's
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((5,), 2.5)) and CALLS[-1] == ("backward", "k2", True)
    assert SCALE.cached("k2") is not None
    x2 = torch.randn(5, requires_grad=True)
    torch.ops.fuselab_test.scale(x2, 2.5).sum().backward()  # the registered autograd: same formula, unsigned call
    assert torch.equal(x2.grad, torch.full((5,), 2.5)) and CALLS[-1] == ("backward", None, False)
    assert SCALE.cached(("custom", 2.5)) is not None  # the custom op's impl planned under its own signature


@dataclass(frozen=True, slots=True, eq=False)
class PlainCall:
    signature: Hashable | None = None

    def arguments(self) -> tuple:
        return ()


class Pair(Op):
    """(2x, a non-differentiable x + 1)."""

    name = "fuselab_test::pair"
    schema = "(Tensor x) -> (Tensor, Tensor)"

    def call_of(self, inputs, signed):
        return PlainCall()

    def plan(self, call, operands):
        return FactorPlan(call)

    def forward(self, plan, operands):
        return 2 * operands[0], operands[0] + 1

    def fake(self, call, operands):
        return torch.empty_like(operands[0]), torch.empty_like(operands[0])

    def setup_context(self, ctx, call, operands, output):
        ctx.mark_non_differentiable(output[1])

    def backward(self, ctx, grad, grad_side):
        CALLS.append(("pair backward", grad_side if grad_side is None else float(grad_side.abs().sum())))
        return (2 * grad,)  # never None: the eager node hands zeros for an unreached differentiable output


PAIR = Pair()


def test_eager_node_passes_none_for_a_non_differentiable_output():
    """No zero-filled gradient is made for an output autograd did not reach (bias_act's pre-activation, the
    matmul output of FusedLinear: a full-size allocation and fill per backward); the registered autograd's zeros
    give the same gradients."""
    x = torch.randn(6, requires_grad=True)
    y, side = PAIR.run(PlainCall(), (x,))
    assert not side.requires_grad
    y.sum().backward()
    assert CALLS[-1] == ("pair backward", None) and torch.equal(x.grad, torch.full((6,), 2.0))
    x2 = torch.randn(6, requires_grad=True)
    torch.ops.fuselab_test.pair(x2)[0].sum().backward()
    assert CALLS[-1] == ("pair backward", 0.0) and torch.equal(x2.grad, x.grad)


def test_eager_node_gives_zeros_for_an_unreached_differentiable_output():
    """gradcheck's undefined-gradient check runs the backward with no gradient for the (differentiable) output:
    the eager node hands the op's backward zeros there, with and without a non-differentiable output beside it."""
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: SCALE.run(FactorCall(1.5), (t,)), (x,))
    assert torch.autograd.gradcheck(lambda t: PAIR.run(PlainCall(), (t,))[0], (x,))


def test_compile_traces_the_custom_op():
    x = torch.randn(4, requires_grad=True)
    compiled = torch.compile(lambda t: SCALE.run(FactorCall(4.0), (t,)).sum(), fullgraph=True)
    compiled(x).backward()
    assert torch.equal(x.grad, torch.full((4,), 4.0))


def test_opcheck_toy():
    torch.library.opcheck(SCALE.custom, (torch.randn(3, requires_grad=True), 2.0))


# ---------------------------------------------------------------------------------------------- caches, tuning
def test_launch_cache_is_bounded_and_cleared_together():
    cache = LaunchCache("test", limit=3)
    for i in range(3):
        cache.keep(i, i)
    assert len(cache) == 3
    cache.keep(3, 3)  # full: emptied first
    assert len(cache) == 1 and cache.get(3) == 3
    opdef.clear()
    assert len(cache) == 0


def test_override_sets_and_restores_tuning_and_empties_caches():
    default = current(BiasActTuning)
    assert current(BiasActTuning) is default  # one default object: plan caches keyed on it hit
    cache = LaunchCache("test2")
    cache.keep("a", 1)
    changed = dataclasses.replace(default, fwd_tile_bytes=8192)
    with override(changed):
        assert current(BiasActTuning) is changed and len(cache) == 0
        cache.keep("b", 2)
    assert current(BiasActTuning) is default and len(cache) == 0
    with pytest.raises(TypeError, match="tuning dataclasses"), override(object()):
        pass


def test_tuning_is_read_by_the_planner(triton_backend, device):
    """A knob changed by override reaches the launch (the forward's flat runs)."""
    from fuselab.ops.bias_act import launch
    from fuselab.ops.bias_act.checks import BiasActCall

    x, y = torch.randn(4, 64, device=device), torch.empty(4, 64, device=device)
    for flat in (True, False):
        with override(BiasActTuning(fwd_flat=flat)):
            plan = launch.plan(BiasActCall("relu"), (x, None, None, 1.0))
        assert plan.launch.constexprs["FLAT"] is flat
        launch.write(plan, (x, None, None, 1.0), y, None)
        torch.testing.assert_close(y, x.relu())


# ---------------------------------------------------------------------------------------------- opcheck, fuselab ops
def _rope_args(k: bool, tables: bool, dtype=torch.float32):
    q = torch.randn(2, 3, 2, 8, dtype=dtype)
    kk = torch.randn(2, 3, 1, 8, dtype=dtype) if k else None
    cos, sin = fuselab.rope_cos_sin(3, 8) if tables else (None, None)
    inv_freq, mscale = (None, 1.0) if tables else rope_frequencies(8)  # computed and cached on the CPU
    inv_freq = None if inv_freq is None else inv_freq.to(q.device)  # the op takes it on q's device
    return (q, kk, cos, sin, inv_freq, None, None, None, 0, "bshd", 4, False, False, mscale)


@pytest.mark.parametrize("k", [True, False], ids=["qk", "q"])
@pytest.mark.parametrize("tables", [True, False], ids=["tables", "angles"])
def test_opcheck_rope(triton_backend, k, tables):
    args = _rope_args(k, tables)
    args[0].requires_grad_(True)
    torch.library.opcheck(ROPE.custom, args)
    torch.library.opcheck(ROPE_.custom, _rope_args(k, tables),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


class _ZeroFills(TorchDispatchMode):
    """Records the shape of every tensor made by ``aten.zeros``/``zeros_like``/``zero_``/``fill_`` (autograd's
    materialised gradients included)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.__name__.split(".")[0] in ("zeros", "zeros_like", "zero_", "fill_") and isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("op", ["bias_act", "fused_linear"])
def test_backward_makes_no_zero_gradient_for_the_kept_pre_activation(triton_backend, op):
    """bias_act with a residual and FusedLinear with gelu_tanh return their pre-activation as a non-differentiable
    output; the eager backward must not allocate and zero-fill a gradient of its (M, N) shape."""
    x = torch.randn(6, 10, requires_grad=True)
    bias = torch.randn(10, requires_grad=True)
    if op == "bias_act":
        residual = torch.randn(6, 10, requires_grad=True)
        y = fuselab.bias_act(x, bias, residual=residual, activation="gelu_tanh")
    else:
        weight = torch.randn(10, 10, requires_grad=True)
        y = fused_linear(x, weight, bias, "gelu_tanh")
    assert type(y.grad_fn).__name__ in ("BiasActFwdFunctionBackward", "FusedLinearFunctionBackward")  # the eager node
    with _ZeroFills() as fills:
        y.backward(torch.ones_like(y))
    assert (6, 10) not in fills.shapes, fills.shapes
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_opcheck_bias_act(triton_backend, residual, activation):
    x = torch.randn(3, 20, requires_grad=True)
    r = torch.randn(3, 20, requires_grad=True) if residual else None
    b = torch.randn(20, requires_grad=True)
    save_pre = residual and activation == "gelu_tanh"
    torch.library.opcheck(bias_act_op.FORWARD.custom, (x, b, r, 0.5, activation, save_pre))
    g, saved = torch.randn(3, 20), torch.randn(3, 20)
    torch.library.opcheck(bias_act_op.BACKWARD.custom,
                          (g, saved, None, 0.5, activation, torch.float32, torch.float32, torch.float32, True,
                           residual, True))
    torch.library.opcheck(bias_act_op.INPLACE.custom,
                          (torch.randn(3, 20), b.detach(), None if r is None else r.detach(), 0.5, activation),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_compile_fullgraph_bias_act_and_inplace_ops(triton_backend):
    """One compiled graph: bias_act forward and backward (save_pre), then the in-place ops of rope and bias_act."""
    x = torch.randn(4, 24, requires_grad=True)
    r, b = torch.randn(4, 24, requires_grad=True), torch.randn(24, requires_grad=True)

    def train(x, r, b):
        return fuselab.bias_act(x, b, residual=r, alpha=0.5, activation="gelu_tanh").square().sum()

    compiled = torch.compile(train, fullgraph=True)
    compiled(x, r, b).backward()
    grads = [t.grad.clone() for t in (x, r, b)]
    for t in (x, r, b):
        t.grad = None
    train(x, r, b).backward()
    for got, want in zip(grads, (x.grad, r.grad, b.grad), strict=True):
        torch.testing.assert_close(got, want)

    def infer(q, k, cos, sin, h, bias):
        fuselab.apply_rope(q, k, cos, sin, inplace=True)
        return fuselab.bias_act(h, bias, inplace=True)

    q, k = torch.randn(2, 3, 2, 8), torch.randn(2, 3, 1, 8)
    cos, sin = fuselab.rope_cos_sin(3, 8)
    h, bias = torch.randn(4, 24), torch.randn(24)
    q2, k2, h2 = q.clone(), k.clone(), h.clone()
    with torch.no_grad():
        torch.compile(infer, fullgraph=True)(q, k, cos, sin, h, bias)
        infer(q2, k2, cos, sin, h2, bias)
    for got, want in ((q, q2), (k, k2), (h, h2)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dims,keepdim", [([1], False), ([0, 1], True)])
def test_opcheck_reduce_all_utils(triton_backend, dims, keepdim):
    """Every opcheck test of ``fuselab::reduce``, AOT dispatch (the registered autograd under tracing) included."""
    x = torch.randn(6, 9, requires_grad=True)
    torch.library.opcheck(REDUCE.custom, (x, dims, keepdim, True, torch.float32))


def test_unhashable_key_keeps_nothing(triton_backend):
    """A key holding an argument the checks accept but a dict cannot (a list of axes) runs and keeps nothing."""
    x = torch.randn(4, 5)
    for _ in range(2):
        torch.testing.assert_close(fuselab.sum(x, [0, 1]), x.sum())
    y = fuselab.sum(x.requires_grad_(True), [0, 1])
    y.backward()
    assert torch.equal(x.grad, torch.ones(4, 5))


# ---------------------------------------------------------------------------------------------- the documented op
def test_architecture_doc_shows_the_toy_op_as_it_is():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- tests/ops/toy_op.py -->\n```python\n", 1)[1].split("```\n", 1)[0]
    assert block == Path(toy_op.__file__).read_text()


def test_toy_op_forward_backward_and_cache(triton_backend, device):
    """The documented op against float64: forward, both gradients (a strided input, an expanded gradient), its plans
    cached by signature (a repeat plans nothing), bad input named."""
    x = torch.randn(40, 7, device=device).t()  # (7, 40), strided
    w = torch.randn(40, device=device)
    leaves = [t.clone().requires_grad_(True) for t in (x, w)]
    y = toy_op.scale(*leaves)
    (y.sum() * 2).backward()  # an expanded upstream gradient
    leaves64 = [t.double().requires_grad_(True) for t in (x, w)]
    ((leaves64[0] * leaves64[1]).sum() * 2).backward()
    assert_close(y, leaves64[0] * leaves64[1], torch.float32, "y")
    for name, a, b in zip(("grad x", "grad w"), leaves, leaves64):
        assert_close(a.grad, b.grad, torch.float32, name, chained=True)
    planned = len(toy_op.SCALE.plans)
    toy_op.scale(x, w)
    assert len(toy_op.SCALE.plans) == planned
    with pytest.raises(ValueError, match="w must have x's dtype"):
        toy_op.scale(x, w.double())
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        toy_op.scale([1.0], w)


def test_opcheck_toy_op(triton_backend, device):
    torch.library.opcheck(toy_op.SCALE.custom, (torch.randn(3, 8, device=device, requires_grad=True),
                                                torch.randn(8, device=device, requires_grad=True)))
