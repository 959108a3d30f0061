"""fuselab.nn.FusedLinear / LoRALinear vs nn.Linear + the eager formula (float64), forward and gradients;
fused_linear's eager training fast path (one autograd node); torch.compile(fullgraph=True) of an MLP built
from them."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

import fuselab
from fuselab.nn import FusedLinear, LoRALinear, fused_linear
from fuselab.nn.linear import LINEAR
from fuselab.reference.bias_act import activation as act_ref
from fuselab.testing import assert_close


@pytest.fixture(params=["triton", "torch"])
def backend(request):
    request.getfixturevalue(f"{request.param}_backend")
    return request.param


def _f64_params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().double().requires_grad_(True) for k, v in module.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh", "none"])
def test_fused_linear_matches_linear(backend, device, activation, dtype):
    layer = FusedLinear(24, 40, activation=activation, device=device, dtype=dtype)
    x = torch.randn(2, 5, 24, dtype=dtype, device=device, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 5, 40) and y.dtype == dtype
    p = _f64_params(layer)
    x64 = x.detach().double().requires_grad_(True)
    y64 = act_ref(nn.functional.linear(x64, p["weight"], p["bias"]), activation)
    assert_close(y, y64, dtype, "y", chained=True)  # the matmul output is rounded, then y
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    assert_close(x.grad, x64.grad, dtype, "grad_x", chained=True)
    assert_close(layer.weight.grad, p["weight"].grad, dtype, "grad_weight", chained=True)
    assert_close(layer.bias.grad, p["bias"].grad, dtype, "grad_bias", chained=True)


def test_fused_linear_is_a_drop_in_for_linear(backend, device):
    linear = nn.Linear(16, 8, device=device)
    layer = FusedLinear(16, 8, activation="silu", device=device)
    layer.load_state_dict(linear.state_dict())
    shared = FusedLinear.from_linear(linear, activation="silu")
    assert shared.weight is linear.weight
    x = torch.randn(6, 16, device=device)
    expected = nn.functional.silu(linear(x))
    with torch.no_grad():  # inference: the epilogue runs in place on the matmul output
        assert_close(layer(x), expected, torch.float32, "loaded")
        assert_close(shared(x), expected, torch.float32, "shared")
    assert_close(layer(x), expected, torch.float32, "with grad")


def test_fused_linear_without_bias(backend, device):
    layer = FusedLinear(12, 20, bias=False, activation="gelu", device=device)
    assert layer.bias is None
    x = torch.randn(3, 12, device=device)
    y = layer(x)
    y.sum().backward()
    w64 = layer.weight.detach().double().requires_grad_(True)
    y64 = act_ref(x.double() @ w64.t(), "gelu")
    y64.sum().backward()
    assert_close(y, y64, torch.float32, "y")
    assert_close(layer.weight.grad, w64.grad, torch.float32, "grad_weight", chained=True)


#: grad_fn class name of fused_linear's eager training fast path
FAST_NODE = LINEAR.function.__name__ + "Backward"
FAST_CASES = [(a, torch.float32) for a in fuselab.ACTIVATIONS] + [("relu", torch.bfloat16),
                                                                   ("gelu_tanh", torch.bfloat16)]


def _check_against_linear(x, w, b, activation, dtype, make_grad=torch.randn_like, fn=fused_linear, node=FAST_NODE):
    """fn(x, w, b) vs float64 nn.Linear + reference activation: output, then the grads of the leaves that
    require grad (others must stay None). ``node``: the autograd node fn must make (the fast path, not the
    custom-op fallback)."""
    y = fn(x, w, b, activation)
    assert y.grad_fn is not None and node in y.grad_fn.name()
    assert y.shape == (*x.shape[:-1], w.shape[0]) and y.dtype == dtype
    linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(w)
        if b is not None:
            linear.bias.copy_(b)
    linear.requires_grad_(False)
    linear.weight.requires_grad_(w.requires_grad)
    if b is not None:
        linear.bias.requires_grad_(b.requires_grad)
    x64 = x.detach().double().requires_grad_(x.requires_grad)
    y64 = act_ref(linear(x64), activation)
    assert_close(y, y64, dtype, "y", chained=True)  # matmul rounded, then y
    g = make_grad(y)
    y.backward(g)
    y64.backward(g.double())
    for name, t, t64 in (("x", x, x64), ("weight", w, linear.weight), ("bias", b, linear.bias)):
        if t is None:
            continue
        if t.requires_grad:
            assert_close(t.grad, t64.grad, dtype, f"grad_{name}", chained=True)
        else:
            assert t.grad is None, name


@pytest.mark.parametrize("x_grad", [True, False], ids=["x_grad", "x_const"])
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", [(7, 13), (2, 5, 13)], ids=["2d", "3d"])
@pytest.mark.parametrize(("activation", "dtype"), FAST_CASES,
                         ids=[f"{a}-{str(d).removeprefix('torch.')}" for a, d in FAST_CASES])
def test_fused_linear_fast_path_matches_linear(triton_backend, device, activation, dtype, shape, has_bias, x_grad):
    w = (torch.randn(33, 13, device=device) / 13**0.5).to(dtype).requires_grad_(True)
    b = torch.randn(33, device=device).to(dtype).requires_grad_(True) if has_bias else None
    x = torch.randn(*shape, device=device).to(dtype).requires_grad_(x_grad)
    _check_against_linear(x, w, b, activation, dtype)


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", ["none", "relu", "gelu_tanh"])
def test_fused_linear_cached_epilogue(triton_backend, device, monkeypatch, activation, has_bias):
    """Repeated 2-D steps reuse the epilogue's forward plan and its backward plan of the first step; a strided
    upstream gradient gets a backward plan of its own; a 3-D x its own forward plan, and a backward planned anew on
    every step (2-D x only are cached). All match float64."""
    from fuselab.ops.bias_act import launch
    from fuselab.ops.bias_act import op as bias_act_op

    fuselab.ops.clear()  # plans cached by earlier tests
    calls, forwards = [], []
    real_grad, real_plan = launch.plan_grad, launch.plan
    monkeypatch.setattr(bias_act_op.BiasActBackward, "plan",
                        staticmethod(lambda *args: calls.append(1) or real_grad(*args)))
    monkeypatch.setattr(launch, "plan", lambda *args: forwards.append(1) or real_plan(*args))

    def step(make_grad=torch.randn_like, x_shape=(7, 13)):
        w = (torch.randn(33, 13, device=device) / 13**0.5).requires_grad_(True)
        b = torch.randn(33, device=device).requires_grad_(True) if has_bias else None
        _check_against_linear(torch.randn(x_shape, device=device, requires_grad=True), w, b, activation,
                              torch.float32, make_grad)

    for _ in range(3):
        step()
    launches = activation != "none" or has_bias  # "none" without bias has nothing to launch, nothing to plan
    assert len(calls) == launches  # the first step planned the backward, the next two reused it
    assert len(forwards) == launches  # and the epilogue of the forward
    step(lambda y: torch.randn(y.shape[1], y.shape[0], device=y.device).t())
    step()
    assert len(calls) == 2 * launches
    step(x_shape=(2, 3, 13))  # 3-D x: its own forward plan, cached, then reused; backwards planned on every step
    step(x_shape=(2, 3, 13))
    assert len(forwards) == 2 * launches and len(calls) == 4 * launches


@pytest.mark.parametrize("activation", ["none", "relu", "silu"])
def test_fused_linear_fast_path_strided_and_empty(triton_backend, device, activation):
    w = torch.randn(33, 13, device=device, requires_grad=True)
    b = torch.randn(33, device=device, requires_grad=True)

    def transposed(y: torch.Tensor) -> torch.Tensor:
        return torch.randn(tuple(reversed(y.shape)), device=device).transpose(0, -1)

    # x and grad_y non-contiguous: 2-D transposed, 3-D whose rows cannot be viewed (reshape copies)
    x = torch.randn(13, 7, device=device).t().requires_grad_(True)
    _check_against_linear(x, w, b, activation, torch.float32, make_grad=transposed)
    w.grad = b.grad = None
    x = torch.randn(5, 2, 13, device=device).transpose(0, 1).requires_grad_(True)
    _check_against_linear(x, w, b, activation, torch.float32, make_grad=transposed)
    for shape in ((0, 13), (2, 0, 13)):  # M == 0: zero weight and bias grads
        w.grad = b.grad = None
        x = torch.randn(shape, device=device, requires_grad=True)
        fused_linear(x, w, b, activation).sum().backward()
        assert x.grad.shape == shape
        assert torch.count_nonzero(w.grad) == 0 and torch.count_nonzero(b.grad) == 0


@pytest.mark.parametrize("frozen", ["weight", "bias", "weight+bias"])
def test_fused_linear_fast_path_frozen_parameters(triton_backend, device, frozen):
    w = torch.randn(33, 13, device=device, requires_grad="weight" not in frozen)
    b = torch.randn(33, device=device, requires_grad="bias" not in frozen)
    x = torch.randn(7, 13, device=device, requires_grad=True)
    _check_against_linear(x, w, b, "gelu", torch.float32)


def test_fused_linear_fast_path_inplace_ops(triton_backend, device):
    # the output is no view (a Function's view output forbids in-place ops); saved x/y get the usual check
    w = torch.randn(33, 13, device=device, requires_grad=True)
    x = torch.randn(2, 5, 13, device=device, requires_grad=True)
    y = fused_linear(x, w, None, "silu")
    assert type(y.grad_fn).__name__ == FAST_NODE
    y.mul_(2.0).sum().backward()
    w64 = w.detach().double().requires_grad_(True)
    (2.0 * act_ref(x.detach().double() @ w64.t(), "silu")).sum().backward()
    assert_close(w.grad, w64.grad, torch.float32, "grad_weight", chained=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # relu saved its output
        fused_linear(x, w, None, "relu").mul_(2.0).sum().backward()
    x1 = x * 1.0
    y = fused_linear(x1, w, None, "silu")
    x1.mul_(2.0)  # x is saved for the weight gradient
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_fused_linear_fast_path_create_graph(triton_backend, device):
    w = (torch.randn(33, 13, device=device) / 13**0.5).requires_grad_(True)
    x = torch.randn(7, 13, device=device, requires_grad=True)
    (gx,) = torch.autograd.grad(fused_linear(x, w, None, "gelu_tanh").sum(), x, create_graph=True)
    (gx_ref,) = torch.autograd.grad(act_ref(x.double() @ w.double().t(), "gelu_tanh").sum(), x)
    assert_close(gx, gx_ref, torch.float32, "grad_x with create_graph", chained=True)


def test_fused_linear_fallbacks_keep_the_custom_op_path(triton_backend, device):
    w = torch.randn(33, 13, device=device, requires_grad=True)
    x = torch.randn(7, 13, device=device)
    with torch.no_grad():  # inference: in place, no autograd
        assert fused_linear(x, w, None, "relu").grad_fn is None
    b64 = torch.randn(33, device=device, dtype=torch.float64, requires_grad=True)  # bias of another dtype
    y = fused_linear(x, w, b64, "relu")
    assert type(y.grad_fn).__name__ != FAST_NODE
    y.sum().backward()
    assert b64.grad is not None and w.grad is not None
    y1 = fused_linear(torch.randn(13, device=device), w, None, "relu")  # 1-D x
    assert y1.shape == (33,) and type(y1.grad_fn).__name__ != FAST_NODE


def test_fused_linear_torch_backend_skips_fast_path(torch_backend, device):
    w = torch.randn(33, 13, device=device, requires_grad=True)
    y = fused_linear(torch.randn(7, 13, device=device), w, None, "relu")
    assert type(y.grad_fn).__name__ != FAST_NODE


def _lora_reference(lora: LoRALinear, x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    scaling = lora.alpha / lora.rank  # the LoRA convention, not the module's own attribute
    h = x @ p["base.weight"].t() + p["base.bias"] + scaling * (x @ p["lora_A"].t()) @ p["lora_B"].t()
    return act_ref(h, lora.activation)


def _assert_summed_grad(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """A weight gradient sums products of rounded low-rank intermediates over all tokens, with cancellation: its
    error scales with the largest element (the operands' size), not with each (possibly cancelled) element."""
    tol = fuselab.testing.tolerances(dtype, chained=True)
    assert_close(got, ref, dtype, what, chained=True, atol=max(tol.rtol * ref.abs().max().item(), tol.atol))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("freeze_base", [True, False])
def test_lora_linear_matches_formula(backend, device, freeze_base, dtype):
    base = nn.Linear(32, 24, device=device, dtype=dtype)
    lora = LoRALinear(base, rank=4, alpha=8.0, activation="gelu_tanh", freeze_base=freeze_base)
    assert torch.count_nonzero(lora.lora_B) == 0  # LoRA convention
    with torch.no_grad():  # a non-zero B, else the branch (and grad of A) would be trivially zero
        lora.lora_B.normal_()
    assert base.weight.requires_grad == (not freeze_base)
    x = torch.randn(3, 7, 32, dtype=dtype, device=device, requires_grad=True)
    y = lora(x)
    p = {k: v.detach().double().requires_grad_(True) for k, v in
         (("base.weight", base.weight), ("base.bias", base.bias), ("lora_A", lora.lora_A), ("lora_B", lora.lora_B))}
    x64 = x.detach().double().requires_grad_(True)
    y64 = _lora_reference(lora, x64, p)
    assert_close(y, y64, dtype, "y", chained=True)  # two matmuls rounded, then y
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    assert_close(x.grad, x64.grad, dtype, "grad_x", chained=True)
    _assert_summed_grad(lora.lora_A.grad, p["lora_A"].grad, dtype, "grad_A")
    _assert_summed_grad(lora.lora_B.grad, p["lora_B"].grad, dtype, "grad_B")
    if freeze_base:
        assert base.weight.grad is None and base.bias.grad is None
    else:
        _assert_summed_grad(base.weight.grad, p["base.weight"].grad, dtype, "grad_W")
        assert_close(base.bias.grad, p["base.bias"].grad, dtype, "grad_b", chained=True)


def test_lora_linear_starts_as_base(backend, device):
    base = nn.Linear(10, 6, device=device)
    lora = LoRALinear(copy.deepcopy(base), rank=2, alpha=4.0, activation="relu")
    x = torch.randn(5, 10, device=device)
    with torch.no_grad():
        assert_close(lora(x), torch.relu(base(x)), torch.float32, "initial LoRA output")


def test_bad_arguments(device):
    with pytest.raises(ValueError, match="activation"):
        FusedLinear(4, 4, activation="tanh")
    with pytest.raises(ValueError, match="in_features"):
        FusedLinear(0, 4)
    with pytest.raises(TypeError, match="base"):
        LoRALinear(nn.Conv1d(2, 2, 1), rank=1)
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(nn.Linear(4, 4), rank=0)
    with pytest.raises(ValueError, match="activation"):
        LoRALinear(nn.Linear(4, 4), rank=1, activation="swish")
    with pytest.raises(ValueError, match="bias"):
        fused_linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4))


class _MLP(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.l1 = FusedLinear(13, 32, activation="relu", device=device)
        self.l2 = LoRALinear(nn.Linear(32, 16, device=device), rank=4, alpha=8.0, activation="gelu_tanh")
        self.l3 = FusedLinear(16, 8, activation="silu", device=device)
        with torch.no_grad():
            self.l2.lora_B.normal_()

    def forward(self, x):
        return self.l3(self.l2(self.l1(x)))


def test_torch_compile_fullgraph_mlp(triton_backend, device):
    torch._dynamo.reset()
    model = _MLP(device)
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(24, 13, device=device)
    y = model(x)
    yc = compiled(x)
    assert_close(yc, y.detach().double(), torch.float32, "compiled forward")
    y.square().sum().backward()
    yc.square().sum().backward()
    for (name, p), (_, pc) in zip(model.named_parameters(), compiled_model.named_parameters()):
        if p.requires_grad:
            assert_close(pc.grad, p.grad.double(), torch.float32, f"compiled grad {name}", chained=True)
        else:
            assert pc.grad is None
    with torch.no_grad():  # the inference graph (in-place epilogue) compiles too
        assert_close(compiled(x), model(x).double(), torch.float32, "compiled no-grad forward")
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mlp_suite_fuselab_provider_passes_check(triton_backend, device, dtype):
    from fuselab.bench.check import check
    from fuselab.bench.spec import CaseQuery
    from fuselab.bench.suites import get_spec

    spec = get_spec("mlp")
    (case,) = spec.cases(CaseQuery(device_type="cpu", dtypes=(dtype,), modes=("fwd+bwd",)))
    result = check(spec, case, spec.provider("fuselab").build(case), device=device)
    if dtype == torch.float32:
        assert result.ok, result
    else:
        # bf16 vs float64 over 4 relu layers: every provider (eager included) is off by a few percent in the
        # weight gradients (relu masks flip where bf16 rounding moves z across 0); the forward must pass, and the
        # gradients must be as close to float64 as eager PyTorch's own bf16 gradients on the same inputs
        assert result.output_error <= result.tolerance, result
        args = spec.make_inputs(case, device)
        ours = check(spec, case, spec.provider("fuselab").build(case), args=args, device=device)
        eager = check(spec, case, spec.provider("eager").build(case), args=args, device=device)
        assert ours.grad_error is not None and eager.grad_error is not None
        assert ours.grad_error <= max(ours.tolerance, 2 * eager.grad_error), (ours, eager)
        assert ours.grad_error < 0.1, ours  # a few percent, not a wrong gradient


# ---------------------------------------------------------------- backend="cuda": one C++ autograd node per layer
CUDA_NODE = "FusedLinearFunction"  # CppNode<fused_linear_impl::FusedLinearFunction>
CUDA_CASES = [(a, torch.float32) for a in fuselab.ACTIVATIONS] + [
    ("relu", torch.bfloat16), ("gelu_tanh", torch.bfloat16), ("silu", torch.float16)]


def _cuda_fused_linear(x, w, b, activation):
    from fuselab.cuda import fused_linear as cuda_fused_linear

    return cuda_fused_linear(x, w, b, activation)


def test_cuda_fused_linear_rejects_bad_arguments():
    from fuselab.cuda import fused_linear as cuda_fused_linear

    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match="backend"):
        FusedLinear(4, 8, backend="cpp")
    with pytest.raises(TypeError, match="x must be float32"):
        cuda_fused_linear(torch.ones(2, 4, dtype=torch.int32), w)
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        cuda_fused_linear(torch.randn(2, 4), w.double())
    with pytest.raises(ValueError, match="weight"):
        cuda_fused_linear(torch.randn(2, 5), w)
    with pytest.raises(ValueError, match="bias must be"):
        cuda_fused_linear(torch.randn(2, 4), w, torch.randn(4))
    with pytest.raises(ValueError, match="activation must be one of"):
        cuda_fused_linear(torch.randn(2, 4), w, None, "tanh")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        cuda_fused_linear(torch.randn(2, 4), w)
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        FusedLinear(4, 8, backend="cuda")(torch.randn(2, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("x_grad", [True, False], ids=["x_grad", "x_const"])
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", [(7, 13), (2, 5, 13), (1, 13), (13,)], ids=["2d", "3d", "1row", "1d"])
@pytest.mark.parametrize(("activation", "dtype"), CUDA_CASES,
                         ids=[f"{a}-{str(d).removeprefix('torch.')}" for a, d in CUDA_CASES])
def test_cuda_fused_linear_matches_linear_gpu(activation, dtype, shape, has_bias, x_grad):
    w = (torch.randn(40, 13, device="cuda") / 13**0.5).to(dtype).requires_grad_(True)  # N = 40: vector path
    b = torch.randn(40, device="cuda").to(dtype).requires_grad_(True) if has_bias else None
    x = torch.randn(*shape, device="cuda").to(dtype).requires_grad_(x_grad)
    _check_against_linear(x, w, b, activation, dtype, fn=_cuda_fused_linear, node=CUDA_NODE)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "relu", "gelu"])
def test_cuda_fused_linear_strided_frozen_and_inplace_gpu(activation):
    w = torch.randn(33, 13, device="cuda", requires_grad=True)  # N = 33: the one-element path
    b = torch.randn(33, device="cuda", requires_grad=True)

    def transposed(y: torch.Tensor) -> torch.Tensor:
        return torch.randn(tuple(reversed(y.shape)), device="cuda").transpose(0, -1)

    check = functools.partial(_check_against_linear, fn=_cuda_fused_linear, node=CUDA_NODE)
    x = torch.randn(13, 7, device="cuda").t().requires_grad_(True)
    check(x, w, b, activation, torch.float32, make_grad=transposed)
    x = torch.randn(5, 2, 13, device="cuda").transpose(0, 1).requires_grad_(True)
    w.grad = b.grad = None
    check(x, w, b, activation, torch.float32, make_grad=transposed)
    frozen = torch.randn(33, 13, device="cuda")
    b.grad = None
    check(torch.randn(7, 13, device="cuda", requires_grad=True), frozen, b, activation, torch.float32)
    y = _cuda_fused_linear(torch.randn(2, 5, 13, device="cuda"), w, b, activation)
    if activation == "relu":  # the output is saved: modifying it in place is caught by the version check
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.mul_(2.0).sum().backward()
    else:  # the output is no view: in-place ops on it are allowed
        y.mul_(2.0).sum().backward()


@pytest.mark.gpu
def test_fused_linear_cuda_backend_trains_like_auto_gpu():
    torch.manual_seed(0)
    layers = [FusedLinear(i, o, activation=a, device="cuda") for i, o, a in ((13, 64, "relu"), (64, 32, "gelu_tanh"),
                                                                            (32, 8, "none"))]
    twins = [FusedLinear.from_linear(layer, activation=layer.activation, backend="cuda") for layer in layers]
    assert "backend='cuda'" in repr(twins[0])
    x = torch.randn(256, 13, device="cuda")
    y_auto, y_cuda = x, x
    for layer, twin in zip(layers, twins):
        y_auto, y_cuda = layer(y_auto), twin(y_cuda)
    assert_close(y_cuda, y_auto.detach().double(), torch.float32, "forward")
    grads = []
    for y in (y_auto, y_cuda):
        for layer in layers:
            layer.zero_grad()
        y.square().sum().backward()
        grads.append([p.grad.clone() for layer in layers for p in layer.parameters()])
    for g_auto, g_cuda in zip(*grads):
        assert_close(g_cuda, g_auto.double(), torch.float32, "parameter grad", chained=True)


@pytest.mark.gpu
def test_cuda_fused_linear_errors_gpu():
    # the C++ checks fail first; the wrapper then names the argument
    w = torch.randn(8, 4, device="cuda")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        _cuda_fused_linear(torch.randn(2, 4), w.cpu(), None, "relu")
    with pytest.raises(ValueError, match="weight must be on x's device"):
        _cuda_fused_linear(torch.randn(2, 4), w, None, "relu")
    with pytest.raises(TypeError, match="x must be float32"):
        _cuda_fused_linear(torch.randn(2, 4, device="cuda", dtype=torch.float64), w.double(), None, "none")
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        _cuda_fused_linear(torch.randn(2, 4, device="cuda"), w, torch.randn(8, device="cuda").half(), "relu")
    with pytest.raises(ValueError, match="x must be"):
        _cuda_fused_linear(torch.randn(2, 5, device="cuda"), w, None, "none")
    with pytest.raises(ValueError, match="activation must be one of"):
        _cuda_fused_linear(torch.randn(2, 4, device="cuda"), w, None, "swish")
