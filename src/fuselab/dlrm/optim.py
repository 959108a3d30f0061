"""The optimizers of a DLRM: one for the MLPs, one for the embedding tables, each with its own learning rate.

``optimizer``:

* ``sgd``: plain SGD for both groups (the tables' gradients are sparse: only looked-up rows move);
* ``adagrad``: element-wise Adagrad for both groups (``torch.optim.Adagrad``, ``eps``);
* ``rowwise_adagrad``: row-wise Adagrad for the tables (one accumulator per row: the mean of the squared
  gradient over the row's D values; TorchRec's and FBGEMM's default), element-wise Adagrad for the MLPs.

This is the PyTorch reference implementation (``--kernels torch``); the fused embedding module applies the same
updates inside its backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .model import DLRM

__all__ = ["Optimizers", "RowWiseAdagrad"]


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad for 2-D weights with dense or sparse (COO) gradients.

    For each row ``r`` with gradient ``g_r`` (D values; duplicate rows of a sparse gradient are summed first):
    ``state_r += mean(g_r ** 2)``, ``w_r -= lr * g_r / (sqrt(state_r) + eps)``. Raises ``ValueError`` for a
    parameter that is not 2-D.
    """

    def __init__(self, params, lr: float, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "eps": eps})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"RowWiseAdagrad needs 2-D weights (rows of a table), got {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
                acc = state["sum"]
                grad = p.grad
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()
                    acc.index_add_(0, rows, values.float().pow(2).mean(1))
                    scale = acc[rows].sqrt_().add_(eps).reciprocal_().mul_(-lr)
                    p.index_add_(0, rows, (values * scale[:, None]).to(p.dtype))
                else:
                    acc.add_(grad.float().pow(2).mean(1))
                    p.add_((grad * (acc.sqrt() + eps).reciprocal()[:, None] * -lr).to(p.dtype))
        return None


class Optimizers:
    """The MLPs' optimizer (``lr_dense``) and the tables' (``lr_sparse``) as one object.

    Raises ``ValueError`` for an unknown ``optimizer`` or a negative rate.
    """

    def __init__(self, model: DLRM, *, optimizer: str, lr_dense: float, lr_sparse: float, eps: float = 1e-8):
        if optimizer not in ("sgd", "adagrad", "rowwise_adagrad"):
            raise ValueError(f"optimizer must be sgd, adagrad or rowwise_adagrad, got {optimizer!r}")
        if lr_dense < 0 or lr_sparse < 0:
            raise ValueError(f"learning rates must be >= 0, got lr_dense={lr_dense}, lr_sparse={lr_sparse}")
        self.kind = optimizer
        dense: list[nn.Parameter] = model.dense_parameters()
        tables: list[nn.Parameter] = model.embedding_parameters()
        if optimizer == "sgd":
            self.dense = torch.optim.SGD(dense, lr=lr_dense)
            self.sparse = torch.optim.SGD(tables, lr=lr_sparse)
        else:
            self.dense = torch.optim.Adagrad(dense, lr=lr_dense, eps=eps)
            self.sparse = (RowWiseAdagrad(tables, lr=lr_sparse, eps=eps) if optimizer == "rowwise_adagrad"
                           else torch.optim.Adagrad(tables, lr=lr_sparse, eps=eps))
        self.all = (self.dense, self.sparse)

    def set_lr(self, dense: float, sparse: float) -> None:
        """Set both groups' learning rates (called before every step by the schedule)."""
        for opt, lr in ((self.dense, dense), (self.sparse, sparse)):
            for group in opt.param_groups:
                group["lr"] = lr

    def step(self) -> None:
        for opt in self.all:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.all:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.kind, "dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ``ValueError`` when it belongs to another optimizer kind."""
        kind = state.get("optimizer", self.kind)
        if kind != self.kind:
            raise ValueError(f"optimizer state is {kind!r}, this run uses {self.kind!r}")
        self.dense.load_state_dict(state["dense"])
        self.sparse.load_state_dict(state["sparse"])
