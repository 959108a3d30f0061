"""The public ops against references written here from their definitions, independent of fuselab's own code.

RoPE: the rotation formula (halves and interleaved pairing), positions, int/tensor offsets, thd varlen, and the
angles ``p * base^(-2i/r)``, each written out below; Hugging Face's ``apply_rotary_pos_emb`` where transformers is
installed. bias_act: every activation from ``torch.nn.functional`` in float64. sum/mean: ``torch.sum``/
``torch.mean`` in float64. Each runs through the Triton kernels (the interpreter on CPU) and the torch backend.
Imports only the public API (and the comparison helpers).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fuselab
from fuselab.testing import assert_close, assert_ulp


# ------------------------------------------------------------------------------------------------ RoPE
def plain_angles(rows: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """(rows, rotary_dim/2) float64 angles ``p * base^(-2i/rotary_dim)``."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    inv = base ** (-2.0 * i / rotary_dim)
    return torch.arange(rows, dtype=torch.float64)[:, None] * inv[None, :]


def plain_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotate the last dim of ``x`` (..., D) by per-token ``cos``/``sin`` (..., r/2) broadcast over heads.

    halves: (x[i], x[i + r/2]) is a pair; interleaved: (x[2i], x[2i+1]). Dims past r pass through."""
    r = 2 * cos.shape[-1]
    if interleaved:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        rot = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    else:
        a, b = x[..., : r // 2], x[..., r // 2 : r]
        rot = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((rot, x[..., r:]), dim=-1)


def token_rows(batch: int, seq: int, offsets) -> torch.Tensor:
    """(batch, seq) table row of each token: its index in the sequence plus the sequence's offset."""
    rows = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        off = int(offsets[b]) if isinstance(offsets, torch.Tensor) else int(offsets)
        for s in range(seq):
            rows[b, s] = s + off
    return rows


def rope_case(q, k, cos, sin, rows_bs, interleaved: bool, to_bshd, **kw):
    """fuselab.apply_rope vs the plain formula (float64 on the same inputs): outputs and both gradients."""
    qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    q_out, k_out = fuselab.apply_rope(qq, kk, cos, sin, interleaved=interleaved, **kw)
    c = cos.double()[rows_bs][:, :, None, :]  # (B, S, 1, r/2)
    s = sin.double()[rows_bs][:, :, None, :]
    q64, k64 = q.double().requires_grad_(True), k.double().requires_grad_(True)
    want_q = plain_rotate(to_bshd(q64), c, s, interleaved)
    want_k = plain_rotate(to_bshd(k64), c, s, interleaved)
    assert_close(to_bshd(q_out), want_q, q.dtype, "q_out")
    assert_close(to_bshd(k_out), want_k, k.dtype, "k_out")
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (gq, gk))
    torch.autograd.backward((want_q, want_k), (to_bshd(gq).double(), to_bshd(gk).double()))
    assert_close(qq.grad, q64.grad, q.dtype, "grad q")  # a rotation by -angle: one rounding
    assert_close(kk.grad, k64.grad, k.dtype, "grad k")


LAYOUT_VIEWS = {"bshd": lambda t: t, "sbhd": lambda t: t.transpose(0, 1), "bhsd": lambda t: t.transpose(1, 2)}


def _make(layout: str, b: int, s: int, h: int, d: int, dtype=torch.float32) -> torch.Tensor:
    shape = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rope_plain_formula(backend, interleaved, layout, offsets):
    b, s, hq, hk, d, r = 2, 5, 3, 1, 16, 12  # partial rotary: dims 12..15 pass through
    q, k = _make(layout, b, s, hq, d), _make(layout, b, s, hk, d)
    off = {"zero": 0, "int": 3, "tensor": torch.tensor([4, 1])}[offsets]
    ang = plain_angles(12, r)
    cos, sin = ang.cos().float(), ang.sin().float()
    rope_case(q, k, cos, sin, token_rows(b, s, off), interleaved, LAYOUT_VIEWS[layout], layout=layout,
              seqlen_offsets=off)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rope_positions(backend, interleaved):
    b, s, d = 2, 6, 8
    q, k = torch.randn(b, s, 2, d), torch.randn(b, s, 1, d)
    positions = torch.tensor([[7, 0, 3, 3, 9, 1], [2, 8, 5, 0, 4, 6]])
    ang = plain_angles(10, d, base=500.0)
    rope_case(q, k, ang.cos().float(), ang.sin().float(), positions, interleaved, lambda t: t, positions=positions)


@pytest.mark.parametrize("offsets", ["int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rope_thd_varlen(backend, interleaved, offsets):
    cu = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    off = 2 if offsets == "int" else torch.tensor([5, 0, 11])
    q, k = torch.randn(9, 2, 8), torch.randn(9, 1, 8)
    rows = torch.zeros(1, 9, dtype=torch.long)
    for seq in range(3):  # token t of sequence `seq` sits at t - cu[seq] (+ the sequence's offset)
        for t in range(int(cu[seq]), int(cu[seq + 1])):
            rows[0, t] = t - int(cu[seq]) + (int(off[seq]) if isinstance(off, torch.Tensor) else off)
    ang = plain_angles(20, 8)
    rope_case(q, k, ang.cos().float(), ang.sin().float(), rows, interleaved, lambda t: t.unsqueeze(0),
              layout="thd", cu_seqlens=cu, seqlen_offsets=off)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rope_in_kernel_angles(backend, interleaved):
    """cos=sin=None: the op computes ``p * base^(-2i/r)`` itself (fp32 angles: error ~ p * 2^-24 rad)."""
    q, k = torch.randn(2, 7, 2, 16), torch.randn(2, 7, 1, 16)
    q_out, k_out = fuselab.apply_rope(q, k, None, None, interleaved=interleaved, base=1000.0, seqlen_offsets=5)
    ang = plain_angles(12, 16, base=1000.0)[5:]  # rows 5..11
    c, s = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    assert_close(q_out, plain_rotate(q.double(), c, s, interleaved), torch.float32, "q_out, in-kernel angles")
    assert_close(k_out, plain_rotate(k.double(), c, s, interleaved), torch.float32, "k_out, in-kernel angles")


def test_rope_cos_sin_is_the_formula():
    cos, sin = fuselab.rope_cos_sin(37, 24, base=10000.0, dtype=torch.float64)
    ang = plain_angles(37, 24)
    assert_close(cos, ang.cos(), torch.float64, "cos table")
    assert_close(sin, ang.sin(), torch.float64, "sin table")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_rope_low_precision_one_rounding(backend, interleaved, dtype):
    """fp32 tables, low-precision q/k: each output is one rounding of the exact rotation, so within one ulp of
    q's dtype (0.5 when rounded to nearest, < 1 for a truncating store) plus the fp32 arithmetic's error for
    outputs that cancel to near zero. Rounding the tables (or the angle) to q's dtype first breaks this."""
    q, k = torch.randn(2, 6, 4, 32).to(dtype), torch.randn(2, 6, 2, 32).to(dtype)
    ang = plain_angles(300, 32)
    cos, sin = ang.cos().float(), ang.sin().float()
    q_out, k_out = fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=290, interleaved=interleaved)
    c, s = cos.double()[290:296][None, :, None, :], sin.double()[290:296][None, :, None, :]
    for name, got, x in (("q_out", q_out, q), ("k_out", k_out, k)):
        want = plain_rotate(x.double(), c, s, interleaved)
        atol = 4 * 2.0**-24 * float(x.double().abs().max())
        assert_ulp(got, want, 1.0, name, atol=atol)


def test_rope_matches_hugging_face(backend):
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama",
                                   reason="transformers is not installed: no Hugging Face reference")
    b, h, s, d = 2, 3, 6, 16
    q, k = torch.randn(b, h, s, d), torch.randn(b, 1, s, d)
    ang = plain_angles(s, d)
    cos_half, sin_half = ang.cos().float(), ang.sin().float()
    # HF's tables are (b, s, d): the half table repeated over both halves
    cos_hf = torch.cat((cos_half, cos_half), -1)[None].expand(b, s, d)
    sin_hf = torch.cat((sin_half, sin_half), -1)[None].expand(b, s, d)
    want_q, want_k = modeling.apply_rotary_pos_emb(q.double(), k.double(), cos_hf.double(), sin_hf.double())
    got_q, got_k = fuselab.apply_rope(q, k, cos_half, sin_half, layout="bhsd")
    assert_close(got_q, want_q, torch.float32, "q vs HF")
    assert_close(got_k, want_k, torch.float32, "k vs HF")


# ------------------------------------------------------------------------------------------------ bias_act
F_ACTIVATIONS = {
    "none": lambda z: z,
    "relu": F.relu,
    "relu2": lambda z: F.relu(z) ** 2,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
}


def test_every_activation_has_a_functional_reference():
    assert set(F_ACTIVATIONS) == set(fuselab.ACTIVATIONS)


@pytest.mark.parametrize("activation", sorted(F_ACTIVATIONS))
def test_bias_act_vs_functional(backend, activation):
    x, bias, res = torch.randn(6, 40), torch.randn(40), torch.randn(6, 40)
    leaves = [t.clone().requires_grad_(True) for t in (x, bias, res)]
    y = fuselab.bias_act(leaves[0], leaves[1], residual=leaves[2], alpha=0.75, activation=activation)
    leaves64 = [t.double().requires_grad_(True) for t in (x, bias, res)]
    y64 = F_ACTIVATIONS[activation](leaves64[0] + 0.75 * leaves64[2] + leaves64[1])
    assert_close(y, y64, torch.float32, f"{activation} y")
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    for name, t, t64 in zip(("grad_x", "grad_bias", "grad_residual"), leaves, leaves64):
        assert_close(t.grad, t64.grad, torch.float32, f"{activation} {name}", chained=True)


@pytest.mark.parametrize("activation", sorted(F_ACTIVATIONS))
def test_bias_act_bf16_one_rounding(backend, activation):
    """bf16 in, bf16 out: the kernel computes ``z`` and ``act(z)`` in fp32 and rounds once, so y is within one
    bf16 ulp of the float64 result (0.5 rounded to nearest, < 1 truncated). Inputs of size 2-8 make a rounded
    pre-activation show: an error of ``|z| * 2^-9`` in z moves sigmoid/silu/gelu by several ulps there."""
    x = (torch.rand(8, 64) * 6 + 2) * torch.where(torch.rand(8, 64) < 0.5, -1.0, 1.0)
    x, bias, res = x.bfloat16(), (torch.randn(64) * 0.3).bfloat16(), torch.randn(8, 64).bfloat16()
    y = fuselab.bias_act(x, bias, residual=res, alpha=0.5, activation=activation)
    z64 = x.double() + 0.5 * res.double() + bias.double()
    y64 = F_ACTIVATIONS[activation](z64)
    assert_ulp(y, y64, 1.0, f"{activation} bf16 y", atol=2.0**-24 * 64)


@pytest.mark.parametrize("activation", sorted(F_ACTIVATIONS))
def test_bias_act_bias_only_vs_functional(backend, activation):
    """Bias without residual: the backward rebuilds z = x + bias from the saved x (silu/gelu/gelu_tanh)."""
    x, bias = torch.randn(6, 40), torch.randn(40)
    leaves = [t.clone().requires_grad_(True) for t in (x, bias)]
    y = fuselab.bias_act(leaves[0], leaves[1], activation=activation)
    leaves64 = [t.double().requires_grad_(True) for t in (x, bias)]
    y64 = F_ACTIVATIONS[activation](leaves64[0] + leaves64[1])
    assert_close(y, y64, torch.float32, f"{activation} y")
    g = torch.randn_like(y)
    y.backward(g)
    y64.backward(g.double())
    for name, t, t64 in zip(("grad_x", "grad_bias"), leaves, leaves64):
        assert_close(t.grad, t64.grad, torch.float32, f"{activation} {name}", chained=True)


def test_bias_act_no_bias_no_residual_vs_functional(backend):
    x = torch.randn(3, 5, 17)
    for activation, fn in F_ACTIVATIONS.items():
        assert_close(fuselab.bias_act(x, None, activation=activation), fn(x.double()), torch.float32, activation)


# ------------------------------------------------------------------------------------------------ sum / mean
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 2), (1, 2)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_reduce_vs_torch(backend, op, dim, dtype):
    x = torch.randn(4, 33, 19).to(dtype)
    ours, theirs = getattr(fuselab, op), getattr(torch, op)
    for keepdim in (False, True):
        got = ours(x, dim, keepdim)
        want = theirs(x.double(), dim=() if dim is None else dim, keepdim=keepdim)
        n = x.numel() // max(want.numel(), 1)
        # fp32 accumulation of n terms of size <= |x|max: a random walk of n roundings
        acc = 4 * 2.0**-24 * math.sqrt(n) * n * float(x.double().abs().max()) / (n if op == "mean" else 1)
        assert got.dtype == dtype and got.shape == want.shape
        # the kernel rounds its fp32 total to nearest (also under the interpreter): half an ulp
        assert_ulp(got, want, 0.5, f"{op}(dim={dim}, keepdim={keepdim})", atol=acc)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reduce_out_dtype_vs_torch(backend, op):
    x = torch.randn(7, 45).bfloat16()
    got = getattr(fuselab, op)(x, 1, dtype=torch.float32)
    want = getattr(torch, op)(x.double(), dim=1)
    assert got.dtype == torch.float32
    assert_close(got, want, torch.float32, f"{op} to float32", atol=4 * 2.0**-24 * 45 * 4)
