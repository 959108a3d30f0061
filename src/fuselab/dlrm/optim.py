"""The DLRM's optimizers: one object for the MLP parameters and the embedding tables.

* **Dense (MLP) parameters**: SGD or element-wise Adagrad written with ``torch._foreach_*`` ops, the learning rate
  a 0-dim fp32 tensor on the parameters' device. No host synchronization and no CPU step counter, so the step can
  be captured in a CUDA graph, and :meth:`Optimizers.set_lr` (an in-place ``fill_``) reaches a captured graph
  without recapture. ``rowwise_adagrad`` is element-wise Adagrad for the MLPs (as torchrec does for dense
  parameters: row-wise state only pays off for embedding rows).
* **Embeddings, ``kernels="torch"``**: ``sparse=True`` COO gradients, coalesced (duplicate ids summed), then
  SGD ``w -= lr g``, Adagrad ``s += g²; w -= lr g / (sqrt(s) + eps)`` per element, or row-wise Adagrad
  ``s_row += mean_D(g²); w -= lr g / (sqrt(s_row) + eps)`` on the touched rows only (torch ops; ``coalesce``
  synchronizes with the host, so this path is not graph-capturable). A dense gradient (``sparse_grad=False``)
  gets the same update on every row.
* **Embeddings, ``kernels="fuselab"``** (or any model with ``embedding_update_in_backward = True``, such as the
  hybrid-parallel :class:`fuselab.dlrm.distributed.DistributedDLRM`): the update is applied in the embedding
  collection's backward; this class only sets its learning rate (``model.sparse_arch.set_lr``). Its optimizer state
  is in the model's state_dict.

Adagrad state starts at zero (``initial_accumulator_value=0``) and the update matches ``torch.optim.Adagrad``
with ``lr_decay=0``, ``weight_decay=0``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")


def _check_lr(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class Optimizers:
    """Updates every parameter of a :class:`fuselab.dlrm.model.DLRM` (build it after moving the model to its
    device): ``zero_grad()`` (grads to None), forward/backward, ``step()``.

    Raises ValueError for an unknown ``optimizer``, a negative or non-finite learning rate, ``eps <= 0``, or a
    fuselab-path model whose embedding collection was built for another optimizer.
    """

    def __init__(self, model: nn.Module, *, optimizer: str, lr_dense: float, lr_sparse: float, eps: float = 1e-8):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if not (float(eps) > 0 and math.isfinite(float(eps))):
            raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
        self.optimizer, self.eps = optimizer, float(eps)
        self.fused = getattr(model, "embedding_update_in_backward", getattr(model, "kernels", "torch") == "fuselab")
        if self.fused and getattr(model, "optimizer", optimizer) != optimizer:
            raise ValueError(f"optimizer={optimizer!r}, but the model's fused embedding update was built for "
                             f"{model.optimizer!r}")
        self.model = model
        self.dense_params: list[Tensor] = list(model.dense_parameters())
        self.sparse_params: list[Tensor] = [] if self.fused else list(model.embedding_parameters())
        dense_device = self.dense_params[0].device if self.dense_params else torch.device("cpu")
        sparse_device = self.sparse_params[0].device if self.sparse_params else dense_device
        self._lr = {"dense": _check_lr("lr_dense", lr_dense), "sparse": _check_lr("lr_sparse", lr_sparse)}
        self.lr_dense = torch.tensor(self._lr["dense"], dtype=torch.float32, device=dense_device)
        self.lr_sparse = torch.tensor(self._lr["sparse"], dtype=torch.float32, device=sparse_device)
        adagrad = optimizer != "sgd"
        self.dense_state = [torch.zeros_like(p) for p in self.dense_params] if adagrad else []
        self.sparse_state: list[Tensor] = []
        if adagrad:
            rowwise = optimizer == "rowwise_adagrad"
            self.sparse_state = [p.new_zeros(p.shape[0]) if rowwise else torch.zeros_like(p)
                                 for p in self.sparse_params]
        if self.fused:
            model.sparse_arch.set_lr(self._lr["sparse"])

    def set_lr(self, dense: float, sparse: float) -> None:
        """New learning rates, written in place into the device tensors (a captured step sees them)."""
        self._lr = {"dense": _check_lr("lr_dense", dense), "sparse": _check_lr("lr_sparse", sparse)}
        self.lr_dense.fill_(self._lr["dense"])
        self.lr_sparse.fill_(self._lr["sparse"])
        if self.fused:
            self.model.sparse_arch.set_lr(self._lr["sparse"])

    @property
    def lr(self) -> dict[str, float]:
        """The learning rates last set: ``{"dense": ..., "sparse": ...}`` (host copies, no synchronization)."""
        return dict(self._lr)

    @torch.no_grad()
    def dense_step(self) -> None:
        """Update the MLP parameters that have a gradient (foreach ops, tensor learning rate, no host sync)."""
        have = [k for k, p in enumerate(self.dense_params) if p.grad is not None]
        if not have:
            return
        params = [self.dense_params[k] for k in have]
        grads = [self.dense_params[k].grad for k in have]
        if self.optimizer == "sgd":
            update = torch._foreach_mul(grads, self.lr_dense)
        else:
            state = [self.dense_state[k] for k in have]
            torch._foreach_addcmul_(state, grads, grads)
            std = torch._foreach_sqrt(state)
            torch._foreach_add_(std, self.eps)
            update = torch._foreach_div(grads, std)
            torch._foreach_mul_(update, self.lr_dense)
        torch._foreach_sub_(params, update)

    @torch.no_grad()
    def sparse_step(self) -> None:
        """Update the torch path's embedding tables from their (sparse) gradients; nothing on the fuselab path."""
        for k, weight in enumerate(self.sparse_params):
            grad = weight.grad
            if grad is None:
                continue
            if grad.is_sparse:
                grad = grad.coalesce()  # duplicate ids summed (sort-based, deterministic)
                rows, values = grad.indices()[0], grad.values()
            else:
                rows, values = None, grad
            self._update_rows(weight, rows, values, self.sparse_state[k] if self.sparse_state else None)

    def _update_rows(self, weight: Tensor, rows: Tensor | None, values: Tensor, state: Tensor | None) -> None:
        """weight[rows] -= lr * values / (sqrt(state[rows]) + eps) after ``state[rows] += values²`` (row mean for
        row-wise); rows None means every row (values is then a dense gradient)."""
        neg_lr = -self.lr_sparse
        if self.optimizer == "sgd":
            step = values * neg_lr
        else:
            square = values * values
            if self.optimizer == "rowwise_adagrad":
                square = square.mean(1)
            if rows is None:
                state.add_(square)
                std = state.sqrt().add_(self.eps)
            else:
                state.index_add_(0, rows, square)
                std = state.index_select(0, rows).sqrt_().add_(self.eps)
            if self.optimizer == "rowwise_adagrad":
                std = std.unsqueeze(1)
            step = values / std * neg_lr
        if rows is None:
            weight.add_(step)
        else:
            weight.index_add_(0, rows, step)

    def step(self) -> None:
        """One update of every parameter that has a gradient (the fuselab embeddings updated in backward)."""
        self.dense_step()
        self.sparse_step()

    def zero_grad(self) -> None:
        """Set every gradient to None."""
        for p in (*self.dense_params, *self.sparse_params):
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """Optimizer name, learning rates, eps and the state tensors (references; the fuselab path's embedding
        state is in the model's state_dict)."""
        return {"optimizer": self.optimizer, "lr_dense": self._lr["dense"], "lr_sparse": self._lr["sparse"],
                "eps": self.eps, "dense": list(self.dense_state), "sparse": list(self.sparse_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy a :meth:`state_dict` into this object's tensors in place (a captured step keeps working).
        Raises ValueError when the optimizer or the state's shapes differ."""
        if state.get("optimizer") != self.optimizer:
            raise ValueError(f"optimizer state is for {state.get('optimizer')!r}, this is {self.optimizer!r}")
        for key, mine in (("dense", self.dense_state), ("sparse", self.sparse_state)):
            theirs = state.get(key, [])
            if len(theirs) != len(mine) or any(a.shape != b.shape for a, b in zip(mine, theirs)):
                raise ValueError(f"optimizer state {key!r} does not match this model's parameters")
            for a, b in zip(mine, theirs):
                a.copy_(b)
        self.set_lr(state["lr_dense"], state["lr_sparse"])
