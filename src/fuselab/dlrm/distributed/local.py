"""Local embedding modules: what one rank runs on the shards it holds.

A local module is a sparse arch of :mod:`fuselab.dlrm.sparse` over the rows of each local shard (shard ``k`` =
rows ``[row_offsets[k], row_offsets[k] + n_k)`` of ``weight`` (R, D) in the factory's ``dtype``: ``fp32``, or
``fp16`` / ``bf16`` on the fused module; ``state`` the optimizer's):
``forward(ids (N,) int64, offsets (B*K + 1,) int64) -> (B, K, D)`` sum-pooled bags, bag ``b*K + k`` of shard ``k``
holding ids in ``[0, n_k)``, and ``forward(ids (B, K)) -> (B, K, D)``, one id per bag; the gradient of the output
applies the optimizer to the looked-up rows during the backward; ``set_lr(value)``; ``capturable``.

Two factories: :func:`torch_factory` (:class:`~fuselab.dlrm.sparse.TorchEmbeddingCollection`: ``F.embedding_bag``,
its sparse gradient coalesced, the optimizer's reference update) and :func:`fused_factory`
(:class:`~fuselab.dlrm.sparse.FusedEmbeddingCollection`: lookup and update in fused kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer

from ..sparse import FusedEmbeddingCollection, TableSpec, TorchEmbeddingCollection

#: ``factory(shard_rows, dim, optimizer=..., lr=..., device=..., dtype=...) -> local module``
LocalFactory = Callable[..., nn.Module]


def torch_factory(shard_rows: Sequence[int], dim: int, *, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                  lr: float = 0.01, device: torch.device | str | None = None, dtype: str = "fp32") -> nn.Module:
    """A :class:`~fuselab.dlrm.sparse.TorchEmbeddingCollection` over the shards (sum pooling; rows drawn at random:
    the caller copies its initial rows in). Raises ValueError for a ``dtype`` other than ``fp32``."""
    return TorchEmbeddingCollection(TableSpec(tuple(shard_rows), dim, dtype=dtype), optimizer=optimizer, lr=lr,
                                    device=device)


def fused_factory(shard_rows: Sequence[int], dim: int, *, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                  lr: float = 0.01, device: torch.device | str | None = None, dtype: str = "fp32") -> nn.Module:
    """A :class:`~fuselab.dlrm.sparse.FusedEmbeddingCollection` over the shards (sum pooling, deterministic; rows
    drawn at random: the caller copies its initial rows in), weights in ``dtype`` (``fp32``, ``fp16``, ``bf16``)."""
    return FusedEmbeddingCollection(TableSpec(tuple(shard_rows), dim, dtype=dtype), optimizer=optimizer, lr=lr,
                                    device=device)


_MASK32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of int64 values in [0, 2**32): multipliers below 2**31
    keep every product under 2**63, so the arithmetic is exact on every device."""
    for shift, mult in ((16, 0x45D9F3B), (16, 0x2C1B3C6D), (15, 0x297A2D39)):
        x = ((x ^ (x >> shift)) * mult) & _MASK32
    return x ^ (x >> 16)


#: rows per chunk of :func:`init_rows`: the hash's int64 and float64 temporaries of a chunk take about 2 GB at D 128
INIT_CHUNK_ROWS = 1 << 19


def init_rows(seed: int, table: int, table_rows: int, row_start: int, row_end: int, dim: int,
              device: torch.device | str | None = None, chunk_rows: int | None = None,
              out: Tensor | None = None) -> Tensor:
    """Initial rows ``[row_start, row_end)`` of table ``table`` (of ``table_rows`` rows): U(-1/sqrt(n), 1/sqrt(n)).

    Element ``(row, col)`` is a hash of (seed, table, row, col), computed with integer arithmetic on ``device``
    (default CPU) in chunks of ``chunk_rows`` rows (default :data:`INIT_CHUNK_ROWS`): the values do not depend on
    how the table is sharded, nor on the device. -> ``(row_end - row_start, dim)`` fp32 on ``device``; with ``out``
    (a tensor of that shape, any float dtype, on its own device) each chunk is written into it, rounded to its
    dtype, and ``out`` is returned: a 40M-row table's rows then need no fp32 copy beside the weight. Raises
    ``ValueError`` for an empty or out-of-range row range, or an ``out`` of another shape."""
    if not 0 <= row_start < row_end <= table_rows or dim <= 0:
        raise ValueError(f"rows [{row_start}, {row_end}) must lie in [0, {table_rows}) and dim > 0, got dim={dim}")
    if out is None:
        out = torch.empty(row_end - row_start, dim, device=device)
    elif tuple(out.shape) != (row_end - row_start, dim):
        raise ValueError(f"out must be ({row_end - row_start}, {dim}), got {tuple(out.shape)}")
    chunk_rows = INIT_CHUNK_ROWS if chunk_rows is None else chunk_rows
    bound = table_rows ** -0.5
    key = _mix32(torch.tensor([(seed * 1_000_003 + table) & _MASK32], dtype=torch.int64, device=out.device))
    cols = torch.arange(dim, dtype=torch.int64, device=out.device)
    for a in range(row_start, row_end, chunk_rows):
        z = min(row_end, a + chunk_rows)
        rows = torch.arange(a, z, dtype=torch.int64, device=out.device)
        h = _mix32(_mix32(key ^ rows)[:, None] ^ cols)  # (rows, dim) in [0, 2**32)
        unit = (h.double() + 0.5) * (2.0 ** -32)  # (0, 1), exact in float64
        out[a - row_start: z - row_start] = ((2.0 * unit - 1.0) * bound).float()
    return out
