"""fuselab.sum / fuselab.mean: Triton kernels (interpreter on CPU) and the PyTorch path vs float64 torch."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import fuselab
from fuselab.backend import forced
from fuselab.bench.check import check
from fuselab.bench.spec import CaseQuery
from fuselab.ops import tuning
from fuselab.ops.reduce import launch as kernels
from fuselab.ops.reduce import plan as planner
from fuselab.ops.reduce.plan import ReduceTuning
from fuselab.ops.tuning import current
from fuselab.testing import assert_close

OPS = {"sum": (fuselab.sum, torch.sum), "mean": (fuselab.mean, torch.mean)}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _expected(x: torch.Tensor, dim, keepdim: bool, op: str) -> torch.Tensor:
    """float64 torch result on the same (already rounded) input."""
    x64 = x.detach().to(torch.float64)
    if x.dim() == 0:
        return x64
    return OPS[op][1](x64, dim=() if dim is None else dim, keepdim=keepdim)


def accumulation_bound(x: torch.Tensor, dim, keepdim: bool, op: str) -> torch.Tensor:
    """Per-output bound on the fp32 accumulation error of a reduction, whatever its order: 4 * 2^-24 * sqrt(n) *
    sqrt(sum x^2) over the n reduced elements (a random walk of n roundings of partial sums no larger than the
    running norm), divided by n for a mean. It scales with the operands, not with the (possibly cancelled) result."""
    x64 = x.detach().to(torch.float64)
    if x.dim() == 0:
        return torch.zeros(())
    dims = () if dim is None else dim
    n = max(x64.numel() // max(torch.sum(x64, dim=dims, keepdim=keepdim).numel(), 1), 1)
    bound = 4 * 2.0**-24 * n**0.5 * torch.sum(x64 * x64, dim=dims, keepdim=keepdim).sqrt()
    return bound / n if op == "mean" else bound


def _check(x: torch.Tensor, dim, keepdim: bool, op: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    out = OPS[op][0](x, dim, keepdim, dtype=dtype)
    ref = _expected(x, dim, keepdim, op)
    assert out.dtype == (dtype or x.dtype)
    assert out.shape == ref.shape
    atol = fuselab.testing.tolerances(out.dtype).atol + accumulation_bound(x, dim, keepdim, op)
    assert_close(out, ref, dtype=out.dtype, what=f"{op}(shape={tuple(x.shape)}, dim={dim}, keepdim={keepdim})",
                 atol=atol)
    return out


# ---------------------------------------------------------------- forward vs float64


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, 2, -1, -3, (0, 2), (1, 2), (0, 1), (2, 0, 1), ()], ids=str)
def test_all_dims(triton_backend, device, dtype, op, keepdim, dim):
    x = torch.randn(5, 37, 65, device=device, dtype=dtype)
    _check(x, dim, keepdim, op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 7, 1023, 2**20 + 3])
def test_sizes_1d(triton_backend, device, op, n):
    x = torch.randn(n, device=device)
    _check(x, None, False, op)
    _check(x, 0, True, op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 1023), (1023, 1), (7, 1023), (1023, 7), (3, 2**17 + 3), (2**15 + 1, 3)],
                         ids=str)
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_sizes_2d(triton_backend, device, op, shape, dim):
    _check(torch.randn(shape, device=device), dim, False, op)


def test_scalar(triton_backend, device):
    x = torch.randn((), device=device)
    for op in OPS:
        for dim in (None, 0, -1, ()):
            _check(x, dim, False, op)
            _check(x, dim, True, op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "view",
    [
        lambda t: t.t(),
        lambda t: t[:, ::2],
        lambda t: t[::3, 1:],
        lambda t: t[2:, 5:-3],
        lambda t: t.t()[::2],
        lambda t: t.unsqueeze(1).expand(-1, 4, -1),
        lambda t: t.view(4, 10, 3, 19).permute(2, 0, 3, 1),
        lambda t: t.view(4, 10, 3, 19).permute(1, 3, 0, 2)[:, ::2],
    ],
    ids=["t", "cols::2", "rows::3", "slice", "t::2", "expand", "permute4d", "permute4d_strided"],
)
def test_strided_views(triton_backend, device, op, view):
    base = torch.randn(40, 57, device=device)
    x = view(base)
    assert not x.is_contiguous()
    for dim in [None, 0, -1, *([(0, 2), (1, 3), (0, 1, 3)] if x.dim() == 4 else [])]:
        for keepdim in (False, True):
            _check(x, dim, keepdim, op)


def test_strided_read_in_place(device):
    """Views whose reduced axes merge are planned on x's own storage (no copy)."""
    base = torch.randn(40, 57, device=device)
    for x, dims in [(base.t(), (0,)), (base.t(), (0, 1)), (base[:, ::2], (1,)), (base[::3], (0,)),
                    (base.view(4, 10, 3, 19).permute(2, 0, 3, 1), (1, 3))]:
        src, _, _ = planner.prepare(x, dims)
        assert src.data_ptr() == x.data_ptr() and src.stride() == x.stride()
    x = torch.randn(4, 5, 6, device=device)  # dims (0, 2) cannot merge: one documented copy
    src, _, _ = planner.prepare(x, (0, 2))
    assert src.is_contiguous() and src.shape == (5, 4, 6)


@pytest.mark.parametrize("op", OPS)
def test_dtype_argument(triton_backend, device, op):
    x = torch.randn(33, 130, device=device, dtype=torch.bfloat16)
    _check(x, -1, False, op, dtype=torch.float32)
    _check(x, None, False, op, dtype=torch.float32)
    _check(torch.randn(33, 130, device=device), 0, False, op, dtype=torch.bfloat16)
    ints = torch.randint(-50, 50, (17, 9), device=device)
    out = OPS[op][0](ints, 1, dtype=torch.float32)
    ref = OPS[op][1](ints, 1, dtype=torch.float64)
    assert out.dtype == torch.float32
    assert_close(out, ref, dtype=torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_torch_backend_matches(torch_backend, device, op):
    x = torch.randn(6, 33, 17, device=device, dtype=torch.bfloat16)
    for dim in (None, 1, (0, 2)):
        _check(x, dim, True, op)
    _check(torch.randn(9, 40, device=device).t(), 1, False, op)


def test_backends_agree(device, monkeypatch):
    x = torch.randn(70, 300, device=device)
    monkeypatch.setenv("FUSELAB_BACKEND", "torch")
    a = fuselab.mean(x, 0)
    monkeypatch.setenv("FUSELAB_BACKEND", "triton")
    b = fuselab.mean(x, 0)
    assert_close(b, a.double())


# ---------------------------------------------------------------- empty tensors


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("shape,dim", [((0,), None), ((0,), 0), ((0, 5), 0), ((0, 5), 1), ((5, 0), 1),
                                       ((5, 0), None), ((3, 0, 4), (0, 1))])
def test_empty(monkeypatch, device, backend, shape, dim):
    monkeypatch.setenv("FUSELAB_BACKEND", backend)
    x = torch.randn(shape, device=device)
    for op, (ours, theirs) in OPS.items():
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            out = ours(x, dim)
        with warnings.catch_warnings(record=True) as want:
            warnings.simplefilter("always")
            ref = theirs(x, dim=() if dim is None else dim)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert torch.equal(out.isnan(), ref.isnan()), op
        assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref)), op
        assert [str(w.message) for w in got] == [str(w.message) for w in want]


# ---------------------------------------------------------------- determinism


# GPU only: the interpreter runs programs one at a time in grid order, so the last program to arrive (which sums
# the split partials) is always the same one there and this cannot fail on CPU
@pytest.mark.gpu
@pytest.mark.parametrize("shape,dim", [((2**20 + 3,), None), ((1023, 1023), 0), ((9, 50_001), -1),
                                       ((3000, 7), 0), ((5, 600, 33), 1)], ids=str)
def test_run_to_run_bitwise(triton_backend, device, shape, dim):
    x = torch.randn(shape, device=device)
    first = fuselab.sum(x, dim)
    for _ in range(2):
        again = fuselab.sum(x, dim)
        assert torch.equal(first.view(torch.int32), again.view(torch.int32))


def test_planned_calls_and_shared_scratch(triton_backend, device, monkeypatch):
    """Repeated eager calls reuse their plan (no validation, no planning); split reductions of one workspace
    size share a per-stream scratch buffer, and each result still matches float64, interleaved."""
    from fuselab.ops.reduce import checks as reduce_checks
    from fuselab.ops.reduce import op as module

    fuselab.ops.clear()  # plans cached by earlier tests
    plans, validated = [], []
    real_plan, real_validate = kernels.plan, reduce_checks.validate
    monkeypatch.setattr(module.Reduce, "plan", staticmethod(lambda *args: plans.append(1) or real_plan(*args)))
    monkeypatch.setattr(reduce_checks, "validate", lambda *args: validated.append(1) or real_validate(*args))
    xs = [torch.randn(1023, 1023, device=device) for _ in range(3)]
    for x in xs:  # a split plan (its workspace comes from scratch) on fresh values each call
        for dim, op in ((0, "sum"), (None, "mean")):
            _check(x, dim, False, op)
    assert len(plans) == 2 and len(validated) == 2  # one per (dim, op): later calls skipped checks and planning
    with pytest.raises(ValueError, match="dim"):
        fuselab.sum(xs[0], 2)  # a new signature: validated, and rejected


def test_split_plans_are_exercised(device):
    """The determinism/size tests above cover both kernels with a second stage (split > 1)."""
    cases = [((2**20 + 3,), (0,)), ((1023, 1023), (0,)), ((9, 50_001), (1,)), ((3000, 7), (0,))]
    kinds = set()
    for shape, dims in cases:
        x = torch.empty(shape, device=device)
        src, kept, red = planner.prepare(x, dims)
        plan = planner.plan_reduction(src, kept, red)
        if plan.split > 1:
            kinds.add(plan.kind)
        assert plan.grid[0] * plan.grid[1] <= 64 or device.type == "cuda"
    assert kinds == {"rows", "cols"}


SPLIT_CASES = [((1000,), None, "dense"), ((3000,), 0, "dense"), ((31, 1001), None, "dense"), ((3000, 7), 0, "dense"),
               ((3001, 7), 0, "column-major"), ((9, 4001), 1, "every-other")]


@pytest.fixture
def plans_anew():
    """For tests that patch the planner's knobs: every plan is emptied before and after the test."""
    fuselab.ops.clear()
    yield
    fuselab.ops.clear()


def _tune(monkeypatch, **changes) -> None:
    """Plan under changed :class:`ReduceTuning` knobs for the rest of the test (what ``fuselab.ops.tuning.override``
    does for a block), on top of those already changed; every cached plan is emptied."""
    monkeypatch.setitem(tuning._ACTIVE, ReduceTuning, dataclasses.replace(current(ReduceTuning), **changes))
    fuselab.ops.clear()


@pytest.mark.parametrize("fast,dtype,block_r", [(False, torch.bfloat16, 4096), (True, torch.bfloat16, 2048),
                                                (True, torch.float32, 2048), (False, torch.float32, 2048)])
def test_row_step_by_memory_bandwidth(monkeypatch, plans_anew, fast, dtype, block_r):
    """One-row plans step 8 KiB per iteration, except bf16/fp16 on a fast-memory device (H200): 4 KiB; 16 warps."""
    monkeypatch.setattr(planner, "fast_memory", lambda device: fast)
    x = torch.empty(8192, 8192, dtype=dtype)
    _, kept, red = planner.prepare(x, (1,))
    sms = 132  # the GPU plan (CPU tensors plan for the interpreter's tiles)
    t = current(ReduceTuning)
    plan = planner._plan(tuple(kept), tuple(red), x.element_size(), True, sms, t.programs_per_sm,
                         t.cols_programs_per_sm, planner.row_tile_bytes(x, t), None, t)
    assert (plan.block_r, plan.block_i, plan.split, plan.num_warps) == (block_r, 1, 1, 16)


def _many_splits(monkeypatch, interleave: bool) -> None:
    """256-byte tiles (many splits even on small inputs), split programs reading interleaved or in chunks, and no
    plans remembered from earlier calls."""
    _tune(monkeypatch, interleave_min_split=dict.fromkeys(("rows", "cols"), 2 if interleave else None),
          interpreter_tile_bytes=256, row_tile_bytes=256, tile_bytes=dict.fromkeys((2, 4, 8), 256))


def _view(x: torch.Tensor, view: str) -> torch.Tensor:
    """``x`` as a SPLIT_CASES view: "dense"; "column-major" (rows kernel, kept axis strided); "every-other" (rows
    kernel over a strided reduced axis)."""
    if view == "column-major":
        return x.t().contiguous().t()
    if view == "every-other":
        return x[:, ::2]
    return x


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "chunked"])
@pytest.mark.parametrize("shape,dim,view", SPLIT_CASES, ids=str)
def test_split_orders(triton_backend, device, monkeypatch, plans_anew, interleave, shape, dim, view):
    """Both orders in which split programs read the reduced axis (interleaved blocks, contiguous chunks) match
    float64, with tiles small enough for many splits and a ragged last block (owned, when interleaved, by the last
    program or one in the middle, depending on the case)."""
    _many_splits(monkeypatch, interleave)
    x = _view(torch.randn(shape, device=device), view)
    src, kept, red = planner.prepare(x, tuple(range(x.dim())) if dim is None else (dim,))
    plan = planner.plan_reduction(src, kept, red)
    assert plan.split > 2 and plan.R % plan.block_r and plan.interleave == interleave, plan
    for op in OPS:
        _check(x, dim, False, op)


def _stealing(monkeypatch) -> None:
    """Work stealing on for every plan of the rows kernel, with small items (two 256-byte blocks each) and one 4-warp
    program on each of four SMs, so that small inputs have many more items than programs."""
    monkeypatch.setattr(planner, "sm_count", lambda device: 4)
    _tune(monkeypatch, steal="all", steal_item_bytes=dict.fromkeys((2, 4, 8), 512), steal_warps_per_sm=4)


STEAL_CASES = [((1000,), None, "dense"), ((31, 1001), None, "dense"), ((3001, 7), 0, "column-major"),
               ((9, 4001), 1, "every-other"), ((37, 1000), 1, "dense"), ((100, 1000), 1, "every-other")]


@pytest.mark.parametrize("shape,dim,view", STEAL_CASES, ids=str)
def test_work_stealing(triton_backend, device, monkeypatch, plans_anew, shape, dim, view):
    """Rows-kernel plans run by a few programs taking (tile, chunk) items from a counter match float64, split
    (partials summed by the last program) or not, with ragged last blocks, and give the same bits on every call."""
    _many_splits(monkeypatch, interleave=False)
    _stealing(monkeypatch)
    x = _view(torch.randn(shape, device=device), view)
    dims = tuple(range(x.dim())) if dim is None else (dim,)
    plan = planner.plan_reduction(*planner.prepare(x, dims))
    assert plan.kind == "rows" and plan.steal and plan.tiles * plan.split > plan.steal and not plan.interleave, plan
    assert plan.split > 1 or dim is not None, plan
    for op in OPS:
        first = _check(x, dim, False, op)
        assert torch.equal(first, OPS[op][0](x, dim)), "stealing changed the bits from one call to the next"


@pytest.mark.gpu
def test_work_stealing_leaves_counters_zeroed(device, monkeypatch, plans_anew):
    """A stealing launch, split or not, leaves the stream's item and ticket counters at zero for the next launch."""
    from fuselab.ops import _tickets

    _tune(monkeypatch, steal="all")
    x = torch.randn(4096, 4096, device=device)
    for dim in (None, -1):
        plan = planner.plan_reduction(*planner.prepare(x, (0, 1) if dim is None else (1,)))
        assert plan.steal, plan
        for _ in range(2):
            _check(x, dim, False, "sum")
        torch.cuda.synchronize()
        assert not _tickets.ticket_counters(x.device, 2)[:2].any()


# ---------------------------------------------------------------- TMA reads of the cols kernel


@pytest.fixture
def tma_everywhere(monkeypatch, plans_anew):
    """fp32 cols plans read through TMA descriptors on any device (the interpreter runs descriptor loads) and at any
    size; the descriptors each launch builds are recorded: ``[(shape, strides, block_shape)]``."""
    monkeypatch.setattr(planner, "tma_capable", lambda device: True)
    _tune(monkeypatch, cols_tma_min_bytes=0)
    built = []

    def descriptor(base, shape, strides, block_shape):
        built.append((tuple(shape), tuple(strides), tuple(block_shape)))
        return real(base, shape, strides, block_shape)

    real = kernels.TensorDescriptor
    monkeypatch.setattr(kernels, "TensorDescriptor", descriptor)
    return built


TMA_CASES = [((300, 200), (0,), "dense"), ((37, 260), (0,), "dense"), ((1000, 1000), (0,), "dense"),
             ((64, 1024), (0,), "first 1000 columns"), ((5, 40, 96), (0, 1), "dense"), ((3, 8), (0,), "dense")]


@pytest.mark.parametrize("shape,dims,view", TMA_CASES, ids=str)
def test_tma_reads(triton_backend, device, tma_everywhere, shape, dims, view):
    """fp32 cols plans read through TMA boxes match float64 and give the same bits on every call: rows and columns
    past the tensor's end (zero-filled by the copy), splits of several chunks or one, row strides wider than the
    rows, reduced axes merged into one, fewer rows than a box."""
    x = torch.randn(shape, device=device)
    if view == "first 1000 columns":
        x = x[:, :1000]
    plan = planner.plan_reduction(*planner.prepare(x, dims))
    assert plan.kind == "cols" and plan.stages > 0 and not plan.interleave, plan
    for op in OPS:
        first = _check(x, dims, False, op)
        assert torch.equal(first, OPS[op][0](x, dims)), "TMA reads changed the bits from one call to the next"
    box = [plan.block_r, plan.block_i]
    assert set(tma_everywhere) == {((plan.R, plan.I), (plan.s_r, 1), tuple(box))}
    assert plan.split > 1 or shape[0] <= 40


def test_tma_falls_back_where_a_descriptor_cannot_describe(triton_backend, device, tma_everywhere):
    """A base address off 16 bytes runs the same TMA plan from pointers (still exact). Layouts TMA cannot take are not
    planned for it: bf16 (slower under the lab's flush), a row stride off 16 bytes, strided columns, two kept
    groups."""
    x = torch.randn(50, 1028, device=device)[:, 1:1025]
    plan = planner.plan_reduction(*planner.prepare(x, (0,)))
    assert plan.stages and x.data_ptr() % 16
    _check(x, 0, False, "sum")
    assert not tma_everywhere
    untaken = [(torch.randn(300, 256, device=device, dtype=torch.bfloat16), (0,)),
               (torch.randn(300, 101, device=device), (0,)), (torch.randn(300, 512, device=device)[:, ::2], (0,)),
               (torch.randn(3, 50, 64, device=device), (1,))]
    for y, dims in untaken:
        plan = planner.plan_reduction(*planner.prepare(y, dims))
        assert plan.kind == "cols" and not plan.stages, plan
        _check(y, dims, False, "mean")


@pytest.mark.gpu
def test_tma_reads_in_a_cuda_graph(device, tma_everywhere):
    """A TMA plan captured in a CUDA graph (its descriptor encoded once, at capture) reads the input's new values on
    every replay."""
    x = torch.randn(1000, 1000, device=device)
    assert planner.plan_reduction(*planner.prepare(x, (0,))).stages
    fuselab.mean(x, 0)  # compile and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fuselab.mean(x, 0)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        assert_close(out, x.double().mean(0), dtype=torch.float32, what="graph replay of a TMA mean(dim=0)")


@pytest.mark.big_memory
@pytest.mark.gpu
def test_tma_reads_past_2_31_elements(device):
    """fp32 dim=0 over more than 2^31 elements, read through TMA where the device has it (64-bit addresses in the
    descriptor, 64-bit partial offsets)."""
    from fuselab.core.device import tma_capable

    if not tma_capable(device):
        pytest.skip("needs a device with TMA (sm_90+)")
    x = torch.ones(2**16 + 3, 2**15, device=device)  # 2^31 + 98304 elements, 8.6 GB
    x[-1, -5:] = 3.0
    x[-2, 7] = -1.0
    assert planner.plan_reduction(*planner.prepare(x, (0,))).stages
    want = torch.full((2**15,), float(x.shape[0]), device=device)
    want[-5:] += 2.0
    want[7] -= 2.0
    torch.testing.assert_close(fuselab.sum(x, 0), want, rtol=0, atol=0)


def test_tma_only_from_min_bytes(monkeypatch, plans_anew):
    """On a TMA device, fp32 cols plans take descriptors from ReduceTuning.cols_tma_min_bytes of input (the host time a
    descriptor costs per call is hidden there); smaller inputs keep the pointer loads."""
    monkeypatch.setattr(planner, "tma_capable", lambda device: True)
    rows = current(ReduceTuning).cols_tma_min_bytes // (4 * 4096)
    for n, tma in ((rows, True), (rows - 1, False)):
        x = torch.empty(n, 4096)  # never written: only its layout is planned
        assert (planner.plan_reduction(*planner.prepare(x, (0,))).stages > 0) == tma


# ---------------------------------------------------------------- int64 offsets


def test_int64_variant(triton_backend, device, monkeypatch, plans_anew):
    """The 64-bit index variant of both kernels (selected past 2^31 elements) computes the same result."""
    monkeypatch.setattr(kernels, "needs_int64", lambda *tensors: True)
    x = torch.randn(300, 257, device=device)
    for dim in (None, 0, -1):
        _check(x, dim, False, "mean")
    _check(x.t(), 0, False, "sum")
    # interleaved splits with a ragged tail, in 64-bit index math
    _many_splits(monkeypatch, interleave=True)
    planner._plan.cache_clear()  # the plans above were made with the shipped knobs
    for shape, dim in (((3000,), None), ((3000, 7), 0)):
        y = torch.randn(shape, device=device)
        assert planner.plan_reduction(*planner.prepare(y, (0,))).interleave
        _check(y, dim, False, "sum")
    # work stealing, split or not, in 64-bit index math
    _many_splits(monkeypatch, interleave=False)
    _stealing(monkeypatch)
    planner._plan.cache_clear()
    for shape, dim in (((3000,), None), ((37, 1000), 1)):
        y = torch.randn(shape, device=device)
        assert planner.plan_reduction(*planner.prepare(y, (dim or 0,))).steal
        _check(y, dim, False, "sum")


@pytest.mark.big_memory
@pytest.mark.gpu
def test_int64_offsets_large(device):
    n = 2**31 + 2**20 + 5
    x = torch.ones(n, device=device, dtype=torch.bfloat16)
    x[-7:] = 3.0
    assert fuselab.sum(x, dtype=torch.float32).item() == pytest.approx(n + 14, rel=1e-6)
    # the view drops the last 5 elements: two of the seven 3.0s (flat n-7, n-6) stay, at the end of the last row
    rows = x[: (n // 4096) * 4096].view(-1, 4096)
    expected_means = torch.ones(rows.shape[0], device=device)
    expected_means[-1] = (4094 + 2 * 3.0) / 4096
    torch.testing.assert_close(fuselab.mean(rows, -1, dtype=torch.float32), expected_means, rtol=0, atol=0)
    expected_cols = torch.full((4096,), float(rows.shape[0]), device=device)
    expected_cols[-2:] += 2.0
    torch.testing.assert_close(fuselab.sum(rows, 0, dtype=torch.float32), expected_cols, rtol=0, atol=0)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (-1, True), ((0, 2), False), ((1, 2), True)],
                         ids=str)
def test_gradients(triton_backend, device, dtype, op, dim, keepdim):
    x = torch.randn(4, 19, 33, device=device, dtype=dtype)[:, :, 1:]  # non-contiguous leaf source
    x = x.detach().requires_grad_(True)
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    out = OPS[op][0](x, dim, keepdim)
    ref = OPS[op][1](x64, dim=() if dim is None else dim, keepdim=keepdim)
    grad_out = torch.randn(ref.shape, device=device, dtype=dtype)
    out.backward(grad_out)
    ref.backward(grad_out.to(torch.float64))
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    assert_close(x.grad, x64.grad, dtype=dtype, what="grad", chained=True)


def test_gradcheck_float64(triton_backend, device):
    x = torch.randn(3, 5, 4, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fuselab.mean(t, (0, 2)), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda t: fuselab.sum(t, -1, True), (x,), fast_mode=True)


def test_grad_with_dtype_argument(triton_backend, device):
    x = torch.randn(8, 40, device=device, dtype=torch.bfloat16, requires_grad=True)
    out = fuselab.mean(x, 1, dtype=torch.float32)
    assert out.dtype == torch.float32
    out.backward(torch.ones_like(out))
    assert x.grad.dtype == torch.bfloat16
    assert torch.all(x.grad == torch.tensor(1 / 40, dtype=torch.bfloat16))


def test_torch_compile_fullgraph(triton_backend, device):
    torch._dynamo.reset()
    x = torch.randn(33, 65, device=device, requires_grad=True)

    def f(t):
        return fuselab.mean(t, dim=-1) * 2 + fuselab.sum(t, 0, keepdim=True).sum() + fuselab.mean(t)

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    expected = f(x)
    expected.sum().backward()
    assert_close(out, expected.double(), what="compiled forward")
    assert_close(grad, x.grad.double(), what="compiled grad", chained=True)


def test_custom_op_matches_eager_path(triton_backend, device):
    """Eager calls without autograd skip the dispatcher; both routes give the same bits."""
    x = torch.randn(70, 300, device=device)
    for dims in ([0], [1], [0, 1]):
        via_op = torch.ops.fuselab.reduce(x, dims, False, True, torch.float32)
        assert torch.equal(via_op, fuselab.mean(x, tuple(dims)))


def test_opcheck(device):
    x = torch.randn(6, 9, device=device)
    with forced("triton"):
        torch.library.opcheck(torch.ops.fuselab.reduce.default, (x, [1], False, True, torch.float32),
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_bad_inputs(monkeypatch, device, backend):
    monkeypatch.setenv("FUSELAB_BACKEND", backend)
    x = torch.randn(3, 4, device=device)
    for fn in (fuselab.sum, fuselab.mean):
        with pytest.raises(ValueError, match="dim=2 is out of range"):
            fn(x, 2)
        with pytest.raises(ValueError, match="dim=-3 is out of range"):
            fn(x, (0, -3))
        with pytest.raises(ValueError, match="more than once"):
            fn(x, (1, -1))
        with pytest.raises(TypeError, match="dim"):
            fn(x, 1.0)
        with pytest.raises(TypeError, match="dim"):
            fn(x, "0")
        with pytest.raises(TypeError, match="dim entries"):
            fn(x, (0, None))
        with pytest.raises(TypeError, match="dtype="):
            fn(torch.ones(3, dtype=torch.int64, device=device))
        with pytest.raises(TypeError, match="dtype="):
            fn(torch.ones(3, dtype=torch.bool, device=device))
        with pytest.raises(TypeError, match="dtype must be one of"):
            fn(x, dtype=torch.int32)
        with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype"):
            fn(x, dtype="float32")
        with pytest.raises(TypeError, match="real tensor"):
            fn(torch.randn(3, dtype=torch.complex64, device=device))
        with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
            fn([1.0, 2.0])
        with pytest.raises(TypeError, match="keepdim"):
            fn(x, 0, keepdim=1)


# ---------------------------------------------------------------- the benchmark suite


def test_suite_fuselab_provider_passes_check(device):
    from fuselab.bench.suites import get_spec

    spec = get_spec("reduce")
    cases = spec.cases(CaseQuery(device_type="cpu", quick=True, modes=("fwd", "fwd+bwd")))  # small shapes
    assert {c.params["dim"] for c in cases} == {None, -1, 0}
    for case in cases:
        with forced("triton"):
            result = check(spec, case, spec.provider("fuselab").build(case), device=device)
        assert result.ok, (case.key, result)
    all_case = next(c for c in cases if c.params["dim"] is None and c.mode == "fwd")
    assert spec.provider("naive").skip_reason(all_case) is None
    with forced("triton"):
        assert check(spec, all_case, spec.provider("naive").build(all_case), device=device).ok
    dim_case = next(c for c in cases if c.params["dim"] == 0)
    assert spec.provider("naive").skip_reason(dim_case)


def test_suite_gpu_cases_cost_model():
    from fuselab.bench.suites import get_spec

    cases = {c.label + "/" + str(c.dtype): c for c in get_spec("reduce").cases(CaseQuery(device_type="cuda"))}
    assert len(cases) == 9
    c = cases["dim=0/65536x512/torch.bfloat16"]
    assert c.bytes == (65536 * 512 + 512) * 2 and c.params == {"shape": (65536, 512), "dim": 0}
    assert cases["all/n=2^28/torch.float32"].bytes == (2**28 + 1) * 4


# ---------------------------------------------------------------- GPU: the benchmark shapes


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype", [((10000, 10000), torch.float32), ((2**28,), torch.float32),
                                         ((8192, 8192), torch.bfloat16), ((65536, 512), torch.bfloat16)], ids=str)
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_gpu_benchmark_shapes(device, shape, dtype, dim):
    """The lab's shapes. Values N(1, 1): the mean of zero-mean noise over 2^28 values is ~1e-5 of the terms' scale,
    where a relative check measures the cancellation (condition number ~4e5), not the kernel."""
    x = torch.randn(shape, device=device, dtype=dtype) + 1
    out = _check(x, dim, False, "mean")
    assert torch.equal(out, fuselab.mean(x, dim))
