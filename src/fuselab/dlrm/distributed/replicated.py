"""Tables that every rank holds whole (data-parallel): :class:`ReplicatedTables`.

Small tables cost less to replicate than to shard (:func:`.plan.replicates`): each rank looks up its own samples,
nothing is exchanged in the forward, and the backward all-reduces the tables' dense gradient (one fp32 ``all_reduce``
of ``(R, D)``, R the replicated rows) before the optimizer's update, so every replica takes the same step. Every
embedding optimizer of :mod:`fuselab.core.embedding_optimizer` leaves a row with a zero gradient (and its state)
unchanged, so this dense update equals the sparse update of the rows the global batch touched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer

from ..sparse import TableSpec, TorchEmbeddingCollection
from .local import init_rows

__all__ = ["ReplicatedTables"]


class ReplicatedTables(TorchEmbeddingCollection):
    """The replicated tables (``spec``: their sizes, dim, pooling, bag sizes), rows from :func:`.local.init_rows`
    (``seed`` and each table's index ``tables[k]`` in the whole model: the values a sharded copy would hold).

    ``forward(rows (B, F_r))`` / ``(B, S_r)`` fixed bags / ``(N,) + offsets`` -> ``(B, F_r, D)``, rows in
    ``[0, n_k)``. Backward: the dense gradient, summed over the ranks of ``group`` (when it has several), times
    ``grad_scale``, then ``optimizer.update_`` on every row. No host synchronization: capturable in a CUDA graph.
    """

    capturable = True

    def __init__(self, spec: TableSpec, tables: list[int], *, seed: int, group=None, grad_scale: float = 1.0,
                 optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01,
                 device: torch.device | str | None = None):
        super().__init__(spec, optimizer=optimizer, lr=lr, sparse_grad=False, device=device)
        if len(tables) != spec.num_features:
            raise ValueError(f"{len(tables)} table indices for {spec.num_features} tables")
        self.tables, self.group, self.grad_scale = list(tables), group, float(grad_scale)
        with torch.no_grad():
            for t, n, start in zip(self.tables, spec.sizes, self.row_offsets.tolist()):
                self.weight[start: start + n] = init_rows(seed, t, n, 0, n, spec.dim, device=self.weight.device)

    @torch.no_grad()
    def apply_gradient(self, grad: Tensor) -> None:
        """The update from this rank's dense ``(R, D)`` gradient, after the sum over the ranks."""
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(grad, group=self.group)
        if self.grad_scale != 1.0:
            grad.mul_(self.grad_scale)
        super().apply_gradient(grad)

    def table_states(self) -> list[tuple[int, Tensor, Tensor | None]]:
        """(table index in the whole model, weight rows (n, D), optimizer state rows or None) of each table: views
        into this module's storage."""
        out = []
        for t, n, start in zip(self.tables, self.spec.sizes, self.row_offsets.tolist()):
            state = self.state[start: start + n] if self.state.numel() else None
            out.append((t, self.weight[start: start + n], state))
        return out
