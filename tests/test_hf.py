"""fuselab.hf.apply_rotary_pos_emb vs Hugging Face's formula (reimplemented here), forward and grads."""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab import hf
from fuselab.testing import assert_close


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_formula(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' Llama apply_rotary_pos_emb, written from its definition."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def hf_tables(position_ids, dim, dtype, base=10000.0):
    """HF's rotary embedding output: duplicated (batch, seq, dim) cos/sin from position ids."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("unsqueeze_dim,dtype,batch_tables", [(1, torch.float32, True), (2, torch.bfloat16, False),
                                                              (1, torch.float16, False)])
def test_drop_in_matches_hf(triton_backend, device, unsqueeze_dim, dtype, batch_tables):
    b, hq, hk, s, d = 2, 4, 2, 7, 32
    shape = (b, hq, s, d) if unsqueeze_dim == 1 else (b, s, hq, d)
    kshape = (b, hk, s, d) if unsqueeze_dim == 1 else (b, s, hk, d)
    q = torch.randn(shape, device=device).to(dtype).requires_grad_(True)
    k = torch.randn(kshape, device=device).to(dtype).requires_grad_(True)
    pos = torch.randint(0, 50, (b, s)) if batch_tables else torch.arange(s)[None]
    cos, sin = hf_tables(pos, d, dtype)
    cos, sin = cos.to(device), sin.to(device)
    qo, ko = hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    q64, k64 = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    rq, rk = hf_formula(q64, k64, cos.double(), sin.double(), unsqueeze_dim)
    assert qo.dtype == dtype and ko.shape == k.shape
    assert_close(qo, rq, dtype, "q_embed")
    assert_close(ko, rk, dtype, "k_embed")
    gq, gk = torch.randn_like(rq), torch.randn_like(rk)
    torch.autograd.backward([qo, ko], [gq.to(dtype), gk.to(dtype)])
    torch.autograd.backward([rq, rk], [gq.to(dtype).double(), gk.to(dtype).double()])
    assert_close(q.grad, q64.grad, dtype, "grad q")
    assert_close(k.grad, k64.grad, dtype, "grad k")


def test_drop_in_cpu_path_and_partial(torch_backend):
    """The reference path; rotary_dim < head_dim passes the remaining dims through."""
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    cos, sin = hf_tables(torch.arange(5)[None], 8, torch.float32)
    qo, ko = hf.apply_rotary_pos_emb(q, k, cos, sin, position_ids=torch.arange(5)[None])
    rq, rk = hf_formula(q[..., :8].double(), k[..., :8].double(), cos.double(), sin.double())
    assert_close(qo[..., :8], rq, torch.float32, "rotated")
    assert torch.equal(qo[..., 8:], q[..., 8:]) and torch.equal(ko[..., 8:], k[..., 8:])
    assert_close(ko[..., :8], rk, torch.float32, "k rotated")


def test_drop_in_matches_apply_rope(triton_backend, device):
    """HF tables from arange positions == fuselab tables: both APIs give the same result."""
    q, k = torch.randn(2, 3, 6, 16, device=device), torch.randn(2, 1, 6, 16, device=device)
    cos, sin = hf_tables(torch.arange(6)[None], 16, torch.float32)
    a = hf.apply_rotary_pos_emb(q, k, cos.to(device), sin.to(device))
    c2, s2 = fuselab.rope_cos_sin(6, 16, device=device)
    b = fuselab.apply_rope(q, k, c2, s2, layout="bhsd")
    assert_close(a[0], b[0].double(), torch.float32, "q")
    assert_close(a[1], b[1].double(), torch.float32, "k")


@pytest.mark.parametrize("case", ["unsqueeze", "rank", "cos_shape", "odd", "too_wide", "kq", "dtype", "sin"])
def test_drop_in_bad_input(torch_backend, case):
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    cos, sin = hf_tables(torch.arange(5)[None], 16, torch.float32)
    args = dict(q=q, k=k, cos=cos, sin=sin)
    err, match = ValueError, None
    if case == "unsqueeze":
        args["unsqueeze_dim"], match = 0, "unsqueeze_dim"
    elif case == "rank":
        args["q"], match = q[0], "q must have 4 dims"
    elif case == "cos_shape":
        args["cos"], args["sin"], match = cos[:, :3], sin[:, :3], "cos must have shape"
    elif case == "odd":
        args["cos"], args["sin"], match = cos[..., :5], sin[..., :5], "rotary_dim"
    elif case == "too_wide":
        args["q"], args["k"], match = q[..., :8], k[..., :8], "rotary_dim"
    elif case == "kq":
        args["k"], match = torch.randn(1, 1, 4, 16), "k must match q"
    elif case == "dtype":
        args["q"], err, match = q.long(), TypeError, "q must have a floating dtype"
    else:
        args["sin"], match = sin[:, :, :8], "sin must have the shape of cos"
    with pytest.raises(err, match=match):
        hf.apply_rotary_pos_emb(**args)
