"""Checkpoints of format 1 (a model per kernels path) read as format 2 (one state_dict): written here from a trained
format-2 model the way format 1 laid it out, converted by ``fuselab.dlrm.upgrade``, loaded into both paths."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from dlrm_models import tiny_model

from fuselab.dlrm.checkpoint import load_checkpoint, save_checkpoint
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.upgrade import upgrade_checkpoint

SIZES = [7, 1, 30, 9] + [2] * 22  # 26 features: top input 4 + 351 = 355, padded to 360


def _trained(optimizer: str, interaction: object = "dot"):
    model = tiny_model(SIZES, optimizer=optimizer, interaction=interaction)
    opts = Optimizers(model, lr_dense=0.05, lr_sparse=0.2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        sparse = torch.stack([torch.randint(0, n, (16,), generator=gen) for n in SIZES], dim=1)
        loss = F.binary_cross_entropy_with_logits(model(torch.rand(16, 13, generator=gen), sparse),
                                                  torch.rand(16, generator=gen).round())
        opts.zero_grad()
        loss.backward()
        opts.step()
    return model, opts


def _unpad(key: str, t: torch.Tensor) -> torch.Tensor:
    return t[:, :13] if key == "dense_arch.mlp.0.weight" else t[:, :355] if key == "over_arch.mlp.0.weight" else t


def _format1(model, opts, kernels: str, per_table: bool = False) -> dict:
    """The checkpoint format 1 wrote for this model trained on ``kernels``."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    dense_keys = [k for k in state if not k.startswith("sparse_arch.")]
    old = {}
    for key in dense_keys:
        new_key = key.replace("interaction_arch.", "interaction_arch.dcn.", 1) if "crossnet" in key else key
        if kernels == "torch":  # nn.Linear at even indices, unpadded
            new_key = re.sub(r"\.mlp\.(\d+)\.", lambda m: f".mlp.{2 * int(m.group(1))}.", new_key)
            old[new_key] = _unpad(key, state[key])
        else:
            old[new_key] = state[key]
    dense_state = [s.clone() for s in opts.dense_state]
    optimizers = {"optimizer": opts.optimizer.name, "lr_dense": 0.05, "lr_sparse": 0.2, "eps": 1e-8,
                  "dense": dense_state, "sparse": []}
    weight, table_state = state["sparse_arch.weight"], state["sparse_arch.state"]
    if kernels == "torch":
        optimizers["dense"] = [_unpad(k, s) for k, s in zip(dense_keys, dense_state)]
        if per_table:
            for t, part in enumerate(weight.split(SIZES)):
                old[f"sparse_arch.tables.{t}.weight"] = part
            optimizers["sparse"] = list(table_state.split(SIZES)) if table_state.numel() else []
        else:
            old["sparse_arch.weight"] = weight
            optimizers["sparse"] = [table_state] if table_state.numel() else []
    else:
        old.update({"sparse_arch.weight": weight, "sparse_arch.momentum": table_state,
                    "sparse_arch.grad_anchor": torch.empty(0)})
    return {"version": 1, "model": old, "optimizers": optimizers, "step": 2}


@pytest.mark.parametrize("kernels, per_table", [("torch", False), ("torch", True), ("fuselab", False)])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_format1_loads_into_both_paths(kernels, per_table, optimizer):
    model, opts = _trained(optimizer)
    upgraded = upgrade_checkpoint(_format1(model, opts, kernels, per_table))
    assert "sparse" not in upgraded["optimizers"] and "eps" not in upgraded["optimizers"]
    for target in ("torch", "fuselab"):
        fresh = tiny_model(SIZES, target, optimizer=optimizer, seed=11)
        fresh.load_state_dict(upgraded["model"])
        for key, value in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], value), (target, key)
        fresh_opts = Optimizers(fresh, lr_dense=1.0, lr_sparse=1.0)
        fresh_opts.load_state_dict(upgraded["optimizers"])
        for a, b in zip(fresh_opts.dense_state, opts.dense_state):
            assert torch.equal(a, b)


@pytest.mark.parametrize("kernels", ["torch", "fuselab"])
def test_format1_dcn_keeps_its_cross_layers(kernels, tmp_path):
    """Through the checkpoint files: the cross network's parameters (under ``interaction_arch.dcn.`` in format 1)
    arrive trained, not at their initial values."""
    model, opts = _trained("adagrad", {"kind": "dcn", "layers": 2, "low_rank": 3})
    path = save_checkpoint(tmp_path, 2, {k: v for k, v in _format1(model, opts, kernels).items() if k != "version"})
    state = load_checkpoint(path)
    fresh = tiny_model(SIZES, "torch", optimizer="adagrad", interaction={"kind": "dcn", "layers": 2, "low_rank": 3},
                       seed=4)
    fresh.load_state_dict(state["model"])
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_format2_passes_unchanged_and_a_tableless_format1_is_named():
    state = {"model": {"x": torch.zeros(1)}, "optimizers": {"optimizer": "sgd", "dense": []}}
    assert upgrade_checkpoint(state) is state
    with pytest.raises(ValueError, match="without embedding tables"):
        upgrade_checkpoint({"model": {"dense_arch.mlp.0.weight": torch.zeros(2, 13)},
                            "optimizers": {"optimizer": "sgd", "sparse": [], "dense": []}})
