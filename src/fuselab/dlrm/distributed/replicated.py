"""Tables that every rank holds whole (data-parallel): :class:`ReplicatedTables`.

Small tables cost less to replicate than to shard (:func:`.plan.replicates`): each rank looks up its own samples,
nothing is exchanged in the forward, and the backward all-reduces the tables' gradient (one fp32 ``all_reduce`` of
``(R, D)``, R the replicated rows) before the optimizer's update, so every replica takes the same step.

The gradient of each row is summed from the pooled gradients by the fused update kernel itself: an SGD step of
learning rate -1 on a zeroed ``(R, D)`` buffer leaves there exactly the sum of each row's gradients, reduced in a
fixed order (deterministic) and without host synchronization (capturable in a CUDA graph), where torch's dense
embedding backward reads a count back to the host. The optimizer's dense update then runs on every row: every
embedding optimizer of :mod:`fuselab.core.embedding_optimizer` leaves a row with a zero gradient (and its state)
unchanged, so it equals the sparse update of the rows the global batch touched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, SGD, EmbeddingOptimizer
from fuselab.ops.embedding import embedding_bag_lookup, embedding_bag_update_

from ..bags import FixedBags
from ..sparse import TableSpec
from .local import init_rows

__all__ = ["ReplicatedTables"]

#: the summing step: w -= lr * g with lr = -1 on a zeroed buffer
_SUM = SGD()


class _ReplicatedLookup(torch.autograd.Function):
    """The fused lookup attached to autograd through ``anchor``; backward: :meth:`ReplicatedTables.apply_gradient`
    (no input gets a gradient)."""

    @staticmethod
    def forward(ctx, anchor: Tensor, ids: Tensor, offsets: Tensor | None, module: ReplicatedTables) -> Tensor:
        ctx.module, ctx.index = module, (ids, offsets)
        return embedding_bag_lookup(module.weight, ids, module.table_sizes, module.row_offsets, offsets,
                                    pooling=module.pooling)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.module.apply_gradient(grad, *ctx.index)
        return None, None, None, None


class ReplicatedTables(nn.Module):
    """The replicated tables (``spec``: their sizes, dim, pooling, fixed bag sizes), fp32 rows from
    :func:`.local.init_rows` (``seed`` and each table's index ``tables[k]`` in the whole model: the values a sharded
    copy holds).

    ``forward(ids (B, F_r))`` raw ids (``id mod n_k`` picks the row) / ``(B, S_r)`` fixed bags / ``(N,) + offsets
    (B*F_r + 1,)`` -> ``(B, F_r, D)`` fp32. Backward: the rows' gradient summed over this rank's samples, then over
    the ranks of ``group`` (when it has several), times ``grad_scale``, then ``optimizer.update_`` on every row.
    Raises ValueError when ``tables`` does not name one table per spec table.
    """

    capturable = True

    def __init__(self, spec: TableSpec, tables: list[int], *, seed: int, group=None, grad_scale: float = 1.0,
                 optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01,
                 device: torch.device | str | None = None):
        super().__init__()
        if len(tables) != spec.num_features:
            raise ValueError(f"{len(tables)} table indices for {spec.num_features} tables")
        self.spec, self.tables, self.optimizer = spec, list(tables), optimizer
        self.dim, self.pooling, self.group, self.grad_scale = spec.dim, spec.pooling, group, float(grad_scale)
        starts = torch.tensor([0, *spec.sizes], dtype=torch.int64).cumsum(0)
        weight = torch.cat([init_rows(seed, t, n, 0, n, spec.dim, device=device) for t, n in zip(tables, spec.sizes)])
        self.register_buffer("weight", weight)
        self.register_buffer("state", torch.zeros(optimizer.state_shape(*weight.shape), device=weight.device))
        self.register_buffer("row_offsets", starts[:-1].to(weight.device), persistent=False)
        self.register_buffer("table_sizes", torch.tensor(spec.sizes, device=weight.device), persistent=False)
        self.register_buffer("lr", torch.tensor(float(lr), device=weight.device), persistent=False)
        self.register_buffer("_gradient", torch.zeros_like(weight), persistent=False)
        self.register_buffer("_minus_one", torch.tensor(-1.0, device=weight.device), persistent=False)
        self.register_buffer("_no_state", torch.zeros(0, device=weight.device), persistent=False)
        self.bags = None if spec.multi_hot_sizes is None else FixedBags(spec.multi_hot_sizes).to(weight.device)
        self.grad_anchor = nn.Parameter(torch.empty(0, device=weight.device))

    def set_lr(self, value: float) -> None:
        self.lr.fill_(value)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        if offsets is None and self.bags is not None:
            ids, offsets = self.bags(ids)
        if self.training and torch.is_grad_enabled():
            return _ReplicatedLookup.apply(self.grad_anchor, ids, offsets, self)
        return embedding_bag_lookup(self.weight, ids, self.table_sizes, self.row_offsets, offsets,
                                    pooling=self.pooling)

    @torch.no_grad()
    def apply_gradient(self, grad: Tensor, ids: Tensor, offsets: Tensor | None) -> None:
        """One update from the pooled gradient ``grad`` (B, F_r, D) of the lookup of ``ids`` / ``offsets``."""
        total = self._gradient
        total.zero_()
        embedding_bag_update_(total, self._no_state, self._minus_one, grad.float().contiguous(), ids,
                              self.table_sizes, self.row_offsets, offsets, pooling=self.pooling, optimizer=_SUM)
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(total, group=self.group)
        if self.grad_scale != 1.0:
            total.mul_(self.grad_scale)
        self.optimizer.update_(self.weight, self.state, total, self.lr)

    def table_states(self) -> list[tuple[int, Tensor, Tensor | None]]:
        """(table index in the whole model, weight rows (n, D), optimizer state rows or None) of each table: views
        into this module's storage."""
        out = []
        for t, n, start in zip(self.tables, self.spec.sizes, self.row_offsets.tolist()):
            state = self.state[start: start + n] if self.state.numel() else None
            out.append((t, self.weight[start: start + n], state))
        return out

    def extra_repr(self) -> str:
        return f"tables={self.tables}, rows={self.weight.shape[0]}, dim={self.dim}, optimizer={self.optimizer}"
