"""apply_rope through the Triton kernel (interpreter on CPU) vs the float64 reference: forward and both grads."""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab.core import device as device_facts
from fuselab.ops.rope import checks as rope_checks
from fuselab.ops.rope import launch as rope_kernel
from fuselab.ops.rope import op as rope_mod
from fuselab.reference import rope as ref
from fuselab.testing import assert_close, poison_


@pytest.fixture
def poisoned(monkeypatch):
    """Every output the op allocates starts as NaN: an element the kernel forgets fails the comparison."""
    monkeypatch.setattr(rope_kernel, "_empty_like", lambda t: poison_(torch.empty_like(t)))
    yield


def make(layout: str, b: int, s: int, h: int, d: int, dtype=torch.float32, device="cpu", strided=False):
    """A random tensor in ``layout`` with logical (b, s, h, d); ``strided``: a non-contiguous view."""
    shape = {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d), "thd": (b * s, h, d)}[layout]
    if not strided:
        return torch.randn(shape, device=device).to(dtype)
    # a padded head_dim and a permuted storage order: no stride is the contiguous one
    big = torch.randn(*reversed(shape[:-1]), shape[-1] + 8, device=device).to(dtype)
    return big[..., : shape[-1]].permute(*reversed(range(len(shape) - 1)), len(shape) - 1)


def run_both(q, k, cos, sin, grads=True, **kw):
    """(outputs, grads) of fuselab.apply_rope and of the float64 reference on the same inputs."""
    results = []
    for use_ref in (False, True):
        qq = q.detach().clone().to(torch.float64) if use_ref else q.detach().clone()
        kk = None if k is None else (k.detach().clone().to(torch.float64) if use_ref else k.detach().clone())
        if grads:
            qq.requires_grad_(True)
            if kk is not None:
                kk.requires_grad_(True)
        cc = None if cos is None else (cos.double() if use_ref else cos)
        ss = None if sin is None else (sin.double() if use_ref else sin)
        fn = ref.apply_rope if use_ref else fuselab.apply_rope
        if use_ref and cos is None:
            kw = {**kw, "rotary_dim": kw.get("rotary_dim") or q.shape[-1]}
        qo, ko = fn(qq, kk, cc, ss, **kw)
        g = []
        if grads:
            torch.manual_seed(1)
            gq = torch.randn(qo.shape, dtype=q.dtype, device=q.device)
            gk = None if ko is None else torch.randn(ko.shape, dtype=q.dtype, device=q.device)
            outs = [qo] + ([ko] if ko is not None else [])
            gs = [gq.to(qo.dtype)] + ([gk.to(ko.dtype)] if ko is not None else [])
            torch.autograd.backward(outs, gs)
            g = [qq.grad] + ([kk.grad] if kk is not None else [])
        results.append(((qo, ko), g))
    return results


def check(q, k, cos, sin, grads=True, **kw):
    (out, g), (rout, rg) = run_both(q, k, cos, sin, grads=grads, **kw)
    assert out[0].dtype == q.dtype and out[0].shape == q.shape
    assert_close(out[0], rout[0], q.dtype, "q_out")
    if k is None:
        assert out[1] is None
    else:
        assert out[1].shape == k.shape
        assert_close(out[1], rout[1], k.dtype, "k_out")
    for name, a, r in zip(("grad q", "grad k"), g, rg):
        assert_close(a, r, q.dtype, name)


LAYOUTS = ("bshd", "sbhd", "bhsd", "thd")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_mqa(triton_backend, poisoned, device, layout, interleaved):
    b, s, hq, hk, d = 2, 5, 4, 1, 16
    q, k = make(layout, b, s, hq, d, device=device), make(layout, b, s, hk, d, device=device)
    cos, sin = fuselab.rope_cos_sin(12, d, device=device)
    kw = {"cu_seqlens": torch.tensor([0, 3, 10], dtype=torch.int32, device=device)} if layout == "thd" else {}
    check(q, k, cos, sin, layout=layout, interleaved=interleaved, **kw)


@pytest.mark.parametrize("layout,interleaved", [("bshd", False), ("bhsd", True), ("thd", False)])
def test_partial_rotary(triton_backend, poisoned, device, layout, interleaved):
    b, s, h, d = 2, 3, 3, 32
    q, k = make(layout, b, s, h, d, device=device), make(layout, b, s, 2, d, device=device)
    cos, sin = fuselab.rope_cos_sin(8, d // 2, device=device)
    kw = {"cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32, device=device)} if layout == "thd" else {}
    check(q, k, cos, sin, layout=layout, interleaved=interleaved, **kw)


def test_gqa_32_8(triton_backend, poisoned, device):
    q, k = make("bshd", 1, 2, 32, 16, device=device), make("bshd", 1, 2, 8, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(4, 16, device=device)
    check(q, k, cos, sin)


@pytest.mark.parametrize("b,s,h,d,interleaved", [(1, 217, 3, 72, False), (2, 1, 3, 80, True), (1, 217, 3, 80, True),
                                                  (3, 1, 3, 72, False)])
def test_odd_sizes(triton_backend, poisoned, device, b, s, h, d, interleaved):
    q, k = make("bshd", b, s, h, d, device=device), make("bshd", b, s, 1, d, device=device)
    cos, sin = fuselab.rope_cos_sin(s + 2, d, device=device)
    check(q, k, cos, sin, interleaved=interleaved, seqlen_offsets=2)


@pytest.mark.parametrize("dtype,table_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                               (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)])
def test_dtypes(triton_backend, poisoned, device, dtype, table_dtype):
    q, k = make("bshd", 2, 7, 3, 32, dtype, device=device), make("bshd", 2, 7, 1, 32, dtype, device=device)
    cos, sin = fuselab.rope_cos_sin(16, 24, device=device, dtype=table_dtype)
    check(q, k, cos, sin, seqlen_offsets=5)


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
def test_non_contiguous(triton_backend, poisoned, device, layout):
    q = make(layout, 2, 5, 3, 16, device=device, strided=True)
    k = make(layout, 2, 5, 2, 16, device=device, strided=True)
    assert not q.is_contiguous() and not k.is_contiguous()
    full_cos, full_sin = fuselab.rope_cos_sin(9, 32, device=device)
    cos, sin = full_cos[1:, ::2], full_sin[1:, ::2]  # strided tables too
    kw = {"cu_seqlens": torch.tensor([0, 4, 10], dtype=torch.int32, device=device)} if layout == "thd" else {}
    check(q, k, cos, sin, layout=layout, interleaved=True, **kw)


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_inplace(triton_backend, device, rotary_dim):
    q, k = make("bshd", 2, 5, 3, 16, device=device), make("bshd", 2, 5, 1, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(5, rotary_dim, device=device)
    want_q, want_k = ref.apply_rope(q.double(), k.double(), cos.double(), sin.double())
    q2, k2 = q.clone(), k.clone()
    ptr_q, ptr_k = q2.data_ptr(), k2.data_ptr()
    out_q, out_k = fuselab.apply_rope(q2, k2, cos, sin, inplace=True)
    assert out_q is q2 and out_k is k2 and q2.data_ptr() == ptr_q and k2.data_ptr() == ptr_k
    assert_close(q2, want_q, torch.float32, "q in place")
    assert_close(k2, want_k, torch.float32, "k in place")
    assert torch.equal(q2[..., rotary_dim:], q[..., rotary_dim:])  # pass-through untouched


def test_inplace_autograd(triton_backend, device):
    q0, k0 = make("bhsd", 1, 4, 2, 8, device=device), make("bhsd", 1, 4, 1, 8, device=device)
    cos, sin = fuselab.rope_cos_sin(4, 8, device=device)
    grads = []
    for inplace in (True, False):
        ql, kl = q0.clone().requires_grad_(True), k0.clone().requires_grad_(True)
        qo, ko = fuselab.apply_rope(ql * 1.0, kl * 1.0, cos, sin, layout="bhsd", inplace=inplace)
        (qo * torch.arange(qo.numel(), device=device).reshape(qo.shape)).sum().backward(retain_graph=True)
        (ko * 3).sum().backward()
        grads.append((ql.grad, kl.grad))
    assert_close(grads[0][0], grads[1][0], torch.float32, "grad q (in place)", chained=True)
    assert_close(grads[0][1], grads[1][1], torch.float32, "grad k (in place)", chained=True)


@pytest.fixture
def plans(monkeypatch):
    """The planner spied on, on fresh caches: yields the list of the calls it planned (forward and backward)."""
    fuselab.ops.clear()  # plans cached by earlier tests
    made = []
    real = rope_kernel.plan
    spy = staticmethod(lambda call, operands: made.append(call) or real(call, operands))
    monkeypatch.setattr(rope_mod.Rope, "plan", spy)  # the in-place op inherits it
    yield made
    fuselab.ops.clear()


def test_cached_backward(triton_backend, poisoned, device, plans):
    """Repeated eager backwards of one layout reuse the plan an earlier one made; gradients of another layout (or
    only grad_q) get their own. All match float64."""
    cos, sin = fuselab.rope_cos_sin(9, 24, device=device)
    for _ in range(3):
        check(make("bshd", 2, 9, 3, 24, device=device), make("bshd", 2, 9, 1, 24, device=device), cos, sin)
    assert [c.conj for c in plans] == [False, True]  # one forward plan, one backward plan
    q = make("bshd", 2, 9, 3, 24, device=device).requires_grad_(True)
    k = make("bshd", 2, 9, 1, 24, device=device).requires_grad_(True)
    qo, ko = fuselab.apply_rope(q, k, cos, sin)
    gq = make("bshd", 2, 9, 3, 24, device=device, strided=True)  # another layout
    torch.autograd.backward([qo, ko], [gq, torch.ones_like(ko)])
    q64, k64 = q.detach().double().requires_grad_(True), k.detach().double().requires_grad_(True)
    qr, kr = ref.apply_rope(q64, k64, cos.double(), sin.double())
    torch.autograd.backward([qr, kr], [gq.double(), torch.ones_like(kr)])
    assert [c.conj for c in plans] == [False, True, True]  # the strided gradient's own plan
    assert_close(q.grad, q64.grad, torch.float32, "grad q (strided upstream gradient)", chained=True)
    assert_close(k.grad, k64.grad, torch.float32, "grad k", chained=True)
    for _ in range(2):  # each gradient layout keeps its own plan: the strided one did not replace this one's
        check(make("bshd", 2, 9, 3, 24, device=device), make("bshd", 2, 9, 1, 24, device=device), cos, sin)
    assert len(plans) == 3


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("tables", [True, False], ids=["tables", "angles"])
def test_cached_forward(triton_backend, poisoned, device, monkeypatch, plans, tables, inplace):
    """Repeated eager calls of one layout (decoding: int offsets that change every step) skip the checks and reuse
    the plan of the first, with or without autograd; all match float64. Another stride or another offset class
    gets its own plan; an offset past the table's end is checked and raises as on a first call."""
    validated = []
    real_validate = rope_checks.validate
    monkeypatch.setattr(rope_checks, "validate", lambda *a: validated.append(1) or real_validate(*a))
    cos, sin = fuselab.rope_cos_sin(40, 16, device=device) if tables else (None, None)

    def step(offset, grads=False, strided=False):
        q = make("bshd", 3, 1, 4, 24, device=device, strided=strided)
        k = make("bshd", 3, 1, 2, 24, device=device, strided=strided)
        kw = dict(seqlen_offsets=offset, rotary_dim=None if tables else 16, inplace=inplace)
        check(q, k, cos, sin, grads=grads, **kw)

    for offset in (3, 5, 7):  # one specialization class (int32, not 1, not a multiple of 16)
        step(offset)
    assert len(plans) == 1 and len(validated) == 1  # the later calls were neither checked nor planned again
    step(9, strided=True)  # another layout: checked and planned
    assert len(plans) == 2 and len(validated) == 2
    step(1)  # offset 1: another class, its own plan
    step(1)
    assert len(plans) == 3 and len(validated) == 3
    if tables:
        with pytest.raises(ValueError, match="seqlen_offsets"):  # same signature as the offset-3 calls
            fuselab.apply_rope(make("bshd", 3, 1, 4, 24, device=device), None, cos, sin, seqlen_offsets=40)
    if not inplace:  # (in place on leaves that require grad is an error)
        step(11, grads=True)  # autograd through the cached plan; its backward plans its own
        step(13, grads=True)
        assert [c.conj for c in plans[3:]] == [True]
    with fuselab.backend.forced("torch"):
        monkeypatch.setattr(rope_mod.Rope, "forward", None)  # the Triton path must not run
        step(15)


@pytest.mark.parametrize("shape", ["bs", "1s"])
def test_positions(triton_backend, poisoned, device, shape):
    b, s = 3, 6
    q, k = make("bshd", b, s, 2, 16, device=device), make("bshd", b, s, 1, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(20, 16, device=device)
    pos = torch.randint(0, 20, (b if shape == "bs" else 1, s), device=device)
    pos[0, 0] = 19  # the last row
    check(q, k, cos, sin, positions=pos, interleaved=shape == "1s")


def test_positions_thd(triton_backend, poisoned, device):
    q, k = make("thd", 1, 11, 2, 16, device=device), make("thd", 1, 11, 2, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(16, 16, device=device)
    pos = torch.randint(0, 16, (11,), device=device, dtype=torch.int32)
    check(q, k, cos, sin, layout="thd", positions=pos)


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
def test_tensor_offsets(triton_backend, poisoned, device, layout):
    if layout == "thd":
        q, k = make("thd", 1, 9, 2, 16, device=device), make("thd", 1, 9, 1, 16, device=device)
        kw = {"cu_seqlens": torch.tensor([0, 1, 1, 6, 9], dtype=torch.int32, device=device), "max_seqlen": 5}
        offsets = torch.tensor([4, 0, 7, 2], device=device)
    else:
        q, k = make(layout, 3, 2, 2, 16, device=device), make(layout, 3, 2, 1, 16, device=device)
        kw, offsets = {}, torch.tensor([0, 5, 10], device=device, dtype=torch.int32)
    cos, sin = fuselab.rope_cos_sin(12, 16, device=device)
    check(q, k, cos, sin, layout=layout, seqlen_offsets=offsets, **kw)


@pytest.mark.parametrize("interleaved", [False, True])
def test_thd_uneven(triton_backend, poisoned, device, interleaved):
    cu = torch.tensor([0, 3, 3, 10, 17, 18], dtype=torch.int32, device=device)  # includes an empty sequence
    q, k = make("thd", 1, 18, 3, 24, device=device), make("thd", 1, 18, 1, 24, device=device)
    cos, sin = fuselab.rope_cos_sin(10, 16, device=device)
    check(q, k, cos, sin, layout="thd", cu_seqlens=cu, max_seqlen=7, seqlen_offsets=3, interleaved=interleaved)


def test_k_none(triton_backend, poisoned, device):
    q = make("sbhd", 2, 3, 3, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(3, 16, device=device)
    check(q, None, cos, sin, layout="sbhd")


def test_fp64_gradcheck(triton_backend, device):
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, device=device, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, device=device, requires_grad=True)
    cos, sin = fuselab.rope_cos_sin(3, 8, device=device, dtype=torch.float64)
    fn = lambda q, k: fuselab.apply_rope(q, k, cos, sin, interleaved=True)
    assert torch.autograd.gradcheck(fn, (q, k), fast_mode=True)


def test_out_of_range_positions_clamped(triton_backend, device):
    """The CUDA behaviour (no host check): rows outside the table are clamped, never read out of bounds."""
    q = make("bshd", 2, 3, 2, 8, device=device)
    cos, sin = fuselab.rope_cos_sin(4, 8, device=device)
    pos = torch.tensor([[0, 3, 9], [-5, 2, 100]], device=device)
    out = torch.full_like(q, float("nan"))
    operands = (q, None, cos, sin, None, pos, None, None, 0)
    call = rope_checks.RopeCall(layout="bshd", half=4, interleaved=False)
    rope_kernel.rotate(rope_kernel.plan(call, operands), operands, out, None)
    want, _ = ref.apply_rope(q.double(), None, cos.double(), sin.double(), positions=pos.clamp(0, 3))
    assert_close(out, want, torch.float32, "clamped")


def test_int64_offsets_path(triton_backend, poisoned, device, monkeypatch, request):
    """Force the 64-bit index path (normally taken past 2^31 elements) and check it computes the same."""
    monkeypatch.setattr(rope_kernel, "INT32_MAX", -1)  # every launch counts as past 2^31
    fuselab.ops.clear()  # plans made before the patch
    request.addfinalizer(fuselab.ops.clear)
    q, k = make("bhsd", 2, 3, 2, 16, device=device), make("bhsd", 2, 3, 1, 16, device=device)
    cos, sin = fuselab.rope_cos_sin(3, 16, device=device)
    check(q, k, cos, sin, layout="bhsd", interleaved=True, grads=False)


@pytest.mark.parametrize("gbps_per_sm,tile_heads,warps", [(25.4, 32, 8), (37.2, 16, 4)])
def test_tile_by_memory_bandwidth(triton_backend, poisoned, device, monkeypatch, request, gbps_per_sm, tile_heads,
                                  warps):
    """Devices with more DRAM bandwidth per SM (H200: 36.5 GB/s) plan 2048-element tiles and 4 warps, others (H100:
    25.4) 4096 and 8; both plans compute the same rotation (at D=128 the small tile takes q's 32 heads in two steps)."""
    monkeypatch.setattr(device_facts, "dram_gbps_per_sm", lambda device: gbps_per_sm)  # what fast_memory reads
    # plans and kept launches made under the real bandwidth must not answer for this test's calls
    fuselab.ops.clear()
    request.addfinalizer(fuselab.ops.clear)
    s = 2 * rope_kernel.sm_count(torch.device(device)) + 1  # enough tokens that the plan does not split heads
    q, k = make("bshd", 1, s, 32, 128, device=device), make("bshd", 1, s, 8, 128, device=device)
    cos, sin = fuselab.rope_cos_sin(s, 128, device=device)
    check(q, k, cos, sin)
    launches = [p.launch.constexprs for p in rope_mod.ROPE.plans.data.values()]
    launches = [c for c in launches if c["HALF"] == 64 and c["HAS_K"]]
    assert launches and all(c["BLOCK_HQ"] == tile_heads and c["num_warps"] == warps for c in launches)


def test_reference_backend_matches(torch_backend, device):
    """The pure-PyTorch path (CPU tensors by default) has the same semantics: bf16 in, bf16 out."""
    q, k = make("bshd", 2, 5, 3, 16, torch.bfloat16, device=device), make("bshd", 2, 5, 1, 16, torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(5, 8, device=device)
    check(q, k.to(device), cos, sin)


@pytest.mark.big_memory
@pytest.mark.gpu
@pytest.mark.parametrize("b,s,hq,hk,d", [(2, 4096, 32, 8, 128), (4, 2048, 16, 16, 64)])
def test_large_shapes_gpu(b, s, hq, hk, d):
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(s, d, device="cuda")
    check(q, k, cos, sin)


@pytest.mark.big_memory
@pytest.mark.gpu
def test_over_2_31_elements_gpu():
    """q with 2^31 + extra elements (4.3 GB bf16): the 64-bit offset path on real hardware."""
    s, h, d = 2**31 // (8 * 128) + 16, 8, 128
    q = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(s, d, device="cuda")
    out, _ = fuselab.apply_rope(q, None, cos, sin, inplace=False)
    tail = slice(s - 64, s)
    want, _ = ref.apply_rope(q[:, tail].double(), None, cos.double(), sin.double(), seqlen_offsets=s - 64)
    assert_close(out[:, tail], want, torch.bfloat16, "tail past 2^31")
