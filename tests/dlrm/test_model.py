"""DLRM architecture: shapes, the dot interaction vs a float64 reference and vs torchrec's order."""

from __future__ import annotations

import pytest
import torch
from dlrm_fake_ops import fuselab_ops  # noqa: F401  (a fixture)

from fuselab.dlrm.config import load_config
from fuselab.dlrm.model import (
    DLRM,
    DenseArch,
    InteractionArch,
    LinearAct,
    OverArch,
    SparseArch,
    pair_indices,
    torchrec_permutation,
)
from fuselab.testing import assert_close

SIZES = [7, 1, 130, 33, 5]


def test_dense_arch_shape():
    arch = DenseArch(13, [17, 9, 4])
    out = arch(torch.randn(3, 13))
    assert out.shape == (3, 4)
    assert (out >= 0).all()  # ReLU after the last layer too


@pytest.mark.parametrize("layout", ["fused", "per_table"])
def test_sparse_arch_shape_and_rows(layout):
    arch = SparseArch(SIZES, 6, layout=layout, generator=torch.Generator().manual_seed(0))
    ids = torch.stack([torch.randint(0, n, (11,)) for n in SIZES], dim=1)
    out = arch(ids)
    assert out.shape == (11, len(SIZES), 6)
    table = arch.weight[int(arch.offsets[2]):][:130] if layout == "fused" else arch.tables[2].weight
    torch.testing.assert_close(out[:, 2], table[ids[:, 2]])


def test_fused_and_per_table_layouts_agree():
    ids = torch.stack([torch.randint(0, n, (9,)) for n in SIZES], dim=1)
    a = SparseArch(SIZES, 4, "fused", generator=torch.Generator().manual_seed(3))(ids)
    b = SparseArch(SIZES, 4, "per_table", generator=torch.Generator().manual_seed(3))(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sparse_arch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="table_sizes"):
        SparseArch([3, 0], 4)
    with pytest.raises(ValueError, match="layout"):
        SparseArch([3], 4, layout="bogus")


def _dot_reference(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool) -> torch.Tensor:
    """Loops in float64: strict lower triangle (or with diagonal), row-major."""
    v = torch.cat([dense.unsqueeze(1), emb], dim=1).double()
    cols = [dense.double()]
    for i in range(v.shape[1]):
        for j in range(i + 1 if self_interaction else i):
            cols.append((v[:, i] * v[:, j]).sum(-1, keepdim=True))
    return torch.cat(cols, dim=1)


@pytest.mark.parametrize("batch,features,dim", [(1, 1, 1), (5, 26, 16), (3, 7, 5)])
@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_interaction_matches_float64_reference(batch, features, dim, self_interaction):
    arch = InteractionArch(features, dim, "dot", self_interaction)
    dense, emb = torch.randn(batch, dim), torch.randn(batch, features, dim)
    out = arch(dense, emb)
    pairs = (features + 1) * features // 2 + (features + 1 if self_interaction else 0)
    assert out.shape == (batch, dim + pairs) == (batch, arch.out_features)
    assert_close(out, _dot_reference(dense, emb, self_interaction), torch.float32, "dot interaction")


def test_dot_interaction_on_strided_inputs():
    arch = InteractionArch(4, 3, "dot")
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
    arch = InteractionArch(features, dim, "dot")
    dense, emb = torch.randn(6, dim), torch.randn(6, features, dim)
    ours = arch(dense, emb)[:, dim:]
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
    arch = InteractionArch(3, 4, "cat", dense_dim=6)
    out = arch(torch.randn(2, 6), torch.randn(2, 3, 4))
    assert out.shape == (2, 6 + 12) == (2, arch.out_features)
    with pytest.raises(ValueError, match="dense output width"):
        InteractionArch(3, 4, "dot", dense_dim=6)
    over = OverArch(18, [5, 1])
    assert over(out).shape == (2, 1)


@pytest.mark.parametrize("preset", ["tiny", "kaggle", "mlperf-v1"])
def test_dlrm_from_presets_forward_backward(preset):
    cfg = load_config(preset)
    sizes = [3, 50, 1, 7] + [2] * 22
    model = DLRM.from_config(cfg, sizes, kernels="torch")
    dense = torch.rand(4, 13)
    sparse = torch.stack([torch.randint(0, n, (4,)) for n in sizes], dim=1)
    logits = model(dense, sparse)
    assert logits.shape == (4,)
    logits.sum().backward()
    weight = model.sparse_arch.weight
    assert weight.grad is not None and weight.grad.is_sparse  # only looked-up rows get gradient
    for p in model.dense_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    expected = cfg.embedding_dim + 27 * 26 // 2
    assert model.interaction_arch.out_features == expected


def test_dlrm_seeded_init_is_reproducible():
    a, b = DLRM([5, 9], 4, [8, 4], [6, 1], seed=7), DLRM([5, 9], 4, [8, 4], [6, 1], seed=7)
    c = DLRM([5, 9], 4, [8, 4], [6, 1], seed=8)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.sparse_arch.weight, c.sparse_arch.weight)


@pytest.mark.parametrize("impl", ["torch", "addmm", "fused_linear"])
@pytest.mark.parametrize("relu", [True, False])
def test_linear_act_matches_float64_reference(impl, relu):
    gen = torch.Generator().manual_seed(4)
    layer = LinearAct(7, 5, relu, impl, in_pad=1, generator=gen)
    assert layer.weight.shape == (5, 8) and torch.all(layer.weight[:, 7] == 0)
    x = torch.cat([torch.randn(9, 7), torch.zeros(9, 1)], dim=1).requires_grad_()
    y = layer(x)
    grad = torch.randn(9, 5)
    y.backward(grad)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    z = x64 @ w64.t() + b64
    y64 = torch.relu(z) if relu else z
    y64.backward(grad.double())
    assert_close(y, y64, torch.float32, f"{impl} forward")
    for got, ref, name in ((x.grad, x64.grad, "dx"), (layer.weight.grad, w64.grad, "dW"), (layer.bias.grad, b64.grad,
                                                                                          "db")):
        assert_close(got, ref, torch.float32, f"{impl} {name}")
    assert torch.all(layer.weight.grad[:, 7] == 0)  # the pad column's input is zero: its weight never moves


@pytest.mark.parametrize("impl", ["addmm", "fused_linear"])
def test_linear_act_under_bf16_autocast(impl):
    layer = LinearAct(6, 4, True, impl, generator=torch.Generator().manual_seed(0))
    x = torch.randn(5, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    ref = torch.relu(x.bfloat16().float() @ layer.weight.bfloat16().float().t() + layer.bias.bfloat16().float())
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


def test_mlp_implementations_start_from_the_same_function():
    dense, sparse = torch.rand(6, 13), torch.stack([torch.randint(0, n, (6,)) for n in SIZES], dim=1)
    models = [DLRM(SIZES, 4, [8, 4], [6, 1], seed=2, mlp=mlp) for mlp in ("torch", "addmm", "fused_linear")]
    ref = models[0](dense, sparse)
    for model in models[1:]:
        assert_close(model(dense, sparse), ref.double(), torch.float32, model.mlp_impl)


def test_dlrm_rejects_bad_options():
    with pytest.raises(ValueError, match="kernels"):
        DLRM(SIZES, 4, [8, 4], [6, 1], kernels="auto")
    with pytest.raises(ValueError, match="kernels"):  # the caller resolves "auto" for its device
        DLRM.from_config(load_config("tiny"), SIZES, kernels="auto")
    with pytest.raises(ValueError, match="pad_to"):
        DLRM(SIZES, 4, [8, 4], [6, 1], pad_to=0)
    with pytest.raises(ValueError, match="optimizer"):
        DLRM(SIZES, 4, [8, 4], [6, 1], optimizer="adam")
    with pytest.raises(ValueError, match="mlp"):
        DLRM(SIZES, 4, [8, 4], [6, 1], mlp="cublas")
    with pytest.raises(ValueError, match="pad_to"):
        InteractionArch(3, 4, "dot", pad_to=8)  # padding needs the fused interaction


@pytest.mark.usefixtures("fuselab_ops")
def test_fuselab_path_starts_from_the_torch_path_function():
    sizes = [7, 1, 130, 33, 5] + [3] * 21  # 26 features: interaction width 4 + 351 = 355, padded to 360
    ref = DLRM(sizes, 4, [8, 4], [6, 1], seed=5)
    ours = DLRM(sizes, 4, [8, 4], [6, 1], seed=5, kernels="fuselab", optimizer="rowwise_adagrad")
    assert torch.equal(ours.sparse_arch.weight, ref.sparse_arch.weight)
    assert ours.interaction_arch.width == 355 and ours.interaction_arch.out_features == 360
    linears = [m for m in ref.modules() if isinstance(m, torch.nn.Linear)]
    fused = [m for m in ours.modules() if isinstance(m, LinearAct)]
    assert len(linears) == len(fused) == 4
    for a, b in zip(linears, fused):
        assert torch.equal(b.weight[:, : a.in_features], a.weight) and torch.equal(b.bias, a.bias)
        assert torch.all(b.weight[:, a.in_features:] == 0)
    dense = torch.rand(5, 13)
    sparse = torch.stack([torch.randint(0, n, (5,)) for n in sizes], dim=1)
    with torch.no_grad():
        assert_close(ours(dense, sparse), ref(dense, sparse).double(), torch.float32, "fuselab vs torch path")


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
def test_seeded_init_follows_the_default_device(kernels):
    """Inside ``with torch.device(...)`` a seeded model draws its values on the CPU generator (no device clash) and
    lives on the context's device: every parameter and buffer there, as nn.Module layers are."""
    with torch.device("meta"):
        model = DLRM([3, 5, 7], 4, [8, 4], [6, 1], seed=3, kernels=kernels, interaction="dcn", dcn_num_layers=1,
                     dcn_low_rank=2)
    tensors = [*model.parameters(), *model.buffers()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
