"""Pure-PyTorch reference of the embedding bag collection: lookup and the fused sparse optimizer updates.

The CPU path of :mod:`fuselab.ops.embedding` and the oracle of its kernels (any floating dtype, float64 included).
Every function is free of host synchronisation (no ``.item()``, no data-dependent shapes), so it also runs inside a
CUDA graph when ``FUSELAB_BACKEND=torch`` routes CUDA tensors here (its ``index_add_`` is then atomic on CUDA: not
bit-reproducible there; on the CPU it sums in index order).

Shapes: ``F`` features (= tables), ``B`` batch, ``D`` embedding dim, ``R`` rows of all tables, ``N`` id positions
(``B*F`` with one id per feature, ``ids.numel()`` with bags).
"""

from __future__ import annotations

import torch

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer
from fuselab.core.reductions import REDUCTIONS

#: how a bag of rows is pooled: one of the reductions
POOLINGS: tuple[str, ...] = REDUCTIONS


def compute_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype the lookups and updates of a ``weight_dtype`` table compute (and return) in: float32 for half
    precision, else the weight's own."""
    return torch.float32 if weight_dtype in (torch.float16, torch.bfloat16) else weight_dtype


def table_rows(raw: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
               feature: torch.Tensor) -> torch.Tensor:
    """Global row of each raw id: ``row_offsets[f] + (raw mod table_sizes[f])`` with the non-negative modulus
    (``raw`` of feature ``feature``, any integer dtype, same shape) -> int64 of ``raw``'s shape."""
    n = table_sizes[feature]
    return row_offsets[feature] + torch.remainder(raw.to(torch.int64), n)


def bag_layout(ids: torch.Tensor, offsets: torch.Tensor, num_features: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For bags: (bag (N,) int64 of each id position, inside (N,) bool, length (B*F,) int64 of each bag).

    Offsets are clamped into ``[0, N]`` and each bag's end to at least its start (the kernels do the same, so
    malformed offsets never read out of bounds); positions no bag covers get ``inside=False``."""
    n = ids.shape[0]
    num_bags = offsets.shape[0] - 1
    start = offsets[:-1].clamp(0, n)
    end = torch.maximum(offsets[1:].clamp(0, n), start)
    pos = torch.arange(n, device=ids.device)
    bag = (torch.searchsorted(offsets.contiguous(), pos, right=True) - 1).clamp(0, max(num_bags - 1, 0))
    inside = (pos >= start[bag]) & (pos < end[bag]) if num_bags > 0 else torch.zeros_like(pos, dtype=torch.bool)
    del num_features  # bags are numbered b*F + f; the feature of a bag is bag % F (callers use it)
    return bag, inside, end - start


def lookup(weight: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
           offsets: torch.Tensor | None = None, pooling: str = "sum") -> torch.Tensor:
    """The pooled embeddings ``(B, F, D)`` in :func:`compute_dtype` of ``weight``'s dtype.

    One id per feature: ``ids`` (B, F) -> ``weight[row_offsets[f] + ids[b, f] mod table_sizes[f]]``.
    Bags: ``ids`` (N,), ``offsets`` (B*F + 1,); bag ``j = b*F + f`` pools ``ids[offsets[j]:offsets[j+1]]``
    of feature ``f`` by ``pooling`` (``sum`` or ``mean``); an empty bag gives zeros.
    """
    f_count, dim = table_sizes.shape[0], weight.shape[1]
    dtype = compute_dtype(weight.dtype)
    if offsets is None:
        feature = torch.arange(f_count, device=ids.device).expand_as(ids)
        return weight[table_rows(ids, table_sizes, row_offsets, feature)].to(dtype)
    num_bags = offsets.shape[0] - 1
    bag, inside, length = bag_layout(ids, offsets, f_count)
    rows = table_rows(ids, table_sizes, row_offsets, bag % f_count)
    vals = weight[rows].to(dtype) * inside.to(dtype)[:, None]
    out = torch.zeros(num_bags, dim, dtype=dtype, device=weight.device).index_add_(0, bag, vals)
    if pooling == "mean":
        out = out / length.clamp(min=1).to(dtype)[:, None]
    return out.view(num_bags // f_count, f_count, dim)


def position_grads(grad: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
                   offsets: torch.Tensor | None, pooling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(global row (N,), gradient (N, D)) of every id position: the output gradient of its bag, divided by the
    bag's length for ``mean``, zero for positions outside every bag."""
    f_count, dim = table_sizes.shape[0], grad.shape[-1]
    flat = grad.reshape(-1, dim)
    if offsets is None:
        feature = torch.arange(f_count, device=ids.device).expand_as(ids)
        return table_rows(ids, table_sizes, row_offsets, feature).reshape(-1), flat
    bag, inside, length = bag_layout(ids, offsets, f_count)
    scale = inside.to(grad.dtype)
    if pooling == "mean":
        scale = scale / length.clamp(min=1).to(grad.dtype)[bag]
    return table_rows(ids, table_sizes, row_offsets, bag % f_count), flat[bag] * scale[:, None]


def sparse_update_(weight: torch.Tensor, state: torch.Tensor, lr: torch.Tensor, grad: torch.Tensor,
                   ids: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
                   offsets: torch.Tensor | None = None, pooling: str = "sum",
                   optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD) -> None:
    """Apply one step of ``optimizer`` to the rows the batch touched, in place, as torch.optim on the coalesced sparse
    gradient: duplicate rows are summed first (stable sort, sums in sorted order), then each row's summed gradient
    goes through :meth:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer.update_` (``state``: its
    ``state_shape(R, D)``).

    ``lr`` is a 0-dim tensor. Every position of a segment computes its row's new value (the same value) and writes
    it: static shapes, no host synchronisation. A half-precision ``weight`` is updated in fp32 (``state`` float32)
    and the result rounded to nearest (the Triton path rounds stochastically).
    """
    dtype = compute_dtype(weight.dtype)
    rows, g = position_grads(grad.to(dtype), ids, table_sizes, row_offsets, offsets, pooling)
    n = rows.shape[0]
    if n == 0:
        return
    sorted_rows, perm = torch.sort(rows, stable=True)
    head = torch.ones(n, dtype=torch.bool, device=rows.device)
    head[1:] = sorted_rows[1:] != sorted_rows[:-1]
    segment = torch.cumsum(head.to(torch.int64), 0) - 1
    sums = torch.zeros(n, g.shape[1], dtype=dtype, device=weight.device).index_add_(0, segment, g[perm])
    if dtype == weight.dtype:
        optimizer.update_(weight, state, sums[segment], lr, rows=sorted_rows)
        return
    # half precision: the touched rows updated in fp32 copies, then rounded to nearest into the table
    rows_w, rows_s = weight[sorted_rows].to(dtype), state[sorted_rows] if state.numel() else state
    optimizer.update_(rows_w, rows_s, sums[segment], lr)
    weight.index_put_((sorted_rows,), rows_w.to(weight.dtype))
    if state.numel():
        state.index_put_((sorted_rows,), rows_s)
