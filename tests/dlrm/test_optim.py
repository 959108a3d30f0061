"""The DLRM's updates against float64 updates written here, on tiny models of both kernel paths: the tables'
optimizer in the lookup's backward (sparse gradients with duplicate ids), the dense rule in ``Optimizers.step``.

Each step is checked alone: the reference starts from float64 copies of the parameters and states before the
step and applies the update with the gradients autograd produced (the tables' from the lookup's output gradient,
ids taken modulo the table rows, duplicates summed); then parameters and states are compared element-wise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dlrm_models import tiny_model

from fuselab.core.embedding_optimizer import EMBEDDING_OPTIMIZERS, SGD, Adagrad
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.sparse import TableSpec, TorchEmbeddingCollection
from fuselab.testing import assert_close

SIZES = [5, 1, 40, 9]
EPS = 1e-6
OPTIMIZERS = tuple(EMBEDDING_OPTIMIZERS)


def _batch(gen: torch.Generator, batch: int = 24):
    # ids from a few rows only: many duplicates per table in every batch
    sparse = torch.stack([torch.randint(0, min(n, 3), (batch,), generator=gen) for n in SIZES], dim=1)
    return torch.rand(batch, 13, generator=gen), sparse, (torch.rand(batch, generator=gen) < 0.4).float()


def _reference_update(optimizer: str, w: torch.Tensor, g: torch.Tensor, s: torch.Tensor | None, lr: float,
                      rowwise_state: bool) -> None:
    """In place, float64, dense form over all rows (untouched rows have g = 0 and stay put)."""
    if optimizer == "sgd":
        w -= lr * g
        return
    if optimizer == "rowwise_adagrad" and rowwise_state:
        s += (g * g).mean(1)
        w -= lr * g / (s.sqrt() + EPS).unsqueeze(1)
    else:  # element-wise Adagrad; also rowwise_adagrad on dense (MLP) parameters
        s += g * g
        w -= lr * g / (s.sqrt() + EPS)


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_step_matches_float64_update(optimizer, kernels):
    model = tiny_model(SIZES, kernels, optimizer=optimizer, adagrad_eps=EPS)
    opts = Optimizers(model, lr_dense=0.05, lr_sparse=0.3)
    tables = model.sparse_arch
    offsets = torch.tensor([0, *SIZES[:-1]]).cumsum(0)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        if step == 2:
            opts.set_lr(0.02, 0.7)
        lr_dense, lr_sparse = opts.lr["dense"], opts.lr["sparse"]
        dense, sparse, labels = _batch(gen)
        if kernels == "fuselab":
            sparse = sparse + 7 * torch.tensor(SIZES)  # raw ids: the fused collection applies id % rows
        w, s = tables.weight.double().clone(), tables.state.double().clone()
        grads = []
        opts.zero_grad()
        emb = model.sparse_forward(sparse)
        emb.register_hook(grads.append)
        F.binary_cross_entropy_with_logits(model.dense_forward(dense, emb), labels).backward()
        rows = (sparse % torch.tensor(SIZES) + offsets).reshape(-1)
        g = torch.zeros_like(w).index_add_(0, rows, grads[0].reshape(-1, w.shape[1]).double())
        touched = torch.zeros(len(w), dtype=torch.bool)
        touched[rows] = True
        w_ref = w.clone()
        _reference_update(optimizer, w_ref, g, s if optimizer != "sgd" else None, lr_sparse, True)
        w_ref[~touched] = w[~touched]
        assert_close(tables.weight, w_ref, torch.float32, f"{optimizer} tables, step {step}")
        if optimizer != "sgd":
            assert_close(tables.state, s, torch.float32, f"{optimizer} tables' state, step {step}")
        assert tables.grad_anchor.grad is None
        expected = []
        for k, p in enumerate(opts.dense_params):
            state = opts.dense_state[k] if opts.dense_state else None
            w64, s64 = p.detach().double().clone(), None if state is None else state.double().clone()
            _reference_update(optimizer, w64, p.grad.double(), s64, lr_dense, False)
            expected.append((p, w64, state, s64))
        opts.step()
        for p, w64, state, s64 in expected:
            assert_close(p.detach(), w64, torch.float32, f"{optimizer} dense step {step}")
            if state is not None:
                assert_close(state, s64, torch.float32, f"{optimizer} dense state, step {step}")
    expect_state = {"sgd": (0,), "adagrad": (sum(SIZES), 4), "rowwise_adagrad": (sum(SIZES),)}[optimizer]
    assert tuple(tables.state.shape) == expect_state


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_torch_collection_equals_torch_optim(optimizer):
    """The torch collection's update in the backward equals F.embedding(sparse=True) + torch.optim's sparse step."""
    lr = 0.3
    kind = SGD() if optimizer == "sgd" else Adagrad(eps=1e-10)
    ours = TorchEmbeddingCollection(TableSpec(SIZES, 4), optimizer=kind, lr=lr,
                                    generator=torch.Generator().manual_seed(2))
    weight = torch.nn.Parameter(ours.weight.clone())
    ref = torch.optim.SGD([weight], lr=lr) if optimizer == "sgd" else torch.optim.Adagrad([weight], lr=lr, eps=1e-10)
    offsets = torch.tensor([0, *SIZES[:-1]]).cumsum(0)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        _, sparse, _ = _batch(gen)
        upstream = torch.randn(*sparse.shape, 4, generator=gen)
        (ours(sparse) * upstream).sum().backward()
        ref.zero_grad()
        (F.embedding(sparse + offsets, weight, sparse=True) * upstream).sum().backward()
        ref.step()
    # the same update up to the order of fp32 roundings (torch adds lr·g/std as a sparse tensor)
    torch.testing.assert_close(ours.weight, weight.detach(), rtol=1e-5, atol=1e-6)
    if optimizer == "adagrad":
        torch.testing.assert_close(ours.state, ref.state[weight]["sum"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
def test_set_lr_zero_freezes_and_lr_tensors_update_in_place(kernels):
    model = tiny_model(SIZES, kernels, optimizer="sgd")
    opts = Optimizers(model, lr_dense=0.1, lr_sparse=0.1)
    dense_lr, sparse_lr = opts.lr_dense, model.sparse_arch.lr
    opts.set_lr(0.0, 0.0)
    assert opts.lr_dense is dense_lr and float(dense_lr) == 0.0 and float(sparse_lr) == 0.0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dense, sparse, labels = _batch(torch.Generator().manual_seed(0))
    F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
    opts.step()
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    opts.set_lr(0.5, 0.25)
    assert float(dense_lr) == 0.5 and float(sparse_lr) == 0.25 and opts.lr == {"dense": 0.5, "sparse": 0.25}


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_state_dict_round_trip_resumes_exactly(optimizer, kernels):
    gen = torch.Generator().manual_seed(5)
    batches = [_batch(gen) for _ in range(6)]

    def run(model, opts, part):
        for dense, sparse, labels in part:
            opts.zero_grad()
            F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
            opts.step()

    def make():
        model = tiny_model(SIZES, kernels, optimizer=optimizer, adagrad_eps=EPS)
        return model, Optimizers(model, lr_dense=0.05, lr_sparse=0.2)

    a, opts_a = make()
    run(a, opts_a, batches)
    b, opts_b = make()
    run(b, opts_b, batches[:3])
    model_state = {k: v.clone() for k, v in b.state_dict().items()}
    opt_state = {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in opts_b.state_dict().items()}
    c, opts_c = make()
    c.load_state_dict(model_state)
    opts_c.set_lr(1.0, 1.0)
    opts_c.load_state_dict(opt_state)
    assert opts_c.lr == {"dense": 0.05, "sparse": 0.2}
    run(c, opts_c, batches[3:])
    for (name, pa), pc in zip(a.state_dict().items(), c.state_dict().values()):
        assert torch.equal(pa, pc), name


def test_bad_arguments():
    model = tiny_model(SIZES)
    with pytest.raises(ValueError, match="lr_dense"):
        Optimizers(model, lr_dense=-1.0, lr_sparse=0.1)
    with pytest.raises(ValueError, match="lr_sparse"):
        Optimizers(model, lr_dense=0.1, lr_sparse=float("nan"))
    with pytest.raises(TypeError, match="EmbeddingOptimizer"):
        Optimizers(torch.nn.Linear(2, 2), lr_dense=0.1, lr_sparse=0.1)
    opts = Optimizers(model, lr_dense=0.1, lr_sparse=0.1)
    with pytest.raises(ValueError, match="optimizer state is for 'sgd'"):
        opts.load_state_dict({"optimizer": "sgd", "dense": [], "lr_dense": 0.1, "lr_sparse": 0.1})
    with pytest.raises(ValueError, match="optimizer state 'dense'"):
        opts.load_state_dict({"optimizer": "adagrad", "dense": [], "lr_dense": 0.1, "lr_sparse": 0.1})


def test_the_optimizer_is_the_models():
    """One choice: the model's tables carry it; the dense rule follows (row-wise Adagrad: element-wise state)."""
    model = tiny_model(SIZES, "fuselab", optimizer="rowwise_adagrad", adagrad_eps=1e-7)
    opts = Optimizers(model, lr_dense=0.1, lr_sparse=0.25)
    assert opts.optimizer is model.sparse_arch.optimizer and opts.optimizer.eps == 1e-7
    assert float(model.sparse_arch.lr) == 0.25
    assert [s.shape for s in opts.dense_state] == [p.shape for p in model.dense_parameters()]
    assert {"sparse_arch.state", "sparse_arch.weight"} <= set(model.state_dict())
    dense = {id(p) for n, p in model.named_parameters() if not n.startswith("sparse_arch.")}
    assert {id(p) for p in opts.dense_params} == dense
