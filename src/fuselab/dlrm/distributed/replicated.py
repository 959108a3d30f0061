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
from torch import Tensor

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, SGD, EmbeddingOptimizer
from fuselab.ops.embedding import embedding_bag_lookup, embedding_bag_update_

from ..sparse import FusedEmbeddingCollection, TableSpec
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
                                    pooling=module.pooling, config=module.config)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.module.apply_gradient(grad, *ctx.index)
        return None, None, None, None


class ReplicatedTables(FusedEmbeddingCollection):
    """The replicated tables (``spec``: their sizes, dim, pooling, fixed bag sizes; fp32), the fused collection's
    buffers and lookup, rows from :func:`.local.init_rows` (``seed`` and each table's index ``tables[k]`` in the
    whole model: the values a sharded copy holds).

    ``forward(ids (B, F_r))`` raw ids (``id mod n_k`` picks the row) / ``(B, S_r)`` fixed bags / ``(N,) + offsets
    (B*F_r + 1,)`` -> ``(B, F_r, D)`` fp32. Backward (instead of the fused collection's update): the rows' gradient
    summed over this rank's samples, then over the ranks of ``group`` (when it has several), times ``grad_scale``,
    then ``optimizer.update_`` on every row. Raises ValueError when ``tables`` does not name one table per spec
    table, and as :class:`~fuselab.dlrm.sparse.FusedEmbeddingCollection`.
    """

    def __init__(self, spec: TableSpec, tables: list[int], *, seed: int, group=None, grad_scale: float = 1.0,
                 optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01,
                 device: torch.device | str | None = None):
        if len(tables) != spec.num_features:
            raise ValueError(f"{len(tables)} table indices for {spec.num_features} tables")
        # a generator of its own: the draw is overwritten below and must not move the global one
        super().__init__(spec, optimizer=optimizer, lr=lr, generator=torch.Generator(), device=device)
        self.tables, self.group, self.grad_scale = list(tables), group, float(grad_scale)
        device = self.weight.device
        with torch.no_grad():
            for t, n, start in zip(self.tables, spec.sizes, self.row_offsets.tolist()):
                init_rows(seed, t, n, 0, n, spec.dim, out=self.weight[start: start + n])
        self.register_buffer("_gradient", torch.zeros_like(self.weight), persistent=False)
        self.register_buffer("_minus_one", torch.tensor(-1.0, device=device), persistent=False)
        self.register_buffer("_no_state", torch.zeros(0, device=device), persistent=False)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return super().forward(ids, offsets)  # the lookup alone
        if offsets is None and self.bags is not None:
            ids, offsets = self.bags(ids)
        return _ReplicatedLookup.apply(self.grad_anchor, ids, offsets, self)

    @torch.no_grad()
    def apply_gradient(self, grad: Tensor, ids: Tensor, offsets: Tensor | None) -> None:
        """One update from the pooled gradient ``grad`` (B, F_r, D) of the lookup of ``ids`` / ``offsets``."""
        total = self._gradient
        total.zero_()
        embedding_bag_update_(total, self._no_state, self._minus_one, grad.float().contiguous(), ids, self.table_sizes,
                              self.row_offsets, offsets, pooling=self.pooling, optimizer=_SUM, config=self.config)
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
