"""fuselab.gemm (the fused linear layer) vs the float64 reference: forward and every gradient (x, weight, bias,
residual, LoRA A and B), every kept kind (output, pre-activation, ReLU bits), odd and unaligned shapes, strided and
transposed operands, the split reduction and its determinism, dZ materialised or formed on load, TMA descriptors
under the interpreter, bad inputs, opcheck and torch.compile.

Bounds: every element within ``atol + rtol·|ref|``. ``rtol`` is the output dtype's one rounding
(:func:`fuselab.testing.tolerances`); ``atol`` is derived per element from the magnitudes the result sums
(:func:`_bound`): the fp32 accumulation (n + 2 roundings of 2^-24 times Σ|a·b|), operands rounded to the dtype
before a product (dZ, T = s·x·Aᵀ, U = s·dZ·B: 2u of their magnitude), and what the kept output or pre-activation,
rounded to the dtype, moves act' by (:func:`_slack`)."""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab.ops.gemm import LoRA, gemm
from fuselab.ops.gemm.spec import GemmTuning, TileConfig
from fuselab.ops.tuning import override
from fuselab.reference import gemm as ref
from fuselab.reference.bias_act import SAVED, activation, activation_grad
from fuselab.testing import assert_close, tolerances

U32 = 2.0**-24
#: twice the unit roundoff: one rounding of an operand to the dtype before a product, with room for the product's
UNIT = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


@pytest.fixture(params=["triton", "torch"])
def backend(request):
    request.getfixturevalue(f"{request.param}_backend")
    return request.param


@pytest.fixture(params=["cublas", "fused"])
def plan(request):
    """The backward's plans: dZ in one elementwise pass and cuBLAS products (the default), or every gradient GEMM in
    the Triton kernel with dZ formed as dY is loaded."""
    with override(GemmTuning(backward=request.param)):
        yield request.param


def _leaf(t: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    if t is None:
        return None
    return t.detach().to(dtype or t.dtype).requires_grad_(True)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.abs() @ b.abs()


def _bound(mag: torch.Tensor, n: int, dtype: torch.dtype, rounded: torch.Tensor | float = 0.0) -> torch.Tensor:
    """atol per element: fp32 accumulation over ``n`` terms of total magnitude ``mag``, plus ``rounded`` (the
    magnitude of the part whose operands were rounded to ``dtype`` first) times 2u."""
    acc_u = 2.0**-53 if dtype == torch.float64 else U32
    return (n + 2) * acc_u * mag + UNIT[dtype] * rounded


def _slack(z64: torch.Tensor, g64: torch.Tensor, act: str, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """|g · (act'(kept) - act'(exact))|: the backward reads the output or the pre-activation as the forward stored
    it, rounded to ``dtype``, where the reference differentiates the exact value."""
    if kind in ("nothing", "mask") or dtype == torch.float64:
        return torch.zeros_like(z64)
    exact = activation(z64, act) if kind == "output" else z64
    return (g64 * (activation_grad(exact.to(dtype).double(), act) - activation_grad(exact, act))).abs()


def _run(x, w, b=None, r=None, *, alpha=1.0, act="none", keep="auto", lora=None, out_dtype=None, grad=None):
    """fuselab.gemm and the float64 reference on leaves of the same values; returns (y, y64, grads, grads64, g64)
    with the gradients of (x, w, b, r, lora.a, lora.b) (None where the input is None or frozen)."""
    xs = (x, w, b, r, None if lora is None else lora.a, None if lora is None else lora.b)
    leaves = [None if t is None else (_leaf(t) if t.requires_grad else t.detach()) for t in xs]
    leaves64 = [None if t is None else (_leaf(t, torch.float64) if t.requires_grad else t.detach().double())
                for t in xs]
    lo = None if lora is None else LoRA(leaves[4], leaves[5], lora.scale)
    lo64 = None if lora is None else LoRA(leaves64[4], leaves64[5], lora.scale)
    y = gemm(leaves[0], leaves[1], leaves[2], residual=leaves[3], alpha=alpha, activation=act, keep=keep, lora=lo,
             out_dtype=out_dtype)
    y64 = ref.linear(leaves64[0], leaves64[1], leaves64[2], residual=leaves64[3], alpha=alpha, activation=act,
                     lora=lo64)
    # the incoming gradient as y's dtype holds it (the reference gets the same rounded values)
    g64 = torch.randn_like(y64).to(y.dtype).double() if grad is None else grad.double()
    needs = [t is not None and t.requires_grad for t in leaves]
    if any(needs):
        y.backward(g64.to(y.dtype) if grad is None else grad)
        y64.backward(g64)
    grads = [t.grad if n else None for t, n in zip(leaves, needs)]
    grads64 = [t.grad if n else None for t, n in zip(leaves64, needs)]
    return y, y64, grads, grads64, g64, leaves64


def _check_all(x, w, b=None, r=None, *, alpha=1.0, act="none", keep="auto", lora=None, out_dtype=None):
    """Run :func:`_run` and compare the output and every gradient within the bounds of the module doc."""
    dtype = x.dtype
    y, y64, grads, grads64, g64, (x64, w64, b64, r64, a64, bb64) = _run(
        x, w, b, r, alpha=alpha, act=act, keep=keep, lora=lora, out_dtype=out_dtype)
    x2 = x64.detach().reshape(-1, x.shape[-1])
    w2 = w64.detach()
    k = x.shape[-1]
    z = x2 @ w2.t()
    mag = _mm(x2, w2.t())
    lora_mag = 0.0
    t64 = None
    if lora is not None:
        t64 = lora.scale * (x2 @ a64.detach().t())
        lora_mag = _mm(t64, bb64.detach().t()) + abs(lora.scale) * _mm(_mm(x2, a64.detach().t()), bb64.detach().t())
        z = z + t64 @ bb64.detach().t()
        mag = mag + lora_mag
    if b64 is not None:
        z, mag = z + b64.detach(), mag + b64.detach().abs()
    if r64 is not None:
        r2 = r64.detach().reshape(z.shape)
        z, mag = z + alpha * r2, mag + abs(alpha) * r2.abs()
    out = out_dtype or dtype
    assert y.dtype == out and y.shape == y64.shape
    # the activation moves an error in z by at most |act'| <= 1.2 (gelu's peak); y rounded once (rtol)
    assert_close(y, y64, out, "y", atol=1.2 * _bound(mag, k + 2, dtype, lora_mag).view(y64.shape))
    if grads64[:6] == [None] * 6:
        return
    g2 = g64.reshape(z.shape)
    kind = "nothing" if act == "none" else (SAVED[act] if keep == "auto" else keep)
    # what rounding the kept tensor moves act' by, plus act' evaluated in fp32 (1 + tanh(u) cancels for z << 0)
    slack = _slack(z, g2, act, kind, dtype) + (0.0 if dtype == torch.float64 else 4 * U32 * (1 + z.abs()) * g2.abs())
    dz = (g2 * activation_grad(activation(z, act) if SAVED[act] == "output" else z, act)) if act != "none" else g2
    dzm = dz.abs() + slack
    m, n = z.shape
    rtol = tolerances(dtype).rtol
    checks = []
    if grads64[0] is not None:
        lora_dx = 0.0 if lora is None else abs(lora.scale) * _mm(_mm(dzm, bb64.detach()), a64.detach())
        checks.append(("dx", grads[0], grads64[0], (_bound(_mm(dzm, w2) + lora_dx, n, dtype, _mm(dzm, w2) + 3 * lora_dx)
                                                    + _mm(slack, w2)).view(grads64[0].shape)))
    if grads64[1] is not None:
        checks.append(("dw", grads[1], grads64[1], _bound(_mm(dzm.t(), x2), m, dtype, _mm(dzm.t(), x2))
                       + _mm(slack.t(), x2)))
    if grads64[2] is not None:
        # dZ may be materialised in the dtype (a residual's gradient, GemmTuning.materialize_dz) before the sums
        checks.append(("db", grads[2], grads64[2], _bound(dzm.sum(0), m, dtype, dzm.sum(0)) + slack.sum(0)))
    if grads64[3] is not None:
        checks.append(("dr", grads[3], grads64[3], (UNIT[dtype] * abs(alpha) * dzm + abs(alpha) * slack)
                       .view(grads64[3].shape)))
    if lora is not None and grads64[4] is not None:
        u = abs(lora.scale) * _mm(dzm, bb64.detach())
        checks.append(("dA", grads[4], grads64[4], _bound(_mm(u.t(), x2), m, dtype, 3 * _mm(u.t(), x2))))
    if lora is not None and grads64[5] is not None:
        tm = t64.abs() if t64 is not None else 0.0
        checks.append(("dB", grads[5], grads64[5], _bound(_mm(dzm.t(), tm), m, dtype, 3 * _mm(dzm.t(), tm))
                       + _mm(slack.t(), tm)))
    for name, got, want, atol in checks:
        assert got is not None, f"{name} missing"
        assert got.shape == want.shape, name
        assert_close(got, want, got.dtype, name, atol=atol, rtol=rtol)


def _inputs(m, k, n, dtype, *, bias=True, residual=False, scale=1.0):
    x = torch.randn(m, k).to(dtype).requires_grad_()
    w = (torch.randn(n, k) * (scale / max(k, 1) ** 0.5)).to(dtype).requires_grad_()
    b = torch.randn(n).to(dtype).requires_grad_() if bias else None
    r = torch.randn(m, n).to(dtype).requires_grad_() if residual else None
    return x, w, b, r


# ---------------------------------------------------------------------------------------------- forward + backward
CASES = [("relu", "auto"), ("relu", "mask"), ("relu", "pre"), ("gelu_tanh", "auto"), ("sigmoid", "auto"),
         ("silu", "pre"), ("relu2", "output"), ("gelu", "auto"), ("none", "auto")]


@pytest.mark.parametrize(("act", "keep"), CASES)
def test_bf16_forward_backward(backend, plan, act, keep):
    x, w, b, r = _inputs(37, 29, 45, torch.bfloat16, residual=True)
    _check_all(x, w, b, r, alpha=0.5, act=act, keep=keep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("act", "keep"), [("relu", "mask"), ("gelu_tanh", "auto"), ("none", "auto")])
def test_fp32_fp16_forward_backward(triton_backend, plan, dtype, act, keep):
    x, w, b, r = _inputs(21, 35, 19, dtype, residual=act == "none")
    _check_all(x, w, b, r, act=act, keep=keep)


# ---------------------------------------------------------------------------------------------- shapes and layouts
@pytest.mark.parametrize(("m", "k", "n"), [(5, 13, 7), (3, 367, 17), (9, 16, 1), (1, 1, 1), (33, 64, 20)])
def test_odd_and_unaligned_shapes(triton_backend, plan, m, k, n):
    x, w, b, r = _inputs(m, k, n, torch.bfloat16, residual=True)
    _check_all(x, w, b, r, act="relu", keep="mask")


@pytest.mark.parametrize("shape", [(0, 8, 5), (4, 8, 0), (4, 0, 5)])
def test_empty(backend, shape):
    m, k, n = shape
    x, w, b, _ = _inputs(m, k, n, torch.float32)
    y = gemm(x, w, b, activation="relu")
    assert y.shape == (m, n)
    y.sum().backward()
    want = torch.relu(b.detach().expand(m, n)) if k == 0 else torch.empty(m, n)
    assert torch.equal(y.detach(), want)
    assert torch.equal(b.grad, (b.detach() > 0).float() * m if k == 0 else torch.zeros(n))
    assert w.grad.shape == w.shape and not w.grad.abs().sum()


def test_leading_dims_and_one_dim(triton_backend):
    x, w, b, r = _inputs(6, 24, 10, torch.bfloat16, residual=True)
    _check_all(x.detach().view(2, 3, 24).requires_grad_(), w, b, r.detach().view(2, 3, 10).requires_grad_(),
               act="gelu_tanh")
    _check_all(x.detach()[0].requires_grad_(), w, b, act="relu")


def test_strided_and_transposed_operands(triton_backend, plan):
    """x as a column slice of a padded buffer (row stride 48 for K = 37, the layout a producer writes so that rows
    stay 16-byte aligned), weight as a transposed view, bias strided, residual transposed, the gradient an expand."""
    m, k, n = 20, 37, 24
    buf = torch.randn(m, 48).to(torch.bfloat16)
    x = buf[:, 3:3 + k].requires_grad_()
    wt = (torch.randn(k, n) / 6).to(torch.bfloat16)
    w = wt.t().requires_grad_()
    b = torch.randn(2 * n).to(torch.bfloat16)[::2].requires_grad_()
    r = torch.randn(n, m).to(torch.bfloat16).t().requires_grad_()
    assert not x.is_contiguous() and not w.is_contiguous() and b.stride(0) == 2 and not r.is_contiguous()
    _check_all(x, w, b, r, act="relu", keep="mask")
    y = gemm(x, w, b, activation="silu")
    y.backward(torch.ones(1, 1, dtype=y.dtype).expand(m, n))  # a gradient with zero strides
    y64 = ref.linear(_leaf(x, torch.float64), w.detach().double(), b.detach().double(), activation="silu")
    assert_close(y, y64, torch.bfloat16, "y", atol=1e-2)


def test_out_dtype(triton_backend):
    x, w, b, _ = _inputs(17, 40, 12, torch.bfloat16)
    _check_all(x, w, b, act="relu", out_dtype=torch.float32)


# ---------------------------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("rank", [4, 16])
def test_lora(backend, plan, rank):
    x, w, b, _ = _inputs(19, 40, 24, torch.bfloat16)
    lora = LoRA((torch.randn(rank, 40) / 6).to(torch.bfloat16).requires_grad_(),
                torch.randn(24, rank).to(torch.bfloat16).requires_grad_(), 0.5)
    _check_all(x, w, b, act="relu", keep="mask", lora=lora)


def test_lora_frozen_base_and_input(triton_backend):
    """The usual LoRA fine-tuning: base weight and bias frozen; and an input that needs no gradient (U = s·dZ·B
    from its own launch)."""
    x, w, b, _ = _inputs(19, 40, 24, torch.bfloat16)
    w.requires_grad_(False)
    b.requires_grad_(False)
    lora = LoRA((torch.randn(8, 40) / 6).to(torch.bfloat16).requires_grad_(),
                torch.randn(24, 8).to(torch.bfloat16).requires_grad_(), 2.0)
    _check_all(x, w, b, act="gelu_tanh", lora=lora)
    x.requires_grad_(False)
    _check_all(x, w, b, act="none", lora=lora)


# ---------------------------------------------------------------------------------------------- variants
def test_split_reduction_and_determinism(triton_backend):
    """Weight and bias gradients with the reduction over tokens split (forced: tiny programs per SM stand-in): equal
    to the reference, bit-identical across two runs, and within rounding of the unsplit result."""
    x, w, b, _ = _inputs(200, 24, 20, torch.float32)
    unsplit = _run(x, w, b, act="relu", keep="mask")[2]
    tuning = GemmTuning(programs_per_sm=64, min_split_steps=1, weight_grad=TileConfig(32, 32, 16, 4, 2),
                        backward="fused")
    with override(tuning):
        _check_all(x, w, b, act="relu", keep="mask")
        first = _run(x, w, b, act="relu", keep="mask", grad=torch.ones(200, 20))[2]
        second = _run(x, w, b, act="relu", keep="mask", grad=torch.ones(200, 20))[2]
    for a, c in zip(first[:3], second[:3]):
        assert torch.equal(a, c)
    ref_grads = _run(x, w, b, act="relu", keep="mask", grad=torch.ones(200, 20))[2]
    for a, c in zip(first[:3], ref_grads[:3]):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    assert unsplit[1] is not None


def test_split_is_used(triton_backend):
    """The forced tuning above does split the weight gradient (a plan with split > 1)."""
    from fuselab.ops.gemm.launch import GemmSpec, plan

    spec = GemmSpec(p=20, q=24, r=200, dtype=torch.float32, device=torch.device("cpu"), n_along_p=True)
    with override(GemmTuning(programs_per_sm=64, min_split_steps=1, weight_grad=TileConfig(32, 32, 16, 4, 2))):
        p = plan(spec)
    assert p.split > 1 and p.k_per_split * p.split >= 200 // p.tile.block_r


@pytest.mark.parametrize("kind", ["mask", "output", "pre", "x0"])
def test_elementwise_pass(triton_backend, kind):
    """The backward's elementwise pass alone: dZ = dY ⊙ (kept bits, act'(y), act'(z)) or dY ⊙ x0 on strided dY, and
    its column sums from several programs' partials (the last to arrive adds them in program order): dZ to one
    rounding, the sums to fp32 accumulation, bit-identical over two runs."""
    from fuselab.ops.gemm.steps import elementwise, prologue_flags

    m, n = 203, 45
    g = torch.randn(n, m).to(torch.bfloat16).t()  # a transposed view: strided rows
    z = torch.randn(m, n)
    act = "gelu_tanh" if kind == "pre" else "relu"
    kept = {"mask": ref.pack_bits(z > 0), "output": torch.relu(z).to(torch.bfloat16), "pre": z.to(torch.bfloat16),
            "x0": None}[kind]
    x0 = torch.randn(m, n).to(torch.bfloat16) if kind == "x0" else None
    factor = (x0.double() if kind == "x0" else
              activation_grad(kept.double(), act) if kind in ("output", "pre") else (z > 0).double())
    want = g.double() * factor
    sums = []
    for _ in range(2):
        dz, db = torch.empty(m, n, dtype=torch.bfloat16), torch.empty(n)
        elementwise(g, dz, s=kept, pro=prologue_flags(kind, act) if kind != "x0" else None, g0=x0, db=db)
        sums.append(db)
    assert_close(dz, want, torch.bfloat16, "dz", atol=4 * U32 * (1 + want.abs()))
    assert_close(sums[0], want.sum(0), torch.float32, "db", atol=(m + 2) * U32 * want.abs().sum(0))
    assert torch.equal(sums[0], sums[1])


def test_elementwise_pass_uses_several_partials(triton_backend):
    """The shapes above give the column sums more than one partial per column block (the tickets are exercised)."""
    from fuselab.ops.gemm.launch import pass_plan
    from fuselab.ops.gemm.spec import PassSpec

    p = pass_plan(PassSpec(m=203, n=45, dtype=torch.bfloat16, device=torch.device("cpu"), pro_mask=True,
                           col_sum=True))
    assert p.grid[0] > 1 and p.grid[0] * p.rows_per_program >= 203


@pytest.mark.parametrize("flag", [{"pro_mask": True}, {"pro_act": 1}, {"pro_x0": True}])
def test_elementwise_pass_refuses_a_prologue_with_the_rotation(flag):
    """The pass rotates pairs loaded where they lie, with no prologue: a plan asking for both is refused by name."""
    from fuselab.ops.gemm.launch import pass_plan
    from fuselab.ops.gemm.spec import PassSpec, RopeSpec

    rope = RopeSpec(pair_stride=8, half=8, head_dim=16, rot_cols=32, use_table=True)
    with pytest.raises(ValueError, match="without a prologue"):
        pass_plan(PassSpec(m=64, n=48, dtype=torch.bfloat16, device=torch.device("cpu"), rope=rope, **flag))


def test_register_operand_plans_run_the_mma_synchronously():
    """Launches whose A operand is computed in registers (a prologue) keep their MMA synchronous (SYNC_DOT: Triton 3.6
    lets the next step overwrite the registers of an asynchronous wgmma, triton-lang/triton#9433); a plain operand
    or the row sums alone do not."""
    from fuselab.ops.gemm.launch import GemmSpec, plan

    base = dict(p=256, q=256, r=256, dtype=torch.bfloat16, device=torch.device("cpu"))
    for flags, sync in ((dict(pro_mask=True), True), (dict(pro_act=1), True), (dict(pro_x0=True), True),
                        (dict(pro_mask=True, write_a=True), True), (dict(row_sum=True, n_along_p=True), False),
                        ({}, False)):
        assert dict(plan(GemmSpec(**base, **flags)).constexprs)["SYNC_DOT"] is sync, flags


def test_gemm_tuning_rejects_an_unknown_plan():
    with pytest.raises(ValueError, match=r"GemmTuning\.backward must be one of cublas, fused"):
        GemmTuning(backward="cuda")
    with pytest.raises(ValueError, match=r"GemmTuning\.qkv_forward must be one of"):
        GemmTuning(qkv_forward="triton")


@pytest.mark.parametrize(("act", "keep"), [("relu", "mask"), ("gelu_tanh", "auto")])
def test_materialized_dz(triton_backend, act, keep):
    x, w, b, _ = _inputs(33, 24, 40, torch.bfloat16)
    with override(GemmTuning(materialize_dz=True, backward="fused")):
        _check_all(x, w, b, act=act, keep=keep)


def test_tma_descriptors_under_interpreter(triton_backend, plan, monkeypatch):
    """The TMA variant (host descriptors, aligned operands) on the interpreter, forward and backward."""
    import fuselab.ops.gemm.launch as launch

    monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    x, w, b, _ = _inputs(40, 32, 48, torch.bfloat16)
    ops = launch.GemmOperands(a=x.detach(), b=w.detach().t(), c=torch.empty(40, 48))
    spec = launch.spec_of(ops)
    assert (spec.a_tma, spec.b_tma) == (1, 2)
    _check_all(x, w, b, act="relu", keep="mask")


def test_mask_bits_match_reference_packing(triton_backend):
    """The kept ReLU bits are the reference packing of z > 0 (one bit per element, 8 per byte)."""
    from fuselab.ops.gemm.op import FORWARD

    x, w, b, _ = _inputs(9, 16, 21, torch.float32)
    y, kept, _ = FORWARD.eager(x.detach(), w.detach(), b.detach(), None, None, None, 1.0, 1.0, "relu", "mask",
                               torch.float32)[0]
    assert_close(y, torch.relu(x.detach().double() @ w.detach().double().t() + b.detach().double()), what="y")
    z = x.detach() @ w.detach().t() + b.detach()
    assert kept.dtype == torch.uint8 and kept.shape == (9, 3)
    assert torch.equal(kept, ref.pack_bits(z > 0))
    assert torch.equal(ref.unpack_bits(kept, 21), z > 0)


def test_fp64_gradcheck(triton_backend, plan):
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    r = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: gemm(a[0], a[1], a[2], residual=a[3], alpha=0.7, activation="silu"),
                                    (x, w, b, r), fast_mode=True)


def test_prepared_call_repeats_the_plan(triton_backend):
    """A second call with the same key skips the checks and the plan and gives the same values."""
    from fuselab.ops.gemm.op import FORWARD

    fuselab.ops.clear()
    x, w, b, _ = _inputs(11, 16, 9, torch.float32)
    with torch.no_grad():
        first = gemm(x, w, b, activation="relu")
        assert len(FORWARD.launches) == 1
        second = gemm(x, w, b, activation="relu")
    assert torch.equal(first, second)


# ---------------------------------------------------------------------------------------------- errors
def _bad_calls():
    x, w = torch.randn(4, 8), torch.randn(5, 8)
    lora_ok = LoRA(torch.randn(2, 8), torch.randn(5, 2), 1.0)
    return [
        (lambda: gemm(x.long(), w), TypeError, "x must have a floating dtype"),
        (lambda: gemm(x, "w"), TypeError, "weight must be a torch.Tensor"),
        (lambda: gemm(x, torch.randn(5, 7)), ValueError, r"weight must have shape \(out_features, in_features\)"),
        (lambda: gemm(x, w.double()), TypeError, "weight must have x's dtype"),
        (lambda: gemm(x, w, torch.randn(4)), ValueError, r"bias must have shape \(out_features,\) = \(5,\)"),
        (lambda: gemm(x, w, residual=torch.randn(4, 4)), ValueError, r"residual must have shape \(4, 5\)"),
        (lambda: gemm(x, w, activation="tanh"), ValueError, "activation must be one of"),
        (lambda: gemm(x, w, keep="bits"), ValueError, "keep must be one of"),
        (lambda: gemm(x, w, activation="gelu", keep="mask"), ValueError, "keep='mask' needs activation='relu'"),
        (lambda: gemm(x, w, activation="silu", keep="output"), ValueError, "keep='output' cannot"),
        (lambda: gemm(x, w, alpha="1"), TypeError, "alpha must be a Python float"),
        (lambda: gemm(x, w, out_dtype=torch.int32), TypeError, "out_dtype must be None or a floating dtype"),
        (lambda: gemm(x, w, lora=(1, 2)), TypeError, "lora must be a"),
        (lambda: gemm(x, w, lora=LoRA(torch.randn(2, 7), torch.randn(5, 2))), ValueError, "lora.a must have shape"),
        (lambda: gemm(x, w, lora=LoRA(torch.randn(2, 8), torch.randn(5, 3))), ValueError, "lora.b must have shape"),
        (lambda: gemm(x, w, lora=LoRA(torch.randn(200, 8), torch.randn(5, 200))), ValueError, "1 <= r <= 128"),
        (lambda: gemm(x, w, lora=LoRA(lora_ok.a.double(), lora_ok.b)), TypeError, "lora.a must have x's dtype"),
        (lambda: gemm(x, w, lora=LoRA(lora_ok.a, lora_ok.b, "s")), TypeError, "lora.scale must be a Python float"),
        (lambda: gemm(torch.tensor(1.0), w), ValueError, "x must have at least one dim"),
    ]


@pytest.mark.parametrize("index", range(19))
def test_bad_inputs(backend, index):
    call, exc, match = _bad_calls()[index]
    with pytest.raises(exc, match=match):
        call()


def test_bad_input_count():
    assert len(_bad_calls()) == 19


def test_mixed_devices():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to mix devices")
    with pytest.raises(ValueError, match="must share a device"):
        gemm(torch.randn(4, 8, device="cuda"), torch.randn(5, 8))


# ---------------------------------------------------------------------------------------------- torch.library, compile
def test_opcheck(triton_backend):
    from fuselab.ops.gemm.op import BACKWARD, FORWARD

    x, w, b = torch.randn(6, 16), torch.randn(8, 16), torch.randn(8)
    r = torch.randn(6, 8)
    la, lb = torch.randn(4, 16), torch.randn(8, 4)
    for args in [(x, w, b, r, None, None, 0.5, 1.0, "relu", "mask", torch.float32),
                 (x.requires_grad_(), w.requires_grad_(), b, None, la, lb, 1.0, 0.5, "gelu_tanh", "pre",
                  torch.float32)]:
        torch.library.opcheck(FORWARD.custom, args, test_utils=("test_schema", "test_faketensor",
                                                               "test_autograd_registration"))
    g = torch.randn(6, 8)
    saved = torch.randn(6, 8)
    torch.library.opcheck(BACKWARD.custom, (g, x.detach(), w.detach(), saved, None, None, None, 1.0, 1.0, "gelu",
                                            "pre", [True, True, True, False, False, False]),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.slow
def test_compile_fullgraph(triton_backend):
    from fuselab.core.compile import compile_quietly

    x, w, b, r = _inputs(12, 16, 8, torch.float32, residual=True)

    def step(x, w, b, r):
        return gemm(x, w, b, residual=r, activation="relu", keep="mask").square().sum()

    loss = compile_quietly(step, fullgraph=True)(x, w, b, r)
    loss.backward()
    x64, w64, b64, r64 = (_leaf(t, torch.float64) for t in (x, w, b, r))
    ref.linear(x64, w64, b64, residual=r64, activation="relu").square().sum().backward()
    for t, t64 in ((x, x64), (w, w64), (b, b64), (r, r64)):
        torch.testing.assert_close(t.grad.double(), t64.grad, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize(("m", "k", "n"), [(65536, 512, 256), (4096, 367, 512), (8192, 1024, 1), (2048, 4096, 4096)])
def test_large_shapes_gpu(plan, m, k, n):
    torch.manual_seed(1)
    x, w, b, _ = (t.cuda().detach().requires_grad_() if t is not None else None
                  for t in _inputs(m, k, n, torch.bfloat16))
    _check_all(x, w, b, act="relu", keep="mask")


@pytest.mark.gpu
@pytest.mark.parametrize("keep", ["mask", "output"])
def test_bias_grad_deterministic_gpu(plan, keep):
    """The weight and bias gradients of a split reduction are bit-identical across runs on the GPU (the partials
    summed in a fixed order; no float atomics)."""
    torch.manual_seed(2)
    x = torch.randn(65536, 256, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(128, 256, device="cuda") / 16).to(torch.bfloat16).requires_grad_()
    b = torch.randn(128, device="cuda", dtype=torch.bfloat16).requires_grad_()
    g = torch.randn(65536, 128, device="cuda", dtype=torch.bfloat16)
    results = []
    for _ in range(3):
        w.grad = b.grad = None
        gemm(x, w, b, activation="relu", keep=keep).backward(g)
        results.append((w.grad.clone(), b.grad.clone()))
    for dw, db in results[1:]:
        assert torch.equal(dw, results[0][0]) and torch.equal(db, results[0][1])


@pytest.mark.gpu
@pytest.mark.parametrize(("keep", "rank", "materialize"), [("mask", 0, False), ("output", 0, False),
                                                           ("output", 16, False), ("mask", 0, True)])
def test_relu_gradients_at_size_gpu(plan, keep, rank, materialize):
    """8192x1024x512 relu (with a rank-16 LoRA; with dZ materialised), every gradient at a size where the GEMM's steps
    pipeline: against float64 products of the kernel's own ReLU mask (y > 0: a z within rounding of 0 cannot flip the
    reference) and, with LoRA, of T = s·(x Aᵀ) rounded to bf16 as the kernel keeps it. On Triton 3.6 a pipelined MMA
    whose operand is computed in registers reads the next step's values (triton-lang/triton#9433), and a tile read
    both by registers and by the MMA gets a buffer too few: errors of 5-15% of the largest gradient, which these
    bounds reject."""
    if materialize:
        with override(GemmTuning(backward=plan, materialize_dz=True)):
            _relu_gradients_at_size(keep, rank)
    else:
        _relu_gradients_at_size(keep, rank)


def _relu_gradients_at_size(keep: str, rank: int) -> None:
    torch.manual_seed(3)
    m, k, n, dt = 8192, 1024, 512, torch.bfloat16
    x, w, b = (t.cuda().detach() for t in _inputs(m, k, n, dt)[:3])
    a, bb = ((torch.randn(rank, k) / k**0.5).to(dt).cuda(), (torch.randn(n, rank) / rank**0.5).to(dt).cuda()) \
        if rank else (None, None)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, *((a, bb) if rank else ()))]
    y = gemm(*leaves[:3], activation="relu", keep=keep, lora=LoRA(leaves[3], leaves[4], 0.5) if rank else None)
    g = torch.randn_like(y)
    y.backward(g)
    x6, w6, b6 = (t.double() for t in (x, w, b))
    z6, mag = x6 @ w6.t() + b6, _mm(x6, w6.t()) + b6.abs()
    if rank:
        t6 = (0.5 * (x6 @ a.double().t())).to(dt).double()
        z6, mag = z6 + t6 @ bb.double().t(), mag + _mm(t6, bb.double().t()) + 0.5 * _mm(_mm(x6, a.double().t()),
                                                                                       bb.double().t())
    assert_close(y, torch.relu(z6), dt, "y", atol=_bound(mag, k + rank, dt, mag))
    dz6 = g.double() * (y > 0).double()
    dzm = dz6.abs()
    checks = [("dx", leaves[0].grad, dz6 @ w6, _mm(dzm, w6)), ("dw", leaves[1].grad, dz6.t() @ x6, _mm(dzm.t(), x6)),
              ("db", leaves[2].grad, dz6.sum(0), dzm.sum(0))]
    if rank:
        u6 = 0.5 * (dz6 @ bb.double())
        checks[0] = ("dx", leaves[0].grad, dz6 @ w6 + u6 @ a.double(),
                     _mm(dzm, w6) + 3 * 0.5 * _mm(_mm(dzm, bb.double()), a.double()))
        checks += [("dA", leaves[3].grad, u6.t() @ x6, 3 * _mm(u6.t().abs(), x6)),
                   ("dB", leaves[4].grad, dz6.t() @ t6, 3 * _mm(dzm.t(), t6))]
    for name, got, want, magnitude in checks:
        assert_close(got, want, dt, name, atol=_bound(magnitude, m, dt, magnitude))
