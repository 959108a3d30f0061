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
from fuselab.reference import gemm as ref
from fuselab.testing import assert_close, tolerances

U32 = 2.0**-24
UNIT = {torch.float64: 2.0**-52, torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


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
def test_dcn_cross(backend, rank, dtype):
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
    g = torch.randn(m, n, dtype=torch.float64)
    y.backward(g.to(dtype))
    y64.backward(g)
    x0d, xld, wd, bd = (t.detach() for t in l64[:4])
    vd = None if v is None else l64[4].detach()
    h = xld if vd is None else (xld @ vd.t())
    hmag = xld.abs() if vd is None else _mm(xld, vd.t())
    z = h @ wd.t() + bd
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


def test_dcn_opcheck(triton_backend):
    from fuselab.ops.gemm.dcn import DCN

    x0, xl = torch.randn(6, 16), torch.randn(6, 16, requires_grad=True)
    args = (x0, xl, torch.randn(16, 4, requires_grad=True), torch.randn(16), torch.randn(4, 16, requires_grad=True))
    torch.library.opcheck(DCN.custom, args, test_utils=("test_schema", "test_faketensor",
                                                        "test_autograd_registration"))
