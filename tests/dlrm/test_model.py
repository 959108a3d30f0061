"""DLRM parts: shapes, the dot interaction vs a float64 reference and vs torchrec's order, the MLP layer vs float64,
both kernel paths from one config to the same function and the same state_dict."""

from __future__ import annotations

import pytest
import torch
from dlrm_models import tiny_config, tiny_model

from fuselab.dlrm.config import load_config
from fuselab.dlrm.interaction import (
    CatConfig,
    CatInteraction,
    DotConfig,
    DotInteraction,
    pair_indices,
    torchrec_permutation,
)
from fuselab.dlrm.model import DLRM, DenseArch, OverArch
from fuselab.dlrm.sparse import TableSpec, TorchEmbeddingCollection
from fuselab.nn.mlp import LinearAct
from fuselab.testing import assert_close

SIZES = [7, 1, 130, 33, 5]


def _ids(sizes, batch: int, gen: torch.Generator | None = None) -> torch.Tensor:
    return torch.stack([torch.randint(0, n, (batch,), generator=gen) for n in sizes], dim=1)


def test_dense_arch_shape_and_padded_first_layer():
    arch = DenseArch(13, [17, 9, 4])
    out = arch(torch.randn(3, 13))
    assert out.shape == (3, 4)
    assert (out >= 0).all()  # ReLU after the last layer too
    first = arch.mlp[0]
    assert first.weight.shape == (17, 16) and torch.all(first.weight[:, 13:] == 0)  # 13 -> 16 zero columns


def test_torch_collection_rows():
    arch = TorchEmbeddingCollection(TableSpec(SIZES, 6), generator=torch.Generator().manual_seed(0))
    ids = _ids(SIZES, 11)
    out = arch(ids)
    assert out.shape == (11, len(SIZES), 6)
    start = sum(SIZES[:2])
    torch.testing.assert_close(out[:, 2], arch.weight[start: start + 130][ids[:, 2]])


def test_tables_and_collections_reject_bad_arguments():
    with pytest.raises(ValueError, match="table_sizes"):
        TableSpec((3, 0), 4)
    with pytest.raises(ValueError, match="dim"):
        TableSpec((3,), 0)
    with pytest.raises(ValueError, match="pooling"):
        TableSpec((3,), 4, pooling="max")
    with pytest.raises(ValueError, match="multi_hot_sizes must be 2 positive ints"):
        TableSpec((3, 4), 4, multi_hot_sizes=(1,))
    with pytest.raises(TypeError, match="optimizer must be an EmbeddingOptimizer"):
        TorchEmbeddingCollection(TableSpec((3,), 4), optimizer="adagrad")
    with pytest.raises(ValueError, match="lr"):
        TorchEmbeddingCollection(TableSpec((3,), 4), lr=-1.0)


def _dot_reference(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool) -> torch.Tensor:
    """Loops in float64: strict lower triangle (or with diagonal), row-major."""
    v = torch.cat([dense.unsqueeze(1), emb], dim=1).double()
    cols = [dense.double()]
    for i in range(v.shape[1]):
        for j in range(i + 1 if self_interaction else i):
            cols.append((v[:, i] * v[:, j]).sum(-1, keepdim=True))
    return torch.cat(cols, dim=1)


def _dot(features: int, dim: int, self_interaction: bool = False, fused: bool = False) -> DotInteraction:
    return DotInteraction(DotConfig(self_interaction), num_sparse=features, dim=dim, dense_dim=dim, fused=fused)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("batch,features,dim", [(1, 1, 1), (5, 26, 16), (3, 7, 5)])
@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_interaction_matches_float64_reference(batch, features, dim, self_interaction, fused):
    arch = _dot(features, dim, self_interaction, fused)
    dense, emb = torch.randn(batch, dim), torch.randn(batch, features, dim)
    out = arch(dense, emb)
    pairs = (features + 1) * features // 2 + (features + 1 if self_interaction else 0)
    assert arch.out_features == dim + pairs
    padded = -arch.out_features % 8 if fused else 0  # the fused op writes the over arch's pad columns
    assert out.shape == (batch, arch.out_features + padded) and torch.all(out[:, arch.out_features:] == 0)
    assert_close(out[:, : arch.out_features], _dot_reference(dense, emb, self_interaction), torch.float32,
                 "dot interaction")


def test_dot_interaction_on_strided_inputs():
    arch = _dot(4, 3)
    dense = torch.randn(3, 6)[:, ::2]
    emb = torch.randn(4, 3, 5).permute(2, 0, 1)  # [5, 4, 3], non-contiguous
    assert_close(arch(dense[:1].expand(5, 3), emb), _dot_reference(dense[:1].expand(5, 3), emb, False),
                 torch.float32)


def _torchrec_order(dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """torchrec's InteractionArch semantics: upper triangle (offset 1) of the Gram matrix, row-major."""
    v = torch.cat([dense.unsqueeze(1), emb], dim=1)
    gram = torch.bmm(v, v.transpose(1, 2))
    r, c = torch.triu_indices(v.shape[1], v.shape[1], offset=1)
    return gram[:, r, c]


@pytest.mark.parametrize("features", [1, 3, 26])
def test_torchrec_permutation(features):
    dim = 4
    dense, emb = torch.randn(6, dim), torch.randn(6, features, dim)
    ours = _dot(features, dim)(dense, emb)[:, dim:]
    perm = torchrec_permutation(features)
    assert sorted(perm.tolist()) == list(range(ours.shape[1]))
    torch.testing.assert_close(ours[:, perm], _torchrec_order(dense, emb))
    # and back: the inverse permutation maps torchrec's order to ours
    inverse = torch.argsort(perm)
    torch.testing.assert_close(_torchrec_order(dense, emb)[:, inverse], ours)


def test_torchrec_permutation_with_diagonal():
    rows, cols = pair_indices(4, self_interaction=True)
    perm = torchrec_permutation(3, self_interaction=True)
    r, c = torch.triu_indices(4, 4, offset=0)
    # our pair at perm[k] is torchrec's pair k transposed
    assert torch.equal(rows[perm], c) and torch.equal(cols[perm], r)


def test_cat_interaction_and_over_arch():
    arch = CatInteraction(CatConfig(), num_sparse=3, dim=4, dense_dim=6)
    dense, emb = torch.randn(2, 6), torch.randn(2, 3, 4)
    out = arch(dense, emb)
    assert out.shape == (2, 6 + 12) == (2, arch.out_features)
    assert torch.equal(out, torch.cat([dense, emb.reshape(2, 12)], dim=1))
    with pytest.raises(ValueError, match="bottom_mlp must end at embedding_dim"):
        DotInteraction(DotConfig(), num_sparse=3, dim=4, dense_dim=6)
    over = OverArch(18, [5, 1])
    assert over(out).shape == (2, 1)


@pytest.mark.parametrize("preset", ["tiny", "kaggle", "mlperf-v1"])
def test_dlrm_from_presets_forward_backward(preset):
    cfg = load_config(preset)
    sizes = [3, 50, 1, 7] + [2] * 22
    model = DLRM.from_config(cfg, sizes, kernels="torch")
    model.sparse_arch.set_lr(0.1)
    dense, sparse = torch.rand(4, 13), _ids(sizes, 4)
    before = model.sparse_arch.weight.clone()
    logits = model(dense, sparse)
    assert logits.shape == (4,)
    logits.sum().backward()
    touched = torch.zeros(sum(sizes), dtype=torch.bool)
    touched[(sparse + model.sparse_arch.row_offsets).reshape(-1)] = True
    moved = (model.sparse_arch.weight != before).any(1)
    assert moved.any() and not moved[~touched].any()  # the backward updated looked-up rows only
    for p in model.dense_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    assert model.interaction_arch.out_features == cfg.embedding_dim + 27 * 26 // 2


def test_dlrm_seeded_init_is_reproducible():
    a, b, c = tiny_model([5, 9], seed=7), tiny_model([5, 9], seed=7), tiny_model([5, 9], seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.sparse_arch.weight, c.sparse_arch.weight)


@pytest.mark.parametrize("impl", ["torch", "addmm", "fused_linear"])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("padded_input", [True, False])
def test_linear_act_matches_float64_reference(impl, relu, padded_input, backend):
    """Each implementation, on the Triton path (the interpreter on CPU) and the PyTorch path."""
    gen = torch.Generator().manual_seed(4)
    layer = LinearAct(7, 5, relu=relu, impl=impl, in_pad=1, generator=gen)
    assert layer.weight.shape == (5, 8) and torch.all(layer.weight[:, 7] == 0)
    x = torch.randn(9, 7)
    x = (torch.cat([x, torch.zeros(9, 1)], dim=1) if padded_input else x).requires_grad_()
    y = layer(x)
    grad = torch.randn(9, 5)
    y.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    z = x64 @ w64[:, : x.shape[1]].t() + b64
    y64 = torch.relu(z) if relu else z
    y64.backward(grad.double())
    assert_close(y, y64, torch.float32, f"{impl} forward")
    for got, ref, name in ((x.grad, x64.grad, "dx"), (layer.weight.grad, w64.grad, "dW"),
                           (layer.bias.grad, b64.grad, "db")):
        assert_close(got, ref, torch.float32, f"{impl} {name}")
    assert torch.all(layer.weight.grad[:, 7] == 0)  # the pad column's input is zero: its weight never moves


@pytest.mark.parametrize("impl", ["addmm", "fused_linear"])
def test_linear_act_under_bf16_autocast(impl):
    layer = LinearAct(6, 4, relu=True, impl=impl, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    ref = torch.relu(x.bfloat16().float() @ layer.weight.bfloat16().float().t() + layer.bias.bfloat16().float())
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


def test_mlp_implementations_start_from_the_same_function():
    dense, sparse = torch.rand(6, 13), _ids(SIZES, 6)
    models = [tiny_model(SIZES, mlp=mlp, seed=2) for mlp in ("torch", "addmm", "fused_linear")]
    ref = models[0](dense, sparse)
    for model in models[1:]:
        assert_close(model(dense, sparse), ref.double(), torch.float32, model.dense_arch.mlp[0].impl)


def test_bad_options_are_named():
    cfg = load_config("tiny")
    with pytest.raises(ValueError, match="kernels"):  # the caller resolves "auto" for its device
        DLRM.from_config(cfg, SIZES)
    with pytest.raises(ValueError, match="mlp"):
        DLRM.from_config(cfg, SIZES, kernels="torch", mlp="cublas")
    with pytest.raises(ValueError, match=r"config field 'optimizer': expected one of sgd, adagrad, rowwise_adagrad"):
        load_config("tiny", optimizer="adam")
    model = tiny_model(SIZES)
    with pytest.raises(ValueError, match="over arch takes 10 features, the interaction gives"):
        DLRM(model.sparse_arch, model.dense_arch, model.interaction_arch, OverArch(10, [1]))


@pytest.mark.parametrize("interaction", ["dot", "cat", "dcn"])
def test_both_kernel_paths_hold_one_state_and_one_function(interaction):
    """The same config on both paths: the same state_dict (keys, shapes, values) and the same function; each
    path's state loads into the other."""
    sizes = [7, 1, 130, 33, 5] + [3] * 21  # 26 features: dot width 4 + 351 = 355, padded to 360
    fields = {"interaction": interaction, "optimizer": "rowwise_adagrad"}
    if interaction == "cat":
        fields["bottom_mlp"] = [8, 6]
    ref, ours = tiny_model(sizes, **fields), tiny_model(sizes, "fuselab", **fields)
    ref_state, our_state = ref.state_dict(), ours.state_dict()
    assert list(ref_state) == list(our_state)
    for key, value in ref_state.items():
        assert torch.equal(our_state[key], value), key
    first = ours.over_arch.mlp[0]
    pad = -first.in_features % 8
    assert first.weight.shape[1] == first.in_features + pad and torch.all(first.weight[:, first.in_features:] == 0)
    dense, sparse = torch.rand(5, 13), _ids(sizes, 5)
    with torch.no_grad():
        assert_close(ours(dense, sparse), ref(dense, sparse).double(), torch.float32, "fuselab vs torch path")
        other = tiny_model(sizes, "fuselab", **{**fields, "seed": 9})
        other.load_state_dict(ref_state)
        assert_close(other(dense, sparse), ref(dense, sparse).double(), torch.float32, "torch state, fuselab path")


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
def test_seeded_init_follows_the_default_device(kernels):
    """Inside ``with torch.device(...)`` a seeded model draws its values on the CPU generator (no device clash) and
    lives on the context's device: every parameter and buffer there, as nn.Module layers are."""
    cfg = tiny_config(interaction={"kind": "dcn", "layers": 1, "low_rank": 2})
    with torch.device("meta"):
        model = DLRM.from_config(cfg, [3, 5, 7], kernels=kernels)
    tensors = [*model.parameters(), *model.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
