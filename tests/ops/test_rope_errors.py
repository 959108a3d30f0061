"""Every bad input to apply_rope raises ValueError/TypeError naming the argument (both backends)."""

from __future__ import annotations

import pytest
import torch

import fuselab


def base_args():
    q, k = torch.randn(2, 5, 3, 16), torch.randn(2, 5, 1, 16)
    cos, sin = fuselab.rope_cos_sin(8, 16)
    return [q, k, cos, sin], {}


def thd_args():
    q, k = torch.randn(9, 3, 16), torch.randn(9, 1, 16)
    cos, sin = fuselab.rope_cos_sin(8, 16)
    return [q, k, cos, sin], {"layout": "thd", "cu_seqlens": torch.tensor([0, 4, 9], dtype=torch.int32)}


def bad(name):
    a, kw = thd_args() if name.startswith("thd") else base_args()
    q, k, cos, sin = a
    if name == "rank":
        a[0] = q[0]
        return a, kw, ValueError, r"q must have 4 dims \(batch, seq, heads, head_dim\)"
    if name == "layout_name":
        return a, {"layout": "bsdh"}, ValueError, "layout must be one of"
    if name == "layout_rank":
        return a, {"layout": "thd", "cu_seqlens": torch.tensor([0, 5])}, ValueError, r"q must have 3 dims"
    if name == "k_rank":
        a[1] = k[0]
        return a, kw, ValueError, "k must have 4 dims"
    if name == "odd_rotary_dim":
        return [q, k, None, None], {"rotary_dim": 7}, ValueError, "rotary_dim must be a positive even int"
    if name == "rotary_dim_too_big":
        c, s = fuselab.rope_cos_sin(8, 32)
        return [q, k, c, s], kw, ValueError, r"rotary_dim \(32\) must be <= head_dim \(16\)"
    if name == "rotary_dim_disagrees":
        return a, {"rotary_dim": 8}, ValueError, "rotary_dim=8 disagrees with cos"
    if name in ("k_batch", "k_seq", "k_dim"):
        a[1] = {"k_batch": torch.randn(1, 5, 1, 16), "k_seq": torch.randn(2, 4, 1, 16),
                "k_dim": torch.randn(2, 5, 1, 8)}[name]
        return a, kw, ValueError, "k must match q in batch, seq and head_dim"
    if name == "table_short_offset":
        return a, {"seqlen_offsets": 4}, ValueError, r"cos/sin have 8 rows .* seqlen_offsets \+ seqlen = 9"
    # tensor positions/offsets are checked on the host when they are on the CPU; CUDA ones with check_positions
    # (else the kernel clamps them, as documented)
    checked = {"check_positions": True} if a[0].is_cuda else {}
    if name == "table_short_positions":
        return a, {"positions": torch.tensor([[0, 1, 2, 3, 8]] * 2), **checked}, ValueError, \
            r"positions reach table row 8"
    if name == "negative_positions":
        return a, {"positions": torch.tensor([[0, 1, -1, 3, 4]]), **checked}, ValueError, r"positions reach"
    if name == "table_short_offsets_tensor":
        return a, {"seqlen_offsets": torch.tensor([0, 4]), **checked}, ValueError, \
            r"seqlen_offsets reach table row 8"
    if name == "thd_table_short":
        return a, {**kw, "seqlen_offsets": 4}, ValueError, r"seqlen_offsets \+ seqlen = 9"
    if name == "thd_cu_not_increasing":
        return a, {**kw, "cu_seqlens": torch.tensor([0, 6, 4, 9], dtype=torch.int32)}, ValueError, "non-decreasing"
    if name == "thd_cu_wrong_end":
        return a, {**kw, "cu_seqlens": torch.tensor([0, 4, 8], dtype=torch.int32)}, ValueError, "end at total_tokens"
    if name == "thd_cu_wrong_start":
        return a, {**kw, "cu_seqlens": torch.tensor([1, 4, 9], dtype=torch.int32)}, ValueError, "start at 0"
    if name == "thd_cu_dtype":
        return a, {**kw, "cu_seqlens": torch.tensor([0.0, 4, 9])}, ValueError, "cu_seqlens must be a 1-D int32"
    if name == "thd_no_cu":
        return a, {"layout": "thd"}, ValueError, "needs cu_seqlens"
    if name == "thd_max_seqlen_short":
        return a, {**kw, "max_seqlen": 3}, ValueError, "max_seqlen=3 is shorter"
    if name == "cu_not_thd":
        return a, {"cu_seqlens": torch.tensor([0, 5, 10], dtype=torch.int32)}, ValueError, "only to layout='thd'"
    if name == "positions_and_offsets":
        return a, {"positions": torch.zeros(2, 5, dtype=torch.long), "seqlen_offsets": 1}, ValueError, "exclusive"
    if name == "positions_shape":
        return a, {"positions": torch.zeros(5, dtype=torch.long)}, ValueError, r"positions must have shape"
    if name == "positions_dtype":
        return a, {"positions": torch.zeros(2, 5)}, TypeError, "positions must be an int32/int64 tensor"
    if name == "offsets_shape":
        return a, {"seqlen_offsets": torch.tensor([1, 2, 3])}, ValueError, r"shape \(batch,\) = \(2,\)"
    if name == "offsets_type":
        return a, {"seqlen_offsets": 1.5}, TypeError, "seqlen_offsets must be an int"
    if name == "offsets_negative":
        return a, {"seqlen_offsets": -1}, ValueError, "seqlen_offsets must be >= 0"
    if name == "devices":
        a[2], a[3] = cos.to("meta"), sin.to("meta")
        return a, kw, ValueError, f"cos is on meta but q is on {a[0].device}"
    if name == "int_q":
        a[0] = q.long()
        return a, kw, TypeError, "q must have a floating dtype"
    if name == "int_cos":
        a[2] = cos.long()
        return a, kw, TypeError, "cos must have a floating dtype"
    if name == "q_not_tensor":
        a[0] = q.tolist()
        return a, kw, TypeError, "q must be a torch.Tensor"
    if name == "one_table":
        a[3] = None
        return a, kw, ValueError, "cos and sin must both be"
    if name == "table_rank":
        a[2], a[3] = cos[None], sin[None]
        return a, kw, ValueError, r"cos must have shape \(seqlen_ro, rotary_dim // 2\)"
    if name == "sin_shape":
        a[3] = sin[:4]
        return a, kw, ValueError, "sin must have the shape of cos"
    if name == "scaling_type":
        return [q, k, None, None], {"scaling": {"type": "nope"}}, ValueError, r"scaling\['type'\] must be one of"
    if name == "scaling_key":
        return [q, k, None, None], {"scaling": {"type": "llama3", "factor": 8.0}}, ValueError, "needs the key"
    if name == "k_dtype":  # fp32 q with fp64 k: k must have q's dtype
        a[1] = k.double()
        return a, kw, ValueError, "k must have q's dtype torch.float32, got torch.float64"
    if name == "inplace_leaf_q":
        a[0] = q.clone().requires_grad_(True)
        return a, {**kw, "inplace": True}, ValueError, "inplace=True on q, a leaf tensor that requires grad"
    if name == "inplace_leaf_k":
        a[1] = k.clone().requires_grad_(True)
        return a, {**kw, "inplace": True}, ValueError, "inplace=True on k, a leaf tensor that requires grad"
    if name == "scaling_not_dict":
        return [q, k, None, None], {"scaling": 2.0}, TypeError, "scaling must be None or a dict"
    raise AssertionError(name)


CASES = ["rank", "layout_name", "layout_rank", "k_rank", "odd_rotary_dim", "rotary_dim_too_big", "rotary_dim_disagrees",
         "k_batch", "k_seq", "k_dim", "table_short_offset", "table_short_positions", "negative_positions",
         "table_short_offsets_tensor", "thd_table_short", "thd_cu_not_increasing", "thd_cu_wrong_end",
         "thd_cu_wrong_start", "thd_cu_dtype", "thd_no_cu", "thd_max_seqlen_short", "cu_not_thd",
         "positions_and_offsets", "positions_shape", "positions_dtype", "offsets_shape", "offsets_type",
         "offsets_negative", "devices", "int_q", "int_cos", "q_not_tensor", "one_table", "table_rank", "sin_shape",
         "scaling_type", "scaling_key", "scaling_not_dict", "k_dtype", "inplace_leaf_q", "inplace_leaf_k"]


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", CASES)
def test_bad_input(request, backend, name):
    request.getfixturevalue(backend)
    args, kw, err, match = bad(name)
    with pytest.raises(err, match=match):
        fuselab.apply_rope(*args, **kw)


@pytest.mark.parametrize("kw,match", [({"seqlen": 0, "rotary_dim": 8}, "seqlen must be a positive int"),
                                      ({"seqlen": 4, "rotary_dim": 7}, "rotary_dim must be a positive even"),
                                      ({"seqlen": 4, "rotary_dim": 8, "base": 1.0}, "base must be a number > 1"),
                                      ({"seqlen": 4, "rotary_dim": 8, "scaling": {"type": "linear"}}, "'factor'")])
def test_rope_cos_sin_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        fuselab.rope_cos_sin(**kw)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
def test_inplace_leaf_rejected_after_a_kept_call(request, backend):
    """The check holds on the fast path too (a call of the same key kept its launch) and leaves q untouched; under
    no_grad, in place on a leaf that requires grad is allowed (as torch allows it)."""
    request.getfixturevalue(backend)
    q, k = torch.randn(2, 5, 3, 16), torch.randn(2, 5, 1, 16)
    cos, sin = fuselab.rope_cos_sin(5, 16)
    fuselab.apply_rope(q.clone(), k.clone(), cos, sin, inplace=True)  # keeps the launch of this key
    leaf = q.clone().requires_grad_(True)
    before = leaf.detach().clone()
    with pytest.raises(ValueError, match="inplace=True on q"):
        fuselab.apply_rope(leaf, k.clone(), cos, sin, inplace=True)
    assert torch.equal(leaf.detach(), before)
    with torch.no_grad():
        out, _ = fuselab.apply_rope(leaf, k.clone(), cos, sin, inplace=True)
    assert out is leaf and not torch.equal(leaf.detach(), before)


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", CASES)
def test_bad_input_after_good_calls(request, backend, name):
    """Every bad input still raises after good calls planned their signatures (a repeat takes the cached path)."""
    request.getfixturevalue(backend)
    for make in (base_args, thd_args):
        args, kw = make()
        fuselab.apply_rope(*args, **kw)
        fuselab.apply_rope(*args, **kw)
    args, kw, err, match = bad(name)
    with pytest.raises(err, match=match):
        fuselab.apply_rope(*args, **kw)


def _same_signature(name):
    """(a good call, a bad call of the same signature: only values differ, so the bad one reaches the cached plan
    unless a check of values stops it, error, match)."""
    q, k = torch.randn(2, 5, 3, 16), torch.randn(2, 5, 1, 16)
    cos, sin = fuselab.rope_cos_sin(8, 16)
    if name == "offset_past_table":  # 3 and 4: one specialization class
        return ([q, k, cos, sin], {"seqlen_offsets": 3}), ([q, k, cos, sin], {"seqlen_offsets": 4}), ValueError, \
            r"seqlen_offsets \+ seqlen = 9"
    if name == "offset_negative":
        return ([q, k, cos, sin], {"seqlen_offsets": 3}), ([q, k, cos, sin], {"seqlen_offsets": -13}), ValueError, \
            "seqlen_offsets must be >= 0"
    if name == "positions_and_offset":  # 0 and 16: one class
        pos = torch.zeros(2, 5, dtype=torch.long)
        return ([q, k, cos, sin], {"positions": pos}), ([q, k, cos, sin], {"positions": pos, "seqlen_offsets": 16}), \
            ValueError, "exclusive"
    if name == "positions_past_table":  # CPU positions: checked on the host on every call
        good, bad_pos = torch.zeros(2, 5, dtype=torch.long), torch.full((2, 5), 8)
        return ([q, k, cos, sin], {"positions": good}), ([q, k, cos, sin], {"positions": bad_pos}), ValueError, \
            "positions reach table row 8"
    if name == "thd_cu_values":
        qt, kt = torch.randn(9, 3, 16), torch.randn(9, 1, 16)
        good, bad_cu = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 6, 4], dtype=torch.int32)
        return ([qt, kt, cos, sin], {"layout": "thd", "cu_seqlens": good}), \
            ([qt, kt, cos, sin], {"layout": "thd", "cu_seqlens": bad_cu}), ValueError, "non-decreasing"
    if name == "inplace_same_tensor":  # apply_rope(x, x, inplace=True) rotated x twice
        a, b = torch.randn(2, 5, 3, 16), torch.randn(2, 5, 3, 16)
        return ([a, b, cos, sin], {"inplace": True}), ([a, a, cos, sin], {"inplace": True}), ValueError, \
            "q and k overlap in memory"
    if name == "inplace_overlapping_views":  # heads 0-3 and 2-5 of one buffer; of two buffers as the good call
        a, b = torch.randn(2, 5, 6, 16), torch.randn(2, 5, 6, 16)
        return ([a[:, :, :4], b[:, :, 2:], cos, sin], {"inplace": True}), \
            ([a[:, :, :4], a[:, :, 2:], cos, sin], {"inplace": True}), ValueError, "q and k overlap in memory"
    if name == "inplace_leaf":
        return ([q.clone(), k.clone(), cos, sin], {"inplace": True}), \
            ([q.clone().requires_grad_(True), k.clone(), cos, sin], {"inplace": True}), ValueError, \
            "inplace=True on q, a leaf tensor"
    raise AssertionError(name)


SAME_SIGNATURE = ["offset_past_table", "offset_negative", "positions_and_offset", "positions_past_table",
                  "thd_cu_values", "inplace_same_tensor", "inplace_overlapping_views", "inplace_leaf"]


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
@pytest.mark.parametrize("name", SAME_SIGNATURE)
def test_bad_values_on_the_cached_path(request, backend, name):
    """A call whose shapes, dtypes and flags equal a good call's (its signature was planned) is still held to the
    checks of values: the same error as on a first call, both ways round, and the bad call writes nothing."""
    request.getfixturevalue(backend)
    (good, good_kw), (bad_args, bad_kw), err, match = _same_signature(name)
    fuselab.ops.clear()
    with pytest.raises(err, match=match):  # first call
        fuselab.apply_rope(*bad_args, **bad_kw)
    fuselab.apply_rope(*good, **good_kw)
    fuselab.apply_rope(*good, **good_kw)
    before = [t.detach().clone() for t in bad_args[:2]]
    with pytest.raises(err, match=match):  # after the signature was planned
        fuselab.apply_rope(*bad_args, **bad_kw)
    for t, was in zip(bad_args[:2], before):
        assert torch.equal(t.detach(), was)


def test_inplace_views_that_do_not_overlap_are_accepted(triton_backend):
    """q and k as disjoint head slices of one packed buffer (fused QKV) rotate in place; out of place, q and k may be
    the same tensor."""
    qkv = torch.randn(2, 5, 6, 16)
    cos, sin = fuselab.rope_cos_sin(5, 16)
    want_q, want_k = fuselab.apply_rope(qkv[:, :, :4].clone(), qkv[:, :, 4:5].clone(), cos, sin)
    fuselab.apply_rope(qkv[:, :, :4], qkv[:, :, 4:5], cos, sin, inplace=True)
    assert torch.equal(qkv[:, :, :4], want_q) and torch.equal(qkv[:, :, 4:5], want_k)
    x = torch.randn(2, 5, 3, 16)
    a, b = fuselab.apply_rope(x, x, cos, sin)
    assert torch.equal(a, b)
