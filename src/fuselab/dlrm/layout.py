"""Parameters of a DLRM in one layout for both kernel paths: the ``kernels="torch"`` state_dict.

The two paths hold the same function in different state_dicts: the torch path has ``nn.Linear`` modules at even
``mlp`` indices (``nn.ReLU`` between them: ``dense_arch.mlp.0/2/4/6``, ``over_arch.mlp.0/2/4``) with unpadded
weights, and the embedding tables as ``sparse_arch.weight`` [R, D] (``tables.{t}.weight`` in the per-table
layout); the fuselab path has :class:`~fuselab.dlrm.model.LinearAct` layers at consecutive indices, zero pad
columns in the first bottom and top layer, and the embedding collection's weight and optimizer state.
:func:`reference_state_dict` writes either model's parameters in the torch path's fused layout (what
``DLRM(kernels="torch")`` loads, and what export needs); :func:`load_reference_state_dict` loads such a dict into
either model (pad columns set to zero). Optimizer state is not part of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .config import DLRMConfig
from .model import DLRM, LinearAct


def _layers(model: DLRM) -> Iterator[tuple[str, nn.Module, int]]:
    """(reference key prefix, layer, unpadded in_features) of every MLP layer, bottom then top."""
    for name, arch in (("dense_arch", model.dense_arch), ("over_arch", model.over_arch)):
        layers = [m for m in arch.mlp if isinstance(m, (nn.Linear, LinearAct))]
        for k, layer in enumerate(layers):
            real_in = layer.in_features - layer.in_pad if isinstance(layer, LinearAct) else layer.in_features
            yield f"{name}.mlp.{2 * k}", layer, real_in


def _tables(model: DLRM) -> list[Tensor]:
    arch = model.sparse_arch
    return list(arch.tables.parameters()) if hasattr(arch, "tables") else [arch.weight]


@torch.no_grad()
def reference_state_dict(model: DLRM) -> dict[str, Tensor]:
    """``model``'s parameters (detached copies) under the keys and shapes of ``DLRM(kernels="torch")``'s state
    dict (fused embedding layout)."""
    state = {}
    for key, layer, real_in in _layers(model):
        state[f"{key}.weight"] = layer.weight[:, :real_in].detach().clone()
        state[f"{key}.bias"] = layer.bias.detach().clone()
    state["sparse_arch.weight"] = torch.cat([t.detach() for t in _tables(model)])
    return state


@torch.no_grad()
def load_reference_state_dict(model: DLRM, state: dict[str, Tensor]) -> None:
    """Copy a :func:`reference_state_dict` (or a torch path state_dict of the fused layout) into ``model`` of
    either path, in place. Raises ValueError naming a missing key or a shape that does not fit."""

    def get(key: str, shape: tuple[int, ...]) -> Tensor:
        if key not in state:
            raise ValueError(f"state has no {key!r}")
        if tuple(state[key].shape) != shape:
            raise ValueError(f"{key}: expected shape {shape}, got {tuple(state[key].shape)}")
        return state[key]

    for key, layer, real_in in _layers(model):
        layer.weight.zero_()
        layer.weight[:, :real_in].copy_(get(f"{key}.weight", (layer.weight.shape[0], real_in)))
        layer.bias.copy_(get(f"{key}.bias", tuple(layer.bias.shape)))
    tables = _tables(model)
    weight = get("sparse_arch.weight", (sum(t.shape[0] for t in tables), tables[0].shape[1]))
    for t, part in zip(tables, weight.split([t.shape[0] for t in tables])):
        t.copy_(part)


def torch_model_from_state(cfg: DLRMConfig, table_sizes: list[int], state: dict) -> DLRM:
    """The ``kernels="torch"`` model of a checkpoint's ``state`` (its ``model`` state_dict, and ``kernels``: the
    path it was trained on; a config's ``"auto"`` is read from the state_dict's keys when a checkpoint lacks it).
    A fuselab-trained model is rebuilt on its own path, then copied through :func:`reference_state_dict`."""
    kernels = state.get("kernels") or ("fuselab" if any(k.startswith("sparse_arch.state") or
                                                        k == "sparse_arch.grad_anchor" for k in state["model"])
                                       else "torch")
    trained = DLRM.from_config(cfg, table_sizes, kernels=kernels)
    trained.load_state_dict(state["model"])
    if kernels == "torch":
        return trained
    model = DLRM.from_config(cfg, table_sizes, kernels="torch")
    load_reference_state_dict(model, reference_state_dict(trained))
    return model
