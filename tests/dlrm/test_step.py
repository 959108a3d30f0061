"""fuselab.dlrm.step.TrainStep: eager equals a step written here, compile agrees, cuda_graph's errors; the torch
and fuselab kernel paths learn the same loss curve (fuselab ops under the interpreter, once they exist)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from dlrm_models import tiny_model

from fuselab.dlrm.config import OPTIMIZERS
from fuselab.dlrm.model import DLRM
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.step import StepOptions, TrainStep

SIZES = [5, 1, 40, 9]


def _model(kernels: str = "torch", mlp: str | None = None, **fields) -> DLRM:
    return tiny_model(SIZES, kernels, mlp, **fields)


def _batches(count: int, batch: int = 32, seed: int = 0, sizes=SIZES):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        sparse = torch.stack([torch.randint(0, n, (batch,), generator=gen) for n in sizes], dim=1)
        dense = torch.rand(batch, 13, generator=gen)
        out.append((dense, sparse, (torch.rand(batch, generator=gen) < 0.3).float()))
    return out


def _hand_step(model, opts, dense, sparse, labels, bf16: bool):
    opts.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(dense, sparse)
    loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
    loss.backward()
    opts.step()
    return loss.detach()


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("mlp", ["torch", "addmm"])
def test_eager_step_equals_hand_written_step(precision, mlp):
    a = _model(mlp=mlp, optimizer="adagrad")
    b = copy.deepcopy(a)
    opts_a = Optimizers(a, lr_dense=0.05, lr_sparse=0.1)
    opts_b = Optimizers(b, lr_dense=0.05, lr_sparse=0.1)
    step = TrainStep(a, opts_a, precision=precision)
    for dense, sparse, labels in _batches(4):
        loss = step(dense, sparse, labels)
        ref = _hand_step(b, opts_b, dense, sparse, labels, precision == "bf16")
        assert loss.shape == () and loss.dtype == torch.float32 and not loss.requires_grad
        assert torch.equal(loss, ref)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert torch.get_float32_matmul_precision() == "highest"  # restored after the tf32 steps


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fuselab_path_eager_step_equals_hand_written_step(precision):
    a = _model("fuselab", optimizer="rowwise_adagrad")
    b = copy.deepcopy(a)
    step = TrainStep(a, Optimizers(a, lr_dense=0.05, lr_sparse=0.1), precision=precision)
    opts_b = Optimizers(b, lr_dense=0.05, lr_sparse=0.1)
    for dense, sparse, labels in _batches(4):
        assert torch.equal(step(dense, sparse, labels), _hand_step(b, opts_b, dense, sparse, labels,
                                                                   precision == "bf16"))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.sparse_arch.state, torch.zeros_like(a.sparse_arch.state))


def test_losses_are_independent_tensors_and_decrease():
    model = _model(optimizer="adagrad")
    step = TrainStep(model, Optimizers(model, lr_dense=0.05, lr_sparse=0.1))
    batch = _batches(1)[0]
    losses = [step(*batch) for _ in range(30)]
    assert len({id(x) for x in losses}) == 30 and losses[-1] < losses[0]


@pytest.mark.slow
def test_compile_mode_agrees_with_eager():
    a = _model(mlp="addmm", optimizer="rowwise_adagrad")
    b = copy.deepcopy(a)
    eager = TrainStep(a, Optimizers(a, lr_dense=0.05, lr_sparse=0.1))
    compiled = TrainStep(b, Optimizers(b, lr_dense=0.05, lr_sparse=0.1), mode="compile")
    for dense, sparse, labels in _batches(3):
        torch.testing.assert_close(compiled(dense, sparse, labels), eager(dense, sparse, labels),
                                   rtol=1e-5, atol=1e-6)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5, msg=name)


def test_bad_arguments_and_cuda_graph_on_cpu():
    model = _model(optimizer="sgd")
    opts = Optimizers(model, lr_dense=0.1, lr_sparse=0.1)
    for graph in ("cuda_graph", "compile_graph"):
        with pytest.raises(ValueError, match=r"cuda_graph.*CUDA device"):
            TrainStep(model, opts, mode=graph)
    with pytest.raises(ValueError, match="precision"):
        TrainStep(model, opts, precision="fp16")
    with pytest.raises(ValueError, match="mode"):
        TrainStep(model, opts, mode="graph")
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainStep(model, opts, options=StepOptions(warmup_steps=0))
    with pytest.raises(ValueError, match=r"pipeline.*prefetch\(\)"):  # one process: no ids to send ahead
        TrainStep(model, opts, options=StepOptions(pipeline=True))
    with pytest.raises(ValueError, match="next_sparse needs"):
        TrainStep(model, opts)(*_batches(2)[0], next_sparse=_batches(2)[1][1])
    model.ddp = True  # a model whose dense gradients DDP reduces cannot split its forward
    with pytest.raises(ValueError, match=r"overlap.*ddp=False"):
        TrainStep(model, opts, options=StepOptions(overlap=True))


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
def test_overlapped_step_equals_the_plain_step(kernels):
    """The split forward (lookup, bottom MLP, then interaction and top MLP) gives the same losses and weights, bit
    for bit (on a CPU the side stream is a no-op: the same ops in another order)."""
    a = _model(kernels, optimizer="rowwise_adagrad")
    b = copy.deepcopy(a)
    plain = TrainStep(a, Optimizers(a, lr_dense=0.05, lr_sparse=0.1), precision="bf16")
    overlapped = TrainStep(b, Optimizers(b, lr_dense=0.05, lr_sparse=0.1), precision="bf16",
                           options=StepOptions(overlap=True))
    assert overlapped.side_stream is None and plain.side_stream is None  # a CPU: no side stream
    bottom, calls = b.bottom_forward, []
    b.bottom_forward = lambda dense: (calls.append(dense.shape), bottom(dense))[1]  # the split forward's first half
    for batch in _batches(4):
        assert torch.equal(overlapped(*batch), plain(*batch))
    assert len(calls) == 4
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "cuda_graph", "compile_graph"])
def test_overlapped_step_equals_the_plain_step_on_gpu(mode):
    """On CUDA the lookup and the update run on the side stream: the same losses and weights, bit for bit (compiled:
    the bottom MLP and the rest compile apart, so Inductor may fuse and round differently: to a tolerance)."""
    a = _model("fuselab", optimizer="rowwise_adagrad").cuda()
    b = copy.deepcopy(a)
    plain = TrainStep(a, Optimizers(a, lr_dense=0.05, lr_sparse=0.1), precision="bf16", mode=mode)
    overlapped = TrainStep(b, Optimizers(b, lr_dense=0.05, lr_sparse=0.1), precision="bf16", mode=mode,
                           options=StepOptions(overlap=True))
    assert overlapped.side_stream is not None and plain.side_stream is None
    tol = dict(rtol=0, atol=0) if mode != "compile_graph" else dict(rtol=1e-4, atol=1e-5)
    for batch in _batches(6):
        batch = [t.cuda() for t in batch]
        torch.testing.assert_close(overlapped(*batch), plain(*batch), **tol)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, **tol, msg=name)


@pytest.mark.gpu
def test_cuda_graph_needs_fuselab_kernels_on_gpu():
    model = _model(optimizer="sgd").cuda()
    with pytest.raises(ValueError, match="kernels='fuselab'"):
        TrainStep(model, Optimizers(model, lr_dense=0.1, lr_sparse=0.1), mode="cuda_graph")


@pytest.mark.parametrize("embedding_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_warm_up_restores_the_state_without_copying_the_tables(optimizer, embedding_dtype, monkeypatch):
    """A capture's warm-up (steps on a zero gradient) ends with every tensor of the model and of the dense
    optimizer bit for bit as before (half-precision tables and their rounding seed too), and copies neither the
    tables nor their optimizer state (at MLPerf's size they are most of a GPU)."""
    model = _model("fuselab", optimizer=optimizer, embedding_dtype=embedding_dtype)
    opts = Optimizers(model, lr_dense=0.05, lr_sparse=0.1)
    step = TrainStep(model, opts, options=StepOptions(warmup_steps=2))
    for batch in _batches(2):  # optimizer state that a step would change
        step(*batch)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    dense_before = [t.clone() for t in opts.dense_state]
    copied, clone = [], torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: copied.append(t.data_ptr()) or clone(t, *a, **k))
    step._warm_up(*_batches(1, seed=5)[0])
    monkeypatch.undo()
    tables = model.sparse_arch
    assert copied and all(t.data_ptr() not in copied for t in (tables.weight, tables.state) if t.numel())
    for name, t in model.state_dict().items():
        assert torch.equal(t, before[name]), name
    for t, b in zip(opts.dense_state, dense_before, strict=True):
        assert torch.equal(t, b)
    step(*_batches(1, seed=6)[0])  # the step after it still trains the tables
    assert not torch.equal(tables.weight, before["sparse_arch.weight"])


@pytest.mark.gpu
@pytest.mark.parametrize("embedding_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("graph", ["cuda_graph", "compile_graph"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_cuda_graph_equals_eager_and_sees_new_lr(optimizer, graph, embedding_dtype):
    a = _model("fuselab", optimizer=optimizer, embedding_dtype=embedding_dtype).cuda()
    b = copy.deepcopy(a)
    steps = [TrainStep(m, Optimizers(m, lr_dense=0.05, lr_sparse=0.1), mode=mode)
             for m, mode in ((a, "eager"), (b, graph))]
    for k, batch in enumerate(_batches(6)):
        if k == 3:
            for s in steps:
                s.optimizers.set_lr(0.01, 0.5)
        batch = [t.cuda() for t in batch]
        # the compiled step fuses element-wise ops: the same values up to the order of fp32 roundings
        tol = dict(rtol=1e-5, atol=1e-6) if graph == "cuda_graph" else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(steps[1](*batch), steps[0](*batch), **tol)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="captured for"):
        steps[1](*[t.cuda()[:5] for t in _batches(1)[0]])


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_kernel_paths_learn_the_same_loss_curve(optimizer):
    """A few hundred steps of both paths from the same initial function: the loss curves agree to tolerance."""
    sizes = [11, 3, 50, 7, 20]
    lr = {"sgd": (0.1, 0.5), "adagrad": (0.02, 0.05), "rowwise_adagrad": (0.02, 0.05)}[optimizer]
    curves = []
    for kernels in ("torch", "fuselab"):
        model = tiny_model(sizes, kernels, optimizer=optimizer, top_mlp=[8, 1], seed=1)
        step = TrainStep(model, Optimizers(model, lr_dense=lr[0], lr_sparse=lr[1]))
        curves.append(torch.stack([step(*b) for b in _batches(200, batch=16, seed=2, sizes=sizes)]))
    torch.testing.assert_close(curves[1], curves[0], rtol=2e-3, atol=2e-4)
    assert curves[0][-20:].mean() < curves[0][:20].mean()  # it learned something
