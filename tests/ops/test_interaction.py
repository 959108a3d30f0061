"""fuselab.ops.interaction.dot_interaction against a float64 reference written here (loops over the pair list):
forward and both gradients per element, Triton kernels (interpreter on CPU) and the PyTorch path, odd shapes,
tiles and D chunks, strided views, poisoned outputs, padding, the DLRM's and torchrec's pair orders, bf16
rounding, bad inputs, opcheck, torch.compile, the bench suite."""

from __future__ import annotations

import math

import pytest
import torch

import fuselab.ops
from fuselab.backend import forced
from fuselab.ops.interaction import dot_interaction
from fuselab.ops.interaction.launch import InteractionTuning, dot_interaction_bwd_, dot_interaction_fwd_

#: per-element bound |out - ref| <= RTOL·|ref| + ACC·mag, mag the same sum over |terms|: RTOL covers the one
#: rounding of the result to the output dtype, ACC the fp32 accumulation
RTOL = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}
ACC = 4e-6
SMALL_TILES = InteractionTuning(rows_per_program=2, bwd_rows_per_program=2, max_block_v=16, max_block_d=16,
                                fwd_outer_fp32=False)
#: the same tiles computed by CUDA-core outer products over D (kernels' OUTER) in both directions, every dtype
SMALL_OUTER = InteractionTuning(rows_per_program=2, bwd_rows_per_program=2, max_block_v=16, max_block_d=16,
                                outer_max_dim=256, fwd_outer_fp32=True, fwd_outer_lowp=True, bwd_outer_fp32=True,
                                bwd_outer_lowp=True)
#: and with four elements of D per forward step (kernels' OUTER4) instead of one
SMALL_OUTER4 = InteractionTuning(rows_per_program=2, bwd_rows_per_program=2, max_block_v=16, max_block_d=16,
                                 outer_max_dim=256, outer4=True, fwd_outer_fp32=True, fwd_outer_lowp=True)


def _pairs(num_sparse: int, self_interaction: bool) -> list[tuple[int, int]]:
    """(i, j) in output order: rows i = 0..F, columns j < i (j <= i with the diagonal), row-major."""
    return [(i, j) for i in range(num_sparse + 1) for j in range(i + 1 if self_interaction else i)]


def _ref64(dense, emb, self_interaction: bool, pad_to: int) -> torch.Tensor:
    """float64 [dense, v_i . v_j for each pair, zeros], differentiable; written without the code under test."""
    vectors = [dense.double()] + [emb[:, k].double() for k in range(emb.shape[1])]
    cols = [dense.double()] + [(vectors[i] * vectors[j]).sum(-1, keepdim=True)
                               for i, j in _pairs(emb.shape[1], self_interaction)]
    out = torch.cat(cols, dim=1)
    width = math.ceil(out.shape[1] / pad_to) * pad_to
    return torch.cat([out, out.new_zeros(out.shape[0], width - out.shape[1])], dim=1)


def _assert_close(out, ref, mag, dtype, what):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    diff = (out.double() - ref).abs()
    bound = RTOL[dtype] * ref.abs() + ACC * mag + 1e-30
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    worst = (diff / bound).max().item() if diff.numel() else 0.0
    assert worst <= 1.0, f"{what}: error {worst:.2f}x the per-element bound ({dtype})"


def _check(dense, emb, self_interaction=False, pad_to=1, grad=None):
    """fuselab's output and gradients vs the float64 reference (values) and its version on |inputs| (bounds)."""
    dtype = dense.dtype
    d_leaf, e_leaf = dense.detach().requires_grad_(True), emb.detach().requires_grad_(True)
    out = dot_interaction(d_leaf, e_leaf, self_interaction=self_interaction, pad_to=pad_to)
    d64, e64 = dense.detach().double().requires_grad_(True), emb.detach().double().requires_grad_(True)
    ref = _ref64(d64, e64, self_interaction, pad_to)
    da, ea = dense.detach().double().abs().requires_grad_(True), emb.detach().double().abs().requires_grad_(True)
    mag = _ref64(da, ea, self_interaction, pad_to)
    assert out.dtype == dtype and out.is_contiguous()
    _assert_close(out, ref.detach(), mag.detach(), dtype, "forward")
    d = dense.shape[1]
    assert torch.equal(out[:, :d], dense), "dense columns are a copy"
    assert (out[:, ref.shape[1] - (ref.shape[1] - d - len(_pairs(emb.shape[1], self_interaction))):] == 0).all()
    if grad is None:
        grad = torch.randn(out.shape, dtype=dtype, device=out.device)
    out.backward(grad)
    used = grad.double().clone()
    used[:, d + len(_pairs(emb.shape[1], self_interaction)):] = 0  # padding gradients are ignored
    ref.backward(used)
    mag.backward(used.abs())
    assert d_leaf.grad.dtype == dtype and e_leaf.grad.dtype == dtype
    _assert_close(d_leaf.grad, d64.grad, da.grad, dtype, "grad dense")
    _assert_close(e_leaf.grad, e64.grad, ea.grad, dtype, "grad emb")
    return out


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("pad_to", [1, 8])
@pytest.mark.parametrize("self_interaction", [False, True], ids=["strict", "self"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_forward_backward(backend, device, dtype, self_interaction, pad_to):
    dense = torch.randn(5, 13, dtype=dtype, device=device)
    emb = torch.randn(5, 6, 13, dtype=dtype, device=device)
    _check(dense, emb, self_interaction, pad_to)


def test_fp16(triton_backend, device):
    _check(torch.randn(4, 9, dtype=torch.float16, device=device),
           torch.randn(4, 5, 9, dtype=torch.float16, device=device), True, 8)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1, 16), (9, 20, 5), (2, 3, 70)], ids=str)
def test_odd_shapes(triton_backend, device, shape):
    b, f, d = shape
    _check(torch.randn(b, d, device=device), torch.randn(b, f, d, device=device), False, 3)


def test_limits(triton_backend, device):
    """F = 128 and D = 256 (3 x 3 Gram tiles, 4 D chunks)."""
    dense = torch.randn(1, 256, device=device)
    emb = torch.randn(1, 128, 256, device=device)
    _check(dense, emb, True, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kaggle_shape(device, dtype):
    """Criteo Kaggle at the training batch: B 65536, F 26, D 16, padded to 368 (GPU: 8192 programs)."""
    _check(torch.randn(65536, 16, device=device, dtype=dtype), torch.randn(65536, 26, 16, device=device, dtype=dtype),
           False, 8)


def test_strided_views(backend, device):
    """emb a slice with a stride-2 last dim, dense a transposed view: read through their strides."""
    big = torch.randn(6, 9, 22, device=device)
    emb = big[:, 2:7, ::2]  # (6, 5, 11)
    dense = torch.randn(11, 6, device=device).t()
    assert not emb.is_contiguous() and not dense.is_contiguous()
    _check(dense, emb, False, 8)
    emb_t = torch.randn(6, 11, 5, device=device).transpose(1, 2)  # D not the fastest dim
    _check(dense, emb_t, True, 1)


def test_expanded_gradient(backend, device):
    """out.sum().backward(): a stride-0 upstream gradient."""
    dense = torch.randn(4, 7, device=device)
    emb = torch.randn(4, 3, 7, device=device)
    _check(dense, emb, False, 8, grad=torch.ones(4, 1, device=device).expand(4, 16))  # 7 + 6 -> 16


def test_padding_gradient_ignored(backend, device):
    """NaN in the padding columns of the gradient changes nothing."""
    dense, emb = torch.randn(5, 6, device=device), torch.randn(5, 3, 6, device=device)
    grad = torch.randn(5, 16, device=device)  # D + P = 6 + 6, padded to 16
    grad[:, 12:] = float("nan")
    _check(dense, emb, False, 8, grad=grad)


@pytest.mark.parametrize("tuning", [SMALL_TILES, SMALL_OUTER, SMALL_OUTER4], ids=["dot", "outer", "outer4"])
@pytest.mark.parametrize("self_interaction", [False, True], ids=["strict", "self"])
def test_tiled_launch_into_poisoned_outputs(triton_backend, device, self_interaction, tuning):
    """Small tiles (several Gram tiles, D chunks, a row tail) into NaN-filled strided outputs: every element of
    the output written (padding exactly 0) and nothing outside it."""
    b, f, d = 7, 20, 37
    dense, emb = torch.randn(b, d, device=device), torch.randn(b, f, d, device=device)
    p = len(_pairs(f, self_interaction))
    buf = torch.full((b, d + p + 9), float("nan"), device=device)
    out = buf[:, 2:-2]  # width d + p + 5: five padding columns
    dot_interaction_fwd_(dense, emb, out, self_interaction, tuning)
    ref = _ref64(dense, emb, self_interaction, 1)
    mag = _ref64(dense.abs(), emb.abs(), self_interaction, 1)
    _assert_close(out[:, : d + p], ref, mag, torch.float32, "forward")
    assert torch.equal(out[:, d + p:], torch.zeros(b, 5, device=device))
    assert buf[:, :2].isnan().all() and buf[:, -2:].isnan().all()

    grad = torch.randn(b, d + p + 5, device=device)
    gd = torch.full((b, d), float("nan"), device=device)
    ge = torch.full((b, f + 2, d), float("nan"), device=device)[:, 1:-1]
    dot_interaction_bwd_(grad, dense, emb, gd, ge, self_interaction, tuning)
    d64, e64 = dense.double().requires_grad_(True), emb.double().requires_grad_(True)
    da, ea = dense.double().abs().requires_grad_(True), emb.double().abs().requires_grad_(True)
    _ref64(d64, e64, self_interaction, 1).backward(grad[:, : d + p].double())
    _ref64(da, ea, self_interaction, 1).backward(grad[:, : d + p].double().abs())
    _assert_close(gd, d64.grad, da.grad, torch.float32, "grad dense")
    _assert_close(ge, e64.grad, ea.grad, torch.float32, "grad emb")
    assert ge._base[:, 0].isnan().all() and ge._base[:, -1].isnan().all()


def test_wide_offsets_path(triton_backend, device, monkeypatch, request):
    """The 64-bit index variant (taken when an operand reaches past 2^31 - 1 elements) computes the same values;
    forced here on small tensors (the real overflow case is the GPU test below)."""
    from fuselab.ops.interaction import launch

    monkeypatch.setattr(launch, "needs_int64", lambda *tensors: True)
    fuselab.ops.clear()  # no launch kept by an earlier test: every call plans (and so reaches needs_int64)
    request.addfinalizer(fuselab.ops.clear)  # nor a kept WIDE launch for later tests
    _check(torch.randn(5, 13, device=device), torch.randn(5, 6, 26, device=device)[:, :, ::2], True, 8)


@pytest.mark.big_memory
@pytest.mark.gpu
def test_offsets_past_int32(device):
    """emb a permuted view whose feature stride times F passes 2^31: no int32 overflow (GPU: 6.4 GB of bf16)."""
    b, f, d = 2**25 + 1, 3, 32
    base = torch.randn(f, b, d, device=device, dtype=torch.bfloat16)
    emb = base.permute(1, 0, 2)  # (B, F, D), stride_ef = B * D
    assert emb.stride(1) * (f - 1) > 2**31 - 1
    dense = torch.randn(b, d, device=device, dtype=torch.bfloat16)
    out = dot_interaction(dense, emb)
    for rows in (slice(0, 4), slice(b - 4, b)):
        ref = _ref64(dense[rows], emb[rows], False, 1)
        mag = _ref64(dense[rows].abs(), emb[rows].abs(), False, 1)
        _assert_close(out[rows], ref, mag, torch.bfloat16, f"rows {rows}")


def test_bf16_rounds_to_nearest_even(triton_backend, device):
    """Integer inputs: the fp32 dot products are exact and need rounding to bf16; the kernel's bits equal torch's
    round-to-nearest-even of them (the interpreter alone would truncate)."""
    gen = torch.Generator().manual_seed(3)
    dense = torch.randint(-15, 16, (6, 8), generator=gen).to(device, torch.bfloat16)
    emb = torch.randint(-15, 16, (6, 5, 8), generator=gen).to(device, torch.bfloat16)
    out = dot_interaction(dense, emb)
    exact = _ref64(dense, emb, False, 1)
    assert (exact != exact.to(torch.bfloat16).double()).any(), "no rounding needed: the test would prove nothing"
    assert torch.equal(out, exact.to(torch.float32).to(torch.bfloat16))


def test_only_emb_requires_grad(backend, device):
    dense, emb = torch.randn(3, 5, device=device), torch.randn(3, 2, 5, device=device, requires_grad=True)
    dot_interaction(dense, emb, pad_to=4).sum().backward()
    assert dense.grad is None and emb.grad is not None and emb.grad.shape == emb.shape


def test_double_backward_raises(triton_backend, device):
    dense = torch.randn(3, 4, device=device, requires_grad=True)
    out = dot_interaction(dense, torch.randn(3, 2, 4, device=device))
    upstream = torch.randn(out.shape, device=device, requires_grad=True)  # the gradient depends on it
    (grad,) = torch.autograd.grad(out, dense, upstream, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        grad.sum().backward()


def test_empty_batch(backend, device):
    out = dot_interaction(torch.randn(0, 4, device=device), torch.randn(0, 3, 4, device=device), pad_to=8)
    assert out.shape == (0, 16)


# ---------------------------------------------------------------- pair orders


@pytest.mark.parametrize("self_interaction", [False, True], ids=["strict", "self"])
def test_matches_dlrm_interaction_arch(backend, device, self_interaction):
    """Same columns as the DLRM's eager dot interaction (bmm + gather), the documented order."""
    from fuselab.dlrm.interaction.dot import DotConfig, DotInteraction

    dense, emb = torch.randn(4, 8, device=device), torch.randn(4, 5, 8, device=device)
    arch = DotInteraction(DotConfig(self_interaction=self_interaction), num_sparse=5, dim=8, dense_dim=8).to(device)
    expected = arch(dense, emb)
    out = dot_interaction(dense, emb, self_interaction=self_interaction)
    assert out.shape == expected.shape == (4, arch.out_features)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("b", "f", "d"), [(10, 2, 3), (20, 4, 8)])
def test_torchrec_order(backend, device, b, f, d):
    """torchrec's InteractionArch: [dense, upper triangle of V Vᵀ row-major], width D + F + C(F, 2) (the widths its
    own tests assert, at their shapes; torchrec publishes no values for it: its tests draw unseeded inputs). Its
    formula written here; our columns remapped with fuselab.dlrm.interaction.dot.torchrec_permutation."""
    from fuselab.dlrm.interaction.dot import torchrec_permutation

    dense, emb = torch.rand(b, d, device=device), torch.rand(b, f, d, device=device)
    combined = torch.cat([dense.unsqueeze(1), emb], dim=1).double()
    gram = torch.bmm(combined, combined.transpose(1, 2))
    rows, cols = torch.triu_indices(f + 1, f + 1, offset=1)
    torchrec = torch.cat([dense.double(), gram[:, rows, cols]], dim=1)
    out = dot_interaction(dense, emb)
    assert out.shape == (b, d + f + math.comb(f, 2))
    perm = torchrec_permutation(f).to(device)
    remapped = torch.cat([out[:, :d], out[:, d:][:, perm]], dim=1)
    torch.testing.assert_close(remapped.double(), torchrec, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- errors


def test_float64_only_on_the_torch_path(device, monkeypatch):
    dense, emb = torch.randn(3, 4, device=device, dtype=torch.float64), torch.randn(3, 2, 4, device=device,
                                                                                      dtype=torch.float64)
    monkeypatch.setenv("FUSELAB_BACKEND", "triton")
    with pytest.raises(TypeError, match="float64 runs on the PyTorch path"):
        dot_interaction(dense, emb)
    monkeypatch.setenv("FUSELAB_BACKEND", "torch")
    torch.testing.assert_close(dot_interaction(dense, emb), _ref64(dense, emb, False, 1))


def test_launcher_rejects_bad_outputs(device):
    dense, emb = torch.randn(3, 4, device=device), torch.randn(3, 2, 4, device=device)
    with pytest.raises(ValueError, match=r"out must be \(B=3, W >= 7\)"):
        dot_interaction_fwd_(dense, emb, torch.empty(3, 6, device=device), False)
    with pytest.raises(ValueError, match=r"out must be a torch\.float32 tensor"):
        dot_interaction_fwd_(dense, emb, torch.empty(3, 8, device=device, dtype=torch.float16), False)
    with pytest.raises(ValueError, match="grad_emb must be"):
        dot_interaction_bwd_(torch.randn(3, 7, device=device), dense, emb, torch.empty(3, 4, device=device),
                             torch.empty(3, 4, 2, device=device), False)
    with pytest.raises(ValueError, match="must be a power of two"):
        InteractionTuning(max_block_v=24)


# ---------------------------------------------------------------- torch.library, torch.compile


def test_opcheck(device):
    """Every opcheck of the forward op (its aot_dispatch_dynamic runs the backward op through AOTAutograd with
    symbolic shapes); schema and fake of the backward op."""
    dense = torch.randn(3, 5, device=device, requires_grad=True)
    emb = torch.randn(3, 2, 5, device=device, requires_grad=True)
    with forced("triton"):
        torch.library.opcheck(torch.ops.fuselab.dot_interaction.default, (dense, emb, True, 8))
        grad = torch.randn(3, 16, device=device)
        torch.library.opcheck(torch.ops.fuselab.dot_interaction_bwd.default, (grad, dense.detach(), emb.detach(),
                                                                               True),
                              test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph(triton_backend, device):
    """Forward + backward traced without a graph break (aot_eager: the custom ops run as they are; Inductor's
    C++ compile of the surrounding code would add ~20 s on CPU and prove nothing more about this op)."""
    torch._dynamo.reset()
    dense = torch.randn(4, 6, device=device, requires_grad=True)
    emb = torch.randn(4, 3, 6, device=device, requires_grad=True)

    def f(x, e):
        return (dot_interaction(x * 2, e, pad_to=8) ** 2).sum()

    backend = "inductor" if device.type == "cuda" else "aot_eager"
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    compiled(dense, emb).backward()
    grads = dense.grad.clone(), emb.grad.clone()
    dense.grad = emb.grad = None
    f(dense, emb).backward()
    torch.testing.assert_close(grads[0], dense.grad)
    torch.testing.assert_close(grads[1], emb.grad)


# ---------------------------------------------------------------- bench suite


def test_bench_cost_model():
    from fuselab.bench.spec import CaseQuery
    from fuselab.bench.suites import get_spec

    spec = get_spec("interaction")
    gpu = {c.key: c for c in spec.cases(CaseQuery("cuda"))}
    kaggle = gpu["interaction/65536x26x16/bf16/fwd"]
    assert kaggle.bytes == (65536 * 27 * 16 + 65536 * 367) * 2 and kaggle.flops == 2 * 65536 * 351 * 16
    both = gpu["interaction/65536x26x16-pad8/bf16/fwd+bwd"]
    read = 65536 * 27 * 16 + 65536 * (16 + 351) + 65536 * 27 * 16
    assert both.read_bytes == read * 2 and both.bytes == (read + 65536 * 368 + 65536 * 27 * 16) * 2
    assert {"interaction/8192x26x16/fp32/fwd", "interaction/65536x26x128/bf16/fwd+bwd"} <= set(gpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bench_providers_correct(triton_backend, device, dtype):
    from fuselab.bench.check import check
    from fuselab.bench.spec import CaseQuery
    from fuselab.bench.suites import get_spec

    spec = get_spec("interaction")
    for case in spec.cases(CaseQuery(device.type, quick=True, dtypes=(dtype,))):
        for name in ("eager", "fuselab"):
            result = check(spec, case, spec.provider(name).build(case), device=device)
            assert result.ok, f"{name} {case.key}: {result.error:.2e} > {result.tolerance:.0e}"
