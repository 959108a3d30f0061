"""The GEMM family's other fused ops against their float64 references: the DCNv2 cross layer (full and low rank,
every gradient), the QKV projection with RoPE in the epilogue (against ``fuselab.apply_rope`` after a plain
projection and against an independent complex rotation, every layout and option), and the optimizer step that writes
the low-precision copy of fp32 master weights (``cast_update_``).

Bounds as in ``tests/ops/test_gemm.py``: ``atol`` per element from the magnitudes each result sums (fp32
accumulation, operands rounded to the dtype before a product), ``rtol`` the output dtype's one rounding."""

from __future__ import annotations

import pytest
import torch

from fuselab.ops.gemm.dcn import dcn_cross
from fuselab.ops.gemm.spec import GemmTuning
from fuselab.ops.tuning import override
from fuselab.reference import gemm as ref
from fuselab.testing import assert_close, tolerances

U32 = 2.0**-24
UNIT = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
#: the plans under test: the Triton kernel everywhere, and the default (cuBLAS products around the elementwise pass)
PLANS = {"fused": GemmTuning(backward="fused", qkv_forward="fused"), "cublas": GemmTuning()}


@pytest.fixture(params=list(PLANS))
def plan(request):
    with override(PLANS[request.param]):
        yield request.param


@pytest.fixture(params=["triton", "torch"])
def backend(request):
    request.getfixturevalue(f"{request.param}_backend")
    return request.param


def _leaves(*ts, dtype=None):
    return [None if t is None else t.detach().to(dtype or t.dtype).requires_grad_(True) for t in ts]


def _mm(a, b):
    return a.abs() @ b.abs()


def _atol(mag, n, dtype, rounded=0.0):
    return (n + 2) * U32 * mag + UNIT[dtype] * rounded


# ---------------------------------------------------------------------------------------------- DCN
@pytest.mark.parametrize("rank", [None, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dcn_cross(backend, plan, rank, dtype):
    m, n = 37, 24
    x0 = torch.randn(m, n).to(dtype)
    xl = torch.randn(m, n).to(dtype)
    k = n if rank is None else rank
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    v = None if rank is None else (torch.randn(rank, n) / n**0.5).to(dtype)
    b = torch.randn(n).to(dtype)
    leaves = _leaves(x0, xl, w, b, v)
    y = dcn_cross(*leaves[:4], weight_v=leaves[4])
    l64 = _leaves(x0, xl, w, b, v, dtype=torch.float64)
    y64 = ref.dcn_cross(*l64)
    g = torch.randn(m, n, dtype=torch.float64).to(dtype).double()  # the gradient as y's dtype holds it
    y.backward(g.to(dtype))
    y64.backward(g)
    x0d, xld, wd, bd = (t.detach() for t in l64[:4])
    vd = None if v is None else l64[4].detach()
    hmag = xld.abs() if vd is None else _mm(xld, vd.t())
    zmag = _mm(hmag, wd.t()) + bd.abs()
    # y: h (low rank: rounded to the dtype) times W, times x0, plus xl
    assert_close(y, y64, dtype, "y", atol=x0d.abs() * _atol(zmag, n + k, dtype, zmag if vd is not None else 0.0))
    gx = (g * x0d).abs()
    rtol = tolerances(dtype).rtol
    assert_close(leaves[0].grad, l64[0].grad, dtype, "dx0", atol=g.abs() * _atol(zmag, n + k, dtype, zmag),
                 rtol=rtol)
    dw_mag = _mm(gx.t(), hmag)
    assert_close(leaves[2].grad, l64[2].grad, dtype, "dw", atol=_atol(dw_mag, m, dtype, 2 * dw_mag), rtol=rtol)
    assert_close(leaves[3].grad, l64[3].grad, dtype, "db", atol=_atol(gx.sum(0), m, dtype, gx.sum(0)), rtol=rtol)
    dxl_mag = _mm(gx, wd) if vd is None else _mm(_mm(gx, wd), vd)
    assert_close(leaves[1].grad, l64[1].grad, dtype, "dxl", atol=_atol(dxl_mag, n + k, dtype, 3 * dxl_mag),
                 rtol=rtol)
    if vd is not None:
        dv_mag = _mm(_mm(gx, wd).t(), xld)
        assert_close(leaves[4].grad, l64[4].grad, dtype, "dv", atol=_atol(dv_mag, m + n, dtype, 3 * dv_mag),
                     rtol=rtol)


def test_dcn_partial_grads_and_leading_dims(triton_backend):
    """Only some inputs need gradients; 3-D inputs."""
    x0 = torch.randn(2, 5, 16)
    xl = torch.randn(2, 5, 16, requires_grad=True)
    w = torch.randn(16, 16) / 4
    y = dcn_cross(x0, xl, w)
    y64 = ref.dcn_cross(x0.double(), xl.detach().double().requires_grad_(), w.double())
    assert y.shape == xl.shape
    assert_close(y, y64, torch.float32, "y", atol=1e-5)
    y.sum().backward()
    want = torch.ones(2, 5, 16) + (x0 @ w)
    assert_close(xl.grad, want.double(), torch.float32, "dxl", atol=1e-5)


@pytest.mark.parametrize("with_bias_grad", [False, True])
def test_dcn_x0_grad_alone(triton_backend, plan, with_bias_grad):
    """x0's gradient (and the bias's) with xl and the weights frozen: the pass writes dx0 from the kept pre-product
    (``"cublas"`` plan) or the epilogue recomputes it (``"fused"``), no gx or dxl formed; float64 reference."""
    x0 = torch.randn(19, 24, requires_grad=True)
    xl, w, v = torch.randn(19, 24), torch.randn(24, 8) / 3, torch.randn(8, 24) / 5
    b = torch.randn(24, requires_grad=with_bias_grad)
    g = torch.randn(19, 24)
    dcn_cross(x0, xl, w, b, weight_v=v).backward(g)
    l64 = _leaves(x0, xl, w, b, v, dtype=torch.float64)
    ref.dcn_cross(*l64).backward(g.double())
    assert_close(x0.grad, l64[0].grad, torch.float32, "dx0", atol=1e-5 * (1 + l64[0].grad.abs()))
    if with_bias_grad:
        assert_close(b.grad, l64[3].grad, torch.float32, "db", atol=1e-4)
    else:
        assert b.grad is None


def _net_reference(x0, w, b, v):
    x = x0
    for layer in range(w.shape[0]):
        x = ref.dcn_cross(x0, x, w[layer], b[layer], None if v is None else v[layer])
    return x


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("rank", [None, 8])
def test_dcn_cross_net(triton_backend, plan, layers, rank):
    """The cross network as one op (the default plan) or as per-layer ops (the fused plan) against the float64 loop of
    the reference layers: the output and the gradient of x0 (every layer's term and the first layer's input), of the
    stacked weights, biases and low-rank factors; float32, an odd batch."""
    from fuselab.ops.gemm import dcn_cross_net

    m, n = 23, 24
    k = n if rank is None else rank
    x0 = torch.randn(m, n)
    w = torch.randn(layers, n, k) / k**0.5
    b = torch.randn(layers, n)
    v = None if rank is None else torch.randn(layers, rank, n) / n**0.5
    g = torch.randn(m, n)
    leaves = _leaves(x0, w, b, v)
    y = dcn_cross_net(*leaves[:3], leaves[3])
    assert ("DcnCrossNet" in type(y.grad_fn).__name__) == (plan == "cublas")  # one op where its pass runs
    y.backward(g)
    l64 = _leaves(x0, w, b, v, dtype=torch.float64)
    y64 = _net_reference(*l64)
    y64.backward(g.double())
    scale = 1 + y64.detach().abs()
    assert_close(y, y64, torch.float32, "y", atol=2e-5 * scale)
    for name, got, want in zip(("dx0", "dw", "db", "dv"), leaves, l64):
        if got is not None:
            assert_close(got.grad, want.grad, torch.float32, name, atol=1e-4 * (1 + want.grad.abs()))


def test_dcn_cross_net_without_grad_and_bad_inputs(triton_backend):
    """Under no_grad the per-layer ops give the same output; shapes that do not stack are refused by name."""
    from fuselab.ops.gemm import dcn_cross_net

    x0, w, b, v = torch.randn(5, 16), torch.randn(2, 16, 4) / 2, torch.randn(2, 16), torch.randn(2, 4, 16) / 4
    with torch.no_grad():
        y = dcn_cross_net(x0, w, b, v)
    y64 = _net_reference(x0.double(), w.double(), b.double(), v.double())
    assert_close(y, y64, torch.float32, "y", atol=2e-5 * (1 + y64.abs()))
    with pytest.raises(ValueError, match="same L >= 1 layers"):
        dcn_cross_net(x0, w, b[:1], v)
    with pytest.raises(ValueError, match="same L >= 1 layers"):
        dcn_cross_net(x0, w[:0], b[:0])
    with pytest.raises(ValueError, match=r"x0 must be \(M, N\)"):
        dcn_cross_net(x0[None], w, b, v)
    with pytest.raises(TypeError, match="dtype"):
        dcn_cross_net(x0, w.double(), b, v)


@pytest.mark.slow
def test_dcn_cross_net_compile_fullgraph(triton_backend):
    """torch.compile(fullgraph=True) traces the one-op cross network (its fake, its registered autograd): forward
    and every gradient against the float64 loop of reference layers."""
    from fuselab.core.compile import compile_quietly
    from fuselab.ops.gemm import dcn_cross_net

    x0, w, b, v = torch.randn(9, 16), torch.randn(2, 16, 4) / 2, torch.randn(2, 16), torch.randn(2, 4, 16) / 4
    leaves = _leaves(x0, w, b, v)
    loss = compile_quietly(lambda *t: dcn_cross_net(*t).square().sum(), fullgraph=True)(*leaves)
    loss.backward()
    l64 = _leaves(x0, w, b, v, dtype=torch.float64)
    _net_reference(*l64).square().sum().backward()
    for name, got, want in zip(("dx0", "dw", "db", "dv"), leaves, l64):
        assert_close(got.grad, want.grad, torch.float32, name, atol=1e-4 * (1 + want.grad.abs()))


def test_dcn_cross_net_opcheck(triton_backend):
    """The op's schema, fake and autograd registration."""
    from fuselab.ops.gemm.dcn_net import DCN_NET

    args = (torch.randn(6, 16, requires_grad=True), torch.randn(2, 16, 4, requires_grad=True),
            torch.randn(2, 16, requires_grad=True), torch.randn(2, 4, 16, requires_grad=True))
    torch.library.opcheck(DCN_NET.custom, args, test_utils=("test_schema", "test_faketensor",
                                                            "test_autograd_registration"))


def _bad_dcn():
    x = torch.randn(4, 8)
    return [
        (lambda: dcn_cross(x, torch.randn(4, 7), torch.randn(7, 7)), ValueError, "x0 must have xl's shape"),
        (lambda: dcn_cross(x, x, torch.randn(8, 4)), ValueError, r"weight must have shape \(N, N\)"),
        (lambda: dcn_cross(x, x, torch.randn(8, 4), weight_v=torch.randn(4, 7)), ValueError, "weight_v must have"),
        (lambda: dcn_cross(x, x, torch.randn(8, 3), weight_v=torch.randn(4, 8)), ValueError, r"\(N, rank\)"),
        (lambda: dcn_cross(x, x, torch.randn(8, 8).double()), TypeError, "weight must have xl's dtype"),
        (lambda: dcn_cross(x, x, torch.randn(8, 8), torch.randn(7)), ValueError, r"bias must have shape \(N,\)"),
        (lambda: dcn_cross(x.long(), x, torch.randn(8, 8)), TypeError, "x0 must have a floating dtype"),
    ]


@pytest.mark.parametrize("index", range(7))
def test_dcn_bad_inputs(index):
    call, exc, match = _bad_dcn()[index]
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("keep_pre", [False, True])
def test_dcn_opcheck(triton_backend, keep_pre):
    """The op's schema, fake and autograd registration, with and without the kept pre-product (x0's gradient)."""
    from fuselab.ops.gemm.dcn import DCN

    x0, xl = torch.randn(6, 16, requires_grad=keep_pre), torch.randn(6, 16, requires_grad=True)
    args = (x0, xl, torch.randn(16, 4, requires_grad=True), torch.randn(16), torch.randn(4, 16, requires_grad=True),
            keep_pre)
    torch.library.opcheck(DCN.custom, args, test_utils=("test_schema", "test_faketensor",
                                                        "test_autograd_registration"))


# ---------------------------------------------------------------------------------------------- QKV + RoPE
def _complex_rotation(z: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, mscale: float, heads: int,
                      head_dim: int, half: int, interleaved: bool) -> torch.Tensor:
    """An independent RoPE: the first ``heads`` heads of each row of ``z`` [M, N] times e^{i·pos·f} as complex
    numbers (pairs (i, i + half) or (2i, 2i + 1)), the rest of each head and the other heads unchanged."""
    out = z.clone()
    theta = pos.double()[:, None] * inv_freq.double()[None, :]  # [M, half]
    rot = torch.polar(torch.full_like(theta, mscale), theta)
    for h in range(heads):
        head = z[:, h * head_dim:(h + 1) * head_dim]
        if interleaved:
            pairs = torch.view_as_complex(head[:, :2 * half].reshape(-1, half, 2).contiguous())
            out[:, h * head_dim:h * head_dim + 2 * half] = torch.view_as_real(pairs * rot).reshape(-1, 2 * half)
        else:
            c = torch.complex(head[:, :half], head[:, half:2 * half]) * rot
            out[:, h * head_dim:h * head_dim + half] = c.real
            out[:, h * head_dim + half:h * head_dim + 2 * half] = c.imag
    return out


QKV_CASES = {
    "bshd-neox-table-gqa": dict(layout="bshd", interleaved=False, table=True, heads=(4, 1), rotary=16),
    "bshd-interleaved-angles-partial-bias": dict(layout="bshd", interleaved=True, table=False, heads=(2, 2),
                                                 rotary=8, bias=True),
    "sbhd-neox-table-positions": dict(layout="sbhd", interleaved=False, table=True, heads=(2, 1), rotary=16,
                                      positions=True),
    "bhsd-interleaved-table-offset": dict(layout="bhsd", interleaved=True, table=True, heads=(2, 2), rotary=16,
                                          offset=3),
    "thd-neox-angles-cu-offsets-partial": dict(layout="thd", interleaved=False, table=False, heads=(4, 2),
                                               rotary=8, packed=True, bias=True),
    "bshd-neox-offsets-tensor": dict(layout="bshd", interleaved=False, table=False, heads=(2, 1), rotary=16,
                                     offsets=True),
}


def _qkv_case(case: dict, dtype: torch.dtype):
    """(x, weight, bias, rope kwargs, per-row positions [M], inv_freq, mscale) of a case: batch 2, seq 5 (thd: 3 + 7
    tokens), hidden 24, head_dim 16."""
    batch, seq, hidden, head_dim = 2, 5, 24, 16
    hq, hkv = case["heads"]
    n = (hq + 2 * hkv) * head_dim
    lay = case["layout"]
    tokens = 10 if lay == "thd" else batch * seq
    x = torch.randn(tokens, hidden)
    x = {"thd": x, "sbhd": x.view(seq, batch, hidden)}.get(lay, x.view(batch, seq, hidden)).to(dtype)
    w = (torch.randn(n, hidden) / hidden**0.5).to(dtype)
    b = torch.randn(n).to(dtype) if case.get("bias") else None
    half = case["rotary"] // 2
    rope = dict(layout=lay, interleaved=case["interleaved"], rotary_dim=case["rotary"])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half)))
    if case["table"]:
        angles = torch.arange(32, dtype=torch.float64)[:, None] * inv_freq
        rope.update(cos=angles.cos().float(), sin=angles.sin().float())
    # per-token position of each row of x viewed as [tokens, hidden]
    if lay == "thd":
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        off = torch.tensor([4, 1])
        rope.update(cu_seqlens=cu, seqlen_offsets=off, max_seqlen=7)
        pos = torch.cat([torch.arange(3) + 4, torch.arange(7) + 1])
    elif case.get("positions"):
        p = torch.randint(0, 20, (batch, seq))
        rope["positions"] = p
        pos = p.t().reshape(-1) if lay == "sbhd" else p.reshape(-1)
    elif case.get("offsets"):
        off = torch.tensor([2, 7])
        rope["seqlen_offsets"] = off
        pos = (torch.arange(seq)[None, :] + off[:, None]).reshape(-1)
    else:
        offset = case.get("offset", 0)
        rope["seqlen_offsets"] = offset
        s_idx = torch.arange(seq)
        pos = (s_idx[:, None].expand(seq, batch) if lay == "sbhd" else s_idx[None, :].expand(batch, seq)).reshape(-1)
        pos = pos + offset
    return x, w, b, rope, pos, inv_freq


def _fused_rows(q, k, v, lay: str) -> torch.Tensor:
    """q, k, v back to the fused [tokens, N] rows (bhsd transposed back)."""
    if lay == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return torch.cat([t.flatten(-2) for t in (q, k, v)], dim=-1).reshape(-1, sum(t.shape[-2] * t.shape[-1]
                                                                                  for t in (q, k, v)))


@pytest.mark.parametrize("name", list(QKV_CASES))
def test_qkv_rope(triton_backend, plan, name):
    import fuselab
    from fuselab.ops.gemm.qkv import qkv_rope

    case = QKV_CASES[name]
    dtype = torch.bfloat16
    x, w, b, rope, pos, inv_freq = _qkv_case(case, dtype)
    hq, hkv = case["heads"]
    head_dim = 16
    xs, ws, bs = _leaves(x, w, b)
    q, k, v = qkv_rope(xs, ws, bs, num_heads=hq, num_kv_heads=hkv, **rope)
    lay = case["layout"]
    # (a) fuselab.apply_rope after the plain projection, in float64
    x64, w64, b64 = _leaves(x, w, b, dtype=torch.float64)
    plain = x64 @ w64.t() + (b64 if b64 is not None else 0.0)
    heads = plain.view(*x.shape[:-1], hq + 2 * hkv, head_dim)
    q64, k64, v64 = heads.split((hq, hkv, hkv), dim=-2)
    if lay == "bhsd":
        q64, k64, v64 = (t.transpose(1, 2) for t in (q64, k64, v64))
    rope64 = {key: (val.double() if key in ("cos", "sin") else val) for key, val in rope.items()}
    q64, k64 = fuselab.apply_rope(q64, k64, rope64.pop("cos", None), rope64.pop("sin", None), **rope64)
    assert q.shape == q64.shape and k.shape == k64.shape and v.shape == v64.shape
    got = _fused_rows(q, k, v, lay)
    want = _fused_rows(q64, k64, v64, lay)
    mag = (_mm(x64.detach().reshape(-1, x.shape[-1]), w64.detach().t()) + (b64.detach().abs() if b is not None
                                                                            else 0.0))
    row = mag.amax(1, keepdim=True).expand_as(mag)
    atol = 3 * _atol(row, x.shape[-1], torch.float32) + 1e-5 * row  # rotation of two fp32 sums; fp32 angles
    if plan == "cublas":  # the projection rounded to the dtype before the rotation
        atol = atol + UNIT[dtype] * row
    assert_close(got, want, dtype, "qkv vs apply_rope", atol=atol)
    # (b) an independent rotation (complex numbers) of the plain projection
    indep = _complex_rotation(plain.detach().reshape(-1, w.shape[0]), pos, inv_freq, 1.0, hq + hkv, head_dim,
                              case["rotary"] // 2, case["interleaved"])
    assert_close(got, indep, dtype, "qkv vs complex rotation", atol=atol + 1e-5 * row)
    # gradients against autograd through (a)
    # the incoming gradients as the bf16 outputs receive them: rounded to the dtype (the reference gets the same)
    gq, gk, gv = (torch.randn_like(t, dtype=torch.float64).to(dtype).double() for t in (q64, k64, v64))
    (q.double() * gq).sum().add_((k.double() * gk).sum()).add_((v.double() * gv).sum()).backward()
    ((q64 * gq).sum() + (k64 * gk).sum() + (v64 * gv).sum()).backward()
    gm = _fused_rows(gq, gk, gv, lay)
    dzm = 2 * gm.abs().amax(1, keepdim=True).expand_as(gm)  # a rotated pair mixes two gradients
    x2 = x64.detach().reshape(-1, x.shape[-1])
    rtol = tolerances(dtype).rtol
    dx_mag = _mm(dzm, w64.detach())
    assert_close(xs.grad.reshape(x2.shape), x64.grad.reshape(x2.shape), dtype, "dx",
                 atol=_atol(dx_mag, w.shape[0], dtype, dx_mag), rtol=rtol)
    dw_mag = _mm(dzm.t(), x2)
    assert_close(ws.grad, w64.grad, dtype, "dw", atol=_atol(dw_mag, x2.shape[0], dtype, dw_mag), rtol=rtol)
    if b is not None:
        # the fused plan sums the rotated dZ as the MMA reads it: each element rounded to the dtype first
        rounded = dzm.sum(0) if plan == "fused" else 0.0
        assert_close(bs.grad, b64.grad, dtype, "db", atol=_atol(dzm.sum(0), x2.shape[0], dtype, rounded), rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_rope_at_size_gpu(plan, interleaved):
    """QKV + RoPE (GQA 16/4 heads of 64, 2x512 tokens of 1024, the neox rotation from tables or interleaved pairs from
    in-kernel angles) at a size where the GEMM's steps pipeline: q, k, v and every gradient against the float64
    reference, with the bounds of test_qkv_rope."""
    from fuselab.ops.gemm.qkv import qkv_rope

    torch.manual_seed(4)
    batch, seq, hidden, hq, hkv, d, dt = 2, 512, 1024, 16, 4, 64, torch.bfloat16
    x = torch.randn(batch, seq, hidden, device="cuda").to(dt)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, device="cuda") / hidden**0.5).to(dt)
    b = torch.randn(w.shape[0], device="cuda").to(dt)
    angles = torch.arange(seq, device="cuda", dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float64) / d))
    rope = {} if interleaved else dict(cos=angles.cos().float(), sin=angles.sin().float())
    xs, ws, bs = _leaves(x, w, b)
    q, k, v = qkv_rope(xs, ws, bs, num_heads=hq, num_kv_heads=hkv, interleaved=interleaved, **rope)
    x6, w6, b6 = _leaves(x, w, b, dtype=torch.float64)
    q6, k6, v6 = ref.qkv_rope(x6, w6, b6, hq, hkv, dict(interleaved=interleaved,
                                                          **{key: t.double() for key, t in rope.items()}))
    got, want = _fused_rows(q, k, v, "bshd"), _fused_rows(q6, k6, v6, "bshd")
    x2 = x6.detach().reshape(-1, hidden)
    row = (_mm(x2, w6.detach().t()) + b6.detach().abs()).amax(1, keepdim=True).expand_as(want)
    atol = 3 * _atol(row, hidden, torch.float32) + 1e-5 * row + (UNIT[dt] * row if plan == "cublas" else 0.0)
    assert_close(got, want, dt, "qkv", atol=atol)
    gq, gk, gv = (torch.randn_like(t, dtype=torch.float64).to(dt).double() for t in (q6, k6, v6))
    torch.autograd.backward((q, k, v), (gq.to(dt), gk.to(dt), gv.to(dt)))
    torch.autograd.backward((q6, k6, v6), (gq, gk, gv))
    gm = _fused_rows(gq, gk, gv, "bshd")
    dzm = 2 * gm.abs().amax(1, keepdim=True).expand_as(gm)
    rtol = tolerances(dt).rtol
    dx_mag, dw_mag = _mm(dzm, w6.detach()), _mm(dzm.t(), x2)
    assert_close(xs.grad.reshape(x2.shape), x6.grad.reshape(x2.shape), dt, "dx",
                 atol=_atol(dx_mag, w.shape[0], dt, dx_mag), rtol=rtol)
    assert_close(ws.grad, w6.grad, dt, "dw", atol=_atol(dw_mag, x2.shape[0], dt, dw_mag), rtol=rtol)
    rounded = dzm.sum(0) if plan == "fused" else 0.0  # the fused plan's sums read dZ rounded to the dtype
    assert_close(bs.grad, b6.grad, dt, "db", atol=_atol(dzm.sum(0), x2.shape[0], dt, rounded), rtol=rtol)


def test_qkv_rope_torch_path_matches(torch_backend):
    """The PyTorch path (CPU without Triton) gives the reference values."""
    from fuselab.ops.gemm.qkv import qkv_rope

    x, w, b, rope, _, _ = _qkv_case(QKV_CASES["bshd-neox-table-gqa"], torch.float32)
    q, k, v = qkv_rope(x, w, b, num_heads=4, num_kv_heads=1, **rope)
    q2, k2, v2 = ref.qkv_rope(x, w, b, 4, 1, rope)
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)


def _bad_qkv():
    from fuselab.ops.gemm.qkv import qkv_rope

    x, w = torch.randn(2, 5, 24), torch.randn(64, 24)
    return [
        (lambda: qkv_rope(x[0], w, num_heads=2, num_kv_heads=1), ValueError, "x must have 3 dims"),
        (lambda: qkv_rope(x, torch.randn(62, 24), num_heads=2, num_kv_heads=1), ValueError, "weight must have shape"),
        (lambda: qkv_rope(x, w, num_heads=0, num_kv_heads=1), ValueError, "num_heads must be a positive int"),
        (lambda: qkv_rope(x, w, num_heads=2, num_kv_heads=1, layout="bsd"), ValueError, "layout must be one of"),
        (lambda: qkv_rope(x, w, num_heads=2, num_kv_heads=1, rotary_dim=12), ValueError, "power of 2 dividing"),
        (lambda: qkv_rope(x, w, num_heads=2, num_kv_heads=1, cos=torch.randn(3, 8), sin=torch.randn(3, 8)),
         ValueError, "cos/sin have 3 rows"),
        (lambda: qkv_rope(x, w, num_heads=2, num_kv_heads=1, rotary_dim=7), ValueError, "rotary_dim"),
        (lambda: qkv_rope(x, w.double(), num_heads=2, num_kv_heads=1), TypeError, "weight must have x's dtype"),
        (lambda: qkv_rope(x, w, torch.randn(3), num_heads=2, num_kv_heads=1), ValueError, "bias must have shape"),
    ]


@pytest.mark.parametrize("index", range(9))
def test_qkv_bad_inputs(index):
    call, exc, match = _bad_qkv()[index]
    with pytest.raises(exc, match=match):
        call()


def test_qkv_opcheck(triton_backend):
    from fuselab.ops.gemm.qkv import QKV

    x, w = torch.randn(2, 5, 24, requires_grad=True), torch.randn(64, 24, requires_grad=True)
    cos, sin = torch.randn(8, 8), torch.randn(8, 8)
    args = (x, w, torch.randn(64), cos, sin, None, None, None, None, "bshd", 2, 1, 8, False, 0, 1.0)
    torch.library.opcheck(QKV.custom, args, test_utils=("test_schema", "test_faketensor",
                                                        "test_autograd_registration"))


# ---------------------------------------------------------------------------------------------- master weights
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
@pytest.mark.parametrize("lr_tensor", [False, True])
@pytest.mark.parametrize("low_dtype", [torch.bfloat16, torch.float16])
def test_cast_update(backend, optimizer, lr_tensor, low_dtype):
    from fuselab.ops.gemm import cast_update_

    master = torch.randn(3000)
    grad = torch.randn(3000).to(low_dtype)
    state = torch.rand(3000) if optimizer == "adagrad" else None
    low = torch.empty(3000, dtype=low_dtype)
    w64, s64, _ = ref.cast_update(master.double(), grad.double(), None if state is None else state.double(),
                                  optimizer=optimizer, lr=0.1, weight_decay=0.01)
    lr = torch.tensor(0.1) if lr_tensor else 0.1
    out = cast_update_(master, grad, low, lr=lr, optimizer=optimizer, state=state, weight_decay=0.01)
    assert out is low
    assert_close(master, w64, torch.float32, "master", atol=1e-6)
    if state is not None:
        assert_close(state, s64, torch.float32, "state")
    assert torch.equal(low, master.to(low_dtype))  # the copy is the updated master rounded to nearest


def test_cast_update_bad_inputs():
    from fuselab.ops.gemm import cast_update_

    w, g, low = torch.randn(8), torch.randn(8), torch.empty(8, dtype=torch.bfloat16)
    cases = [
        (lambda: cast_update_(w.bfloat16(), g, low, lr=0.1), TypeError, "master must be float32"),
        (lambda: cast_update_(w, torch.randn(7), low, lr=0.1), ValueError, "grad must have master's shape"),
        (lambda: cast_update_(w, g, low, lr=0.1, optimizer="adam"), ValueError, "optimizer must be one of"),
        (lambda: cast_update_(w, g, low, lr=0.1, optimizer="adagrad"), TypeError, "state must be a torch.Tensor"),
        (lambda: cast_update_(w, g, low, lr=0.1, state=torch.zeros(8)), ValueError, "only with optimizer='adagrad'"),
        (lambda: cast_update_(w, g, low, lr="0.1"), TypeError, "lr must be a float"),
        (lambda: cast_update_(torch.randn(8, 2).t(), g, low, lr=0.1), ValueError, "master must be contiguous"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
