"""The DLRM's optimizers: the dense (MLP) update, and the learning rates of both parts.

* **Embedding tables**: their optimizer lives with them (:mod:`fuselab.dlrm.sparse`, the sharded collection of
  :mod:`fuselab.dlrm.distributed`): it is applied in the lookup's backward, and its state is in the model's
  ``state_dict``. This class sets its learning rate (``model.sparse_arch.set_lr``).
* **Dense (MLP) parameters**: the element-wise rule of the model's
  :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer` (SGD; Adagrad, also for row-wise Adagrad: row-wise
  state only pays off for embedding rows, as torchrec does), written with ``torch._foreach_*`` ops, the learning
  rate a 0-dim fp32 tensor on the parameters' device. No host synchronization and no CPU step counter, so the step
  can be captured in a CUDA graph, and :meth:`Optimizers.set_lr` (an in-place ``fill_``) reaches a captured graph
  without recapture.

Adagrad state starts at zero (``initial_accumulator_value=0``) and the update matches ``torch.optim.Adagrad``
with ``lr_decay=0``, ``weight_decay=0``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import EmbeddingOptimizer


def _check_lr(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class Optimizers:
    """Updates every dense parameter of a DLRM (:class:`fuselab.dlrm.model.DLRM`, or the hybrid-parallel
    :class:`fuselab.dlrm.distributed.DistributedDLRM`; build it after moving the model to its device) and sets both
    learning rates: ``zero_grad()`` (grads to None), forward/backward (the tables update themselves), ``step()``.

    The optimizer is the model's (``model.optimizer``, its tables'). Raises ValueError for a negative or non-finite
    learning rate, TypeError for a model without an embedding optimizer.
    """

    def __init__(self, model: nn.Module, *, lr_dense: float, lr_sparse: float):
        optimizer = getattr(model, "optimizer", None)
        if not isinstance(optimizer, EmbeddingOptimizer):
            raise TypeError(f"model has no tables with an EmbeddingOptimizer (model.optimizer is {optimizer!r})")
        self.optimizer: EmbeddingOptimizer = optimizer
        self.model = model
        self.dense_params: list[Tensor] = list(model.dense_parameters())
        dense_device = self.dense_params[0].device if self.dense_params else torch.device("cpu")
        self._lr = {"dense": _check_lr("lr_dense", lr_dense), "sparse": _check_lr("lr_sparse", lr_sparse)}
        self.lr_dense = torch.tensor(self._lr["dense"], dtype=torch.float32, device=dense_device)
        self.dense_state: list[Tensor] = optimizer.dense_states(self.dense_params)
        model.sparse_arch.set_lr(self._lr["sparse"])

    def set_lr(self, dense: float, sparse: float) -> None:
        """New learning rates, written in place into the device tensors (a captured step sees them)."""
        self._lr = {"dense": _check_lr("lr_dense", dense), "sparse": _check_lr("lr_sparse", sparse)}
        self.lr_dense.fill_(self._lr["dense"])
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
        states = [self.dense_state[k] for k in have] if self.dense_state else []
        self.optimizer.dense_update_(params, grads, states, self.lr_dense)

    def step(self) -> None:
        """One update of every dense parameter that has a gradient (the tables updated in the backward)."""
        self.dense_step()

    def zero_grad(self) -> None:
        """Set every dense gradient to None."""
        for p in self.dense_params:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """Optimizer name, learning rates and the dense state tensors (references; the tables' state is in the
        model's state_dict)."""
        return {"optimizer": self.optimizer.name, "lr_dense": self._lr["dense"], "lr_sparse": self._lr["sparse"],
                "dense": list(self.dense_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy a :meth:`state_dict` into this object's tensors in place (a captured step keeps working).
        Raises ValueError when the optimizer or the state's shapes differ."""
        if state.get("optimizer") != self.optimizer.name:
            raise ValueError(f"optimizer state is for {state.get('optimizer')!r}, this is {self.optimizer.name!r}")
        theirs = state.get("dense", [])
        if len(theirs) != len(self.dense_state) or any(a.shape != b.shape for a, b in zip(self.dense_state, theirs)):
            raise ValueError("optimizer state 'dense' does not match this model's parameters")
        for a, b in zip(self.dense_state, theirs):
            a.copy_(b)
        self.set_lr(state["lr_dense"], state["lr_sparse"])
