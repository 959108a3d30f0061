"""Local embedding modules: what one rank runs on the shards it holds.

Contract of a local module (built by a :data:`LocalFactory` from the rows of each local shard): buffers or
parameters ``weight`` (R, D) fp32 (shard ``k`` = rows ``[row_offsets[k], row_offsets[k] + n_k)``) and ``state``
(optimizer state: (R,) rowwise_adagrad, (R, D) adagrad, (0,) sgd); ``forward(ids (N,) int64, offsets (B*K + 1,)
int64) -> (B, K, D)`` sum-pooled bags, bag ``b*K + k`` of shard ``k`` holding ids in ``[0, n_k)``, and
``forward(ids (B, K)) -> (B, K, D)``, one id per bag; the gradient of the output applies the optimizer to the
looked-up rows during the backward; ``set_lr(value)``.

Two implementations: :func:`torch_factory` (``F.embedding_bag`` with sparse gradients, the update applied by a
post-accumulate-grad hook with the formulas of torch.optim's sparse Adagrad / row-wise Adagrad) and
:func:`fused_factory` (``fuselab.ops.embedding.EmbeddingBagCollection``: lookup and update in fused kernels).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fuselab.core.embedding_optimizer import embedding_optimizer

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")

#: ``factory(shard_rows, dim, optimizer=..., lr=..., eps=..., device=...) -> local module``
LocalFactory = Callable[..., nn.Module]


def _momentum_shape(optimizer: str, rows: int, dim: int) -> tuple[int, ...]:
    return {"sgd": (0,), "adagrad": (rows, dim), "rowwise_adagrad": (rows,)}[optimizer]


class TorchShards(nn.Module):
    """The torch local module: one ``(R, D)`` weight parameter, ``F.embedding_bag(sparse=True)`` lookups, and the
    sparse optimizer step applied to the coalesced gradient as soon as it is accumulated (then the gradient is
    dropped): ``sgd`` ``w -= lr*g``; ``adagrad`` ``s += g*g, w -= lr*g/(sqrt(s)+eps)``; ``rowwise_adagrad``
    ``s += mean(g*g)`` per row, same step. Weights start at zero: the caller copies its initial rows in.

    Raises ``ValueError`` for an unknown optimizer, non-positive sizes or a negative lr/eps.
    """

    def __init__(self, shard_rows: Sequence[int], dim: int, *, optimizer: str = "rowwise_adagrad",
                 lr: float = 0.01, eps: float = 1e-8, device: torch.device | str | None = None):
        super().__init__()
        rows = [int(n) for n in shard_rows]
        if not rows or any(n <= 0 for n in rows) or dim <= 0:
            raise ValueError(f"shard_rows and dim must be positive, got {rows[:8]}, dim={dim}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if lr < 0 or eps < 0:
            raise ValueError(f"lr and eps must be >= 0, got lr={lr}, eps={eps}")
        starts = torch.tensor([0, *rows], dtype=torch.int64).cumsum(0)
        self.optimizer, self.eps, self.num_shards = optimizer, float(eps), len(rows)
        self.weight = nn.Parameter(torch.zeros(int(starts[-1]), dim, device=device))
        self.register_buffer("state", torch.zeros(_momentum_shape(optimizer, int(starts[-1]), dim), device=device))
        self.register_buffer("row_offsets", starts[:-1].to(device), persistent=False)
        self.register_buffer("lr", torch.tensor(float(lr), device=device), persistent=False)
        self.weight.register_post_accumulate_grad_hook(self._apply_update)

    def set_lr(self, value: float) -> None:
        self.lr.fill_(value)

    @torch.no_grad()
    def _apply_update(self, weight: Tensor) -> None:
        grad = weight.grad.coalesce()
        weight.grad = None
        rows, g = grad.indices()[0], grad.values()
        if self.optimizer == "sgd":
            weight.index_add_(0, rows, g, alpha=-float(self.lr))
            return
        if self.optimizer == "adagrad":
            state = self.state[rows] + g * g
            self.state[rows] = state
            denom = state.sqrt() + self.eps
        else:
            state = self.state[rows] + (g * g).mean(dim=1)
            self.state[rows] = state
            denom = state.sqrt()[:, None] + self.eps
        weight[rows] = weight[rows] - self.lr * (g / denom)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        """ids (N,) int64 in ``[0, n_k)`` of their bag's shard, offsets (B*K + 1,) int64 -> (B, K, D) sums; or ids
        (B, K) without offsets: one id per bag."""
        if offsets is None:
            offsets = torch.arange(ids.numel() + 1, device=ids.device)
            ids = ids.reshape(-1)
        num_bags = offsets.shape[0] - 1
        shard = torch.arange(num_bags, device=ids.device).remainder(self.num_shards)
        rows = ids + self.row_offsets[shard].repeat_interleave(offsets.diff(), output_size=ids.shape[0])
        out = F.embedding_bag(rows, self.weight, offsets, mode="sum", sparse=True, include_last_offset=True)
        return out.view(num_bags // self.num_shards, self.num_shards, -1)


def torch_factory(shard_rows: Sequence[int], dim: int, **kwargs) -> nn.Module:
    """Build a :class:`TorchShards` (keyword arguments: optimizer, lr, eps, device)."""
    return TorchShards(shard_rows, dim, **kwargs)


def fused_factory(shard_rows: Sequence[int], dim: int, *, optimizer: str = "rowwise_adagrad", lr: float = 0.01,
                  eps: float = 1e-8, device: torch.device | str | None = None) -> nn.Module:
    """Build ``fuselab.ops.embedding.EmbeddingBagCollection`` (sum pooling, deterministic) over the shards.

    Raises ``ImportError`` when that op is not installed (use :func:`torch_factory`)."""
    ops = importlib.import_module("fuselab.ops.embedding")
    return ops.EmbeddingBagCollection([int(n) for n in shard_rows], dim,
                                      optimizer=embedding_optimizer(optimizer, eps=eps), lr=lr, pooling="sum",
                                      deterministic=True, device=device)


def default_factory() -> LocalFactory:
    """:func:`fused_factory` when ``fuselab.ops.embedding.EmbeddingBagCollection`` exists, else
    :func:`torch_factory`."""
    try:
        ops = importlib.import_module("fuselab.ops.embedding")
    except ImportError:
        return torch_factory
    return fused_factory if hasattr(ops, "EmbeddingBagCollection") else torch_factory


_MASK32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of int64 values in [0, 2**32): multipliers below 2**31
    keep every product under 2**63, so the arithmetic is exact on every device."""
    for shift, mult in ((16, 0x45D9F3B), (16, 0x2C1B3C6D), (15, 0x297A2D39)):
        x = ((x ^ (x >> shift)) * mult) & _MASK32
    return x ^ (x >> 16)


def init_rows(seed: int, table: int, table_rows: int, row_start: int, row_end: int, dim: int,
              device: torch.device | str | None = None, chunk_rows: int = 1 << 21) -> Tensor:
    """Initial rows ``[row_start, row_end)`` of table ``table`` (of ``table_rows`` rows): U(-1/sqrt(n), 1/sqrt(n)).

    Element ``(row, col)`` is a hash of (seed, table, row, col), computed with integer arithmetic on ``device``
    (default CPU) in chunks of ``chunk_rows`` rows: the values do not depend on how the table is sharded, nor on the
    device. -> ``(row_end - row_start, dim)`` fp32 on ``device``. Raises ``ValueError`` for an empty or
    out-of-range row range."""
    if not 0 <= row_start < row_end <= table_rows or dim <= 0:
        raise ValueError(f"rows [{row_start}, {row_end}) must lie in [0, {table_rows}) and dim > 0, got dim={dim}")
    bound = table_rows ** -0.5
    out = torch.empty(row_end - row_start, dim, device=device)
    key = _mix32(torch.tensor([(seed * 1_000_003 + table) & _MASK32], dtype=torch.int64, device=out.device))
    cols = torch.arange(dim, dtype=torch.int64, device=out.device)
    for a in range(row_start, row_end, chunk_rows):
        z = min(row_end, a + chunk_rows)
        rows = torch.arange(a, z, dtype=torch.int64, device=out.device)
        h = _mix32(_mix32(key ^ rows)[:, None] ^ cols)  # (rows, dim) in [0, 2**32)
        unit = (h.double() + 0.5) * (2.0 ** -32)  # (0, 1), exact in float64
        out[a - row_start: z - row_start] = ((2.0 * unit - 1.0) * bound).float()
    return out
