"""The DLRM's sparse arch: F embedding tables in one ``(R, D)`` weight, pooled lookups, and the tables' optimizer
applied in the lookup's backward (FBGEMM's trick: no gradient of the tables outlives the backward).

Shapes: ``B`` batch, ``F`` tables (= sparse features), ``D`` embedding dim, ``R`` rows of all tables, ``S`` ids per
sample of fixed-size bags, ``N`` ids of CSR bags.

Two implementations of one part, with one ``state_dict``: ``weight`` (R, D) fp32 (table ``t`` = rows
``[row_offsets[t], row_offsets[t] + n_t)``), ``state`` (the optimizer's, ``optimizer.state_shape(R, D)``) and
``grad_anchor`` (an empty parameter through which autograd reaches the update):

* :class:`TorchEmbeddingCollection` (``kernels="torch"``, and the torch shards of the distributed DLRM): torch's own
  lookup (``F.embedding``, ``F.embedding_bag``) and sparse gradient, coalesced (duplicate rows summed), then the
  optimizer's reference update (:meth:`fuselab.core.embedding_optimizer.EmbeddingOptimizer.update_`). ``coalesce``
  synchronizes with the host: not capturable in a CUDA graph.
* :class:`FusedEmbeddingCollection` (``kernels="fuselab"``): :class:`fuselab.ops.embedding.EmbeddingBagCollection`
  (lookup and update in fused kernels, deterministic, capturable).

Both are built from a :class:`TableSpec` (the tables' sizes, dim, pooling and fixed bag sizes, checked once) and
take ``forward(ids (B, F))`` one id per table; with ``multi_hot_sizes`` ``forward(ids (B, S))`` fixed-size bags
(table ``f`` in its own columns, :mod:`fuselab.dlrm.bags`); ``forward(ids (N,), offsets (B*F + 1,))`` CSR bags, bag
``b*F + f`` of table ``f`` — each pooled by ``pooling`` (``sum`` or ``mean``) -> ``(B, F, D)``. The fused one folds
raw ids (``id mod n_f``); the torch one takes ids in ``[0, n_f)`` (the data's hasher folds them). Both draw table
``t`` U(-1/sqrt(n_t), 1/sqrt(n_t)) in table order from ``generator`` (the global CPU generator when None): the
same values. In eval mode or under no_grad: lookup only. ``set_lr(value)`` writes the learning rate in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer
from fuselab.core.reductions import REDUCTIONS
from fuselab.core.seeded import uniform_tables_
from fuselab.ops.embedding import EmbeddingBagCollection, EmbeddingConfig

from .bags import FixedBags, check_sizes

__all__ = ["POOLINGS", "FusedEmbeddingCollection", "TableSpec", "TorchEmbeddingCollection"]

POOLINGS = REDUCTIONS  # a bag is pooled by a reduction
#: the tables' dtypes by the config's names (``embedding_dtype``)
TABLE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TableSpec:
    """The tables of a sparse arch: ``sizes`` the rows of each of the F tables, ``dim`` D, ``pooling`` of a bag
    (``sum`` or ``mean``), ``multi_hot_sizes`` the ids per sample of each table for fixed-size bags (None: one id per
    table), ``dtype`` the weights' (``fp32``; ``fp16`` or ``bf16`` on fuselab's collection only). Raises ValueError
    naming a bad field."""

    sizes: tuple[int, ...]
    dim: int
    pooling: str = "sum"
    multi_hot_sizes: tuple[int, ...] | None = None
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        sizes = tuple(int(n) for n in self.sizes)
        if not sizes or any(n <= 0 for n in sizes):
            raise ValueError(f"table_sizes must be positive row counts, got {list(sizes)[:8]}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim <= 0:
            raise ValueError(f"dim must be a positive int, got {self.dim!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        object.__setattr__(self, "sizes", sizes)
        if self.dtype not in TABLE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(TABLE_DTYPES)}, got {self.dtype!r}")
        if self.multi_hot_sizes is not None:
            object.__setattr__(self, "multi_hot_sizes", tuple(check_sizes(self.multi_hot_sizes, len(sizes))))

    @property
    def num_features(self) -> int:
        return len(self.sizes)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TABLE_DTYPES[self.dtype]


class _Lookup(torch.autograd.Function):
    """``F.embedding(rows, weight)`` attached to autograd through ``anchor``; backward: the tables' gradient as
    ``F.embedding``'s own backward makes it, handed to the collection's update; no input gets a gradient."""

    @staticmethod
    def forward(ctx, anchor: Tensor, weight: Tensor, rows: Tensor, module: TorchEmbeddingCollection) -> Tensor:
        ctx.save_for_backward(rows)
        ctx.module = module
        return F.embedding(rows, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (rows,) = ctx.saved_tensors
        module = ctx.module
        module.apply_gradient(torch.ops.aten.embedding_backward(grad, rows, module.weight.shape[0], -1, False,
                                                                module.sparse_grad))
        return None, None, None, None


class _LookupBags(torch.autograd.Function):
    """``F.embedding_bag(rows, weight, offsets)`` (CSR bags, ``include_last_offset``) attached through ``anchor``;
    backward: ``F.embedding_bag``'s gradient (each id's row gets its bag's gradient, times 1/length for ``mean``),
    handed to the collection's update."""

    @staticmethod
    def forward(ctx, anchor: Tensor, weight: Tensor, rows: Tensor, offsets: Tensor,
                module: TorchEmbeddingCollection) -> Tensor:
        ctx.save_for_backward(rows, offsets)
        ctx.module = module
        return F.embedding_bag(rows, weight, offsets, mode=module.pooling, include_last_offset=True)

    @staticmethod
    def backward(ctx, grad: Tensor):
        rows, offsets = ctx.saved_tensors
        module = ctx.module
        lengths = offsets.diff()
        bag = torch.repeat_interleave(torch.arange(lengths.shape[0], device=rows.device), lengths,
                                      output_size=rows.shape[0])
        values = grad.index_select(0, bag)
        if module.pooling == "mean":
            values = values * (1 / lengths.to(grad.dtype)).unsqueeze(1).index_select(0, bag)
        module.apply_gradient(torch.ops.aten.embedding_backward(values, rows, module.weight.shape[0], -1, False,
                                                                module.sparse_grad))
        return None, None, None, None, None


def _check_optimizer(optimizer: object) -> None:
    if not isinstance(optimizer, EmbeddingOptimizer):
        raise TypeError(f"optimizer must be an EmbeddingOptimizer (fuselab.core.embedding_optimizer), got "
                        f"{type(optimizer).__name__}")


class TorchEmbeddingCollection(nn.Module):
    """The sparse arch on torch ops (module docstring): ``F.embedding`` / ``F.embedding_bag`` lookups, their sparse
    gradient (``sparse_grad=False``: a dense ``(R, D)`` one, the same update on every row) coalesced, then
    ``optimizer.update_`` on the touched rows.

    Fixed-size bags (``spec.multi_hot_sizes``) pool as one product with an ``(F, S)`` matrix of 0/1 (or 1/size):
    plain ops that ONNX exports. Raises ValueError for a negative lr, TypeError for an ``optimizer`` that is no
    EmbeddingOptimizer.
    """

    #: its update synchronizes with the host (``coalesce``): no CUDA graph, no whole-step compile
    capturable = False

    def __init__(self, spec: TableSpec, *, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01,
                 sparse_grad: bool = True, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        _check_optimizer(optimizer)
        if spec.dtype != "fp32":
            raise ValueError(f"the torch embedding collection keeps fp32 tables; {spec.dtype} tables need fuselab's "
                             "(kernels fuselab)")
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr!r}")
        self.spec, self.optimizer, self.sparse_grad = spec, optimizer, bool(sparse_grad)
        self.dim, self.pooling = spec.dim, spec.pooling
        device = torch.device(device) if device is not None else torch.get_default_device()
        starts = torch.tensor([0, *spec.sizes], dtype=torch.int64, device="cpu").cumsum(0)
        weight = torch.empty(int(starts[-1]), spec.dim, device=device)
        uniform_tables_(weight, spec.sizes, generator if generator is not None else torch.default_generator)
        self.register_buffer("weight", weight)
        self.register_buffer("state", torch.zeros(optimizer.state_shape(*weight.shape), device=device))
        self.register_buffer("row_offsets", starts[:-1].to(device), persistent=False)
        self.register_buffer("lr", torch.tensor(float(lr), device=device), persistent=False)
        self.grad_anchor = nn.Parameter(torch.empty(0, device=device))
        self.register_buffer("pool", None, persistent=False)  # (F, S) with fixed-size bags
        if spec.multi_hot_sizes is not None:
            bags = torch.tensor(spec.multi_hot_sizes, device="cpu")
            tables = torch.arange(spec.num_features, device="cpu")
            table = tables.repeat_interleave(bags)  # the table of each column
            pool = (table[None, :] == tables[:, None]).float()
            self.register_buffer("pool", (pool / bags[:, None] if spec.pooling == "mean" else pool).to(device),
                                 persistent=False)
            self.register_buffer("column_offsets", starts[table].to(device), persistent=False)

    @property
    def num_features(self) -> int:
        return self.spec.num_features

    def set_lr(self, value: float) -> None:
        """Set the learning rate in place (``lr.fill_``)."""
        self.lr.fill_(value)

    @torch.no_grad()
    def apply_gradient(self, grad: Tensor) -> None:
        """One optimizer step from the tables' gradient (sparse COO, coalesced here, or dense ``(R, D)``)."""
        if grad.is_sparse:
            grad = grad.coalesce()  # duplicate rows summed (sort-based, deterministic)
            self.optimizer.update_(self.weight, self.state, grad.values(), self.lr, rows=grad.indices()[0])
        else:
            self.optimizer.update_(self.weight, self.state, grad, self.lr)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        """ids ``(B, F)`` in ``[0, n_f)`` -> ``(B, F, D)``; with fixed-size bags: ids ``(B, S)`` -> ``(B, F, D)``
        pooled; ids ``(N,)`` + offsets ``(B*F + 1,)`` int64 -> ``(B, F, D)`` pooled CSR bags (empty ones zero)."""
        train = self.training and torch.is_grad_enabled()
        if offsets is not None:
            num_bags = offsets.shape[0] - 1
            table = torch.arange(num_bags, device=ids.device).remainder(self.num_features)
            rows = ids + self.row_offsets[table].repeat_interleave(offsets.diff(), output_size=ids.shape[0])
            out = (_LookupBags.apply(self.grad_anchor, self.weight, rows, offsets, self) if train else
                   F.embedding_bag(rows, self.weight, offsets, mode=self.pooling, include_last_offset=True))
            return out.view(num_bags // self.num_features, self.num_features, self.dim)
        rows = ids + (self.row_offsets if self.pool is None else self.column_offsets)
        emb = _Lookup.apply(self.grad_anchor, self.weight, rows, self) if train else F.embedding(rows, self.weight)
        return emb if self.pool is None else torch.matmul(self.pool, emb)  # (F, S) @ (B, S, D): bags pooled

    def extra_repr(self) -> str:
        return (f"tables={self.num_features}, rows={self.weight.shape[0]}, dim={self.dim}, "
                f"optimizer={self.optimizer}, pooling={self.pooling}")


class FusedEmbeddingCollection(EmbeddingBagCollection):
    """The sparse arch on fuselab's fused kernels: :class:`fuselab.ops.embedding.EmbeddingBagCollection` (raw ids
    folded in the kernel, deterministic update), plus fixed-size bags (``spec.multi_hot_sizes``: ids ``(B, S)``
    become flat ids and offsets, :class:`~fuselab.dlrm.bags.FixedBags`). Raises as that class."""

    #: lookup and update run inside a CUDA graph and under ``torch.compile``
    capturable = True

    def __init__(self, spec: TableSpec, *, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01,
                 deterministic: bool = True, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None, config: EmbeddingConfig | None = None):
        super().__init__(list(spec.sizes), spec.dim, optimizer=optimizer, lr=lr, pooling=spec.pooling,
                         deterministic=deterministic, device=device, generator=generator, config=config,
                         weight_dtype=spec.torch_dtype)
        self.spec = spec
        self.bags = None if spec.multi_hot_sizes is None else FixedBags(spec.multi_hot_sizes).to(self.weight.device)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        """As :class:`TorchEmbeddingCollection` (raw ids too)."""
        if offsets is None and self.bags is not None:
            ids, offsets = self.bags(ids)
        return super().forward(ids, offsets)
