"""Checkpoints of format 1 read as format 2, the one ``state_dict`` of both kernel paths.

Format 1 (told by its optimizer state's ``"sparse"`` entry) kept a model per kernels path:

* ``kernels="torch"``: each MLP an ``nn.Sequential`` of ``nn.Linear`` at even indices (``nn.ReLU`` between:
  ``dense_arch.mlp.0/2/4``) with unpadded weights; the tables ``sparse_arch.weight`` (or
  ``sparse_arch.tables.{t}.weight``, one per table); their optimizer state in ``optimizers["sparse"]``;
* ``kernels="fuselab"``: MLP layers at consecutive indices, the first layer of each MLP padded to a multiple of 8
  input columns; ``sparse_arch.momentum`` and ``sparse_arch.grad_anchor``;
* both: the DCN interaction's parameters under ``interaction_arch.dcn.``; ``optimizers["eps"]``.

Format 2: consecutive MLP indices, each MLP's first layer padded to a multiple of
:data:`~fuselab.nn.mlp.INPUT_ALIGN` (zero columns), ``sparse_arch.weight`` / ``state`` / ``grad_anchor``,
``interaction_arch.crossnet.``; the dense optimizer state padded as its parameters. The config inside reads through
:func:`fuselab.dlrm.config.config_from_dict` (older spellings included).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F

from fuselab.core.embedding_optimizer import embedding_optimizer
from fuselab.nn.mlp import INPUT_ALIGN

__all__ = ["upgrade_checkpoint"]

_MLP_KEY = re.compile(r"^(dense_arch|over_arch)\.mlp\.(\d+)\.(weight|bias)$")


def _mlp_key(key: str, index_of: dict[tuple[str, int], int]) -> str:
    """The format-2 name of a format-1 MLP key (layers renumbered 0, 1, 2, ... in order)."""
    match = _MLP_KEY.match(key)
    if match is None:
        return key.replace("interaction_arch.dcn.", "interaction_arch.", 1)
    arch, index, what = match.group(1), int(match.group(2)), match.group(3)
    return f"{arch}.mlp.{index_of[arch, index]}.{what}"


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """A first layer's weight (or its Adagrad state) with zero columns up to a multiple of INPUT_ALIGN."""
    return F.pad(t, (0, -t.shape[1] % INPUT_ALIGN))


def _tables(model: dict[str, Any], optimizers: dict[str, Any], optimizer: str) -> dict[str, torch.Tensor]:
    """``sparse_arch.weight`` / ``state`` / ``grad_anchor`` of a format-1 model state."""
    per_table = sorted((k for k in model if k.startswith("sparse_arch.tables.")), key=lambda k: int(k.split(".")[2]))
    weight = torch.cat([model[k] for k in per_table]) if per_table else model["sparse_arch.weight"]
    if "sparse_arch.momentum" in model:
        state = model["sparse_arch.momentum"]
    elif optimizers.get("sparse"):
        state = torch.cat(list(optimizers["sparse"]))  # one per table in the per-table layout, in table order
    else:
        state = weight.new_zeros(embedding_optimizer(optimizer).state_shape(*weight.shape))
    return {"sparse_arch.weight": weight, "sparse_arch.state": state,
            "sparse_arch.grad_anchor": model.get("sparse_arch.grad_anchor", weight.new_empty(0))}


def upgrade_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """A loaded checkpoint (``model``, ``optimizers``, ...) in format 2: format 1 converted (module docstring),
    format 2 returned as it is. Raises ValueError for a format-1 state it cannot read (a missing table)."""
    optimizers = state.get("optimizers")
    if not isinstance(optimizers, dict) or "sparse" not in optimizers:
        return state
    old = state["model"]
    if not any(k.startswith("sparse_arch.") for k in old):
        raise ValueError("checkpoint of format 1 without embedding tables (sparse_arch.*): cannot convert it")
    indices: dict[str, list[int]] = {}
    for key in old:
        match = _MLP_KEY.match(key)
        if match is not None:
            indices.setdefault(match.group(1), []).append(int(match.group(2)))
    index_of = {(arch, i): n for arch, found in indices.items() for n, i in enumerate(sorted(set(found)))}
    dense_keys = [k for k in old if not k.startswith("sparse_arch.")]  # the dense parameters, in their order
    model = {_mlp_key(k, index_of): old[k] for k in dense_keys}
    first = {f"{arch}.mlp.0.weight" for arch in indices}
    for key in first:
        model[key] = _aligned(model[key])
    model.update(_tables(old, optimizers, optimizers["optimizer"]))
    dense_state = [_aligned(s) if _mlp_key(k, index_of) in first else s
                   for k, s in zip(dense_keys, optimizers.get("dense", []))]
    new_optimizers = {"optimizer": optimizers["optimizer"], "lr_dense": optimizers["lr_dense"],
                      "lr_sparse": optimizers["lr_sparse"], "dense": dense_state}
    return {**state, "model": model, "optimizers": new_optimizers}
