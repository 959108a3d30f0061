"""fuselab.hf.apply_rotary_pos_emb: against Hugging Face's formula (written here) and against the installed
transformers' own function (5.x in the venv, 4.x in a subprocess: ``tests/hf_library.py``), forward and grads,
positional and keyword calls in the installed version's signature."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

import fuselab
from fuselab import hf
from fuselab.testing import assert_close
from hf_library import major, run_under_transformers_4, transformers


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def swap_halves(x):
    return torch.cat((x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


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
    qo, ko = hf.apply_rotary_pos_emb_v5(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
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


@pytest.mark.parametrize("fn", [hf.apply_rotary_pos_emb_v4, hf.apply_rotary_pos_emb_v5])
def test_drop_in_cpu_path_and_partial(torch_backend, fn):
    """The reference path; rotary_dim < head_dim passes the remaining dims through."""
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    cos, sin = hf_tables(torch.arange(5)[None], 8, torch.float32)
    extra = {"position_ids": torch.arange(5)[None]} if fn is hf.apply_rotary_pos_emb_v4 else {}
    qo, ko = fn(q, k, cos, sin, **extra)
    rq, rk = hf_formula(q[..., :8].double(), k[..., :8].double(), cos.double(), sin.double())
    assert_close(qo[..., :8], rq, torch.float32, "rotated")
    assert torch.equal(qo[..., 8:], q[..., 8:]) and torch.equal(ko[..., 8:], k[..., 8:])
    assert_close(ko[..., :8], rk, torch.float32, "k rotated")


def test_drop_in_matches_apply_rope(triton_backend, device):
    """HF tables from arange positions == fuselab tables: both APIs give the same result."""
    q, k = torch.randn(2, 3, 6, 16, device=device), torch.randn(2, 1, 6, 16, device=device)
    cos, sin = hf_tables(torch.arange(6)[None], 16, torch.float32)
    a = hf.apply_rotary_pos_emb_v5(q, k, cos.to(device), sin.to(device))
    c2, s2 = fuselab.rope_cos_sin(6, 16, device=device)
    b = fuselab.apply_rope(q, k, c2, s2, layout="bhsd")
    assert_close(a[0], b[0].double(), torch.float32, "q")
    assert_close(a[1], b[1].double(), torch.float32, "k")


BAD_CASES = ["unsqueeze", "unsqueeze_bool", "position_ids_as_unsqueeze_v5", "unsqueeze_as_position_ids_v4", "rank",
             "cos_2d", "cos_shape", "odd", "too_wide", "kq", "dtype", "sin"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_drop_in_bad_input(torch_backend, case):
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    cos, sin = hf_tables(torch.arange(5)[None], 16, torch.float32)
    fn, args, kwargs = hf.apply_rotary_pos_emb_v5, [q, k, cos, sin], {}
    err, match = ValueError, None
    if case == "unsqueeze":
        kwargs["unsqueeze_dim"], match = 0, "unsqueeze_dim must be 1"
    elif case == "unsqueeze_bool":
        kwargs["unsqueeze_dim"], err, match = True, TypeError, "unsqueeze_dim must be an int, got bool"
    elif case == "position_ids_as_unsqueeze_v5":  # a 4.x call (position_ids fifth) against the 5.x signature
        args.append(torch.arange(5)[None])
        err, match = TypeError, "no position_ids parameter"
    elif case == "unsqueeze_as_position_ids_v4":  # a 5.x call (unsqueeze_dim fifth) against the 4.x signature
        fn = hf.apply_rotary_pos_emb_v4
        args.append(2)
        err, match = TypeError, "position_ids must be a tensor or None.*got int: pass unsqueeze_dim by keyword"
    elif case == "rank":
        args[0], match = q[0], "q must have 4 dims"
    elif case == "cos_2d":  # transformers would broadcast (seq, dim).unsqueeze(1) against heads: refused
        args[2], args[3], match = cos[0], sin[0], r"cos must have shape \(batch or 1, seq, rotary_dim\)"
    elif case == "cos_shape":
        args[2], args[3], match = cos[:, :3], sin[:, :3], "cos must have shape"
    elif case == "odd":
        args[2], args[3], match = cos[..., :5], sin[..., :5], "rotary_dim"
    elif case == "too_wide":
        args[0], args[1], match = q[..., :8], k[..., :8], "rotary_dim"
    elif case == "kq":
        args[1], match = torch.randn(1, 1, 4, 16), "k must match q"
    elif case == "dtype":
        args[0], err, match = q.long(), TypeError, "q must have a floating dtype"
    else:
        args[3], match = sin[:, :, :8], "sin must have the shape of cos"
    with pytest.raises(err, match=match):
        fn(*args, **kwargs)


@pytest.mark.parametrize("version,want", [("4.45.0", "v4"), ("4.57.6", "v4"), ("3.5.1", "v4"), ("5.0.0", "v5"),
                                          ("5.24.0.dev0", "v5"), ("6.1.0", "v5"), (None, "v5")])
def test_signature_follows_the_version(monkeypatch, version, want):
    """``apply_rotary_pos_emb`` is the function of the imported transformers' major version (5.x's without one or
    past 5.x); the lookup runs on each access."""
    fns = {"v4": hf.apply_rotary_pos_emb_v4, "v5": hf.apply_rotary_pos_emb_v5}
    assert hf.signature_for(version) is fns[want]
    if version is not None:
        monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__=version))
        assert hf.apply_rotary_pos_emb is fns[want]
        from fuselab.hf import apply_rotary_pos_emb
        assert apply_rotary_pos_emb is fns[want]
    with pytest.raises(ValueError, match="version must look like"):
        hf.signature_for("main")
    with pytest.raises(AttributeError, match="no attribute 'apply_rotary'"):
        hf.apply_rotary  # noqa: B018


# ---------------------------------------------------------------- against the installed transformers' function
def library_function():
    library = transformers()
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    return library, apply_rotary_pos_emb


def roundoff_bound(q, cos, sin, dtype, unsqueeze_dim):
    """Per element, what the library's rounded products and sum plus fuselab's one rounding can differ by:
    ``4 u (|q cos| + |rotate_half(q) sin|)`` with ``u`` the unit roundoff of ``dtype`` (float64 arithmetic)."""
    u = torch.finfo(dtype).eps / 2
    c, s = cos.double().abs().unsqueeze(unsqueeze_dim), sin.double().abs().unsqueeze(unsqueeze_dim)
    a = q.detach().double().abs()
    return 4 * u * (a * c + swap_halves(a) * s)


def grad_bound(g, cos, sin, dtype, unsqueeze_dim):
    """The same bound for the gradient ``g cos + rotate_half^T(g sin)``."""
    u = torch.finfo(dtype).eps / 2
    c, s = cos.double().abs().unsqueeze(unsqueeze_dim), sin.double().abs().unsqueeze(unsqueeze_dim)
    a = g.double().abs()
    return 4 * u * (a * c + swap_halves(a * s))


def make_inputs(device, unsqueeze_dim, dtype, heads, seq, kv_heads=1, head_dim=16, batch=2, table_dtype=None):
    """q as a model makes it (a projection's view, transposed for unsqueeze_dim 1), k, HF's tables."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(batch, seq, heads * head_dim, generator=gen).to(device, dtype).view(batch, seq, heads, head_dim)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=gen).to(device, dtype)
    if unsqueeze_dim in (1, -3):
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = hf_tables(torch.randint(0, 64, (batch, seq), generator=gen), head_dim, table_dtype or dtype)
    return q.requires_grad_(True), k.requires_grad_(True), cos.to(device), sin.to(device)


def compare_with_library(lib_fn, ours, q, k, cos, sin, args, kwargs, unsqueeze_dim):
    """Outputs (dtype and every element) and the gradients of q and k, ours against the library's."""
    q2, k2 = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
    want_q, want_k = lib_fn(q2, k2, cos, sin, *args, **kwargs)
    got_q, got_k = ours(q, k, cos, sin, *args, **kwargs)
    assert (got_q.dtype, got_k.dtype, got_q.shape, got_k.shape) == (want_q.dtype, want_k.dtype, want_q.shape,
                                                                     want_k.shape)
    assert_close(got_q, want_q, atol=roundoff_bound(q, cos, sin, want_q.dtype, unsqueeze_dim), rtol=0.0,
                 what="q_embed")
    assert_close(got_k, want_k, atol=roundoff_bound(k, cos, sin, want_k.dtype, unsqueeze_dim), rtol=0.0,
                 what="k_embed")
    gq, gk = torch.randn_like(want_q), torch.randn_like(want_k)
    torch.autograd.backward([want_q, want_k], [gq, gk])
    torch.autograd.backward([got_q, got_k], [gq, gk])
    assert (q.grad.dtype, k.grad.dtype) == (q2.grad.dtype, k2.grad.dtype) == (q.dtype, k.dtype)
    # the gradients have q's and k's dtypes (narrower than the outputs' where the tables are wider)
    assert_close(q.grad, q2.grad, atol=grad_bound(gq, cos, sin, q.dtype, unsqueeze_dim), rtol=0.0, what="grad q")
    assert_close(k.grad, k2.grad, atol=grad_bound(gk, cos, sin, k.dtype, unsqueeze_dim), rtol=0.0, what="grad k")


def call_arguments(lib_fn, form, unsqueeze_dim, position_ids):
    """``(args, kwargs)`` after ``q, k, cos, sin`` in the library's own signature: every parameter after ``sin``
    positionally, or by keyword, or (``unsqueeze_dim`` 1 only) none: the defaults."""
    names = list(inspect.signature(lib_fn).parameters)[4:]
    values = {"position_ids": position_ids, "unsqueeze_dim": unsqueeze_dim}
    assert set(names) <= set(values), f"unknown parameters {names}"
    if form == "defaults":
        return [], {}
    if form == "positional":
        return [values[n] for n in names], {}
    return [], {n: values[n] for n in names}


def test_signature_matches_transformers():
    library, lib_fn = library_function()
    ours = fuselab.hf.apply_rotary_pos_emb
    want = [(p.name, p.kind, p.default) for p in inspect.signature(lib_fn).parameters.values()]
    got = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
    assert got == want, f"transformers {library.__version__}: {want}, fuselab.hf: {got}"
    assert ours is (hf.apply_rotary_pos_emb_v4 if major(library) == 4 else hf.apply_rotary_pos_emb_v5)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("form,unsqueeze_dim", [("defaults", 1), ("positional", 1), ("keywords", 1),
                                                ("positional", 2), ("keywords", 2), ("positional", -2),
                                                ("keywords", -3)])
def test_calls_match_transformers(request, device, backend, form, unsqueeze_dim):
    _, lib_fn = library_function()
    request.getfixturevalue(backend)
    q, k, cos, sin = make_inputs(device, unsqueeze_dim, torch.float32, heads=3, seq=5)
    args, kwargs = call_arguments(lib_fn, form, unsqueeze_dim, torch.arange(5, device=device)[None])
    compare_with_library(lib_fn, fuselab.hf.apply_rotary_pos_emb, q, k, cos, sin, args, kwargs, unsqueeze_dim)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("unsqueeze_dim", [2, -2])
def test_fifth_positional_argument_matches_transformers(request, device, backend, unsqueeze_dim):
    """As many heads (of q and k) as tokens: a fifth positional argument taken for the wrong parameter would rotate
    along the heads, silently; every element matches the library's instead."""
    _, lib_fn = library_function()
    request.getfixturevalue(backend)
    q, k, cos, sin = make_inputs(device, unsqueeze_dim, torch.float32, heads=4, seq=4, kv_heads=4)
    args, _ = call_arguments(lib_fn, "positional", unsqueeze_dim, None)
    compare_with_library(lib_fn, fuselab.hf.apply_rotary_pos_emb, q, k, cos, sin, args, {}, unsqueeze_dim)


@pytest.mark.parametrize("dtype,table_dtype", [(torch.bfloat16, None), (torch.float16, None),
                                               (torch.float64, None), (torch.bfloat16, torch.float32)])
def test_dtypes_match_transformers(triton_backend, device, dtype, table_dtype):
    """Low precision (the library rounds each product and the sum), float64, and bf16 q and k with float32 tables
    (the library's outputs are float32 then, and so are ours)."""
    _, lib_fn = library_function()
    q, k, cos, sin = make_inputs(device, 2, dtype, heads=2, seq=3, table_dtype=table_dtype)
    compare_with_library(lib_fn, fuselab.hf.apply_rotary_pos_emb, q, k, cos, sin, [], {"unsqueeze_dim": 2}, 2)


def test_mixed_q_k_dtypes_match_transformers(triton_backend, device):
    """float32 q with bfloat16 k and tables: the library gives a float32 q_embed and a bfloat16 k_embed (one launch
    each here)."""
    _, lib_fn = library_function()
    q, _, cos, sin = make_inputs(device, 1, torch.float32, heads=2, seq=3, table_dtype=torch.bfloat16)
    k = make_inputs(device, 1, torch.bfloat16, heads=1, seq=3)[0]
    compare_with_library(lib_fn, fuselab.hf.apply_rotary_pos_emb, q, k, cos, sin, [], {}, 1)


def test_signature_without_an_imported_transformers(monkeypatch):
    """Before transformers is imported, the installed package's metadata decides (5.x's without one)."""
    import importlib.metadata
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = None
    assert hf.apply_rotary_pos_emb is hf.signature_for(version)
    assert "transformers" not in sys.modules  # the lookup imports nothing


def test_transformers_4x_in_a_subprocess():
    """The comparisons with the library above and those of ``tests/test_rope_scaling.py``, with the transformers
    4.x of ``.ci/run`` first on sys.path; on the reference path only and without the dtype cases (the kernel and
    the dtypes do not depend on the signature: the 5.x run covers them)."""
    run_under_transformers_4(["test_hf.py", "test_rope_scaling.py"],
                             "transformers and not subprocess and not dtypes and not triton_backend")
