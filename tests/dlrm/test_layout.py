"""fuselab.dlrm.layout: one state_dict layout (the torch path's) for both kernel paths."""

from __future__ import annotations

import pytest
import torch
from dlrm_fake_ops import fuselab_ops  # noqa: F401  (a fixture)

from fuselab.dlrm.layout import load_reference_state_dict, reference_state_dict
from fuselab.dlrm.model import DLRM
from fuselab.testing import assert_close

SIZES = [7, 1, 30, 9] + [2] * 22  # 26 features: top input 4 + 351 = 355, padded to 360 on the fuselab path


def _inputs():
    gen = torch.Generator().manual_seed(0)
    sparse = torch.stack([torch.randint(0, n, (6,), generator=gen) for n in SIZES], dim=1)
    return torch.rand(6, 13, generator=gen), sparse


def test_reference_state_dict_of_the_torch_path_is_its_state_dict():
    model = DLRM(SIZES, 4, [8, 4], [6, 1], seed=1)
    ref, own = reference_state_dict(model), model.state_dict()
    assert ref.keys() == own.keys()
    for key in ref:
        assert torch.equal(ref[key], own[key]), key


@pytest.mark.parametrize("layout", ["fused", "per_table"])
def test_torch_layouts_load_each_other(layout):
    a = DLRM(SIZES, 4, [8, 4], [6, 1], seed=1)
    b = DLRM(SIZES, 4, [8, 4], [6, 1], seed=2, embedding_layout=layout, mlp="addmm")
    load_reference_state_dict(b, reference_state_dict(a))
    with torch.no_grad():
        assert_close(b(*_inputs()), a(*_inputs()).double(), torch.float32, layout)
    for key, value in reference_state_dict(b).items():
        assert torch.equal(value, a.state_dict()[key]), key


@pytest.mark.usefixtures("fuselab_ops")
def test_fuselab_path_round_trip():
    a = DLRM(SIZES, 4, [8, 4], [6, 1], seed=1)
    b = DLRM(SIZES, 4, [8, 4], [6, 1], seed=2, kernels="fuselab", optimizer="rowwise_adagrad")
    load_reference_state_dict(b, reference_state_dict(a))
    first_top = b.over_arch.mlp[0]
    assert first_top.weight.shape == (6, 360) and torch.all(first_top.weight[:, 355:] == 0)
    with torch.no_grad():
        assert_close(b(*_inputs()), a(*_inputs()).double(), torch.float32, "fuselab path from torch weights")
    c = DLRM(SIZES, 4, [8, 4], [6, 1], seed=3)
    load_reference_state_dict(c, reference_state_dict(b))
    for key, value in c.state_dict().items():
        assert torch.equal(value, a.state_dict()[key]), key


def test_bad_state_is_named():
    model = DLRM(SIZES, 4, [8, 4], [6, 1])
    state = reference_state_dict(model)
    del state["over_arch.mlp.2.bias"]
    with pytest.raises(ValueError, match=r"over_arch\.mlp\.2\.bias"):
        load_reference_state_dict(model, state)
    state = reference_state_dict(model)
    state["sparse_arch.weight"] = state["sparse_arch.weight"][1:]
    with pytest.raises(ValueError, match=r"sparse_arch\.weight: expected shape"):
        load_reference_state_dict(model, state)
