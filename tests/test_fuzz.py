"""Property-based fuzzing of every public op through the Triton kernels (the interpreter on CPU).

Random small shapes (0-size and 1-element dims where the API takes them), strided views, dtypes, layouts and
parameters; forward and gradients against the same public call on the torch backend in float64. Bad inputs are
drawn too: each must raise ``ValueError`` or ``TypeError``, never another exception. A fixed, derandomized
example budget keeps the file within about a minute on one core.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuselab
from fuselab.backend import forced
from fuselab.nn import FusedLinear
from fuselab.testing import assert_close, assert_ulp, tolerances

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def budget(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


def randn(draw, shape, dtype, strided: bool, scale: float = 1.0) -> torch.Tensor:
    """A random tensor of ``shape``: contiguous, or a view of a padded, reversed-order buffer (no stride is
    the contiguous one), on the default device (the kernels' device under ``triton_backend``). Values from a seed
    drawn by hypothesis (drawn on the CPU: the same numbers on every machine)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    device = torch.get_default_device()
    if not strided or len(shape) == 0:
        return (torch.randn(shape, generator=g) * scale).to(device, dtype)
    big = (torch.randn(*reversed(shape[:-1]), shape[-1] + 3, generator=g) * scale).to(device)
    return big[..., : shape[-1]].permute(*reversed(range(len(shape) - 1)), len(shape) - 1).to(dtype)


def leaf(t: torch.Tensor | None, dtype=None) -> torch.Tensor | None:
    """``t`` (strides kept) as a leaf that requires grad, optionally converted."""
    if t is None:
        return None
    t = t.detach() if dtype is None else t.detach().to(dtype)
    return t.requires_grad_(True)


def check_low_or_fp32(got: torch.Tensor, want: torch.Tensor, what: str, atol: float) -> None:
    """One rounding of the exact result: fp32 by the table; fp16/bf16 within one ulp (holds for a store that
    rounds to nearest and for the interpreter's truncating one)."""
    if got.dtype == torch.float32:
        assert_close(got, want, torch.float32, what, atol=max(atol, tolerances(torch.float32).atol))
    else:
        assert_ulp(got, want, 1.0, what, atol=atol)


# ------------------------------------------------------------------------------------------------ apply_rope
@st.composite
def rope_calls(draw):
    layout = draw(st.sampled_from(["bshd", "sbhd", "bhsd", "thd"]))
    dtype = draw(st.sampled_from(DTYPES))
    half = draw(st.integers(1, 6))
    d = 2 * half + draw(st.sampled_from([0, 2]))  # pass-through dims past rotary_dim
    hq, hk = draw(st.integers(1, 3)), draw(st.integers(1, 2))  # hq=0 with k: see test_rope_empty_q_heads
    with_k, interleaved, strided = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    kw: dict = {"layout": layout, "interleaved": interleaved}
    if layout == "thd":
        lens = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
        b, s = len(lens), sum(lens)
        kw["cu_seqlens"] = torch.tensor([0, *itertools_accumulate(lens)], dtype=torch.int32)
        q_shape, k_shape = (s, hq, d), (s, hk, d)
        longest = max(lens)
    else:
        b, s = draw(st.integers(0, 3)), draw(st.integers(0, 4))
        q_shape = {"bshd": (b, s, hq, d), "sbhd": (s, b, hq, d), "bhsd": (b, hq, s, d)}[layout]
        k_shape = {"bshd": (b, s, hk, d), "sbhd": (s, b, hk, d), "bhsd": (b, hk, s, d)}[layout]
        longest = s
    where = draw(st.sampled_from(["int", "tensor", "positions"]))
    if where == "int":
        kw["seqlen_offsets"] = draw(st.integers(0, 3))
        rows = longest + kw["seqlen_offsets"]
    elif where == "tensor":
        kw["seqlen_offsets"] = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)),
                                            dtype=torch.long)
        rows = longest + 3
    else:
        n = s if layout == "thd" else b * s
        pos = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
        kw["positions"] = torch.tensor(pos, dtype=torch.long).reshape((s,) if layout == "thd" else (b, s))
        rows = 10
    rows = max(rows, 1) + draw(st.integers(0, 2))
    tables = draw(st.sampled_from(["fp32", "same", "kernel"]))
    if tables == "kernel":
        cos = sin = None
        kw["rotary_dim"] = 2 * half
        kw["base"] = draw(st.sampled_from([10000.0, 500.0]))
    else:
        cos, sin = fuselab.rope_cos_sin(rows, 2 * half, dtype=torch.float32 if tables == "fp32" else dtype)
    q = randn(draw, q_shape, dtype, strided)
    k = randn(draw, k_shape, dtype, strided) if with_k else None
    return q, k, cos, sin, kw, rows


def itertools_accumulate(xs):
    total, out = 0, []
    for x in xs:
        total += x
        out.append(total)
    return out


@budget(40)
@given(call=rope_calls(), seed=st.integers(0, 2**16))
def test_fuzz_apply_rope(triton_backend, call, seed):
    q, k, cos, sin, kw, rows = call
    qq, kk = leaf(q), leaf(k)
    q_out, k_out = fuselab.apply_rope(qq, kk, cos, sin, **kw)
    with forced("torch"):
        q64, k64 = leaf(q, torch.float64), leaf(k, torch.float64)
        c64 = None if cos is None else cos.double()
        s64 = None if sin is None else sin.double()
        want_q, want_k = fuselab.apply_rope(q64, k64, c64, s64, **kw)
    assert q_out.shape == q.shape and q_out.dtype == q.dtype and (k_out is None) == (k is None)
    scale = float(q.double().abs().max()) if q.numel() else 0.0
    if k is not None and k.numel():
        scale = max(scale, float(k.double().abs().max()))
    atol = 8 * 2.0**-24 * (rows + 2) * scale  # fp32 angles (in-kernel) and the fp32 rotation
    check_low_or_fp32(q_out, want_q, "q_out", atol)
    if k is not None:
        check_low_or_fp32(k_out, want_k, "k_out", atol)
    g = torch.Generator().manual_seed(seed)
    gq = torch.randn(q_out.shape, generator=g).to(q.device, q.dtype)
    outs, grads = [q_out], [gq]
    if k is not None:
        outs.append(k_out)
        grads.append(torch.randn(k_out.shape, generator=g).to(k.device, k.dtype))
    torch.autograd.backward(outs, grads)
    torch.autograd.backward([want_q] + ([want_k] if k is not None else []), [t.double() for t in grads])
    gscale = max(float(t.double().abs().max()) if t.numel() else 0.0 for t in grads)
    gatol = 8 * 2.0**-24 * (rows + 2) * gscale
    check_low_or_fp32(qq.grad, q64.grad, "grad q", gatol)
    if k is not None:
        check_low_or_fp32(kk.grad, k64.grad, "grad k", gatol)


# ------------------------------------------------------------------------------------------------ bias_act
@st.composite
def bias_act_calls(draw):
    dtype = draw(st.sampled_from(DTYPES))
    lead = draw(st.lists(st.integers(0, 4), min_size=0, max_size=2))
    n = draw(st.integers(1, 40))
    shape = (*lead, n)
    strided = draw(st.booleans()) and len(shape) >= 2
    x = randn(draw, shape, dtype, strided, scale=2.0)
    bias = randn(draw, (n,), dtype, False) if draw(st.booleans()) else None
    residual = randn(draw, shape, dtype, draw(st.booleans())) if draw(st.booleans()) else None
    alpha = draw(st.sampled_from([1.0, -1.5, 0.25, 0.0, 2]))
    activation = draw(st.sampled_from(fuselab.ACTIVATIONS))
    return x, bias, residual, alpha, activation


@budget(40)
@given(call=bias_act_calls(), seed=st.integers(0, 2**16))
def test_fuzz_bias_act(triton_backend, call, seed):
    x, bias, residual, alpha, activation = call
    xs = [leaf(x), leaf(bias), leaf(residual)]
    y = fuselab.bias_act(xs[0], xs[1], residual=xs[2], alpha=alpha, activation=activation)
    with forced("torch"):
        x64 = [leaf(t, torch.float64) for t in (x, bias, residual)]
        want = fuselab.bias_act(x64[0], x64[1], residual=x64[2], alpha=alpha, activation=activation)
    assert y.shape == x.shape and y.dtype == x.dtype
    zmax = max([float(t.double().abs().max()) for t in (x, bias, residual) if t is not None and t.numel()] or [0])
    check_low_or_fp32(y, want, f"{activation} y", 64 * 2.0**-24 * (zmax + 1) ** 2)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y.device, y.dtype)
    y.backward(g)
    want.backward(g.double())
    for name, t, t64 in zip(("grad_x", "grad_bias", "grad_residual"), xs, x64):
        if t is not None:
            assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
            ref = t64.grad
            atol = tolerances(x.dtype, chained=True).atol * max(1.0, float(ref.abs().max()) if ref.numel() else 0)
            assert_close(t.grad, ref, x.dtype, f"{activation} {name}", chained=True, atol=atol)


# ------------------------------------------------------------------------------------------------ sum / mean
@st.composite
def reduce_calls(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    if len(shape) and draw(st.booleans()):
        shape = tuple(max(1, n) for n in shape)  # mostly non-empty; 0-size dims still drawn
    x = randn(draw, shape, dtype, draw(st.booleans()))
    r = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or r == 0:
        dim = None
    elif kind == "int":
        dim = draw(st.integers(-r, r - 1))
    else:
        dim = tuple(draw(st.lists(st.integers(0, r - 1), unique=True, min_size=1, max_size=r)))
    out_dtype = draw(st.sampled_from([None, torch.float32]))
    return x, dim, draw(st.booleans()), out_dtype, draw(st.sampled_from(["sum", "mean"]))


@budget(40)
@given(call=reduce_calls())
def test_fuzz_reduce(triton_backend, call):
    x, dim, keepdim, out_dtype, op = call
    xx = leaf(x)
    got = getattr(fuselab, op)(xx, dim, keepdim, dtype=out_dtype)
    x64 = leaf(x, torch.float64)
    want = getattr(torch, op)(x64, dim=() if dim is None else dim, keepdim=keepdim)
    assert got.dtype == (out_dtype or x.dtype) and got.shape == want.shape
    n = x.numel() // max(want.numel(), 1)
    acc = 4 * 2.0**-24 * math.sqrt(max(n, 1)) * max(n, 1) * (float(x.double().abs().max()) if x.numel() else 0)
    if op == "mean":
        acc /= max(n, 1)
    check_low_or_fp32(got, want, f"{op}(dim={dim}, keepdim={keepdim})", acc)
    if got.numel():
        g = torch.randn(got.shape).to(got.dtype)
        got.backward(g)
        want.backward(g.double())
        assert xx.grad.shape == x.shape and xx.grad.dtype == x.dtype
        check_low_or_fp32(xx.grad, x64.grad, "grad", 0.0)


# ------------------------------------------------------------------------------------------------ FusedLinear
F_ACT = {"none": lambda z: z, "relu": F.relu, "relu2": lambda z: F.relu(z) ** 2, "sigmoid": torch.sigmoid,
         "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}


@budget(20)
@given(fin=st.integers(1, 8), fout=st.integers(1, 8), lead=st.lists(st.integers(0, 4), min_size=1, max_size=2),
       bias=st.booleans(), activation=st.sampled_from(fuselab.ACTIVATIONS), seed=st.integers(0, 2**16))
def test_fuzz_fused_linear(triton_backend, fin, fout, lead, bias, activation, seed):
    torch.manual_seed(seed)
    layer = FusedLinear(fin, fout, bias=bias, activation=activation)
    x = torch.randn(*lead, fin, requires_grad=True)
    y = layer(x)
    params = {name: p.detach().double().requires_grad_(True) for name, p in layer.named_parameters()}
    x64 = x.detach().double().requires_grad_(True)
    want = F_ACT[activation](F.linear(x64, params["weight"], params.get("bias")))
    assert_close(y, want, torch.float32, f"FusedLinear({fin}, {fout}, {activation}) y")
    g = torch.randn(y.shape)
    y.backward(g)
    want.backward(g.double())
    assert_close(x.grad, x64.grad, torch.float32, "grad_x", chained=True)
    for name, p in layer.named_parameters():
        assert_close(p.grad, params[name].grad, torch.float32, f"grad_{name}", chained=True)


# ------------------------------------------------------------------------------------------------ bad inputs
def _bad_rope(draw):
    q = torch.randn(2, 3, 2, 8)
    cos, sin = fuselab.rope_cos_sin(6, 8)
    case = draw(st.sampled_from(["layout", "offset", "dtype", "k_dim", "rows", "cos_only", "both", "rotary", "pos",
                                 "cu", "q_type", "table_shape"]))
    if case == "layout":
        return lambda: fuselab.apply_rope(q, None, cos, sin, layout=draw(st.text(max_size=5)))
    if case == "offset":
        return lambda: fuselab.apply_rope(q, None, cos, sin, seqlen_offsets=draw(st.integers(-(2**40), -1)))
    if case == "dtype":
        return lambda: fuselab.apply_rope(q.to(draw(st.sampled_from([torch.int32, torch.int64, torch.bool]))),
                                          None, cos, sin)
    if case == "k_dim":
        return lambda: fuselab.apply_rope(q, torch.randn(2, 3, 1, draw(st.sampled_from([2, 6, 10]))), cos, sin)
    if case == "rows":
        return lambda: fuselab.apply_rope(q, None, cos, sin, seqlen_offsets=draw(st.integers(4, 2**40)))
    if case == "cos_only":
        return lambda: fuselab.apply_rope(q, None, cos, None)
    if case == "both":
        return lambda: fuselab.apply_rope(q, None, cos, sin, positions=torch.zeros(2, 3, dtype=torch.long),
                                          seqlen_offsets=1)
    if case == "rotary":
        return lambda: fuselab.apply_rope(q, None, None, None, rotary_dim=draw(st.sampled_from([0, -2, 3, 10])))
    if case == "pos":  # checked on the host (on CUDA only with check_positions: else clamped in the kernel)
        return lambda: fuselab.apply_rope(q, None, cos, sin, check_positions=True,
                                          positions=torch.full((2, 3), draw(st.sampled_from([-1, 6, 2**33]))))
    if case == "cu":
        bad = draw(st.sampled_from([[0, 3, 4], [0, 4, 3, 6], [1, 6], [0, 6, 9]]))
        return lambda: fuselab.apply_rope(torch.randn(6, 2, 8), None, cos, sin, layout="thd",
                                          cu_seqlens=torch.tensor(bad, dtype=torch.int32))
    if case == "q_type":
        return lambda: fuselab.apply_rope(draw(st.sampled_from([None, 1.0, [1.0]])), None, cos, sin)
    return lambda: fuselab.apply_rope(q, None, cos[:, :3], sin[:, :2])  # cos and sin of different widths


def _bad_bias_act(draw):
    x = torch.randn(3, 4)
    case = draw(st.sampled_from(["activation", "alpha", "bias", "residual", "dtype", "x_type", "bias_dtype"]))
    if case == "activation":
        act = draw(st.one_of(st.text(max_size=6).filter(lambda a: a not in fuselab.ACTIVATIONS), st.none(),
                             st.integers()))
        return lambda: fuselab.bias_act(x, None, activation=act)
    if case == "alpha":
        alpha = draw(st.sampled_from(["1", None, True, torch.tensor(1.0), [1.0]]))
        return lambda: fuselab.bias_act(x, None, residual=x, alpha=alpha)
    if case == "bias":
        shape = draw(st.sampled_from([(3,), (5,), (1, 4), (4, 1), ()]))
        return lambda: fuselab.bias_act(x, torch.randn(shape))
    if case == "residual":
        shape = draw(st.sampled_from([(4, 3), (3, 5), (4,), (1, 3, 4)]))
        return lambda: fuselab.bias_act(x, None, residual=torch.randn(shape))
    if case == "dtype":
        return lambda: fuselab.bias_act(x.to(draw(st.sampled_from([torch.int32, torch.bool]))), None)
    if case == "bias_dtype":
        return lambda: fuselab.bias_act(x, torch.ones(4, dtype=torch.int64))
    return lambda: fuselab.bias_act(draw(st.sampled_from([None, 2.0, [1.0, 2.0]])), None)


def _bad_reduce(draw):
    x = torch.randn(3, 4)
    op = getattr(fuselab, draw(st.sampled_from(["sum", "mean"])))
    case = draw(st.sampled_from(["dim", "dup", "dim_type", "dtype", "int_input", "x_type"]))
    if case == "dim":
        d = draw(st.one_of(st.integers(2, 2**40), st.integers(-(2**40), -3)))
        return lambda: op(x, d)
    if case == "dup":
        return lambda: op(x, draw(st.sampled_from([(0, 0), (1, -1), (0, 1, 0)])))
    if case == "dim_type":
        return lambda: op(x, draw(st.sampled_from(["0", 1.0, [0.5], (0, "a")])))
    if case == "dtype":
        return lambda: op(x, 0, dtype=draw(st.sampled_from([torch.int32, torch.int64, torch.bool, "float32"])))
    if case == "int_input":
        return lambda: op(torch.ones(3, dtype=draw(st.sampled_from([torch.int32, torch.int64, torch.bool]))))
    return lambda: op(draw(st.sampled_from([None, 1.0, [1.0]])))


def _bad_fused_linear(draw):
    case = draw(st.sampled_from(["activation", "features", "backend"]))
    if case == "activation":
        act = draw(st.text(max_size=6).filter(lambda a: a not in fuselab.ACTIVATIONS))
        return lambda: FusedLinear(4, 3, activation=act)
    if case == "features":
        fin, fout = draw(st.sampled_from([(0, 3), (4, 0), (-1, 3), (4, -2)]))
        return lambda: FusedLinear(fin, fout)
    return lambda: FusedLinear(4, 3, backend=draw(st.text(max_size=6).filter(lambda b: b not in ("auto",))))


@budget(120)
@given(data=st.data())
def test_fuzz_bad_inputs_raise_value_or_type_error(triton_backend, data):
    make = data.draw(st.sampled_from([_bad_rope, _bad_bias_act, _bad_reduce, _bad_fused_linear]))
    call = make(data.draw)
    with pytest.raises((ValueError, TypeError)):
        call()


# ------------------------------------------------------------------------------------------------ edge cases
def test_fused_linear_wrong_in_features(triton_backend):
    with pytest.raises((ValueError, TypeError)):
        FusedLinear(4, 3)(torch.randn(2, 5))


def test_rope_empty_q_heads(triton_backend):
    q, k = torch.randn(3, 2, 0, 10), torch.randn(3, 2, 1, 10)
    cos, sin = fuselab.rope_cos_sin(4, 10)
    _, k_out = fuselab.apply_rope(q, k, cos, sin)
    with forced("torch"):
        _, want = fuselab.apply_rope(q.double(), k.double(), cos.double(), sin.double())
    assert_close(k_out, want, torch.float32, "k_out")
