"""fuselab.bias_act vs the float64 reference: forward and every gradient, Triton kernels (interpreter on CPU)
and the PyTorch path, odd shapes, strided views, in place, bias-grad determinism, bad inputs, the bench suite."""

from __future__ import annotations

import math

import pytest
import torch

import fuselab
from fuselab.core.compile import compile_quietly
from fuselab.ops.bias_act import checks as bias_act_checks
from fuselab.ops.bias_act import launch as kernels
from fuselab.ops.bias_act import op as bias_act_op
from fuselab.ops.bias_act.checks import BiasActCall, BiasActGradCall
from fuselab.ops.bias_act.launch import BiasActTuning
from fuselab.ops.tuning import override
from fuselab.reference import bias_act as ref
from fuselab.testing import assert_close, poison_, tolerances

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ACTS = fuselab.ACTIVATIONS


@pytest.fixture(params=["triton", "torch"])
def backend(request):
    request.getfixturevalue(f"{request.param}_backend")
    return request.param


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().requires_grad_(True)


def _storage_slack(x64, b64, r64, alpha, activation, g64, dtype) -> torch.Tensor:
    """``g · (act'(stored) - act'(exact))`` per element: the backward reads the output (relu, relu2, sigmoid) or the
    pre-activation as the forward stored it, rounded to ``dtype``, where the float64 reference differentiates the
    exact value. One element's share is far inside the tolerance, but a bias gradient sums M of them (about
    sqrt(M) · ulp · |act''| on random data): its allowance adds the sum of this slack over the rows."""
    z = x64.detach()
    if r64 is not None:
        z = z + alpha * r64.detach()
    if b64 is not None:
        z = z + b64.detach()
    kind = ref.SAVED[activation]
    if kind == "nothing" or dtype == torch.float64:
        return torch.zeros_like(z)
    exact = ref.activation(z, activation) if kind == "output" else z
    stored = exact.to(dtype).double()
    return g64 * (ref.activation_grad(stored, activation) - ref.activation_grad(exact, activation))


def _check(x, bias, residual, alpha, activation, grad_fn=None):
    """Run fuselab.bias_act and the float64 reference on the same inputs; compare y and every gradient (each
    gradient allowed, beyond the dtype's tolerance, what storing the output or pre-activation in the dtype moves
    it: :func:`_storage_slack`)."""
    x, bias, residual = _leaf(x), _leaf(bias), _leaf(residual)
    y = fuselab.bias_act(x, bias, residual=residual, alpha=alpha, activation=activation)
    assert y.shape == x.shape and y.dtype == x.dtype
    x64 = _leaf(x.detach().double())
    b64 = None if bias is None else _leaf(bias.detach().double())
    r64 = None if residual is None else _leaf(residual.detach().double())
    y64 = ref.bias_act(x64, b64, r64, alpha, activation)
    assert_close(y, y64, x.dtype, "y")
    g = torch.randn(y.shape, dtype=y.dtype, device=y.device) if grad_fn is None else None
    if grad_fn is None:
        y.backward(g)
        y64.backward(g.double())
        g64 = g.double()
    else:  # e.g. .sum(): a stride-0 (expanded) upstream gradient
        grad_fn(y).backward()
        grad_fn(y64).backward()
        g64 = torch.ones_like(y64)
    _check_grads(x, bias, residual, x64, b64, r64, alpha, activation, g64)


def _check_grads(x, bias, residual, x64, b64, r64, alpha, activation, g64) -> None:
    slack = _storage_slack(x64, b64, r64, alpha, activation, g64, x.dtype)
    tol = tolerances(x.dtype, chained=True)
    column_sums = slack.reshape(math.prod(slack.shape[:-1]), slack.shape[-1]).sum(0).abs() if slack.dim() else slack
    for name, t, t64, extra in (("grad_x", x, x64, slack.abs()), ("grad_bias", bias, b64, column_sums),
                                ("grad_residual", residual, r64, abs(alpha) * slack.abs())):
        if t is not None:
            assert t.grad is not None, name
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape, name
            assert_close(t.grad, t64.grad, x.dtype, name, chained=True, atol=tol.atol + 2 * extra)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("activation", ACTS)
def test_forward_backward(backend, device, activation, dtype):
    x = torch.randn(5, 37, dtype=dtype, device=device)
    residual = torch.randn(5, 37, dtype=dtype, device=device)
    bias = torch.randn(37, dtype=dtype, device=device)
    _check(x, bias, residual, 0.7, activation)


def _nan_case(device, activation, impl):
    """y and the three gradients of ``impl`` on fp32 inputs with NaN in x at a few places."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 37, generator=gen).to(device)
    x[0, 3] = x[2, 36] = float("nan")
    r, b = torch.randn(3, 37, generator=gen).to(device), torch.randn(37, generator=gen).to(device)
    g = torch.randn(3, 37, generator=gen).to(device)
    x, r, b = (t.requires_grad_(True) for t in (x, r, b))
    y = impl(x, b, residual=r, alpha=0.7, activation=activation)
    y.backward(g)
    return y.detach(), x.grad, r.grad, b.grad


def _torch_formula(x, b, *, residual, alpha, activation):
    z = x + alpha * residual + b
    return {"relu": torch.relu(z), "relu2": torch.relu(z).square(), "none": z}[activation]


def _assert_nan_like_torch(device, activation, impl) -> None:
    """``impl``'s y and gradients on inputs with NaN: NaN where torch's are, the same values elsewhere."""
    got = _nan_case(device, activation, impl)
    want = _nan_case(device, activation, _torch_formula)
    for name, a, w in zip(("y", "grad_x", "grad_residual", "grad_bias"), got, want):
        assert torch.equal(a.isnan(), w.isnan()), name
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)


@pytest.mark.parametrize("activation", ["relu", "relu2", "none"])
def test_nan_propagates_like_torch(backend, device, activation):
    """NaN stays NaN through relu (max(z, 0) would hide it), and the gradients match torch's autograd."""
    _assert_nan_like_torch(device, activation, fuselab.bias_act)


@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("has_residual", [True, False])
@pytest.mark.parametrize("activation", ["none", "relu2", "sigmoid", "silu", "gelu"])
def test_optional_operands(triton_backend, device, activation, has_bias, has_residual):
    # covers every save path: nothing, output y, z written by the forward, x (+ bias) rebuilt in the backward
    x = torch.randn(3, 2, 50, dtype=torch.bfloat16, device=device)
    bias = torch.randn(50, dtype=torch.bfloat16, device=device) if has_bias else None
    residual = torch.randn(3, 2, 50, dtype=torch.bfloat16, device=device) if has_residual else None
    _check(x, bias, residual, -1.5, activation)


@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_odd_shapes(triton_backend, device, m, n, dtype):
    x = torch.randn(m, n, dtype=dtype, device=device)
    _check(x, torch.randn(n, dtype=dtype, device=device), torch.randn(m, n, dtype=dtype, device=device),
           0.5, "gelu_tanh")


def test_one_dim_input(triton_backend, device):
    _check(torch.randn(33, device=device), torch.randn(33, device=device), torch.randn(33, device=device),
           1.0, "silu")


@pytest.mark.parametrize("layout", ["inner_stride", "transposed", "rows_stride", "3d_unmergeable"])
def test_strided_views(backend, device, layout):
    if layout == "inner_stride":
        x = torch.randn(6, 80, device=device)[:, ::2]
        residual = torch.randn(6, 120, device=device)[:, 10:50]
    elif layout == "transposed":
        x = torch.randn(40, 6, device=device).t()
        residual = torch.randn(40, 6, device=device).t()
    elif layout == "rows_stride":
        x = torch.randn(12, 40, device=device)[::2]
        residual = torch.randn(6, 64, device=device)[:, :40]
    else:  # (2, 3, 40) whose leading dims cannot merge into rows without a copy
        x = torch.randn(3, 2, 40, device=device).transpose(0, 1)
        residual = torch.randn(2, 40, 3, device=device).permute(0, 2, 1)
    bias = torch.randn(80, device=device)[::2]
    assert not x.is_contiguous()
    _check(x, bias, residual, 0.3, "gelu", grad_fn=lambda y: (y * y).sum())


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_expanded_grad(triton_backend, device, activation):
    # y.sum() hands the backward a stride-0 gradient
    x = torch.randn(4, 3, 24, device=device)
    _check(x, torch.randn(24, device=device), torch.randn(4, 3, 24, device=device), 2.0, activation,
           grad_fn=lambda y: y.sum())


def test_only_residual_requires_grad(triton_backend, device):
    # LoRA with a frozen base: x (the base matmul output) needs no gradient, the residual branch does
    x = torch.randn(4, 16, device=device)
    residual = torch.randn(4, 16, device=device, requires_grad=True)
    bias = torch.randn(16, device=device)
    y = fuselab.bias_act(x, bias, residual=residual, alpha=0.25, activation="silu")
    g = torch.randn_like(y)
    y.backward(g)
    r64 = residual.detach().double().requires_grad_(True)
    ref.bias_act(x.double(), bias.double(), r64, 0.25, "silu").backward(g.double())
    assert_close(residual.grad, r64.grad, torch.float32, "grad_residual", chained=True)
    assert x.grad is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_inplace(backend, device, activation, dtype):
    x = torch.randn(7, 33, dtype=dtype, device=device)
    residual = torch.randn(7, 33, dtype=dtype, device=device)
    bias = torch.randn(33, dtype=dtype, device=device)
    expected = ref.bias_act(x.double(), bias.double(), residual.double(), 0.5, activation)
    buf = x.clone()
    out = fuselab.bias_act(buf, bias, residual=residual, alpha=0.5, activation=activation, inplace=True)
    assert out is buf
    assert_close(buf, expected, dtype, "in-place y")


@pytest.mark.parametrize("layout", ["strided_2d", "3d_unmergeable"])
def test_inplace_strided_leaves_gaps(backend, device, layout):
    storage = torch.randn(6, 64, device=device)
    if layout == "strided_2d":
        view = storage[:, 1::2]
    else:
        view = storage.view(2, 3, 64).transpose(0, 1)[:, :, 1::2]
    before = storage.clone()
    expected = ref.bias_act(view.double(), None, None, 1.0, "sigmoid")
    fuselab.bias_act(view, activation="sigmoid", inplace=True)
    assert_close(view, expected, torch.float32, "in-place view")
    untouched = torch.ones_like(storage, dtype=torch.bool)
    untouched[:, 1::2] = False
    assert torch.equal(storage[untouched], before[untouched])


def test_launchers_write_every_element(triton_backend, device):
    # poisoned outputs: an element a kernel forgets to write stays NaN and fails the comparison
    m, n = 45, 130
    x = torch.randn(m, n, dtype=torch.bfloat16, device=device)
    r = torch.randn(m, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, dtype=torch.float32, device=device)
    y = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    pre = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    operands = (x, b, r, 0.75)
    kernels.write(kernels.plan(BiasActCall("gelu_tanh", save_pre=True), operands), operands, y, pre)
    z64 = x.double() + 0.75 * r.double() + b.double()
    assert_close(pre, z64, torch.bfloat16, "pre")
    assert_close(y, ref.activation(z64, "gelu_tanh"), torch.bfloat16, "y")
    g = torch.randn(m, n, dtype=torch.bfloat16, device=device)
    gx = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    gr = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    gb = poison_(torch.empty(n, dtype=torch.float32, device=device))
    rows = kernels.bwd_partial_rows(m, n, torch.bfloat16, device)
    partial = poison_(torch.empty(rows, n, dtype=torch.float32, device=device))
    call = BiasActGradCall("gelu_tanh", torch.bfloat16, torch.bfloat16, torch.float32, True, True, True)
    operands = (g, pre, None, 0.75)
    kernels.write_grad(kernels.plan_grad(call, operands), operands, gx, gr, gb, partial)
    f64 = torch.float64  # the reference's backward formula from the saved pre-activation
    want_x, want_r, want_b = ref.bias_act_backward(g.double(), pre.double(), 0.75, "gelu_tanh", f64, f64, f64)
    assert_close(gx, want_x, torch.bfloat16, "grad_x", chained=True)
    assert_close(gr, want_r, torch.bfloat16, "grad_residual", chained=True)
    assert_close(gb, want_b, torch.bfloat16, "grad_bias", chained=True)


@pytest.mark.parametrize("flat_knob", [True, False], ids=["flat", "tiles"])
@pytest.mark.parametrize("int64", [False, True], ids=["int32", "int64"])
@pytest.mark.parametrize("m,n", [(4, 256), (3, 37)], ids=["even", "ragged"])
def test_forward_paths(triton_backend, device, monkeypatch, flat_knob, int64, m, n):
    """Contiguous operands take the flat kernel (a run of the flat [M*N] per program, bias column = offset mod N; no
    masks when the runs divide M*N), others the 2-D tiles; both with 32- and 64-bit offsets (forced here: normally
    past 2^31 elements) write every element of y and z (poisoned) with the float64 values."""
    if int64:
        monkeypatch.setattr(kernels, "needs_int64", lambda *tensors: True)
    x, r = (torch.randn(m, n, device=device) for _ in range(2))
    b = torch.randn(2 * n, device=device)[::2]  # a strided bias: the flat kernel reads column (offset mod N) * stride
    y, pre = (poison_(torch.empty(m, n, device=device)) for _ in range(2))
    # 64 fp32 per run: 256*4 divides, 37*3 does not
    operands = (x, b, r, 0.75)
    with override(BiasActTuning(fwd_flat=flat_knob, fwd_flat_tile_bytes=64 * 4)):
        plan = kernels.plan(BiasActCall("gelu_tanh", save_pre=True), operands)
        kernels.write(plan, operands, y, pre)
    flags = plan.launch.constexprs  # what the launch was given
    assert flags["FLAT"] is flat_knob and flags["INT64"] is int64
    assert flags["EVEN"] is (flat_knob and m * n % 64 == 0)
    z64 = x.double() + 0.75 * r.double() + b.double()
    assert_close(pre, z64, torch.float32, "pre")
    assert_close(y, ref.activation(z64, "gelu_tanh"), torch.float32, "y")


def test_bias_grad_deterministic(triton_backend, device):
    # several programs each reduce their rows into the partial buffer: the sum must not depend on timing
    m, n = 700, 48
    x = torch.randn(m, n, device=device)
    bias = torch.randn(n, device=device)
    g = torch.randn(m, n, device=device)
    grads = []
    for _ in range(2):
        b = bias.clone().requires_grad_(True)
        xx = x.clone().requires_grad_(True)
        fuselab.bias_act(xx, b, activation="gelu_tanh").backward(g)
        grads.append(b.grad)
    assert kernels.bwd_partial_rows(m, n, torch.float32, device) > 1
    # the equality can only fail on a GPU (the interpreter runs programs in order); the float64 comparison below
    # checks the multi-partial bias sum on CPU too. tests/test_gpu_stress.py repeats this with many programs.
    assert torch.equal(grads[0], grads[1])
    expected = (g.double() * ref.activation_grad(x.double() + bias.double(), "gelu_tanh")).sum(0)
    assert_close(grads[0], expected, torch.float32, "grad_bias", chained=True)


def test_fp64_gradcheck(triton_backend, device):
    x = torch.randn(3, 9, dtype=torch.float64, device=device, requires_grad=True)
    r = torch.randn(3, 9, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, device=device, requires_grad=True)
    f = lambda x, r, b: fuselab.bias_act(x, b, residual=r, alpha=0.3, activation="gelu_tanh")
    assert torch.autograd.gradcheck(f, (x, r, b), fast_mode=True)


EMPTY_SHAPES = [(0, 8), (3, 0), (2, 3, 0), (0,), (0, 0), (2, 0, 7)]
EMPTY_CASES = [("relu", True), ("gelu_tanh", False), ("gelu_tanh", True), ("none", True), ("sigmoid", False)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize(("activation", "has_residual"), EMPTY_CASES)
def test_empty_inputs(backend, device, shape, activation, has_residual):
    """No rows or an empty last dim: an empty y of x's shape and dtype, gradients of their inputs' shapes and
    dtypes, each element against the float64 reference (the bias gradient of no rows: zeros)."""
    x = torch.randn(shape, device=device)
    bias = torch.randn(shape[-1], dtype=torch.bfloat16, device=device)
    residual = torch.randn(shape, device=device) if has_residual else None
    _check(x, bias, residual, 0.5, activation)
    y = fuselab.bias_act(_leaf(x), _leaf(bias), residual=_leaf(residual), alpha=0.5, activation=activation)
    (y * 2).sum().backward()  # a summed upstream gradient: expanded, stride 0
    with torch.no_grad():
        same = x.clone()
        assert fuselab.bias_act(same, bias, residual=residual, alpha=0.5, activation=activation, inplace=True) is same
        assert same.shape == x.shape


@pytest.mark.parametrize("shape", [(3, 0), (2, 3, 0), (0, 5)], ids=str)
def test_empty_inputs_compiled(triton_backend, device, shape):
    """torch.compile(fullgraph=True) of forward and backward on empty inputs: shapes and every element against
    the float64 reference."""
    x, r = (torch.randn(shape, device=device, requires_grad=True) for _ in range(2))
    b = torch.randn(shape[-1], device=device, requires_grad=True)

    def forward(x, r, b):
        return fuselab.bias_act(x, b, residual=r, alpha=0.5, activation="gelu_tanh")

    torch._dynamo.reset()
    y = compile_quietly(forward, fullgraph=True)(x, r, b)
    y.sum().backward()  # the compiled graph's backward
    x64, r64, b64 = (_leaf(t.detach().double()) for t in (x, r, b))
    y64 = ref.bias_act(x64, b64, r64, 0.5, "gelu_tanh")
    y64.sum().backward()
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, y64, torch.float32, "y")
    for name, t, t64 in (("grad_x", x, x64), ("grad_residual", r, r64), ("grad_bias", b, b64)):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        assert_close(t.grad, t64.grad, torch.float32, name, chained=True)
    with torch.no_grad():
        h = torch.randn(shape, device=device)
        assert compile_quietly(lambda h, b: fuselab.bias_act(h, b, inplace=True), fullgraph=True)(h, b).shape == shape


def test_no_grad_fast_path_matches_autograd_path(triton_backend, device):
    x = torch.randn(9, 40, device=device)
    r = torch.randn(9, 40, device=device)
    b = torch.randn(40, device=device)
    with torch.no_grad():
        fast = fuselab.bias_act(x, b, residual=r, alpha=0.5, activation="silu")
    slow = fuselab.bias_act(x.requires_grad_(True), b, residual=r, alpha=0.5, activation="silu")
    assert torch.equal(fast, slow.detach())


@pytest.fixture
def planned(monkeypatch):
    """The forward's and the backward's planners spied on, on fresh caches: yields the lists of the calls each
    planned (``{"forward": [...], "backward": [...]}``; the in-place op's plans are the forward's)."""
    fuselab.ops.clear()  # plans cached by earlier tests
    made = {"forward": [], "backward": []}
    for name, cls, real in (("forward", bias_act_op.BiasActForward, kernels.plan),
                            ("backward", bias_act_op.BiasActBackward, kernels.plan_grad)):
        spy = staticmethod(lambda call, operands, real=real, name=name: made[name].append(call) or real(call, operands))
        monkeypatch.setattr(cls, "plan", spy)
    yield made
    fuselab.ops.clear()


@pytest.mark.parametrize(("activation", "has_residual"), [("relu", True), ("gelu_tanh", False), ("gelu_tanh", True),
                                                        ("none", True)])
def test_cached_backward(triton_backend, device, planned, activation, has_residual):
    """Repeated eager backwards of one layout reuse the plan an earlier one made; a gradient of another layout, or a
    forward of another signature (x at another alignment), gets its own plan; all match float64."""
    m, n = 6, 40

    def run(x, grad_fn=None):
        residual = torch.randn(m, n, device=device) if has_residual else None
        _check(x, torch.randn(n, device=device), residual, 0.5, activation, grad_fn)

    for _ in range(3):
        run(torch.randn(m, n, device=device))
    assert len(planned["backward"]) == 1  # the later backwards found the first one's plan
    run(torch.randn(m, n, device=device), grad_fn=lambda y: (y * torch.ones_like(y).t().contiguous().t()).sum())
    assert len(planned["backward"]) == 2  # a transposed upstream gradient: its own plan
    run(torch.randn(m, n, device=device), grad_fn=lambda y: y[:, ::2].sum())  # a gradient laid out as the first's
    assert len(planned["backward"]) == 2
    run(torch.randn(m * n + 1, device=device)[1:].view(m, n))  # x at another 16-byte alignment
    run(torch.randn(m, n, device=device))
    assert len(planned["backward"]) == 3 and len(planned["forward"]) == 2


@pytest.mark.parametrize("needs_grad", [False, True])
@pytest.mark.parametrize(("activation", "has_residual"), [("relu", True), ("gelu_tanh", True), ("silu", False)])
def test_cached_forward(triton_backend, device, monkeypatch, planned, activation, has_residual, needs_grad):
    """Repeated eager calls of one layout skip the checks and reuse the plan of the first, with and without
    autograd; every result and gradient matches float64; an operand at another alignment, a 3-D x and a residual
    that must be copied into rows (on every call) get their own plan. The backend switch is read on every call."""
    validated = []
    real_validate = bias_act_checks.validate
    monkeypatch.setattr(bias_act_checks, "validate", lambda *args: validated.append(1) or real_validate(*args))
    m, n = 6, 40

    def run(x, residual=None):
        bias = torch.randn(n, device=device)
        if residual is None and has_residual:
            residual = torch.randn(x.shape, device=device)
        if needs_grad:
            _check(x, bias, residual, 0.5, activation)
            return
        y = fuselab.bias_act(x, bias, residual=residual, alpha=0.5, activation=activation)
        y64 = ref.bias_act(x.double(), bias.double(), None if residual is None else residual.double(), 0.5,
                           activation)
        assert_close(y, y64, x.dtype, "y")

    for _ in range(3):
        run(torch.randn(m, n, device=device))
    assert len(planned["forward"]) == 1 and len(validated) == 1  # the later calls were neither checked nor planned
    run(torch.randn(m * n + 1, device=device)[1:].view(m, n))  # x at another 16-byte alignment
    run(torch.randn(2, 3, n, device=device))  # 3-D x: its own signature
    run(torch.randn(2, 3, n, device=device))
    assert len(planned["forward"]) == 3 and len(validated) == 3
    if has_residual:  # rows that cannot be viewed: copied on every call, planned once
        for _ in range(2):
            run(torch.randn(2, 3, n, device=device), torch.randn(3, 2, n, device=device).transpose(0, 1))
        assert len(planned["forward"]) == 4 and len(validated) == 4
    plans = len(planned["forward"])
    with fuselab.backend.forced("torch"):  # the backend switch is read on every call, cache or not
        monkeypatch.setattr(bias_act_op.BiasActForward, "forward", None)  # the Triton path must not run
        run(torch.randn(m, n, device=device))
    assert len(planned["forward"]) == plans


def test_cached_forward_still_checks(triton_backend, device):
    """A call that differs from a planned one only in what the checks reject still raises, naming the argument."""
    x = torch.randn(4, 8, device=device)
    fuselab.bias_act(x, torch.randn(8, device=device), residual=torch.randn(4, 8, device=device))
    fuselab.bias_act(x, torch.randn(8, device=device), residual=torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="bias"):
        fuselab.bias_act(x, torch.randn(9, device=device), residual=torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="residual"):
        fuselab.bias_act(x, torch.randn(8, device=device), residual=torch.randn(5, 8, device=device))
    with pytest.raises(TypeError, match="alpha"):
        fuselab.bias_act(x, torch.randn(8, device=device), residual=torch.randn(4, 8, device=device), alpha=True)
    with pytest.raises(ValueError, match="activation"):
        fuselab.bias_act(x, torch.randn(8, device=device), residual=torch.randn(4, 8, device=device),
                         activation=["relu"])


# ---------------------------------------------------------------- bad inputs


def _bad_cases(device):
    x = torch.randn(4, 8, device=device)
    return [
        (TypeError, "x", lambda: fuselab.bias_act([1.0, 2.0])),
        (TypeError, "x", lambda: fuselab.bias_act(torch.ones(4, 8, dtype=torch.int32, device=device))),
        (TypeError, "bias", lambda: fuselab.bias_act(x, torch.ones(8, dtype=torch.int64, device=device))),
        (ValueError, "bias", lambda: fuselab.bias_act(x, torch.randn(7, device=device))),
        (ValueError, "bias", lambda: fuselab.bias_act(x, torch.randn(1, 8, device=device))),
        (ValueError, "residual", lambda: fuselab.bias_act(x, residual=torch.randn(4, 7, device=device))),
        (ValueError, "residual", lambda: fuselab.bias_act(x, residual=torch.randn(8, device=device))),
        (ValueError, "gelu_tanh", lambda: fuselab.bias_act(x, activation="tanh")),
        (TypeError, "alpha", lambda: fuselab.bias_act(x, alpha=torch.tensor(1.0))),
        (ValueError, "inplace", lambda: fuselab.bias_act(x.clone().requires_grad_(True), inplace=True)),
        (ValueError, "inplace", lambda: fuselab.bias_act(x.clone(), torch.randn(8, device=device,
                                                                                 requires_grad=True),
                                                         inplace=True)),
        (ValueError, "x", lambda: fuselab.bias_act(torch.tensor(1.0, device=device))),
    ]


@pytest.mark.parametrize("index", range(12))
def test_bad_inputs(triton_backend, device, index):
    exc, word, call = _bad_cases(device)[index]
    with pytest.raises(exc, match=word):
        call()


def test_mixed_devices(device):
    x = torch.randn(4, 8, device="meta")
    with pytest.raises(ValueError, match="bias"):
        fuselab.bias_act(x, torch.randn(8, device=device))


# ---------------------------------------------------------------- bench suite


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_suite_fuselab_provider_passes_check(triton_backend, device, mode):
    from fuselab.bench.check import check
    from fuselab.bench.spec import CaseQuery
    from fuselab.bench.suites import get_spec

    spec = get_spec("bias_act")
    cases = [c for c in spec.cases(CaseQuery(device_type="cpu", dtypes=(torch.bfloat16,), modes=(mode,)))
             if c.params["shape"] == (64, 256)]
    assert {c.params["activation"] for c in cases} == {"relu", "gelu_tanh"}
    provider = spec.provider("fuselab")
    for case in cases:
        result = check(spec, case, provider.build(case), device=device)
        assert result.ok, (case.key, result)
        assert (result.grad_error is None) == (mode == "fwd")


def test_suite_byte_model():
    from fuselab.bench.suites.bias_act import case_bytes

    m, n = 16384, 4096
    assert case_bytes(m, n, 2, "relu", "fwd") == (3 * m * n + n) * 2
    assert case_bytes(m, n, 2, "relu", "bwd") == (4 * m * n + n) * 2
    assert case_bytes(m, n, 2, "relu", "fwd+bwd") == (7 * m * n + 2 * n) * 2
    assert case_bytes(m, n, 2, "gelu_tanh", "fwd+bwd") == (8 * m * n + 2 * n) * 2


# ---------------------------------------------------------------- GPU only


@pytest.mark.big_memory
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(65536, 512), (16384, 4096), (262144, 1024)])
@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_large_shapes_gpu(shape, activation):
    m, n = shape
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    _check(x, torch.randn(n, dtype=torch.bfloat16, device="cuda"), torch.randn(m, n, dtype=torch.bfloat16,
                                                                                    device="cuda"),
           0.5, activation)


@pytest.mark.big_memory
@pytest.mark.gpu
def test_over_2_31_elements_gpu():
    """2^31 + 2^10 elements (4 GiB of bf16 per tensor): the flat forward's offsets and the backward's rows are 64-bit;
    the last rows (past 2^31) are checked against float64, the whole output for NaNs (poisoned before)."""
    m, n = 2**31 // 1024 + 1, 1024
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    y = poison_(torch.empty_like(x))
    operands = (x, b, None, 1.0)
    kernels.write(kernels.plan(BiasActCall("relu"), operands), operands, y, None)
    assert not y.isnan().any()
    tail = slice(m - 3, m)
    assert_close(y[tail], ref.activation(x[tail].double() + b.double(), "relu"), torch.bfloat16, "y past 2^31")
    del y
    g = torch.randn_like(x)
    xl = x.requires_grad_(True)
    out = fuselab.bias_act(xl, b.requires_grad_(True), activation="relu")
    out.backward(g)
    want = g[tail].double() * (out[tail].double() > 0)
    assert_close(xl.grad[tail], want, torch.bfloat16, "grad_x past 2^31", chained=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("shape", [(3, 37), (1000, 4096), (257, 1000)])
def test_cuda_backend_gpu(activation, dtype, shape):
    from fuselab.cuda import bias_act as cuda_bias_act

    m, n = shape
    # alpha exact in every dtype: x + alpha*r + b is then exact in float32, and relu's mask at z = 0 is the
    # reference's (0.7 rounds to float32 in the kernel: where x + b = -0.7 r exactly, z is a few ulp off zero)
    alpha = 0.75
    x = torch.randn(m, n, dtype=dtype, device="cuda", requires_grad=True)
    r = torch.randn(m, n, dtype=dtype, device="cuda", requires_grad=True)
    b = torch.randn(n, dtype=dtype, device="cuda", requires_grad=True)
    y = cuda_bias_act(x, b, residual=r, alpha=alpha, activation=activation)
    g = torch.randn_like(y)
    y.backward(g)
    x64, r64, b64 = (t.detach().double().requires_grad_(True) for t in (x, r, b))
    y64 = ref.bias_act(x64, b64, r64, alpha, activation)
    y64.backward(g.double())
    assert_close(y, y64, dtype, "y")
    _check_grads(x, b, r, x64, b64, r64, alpha, activation, g.double())


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "relu2"])
def test_cuda_backend_nan_gpu(activation):
    from fuselab.cuda import bias_act as cuda_bias_act

    _assert_nan_like_torch(torch.device("cuda"), activation, cuda_bias_act)


@pytest.mark.gpu
def test_cuda_backend_strided_gpu():
    from fuselab.cuda import bias_act as cuda_bias_act

    x = torch.randn(64, 300, device="cuda")[:, 5:261]
    r = torch.randn(256, 64, device="cuda").t()
    b = torch.randn(256, device="cuda")
    y = cuda_bias_act(x, b, residual=r, alpha=2.0, activation="gelu")
    assert_close(y, ref.bias_act(x.double(), b.double(), r.double(), 2.0, "gelu"), torch.float32, "y")


@pytest.mark.gpu
def test_cuda_extension_raises_on_bad_arguments_gpu():
    # the extension's own checks raise (a check whose message c10 assembled from parts once crashed the process)
    from fuselab.cuda._bias_act import _extension

    ext = _extension()
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="saved must be"):
        ext.bias_act_backward(x, torch.randn(3, 8, device="cuda"), None, 1.0, 1, True, False, True, 0)
    with pytest.raises(RuntimeError, match="residual must"):
        ext.bias_act_forward(x, None, torch.randn(4, 7, device="cuda"), 1.0, 1, False, None, 0)
    with pytest.raises(RuntimeError, match="unknown activation id"):
        ext.bias_act_forward(x, None, None, 1.0, 99, False, None, 0)
    with pytest.raises(RuntimeError, match="unknown activation id"):
        ext.fused_linear(x, torch.randn(2, 8, device="cuda"), None, -1)
