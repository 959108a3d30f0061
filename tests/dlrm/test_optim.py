"""fuselab.dlrm.optim.Optimizers against float64 updates written here, on a tiny torch-path DLRM.

Each step is checked alone: the reference starts from float64 copies of the parameters and states before the
step and applies the update with the gradients autograd produced (sparse COO for the tables, duplicates in the
ids); then parameters and states are compared element-wise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dlrm_fake_ops import fuselab_ops  # noqa: F401  (a fixture)

from fuselab.dlrm.model import DLRM
from fuselab.dlrm.optim import OPTIMIZERS, Optimizers
from fuselab.testing import assert_close

SIZES = [5, 1, 40, 9]
EPS = 1e-6


def _model(optimizer: str = "adagrad", layout: str = "fused") -> DLRM:
    return DLRM(SIZES, 4, [8, 4], [6, 1], embedding_layout=layout, seed=3, optimizer=optimizer)


def _batch(gen: torch.Generator, batch: int = 24):
    # ids from a few rows only: many duplicates per table in every batch
    sparse = torch.stack([torch.randint(0, min(n, 3), (batch,), generator=gen) for n in SIZES], dim=1)
    return torch.rand(batch, 13, generator=gen), sparse, (torch.rand(batch, generator=gen) < 0.4).float()


def _reference_update(optimizer: str, w: torch.Tensor, g: torch.Tensor, s: torch.Tensor | None, lr: float,
                      rows_2d: bool) -> None:
    """In place, float64, dense form over all rows (untouched rows have g = 0 and stay put)."""
    if optimizer == "sgd":
        w -= lr * g
        return
    if optimizer == "rowwise_adagrad" and rows_2d:
        s += (g * g).mean(1)
        w -= lr * g / (s.sqrt() + EPS).unsqueeze(1)
    else:  # element-wise Adagrad; also rowwise_adagrad on dense (MLP) parameters
        s += g * g
        w -= lr * g / (s.sqrt() + EPS)


@pytest.mark.parametrize("layout", ["fused", "per_table"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_each_step_matches_float64_update(optimizer, layout):
    torch.manual_seed(0)
    model = _model(optimizer, layout)
    opts = Optimizers(model, optimizer=optimizer, lr_dense=0.05, lr_sparse=0.3, eps=EPS)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        if step == 3:
            opts.set_lr(0.02, 0.7)
        lr_dense, lr_sparse = opts.lr["dense"], opts.lr["sparse"]
        dense, sparse, labels = _batch(gen)
        opts.zero_grad()
        F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
        groups = [(opts.dense_params, opts.dense_state, lr_dense, False),
                  (opts.sparse_params, opts.sparse_state, lr_sparse, True)]
        expected = []
        for params, states, lr, is_table in groups:
            for k, p in enumerate(params):
                assert p.grad is not None and p.grad.is_sparse == is_table
                w, g = p.detach().double().clone(), p.grad.to_dense().double()
                s = states[k].double().clone() if states else None
                _reference_update(optimizer, w, g, s, lr, is_table)
                expected.append((p, w, states[k] if states else None, s))
        opts.step()
        for p, w, state, s in expected:
            assert_close(p.detach(), w, torch.float32, f"{optimizer} step {step} weights")
            if state is not None:
                assert_close(state, s, torch.float32, f"{optimizer} step {step} state")
    assert opts.sparse_state == [] or opts.sparse_state[0].dim() == (1 if optimizer == "rowwise_adagrad" else 2)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_sparse_adagrad_equals_torch_optim_adagrad():
    torch.manual_seed(0)
    a, b = _model(), _model()
    opts = Optimizers(a, optimizer="adagrad", lr_dense=0.05, lr_sparse=0.3, eps=1e-10)
    ref = torch.optim.Adagrad(b.embedding_parameters(), lr=0.3, eps=1e-10)
    ref_dense = torch.optim.Adagrad(b.dense_parameters(), lr=0.05, eps=1e-10)
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        dense, sparse, labels = _batch(gen)
        for model, step in ((a, opts.step), (b, lambda: (ref.step(), ref_dense.step()))):
            model.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
            step()
    # the same update up to the order of fp32 roundings (torch adds lr·g/std as a sparse tensor)
    torch.testing.assert_close(a.sparse_arch.weight, b.sparse_arch.weight, rtol=1e-5, atol=1e-6)
    for pa, pb in zip(a.dense_parameters(), b.dense_parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_set_lr_zero_freezes_and_lr_tensors_update_in_place():
    model = _model("sgd")
    opts = Optimizers(model, optimizer="sgd", lr_dense=0.1, lr_sparse=0.1)
    dense_lr, sparse_lr = opts.lr_dense, opts.lr_sparse
    opts.set_lr(0.0, 0.0)
    assert opts.lr_dense is dense_lr and float(dense_lr) == 0.0 and float(sparse_lr) == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    dense, sparse, labels = _batch(torch.Generator().manual_seed(0))
    F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
    opts.step()
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q)
    opts.set_lr(0.5, 0.25)
    assert float(dense_lr) == 0.5 and float(sparse_lr) == 0.25 and opts.lr == {"dense": 0.5, "sparse": 0.25}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_state_dict_round_trip_resumes_exactly(optimizer):
    gen = torch.Generator().manual_seed(5)
    batches = [_batch(gen) for _ in range(6)]

    def run(model, opts, part):
        for dense, sparse, labels in part:
            opts.zero_grad()
            F.binary_cross_entropy_with_logits(model(dense, sparse), labels).backward()
            opts.step()

    a = _model(optimizer)
    opts_a = Optimizers(a, optimizer=optimizer, lr_dense=0.05, lr_sparse=0.2, eps=EPS)
    run(a, opts_a, batches)
    b = _model(optimizer)
    opts_b = Optimizers(b, optimizer=optimizer, lr_dense=0.05, lr_sparse=0.2, eps=EPS)
    run(b, opts_b, batches[:3])
    model_state = {k: v.clone() for k, v in b.state_dict().items()}
    opt_state = {k: [t.clone() for t in v] if isinstance(v, list) else v for k, v in opts_b.state_dict().items()}
    c = _model(optimizer)
    c.load_state_dict(model_state)
    opts_c = Optimizers(c, optimizer=optimizer, lr_dense=1.0, lr_sparse=1.0, eps=EPS)
    opts_c.load_state_dict(opt_state)
    assert opts_c.lr == {"dense": 0.05, "sparse": 0.2}
    run(c, opts_c, batches[3:])
    for (name, pa), pc in zip(a.state_dict().items(), c.state_dict().values()):
        assert torch.equal(pa, pc), name


def test_bad_arguments():
    model = _model()
    with pytest.raises(ValueError, match="optimizer"):
        Optimizers(model, optimizer="adam", lr_dense=0.1, lr_sparse=0.1)
    with pytest.raises(ValueError, match="lr_dense"):
        Optimizers(model, optimizer="sgd", lr_dense=-1.0, lr_sparse=0.1)
    with pytest.raises(ValueError, match="lr_sparse"):
        Optimizers(model, optimizer="sgd", lr_dense=0.1, lr_sparse=float("nan"))
    with pytest.raises(ValueError, match="eps"):
        Optimizers(model, optimizer="adagrad", lr_dense=0.1, lr_sparse=0.1, eps=0.0)
    opts = Optimizers(model, optimizer="sgd", lr_dense=0.1, lr_sparse=0.1)
    with pytest.raises(ValueError, match="optimizer state"):
        opts.load_state_dict({"optimizer": "adagrad", "dense": [], "sparse": [], "lr_dense": 0.1, "lr_sparse": 0.1})


@pytest.mark.usefixtures("fuselab_ops")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_fuselab_path_fused_update_matches_float64_update(optimizer):
    """The embedding update happens in backward: weight and state after it equal a float64 update computed here
    from the gradient of the lookup's output (duplicates summed, ids taken modulo the table rows)."""
    model = DLRM(SIZES, 4, [8, 4], [6, 1], seed=3, kernels="fuselab", optimizer=optimizer, lr_sparse=0.3,
                 adagrad_eps=EPS)
    opts = Optimizers(model, optimizer=optimizer, lr_dense=0.05, lr_sparse=0.3, eps=EPS)
    ebc = model.sparse_arch
    offsets = torch.tensor([0, *SIZES[:-1]]).cumsum(0)
    gen = torch.Generator().manual_seed(4)
    for step in range(4):
        if step == 2:
            opts.set_lr(0.05, 0.8)
        dense, sparse, labels = _batch(gen)
        sparse = sparse + 7 * torch.tensor(SIZES)  # raw ids: the collection applies id % rows
        w = ebc.weight.detach().double().clone()
        s = ebc.state.detach().double().clone() if optimizer != "sgd" else None
        grads = []
        opts.zero_grad()
        emb = ebc(sparse)
        emb.register_hook(grads.append)
        F.binary_cross_entropy_with_logits(model.dense_forward(dense, emb), labels).backward()
        assert ebc.weight.grad is None
        rows = (sparse % torch.tensor(SIZES) + offsets).reshape(-1)
        g = torch.zeros_like(w).index_add_(0, rows, grads[0].reshape(-1, 4).double())
        touched = torch.zeros(len(w), dtype=torch.bool)
        touched[rows] = True
        w_ref = w.clone()
        _reference_update(optimizer, w_ref, g, s, opts.lr["sparse"], True)
        w_ref[~touched] = w[~touched]
        assert_close(ebc.weight.detach(), w_ref, torch.float32, f"{optimizer} fused update, step {step}")
        if optimizer != "sgd":
            assert_close(ebc.state, s, torch.float32, f"{optimizer} fused state, step {step}")
        opts.step()


@pytest.mark.usefixtures("fuselab_ops")
def test_fuselab_path_learning_rate_and_state():
    model = DLRM(SIZES, 4, [8, 4], [6, 1], kernels="fuselab", optimizer="rowwise_adagrad")
    with pytest.raises(ValueError, match="built for 'rowwise_adagrad'"):
        Optimizers(model, optimizer="sgd", lr_dense=0.1, lr_sparse=0.1)
    opts = Optimizers(model, optimizer="rowwise_adagrad", lr_dense=0.1, lr_sparse=0.25)
    assert float(model.sparse_arch.lr) == 0.25 and opts.sparse_params == [] and opts.sparse_state == []
    opts.set_lr(0.1, 0.125)
    assert float(model.sparse_arch.lr) == 0.125
    assert "sparse_arch.state" in model.state_dict() and "sparse_arch.weight" in model.state_dict()
    dense = {id(p) for n, p in model.named_parameters() if not n.startswith("sparse_arch.")}
    assert {id(p) for p in opts.dense_params} == dense and id(model.sparse_arch.weight) not in dense
