"""``EmbeddingBagCollection``: F embedding tables in one buffer, lookup in one launch, optimizer fused into backward."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer
from fuselab.core.reductions import REDUCTIONS
from fuselab.core.seeded import uniform_tables_

from .checks import HALF_WEIGHT_DTYPES, KERNEL_WEIGHT_DTYPES, EmbeddingConfig, state_dtype
from .op import embedding_bag_collection


class EmbeddingBagCollection(nn.Module):
    """F embedding tables (one per sparse feature) stored as row ranges of one ``(R, D)`` buffer, with the
    optimizer fused into the backward (torchrec's EmbeddingBagCollection + FBGEMM's fused TBE, in one module).

    Buffers: ``weight`` (R, D) of ``weight_dtype``, ``R = sum(table_sizes)``, table ``t`` = rows ``[row_offsets[t],
    row_offsets[t] + n_t)``; ``state`` the optimizer's state (``optimizer.state_shape(R, D)``: (R,) row-wise
    Adagrad, (R, D) Adagrad, (0,) SGD; fp32 zeros at start); ``row_offsets`` and ``table_sizes`` (F,) int64; ``lr`` a
    0-dim fp32 tensor (:meth:`set_lr`); with half-precision weights, ``rounding_seed`` a 0-dim int64 tensor (the seed
    of the stochastic rounding, advanced by every update and saved in the state dict, so a resumed run draws what an
    uninterrupted one would). ``weight`` does not require grad; the empty parameter ``grad_anchor`` does, so that
    autograd runs the fused update. It never gets a gradient: no dense or sparse gradient of the tables is ever
    allocated.

    ``weight_dtype``: float32 (4 bytes per element), or float16 / bfloat16 (2 bytes: half the memory and the
    lookup's traffic; the lookup and the update compute in fp32, the output is fp32, and the updated weight is
    rounded stochastically, without bias, as FBGEMM's half-precision tables are; bf16 keeps fp32's range, fp16 has
    3 more bits of mantissa and flushes magnitudes under 6e-8 to zero).

    Initialisation: table ``t`` drawn U(-1/sqrt(n_t), 1/sqrt(n_t)) in table order from ``generator`` on its device
    (the global CPU generator when None; a default-device context does not move it), then moved to ``device``
    (default: the default device, e.g. a ``with torch.device(...)`` context's; every buffer lives there):
    bit-identical to the DLRM's torch sparse arch (``fuselab.dlrm.sparse.TorchEmbeddingCollection``) with the same
    generator.

    Training: in training mode with grad enabled, the gradient of the output applies the optimizer to the looked-up
    rows in place when it reaches the backward (``loss.backward()``; running the backward twice updates twice).
    Duplicate rows are summed first, with the same bits every run (``deterministic=False``: SGD updates with atomics,
    faster, not reproducible; the Adagrad variants stay deterministic). In eval mode or under no_grad: lookup only.

    ``optimizer``: an :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer` (kind and hyper-parameters);
    the kernels implement SGD, Adagrad and row-wise Adagrad (another kind runs on the reference path only).

    Raises: ValueError for non-positive table sizes or dim, unknown pooling or a negative lr; TypeError for an
    ``optimizer`` that is no EmbeddingOptimizer.
    """

    def __init__(self, table_sizes: Sequence[int], dim: int, *, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                 lr: float = 0.01, pooling: str = "sum", deterministic: bool = True,
                 device: torch.device | str | None = None, generator: torch.Generator | None = None,
                 config: EmbeddingConfig | None = None, weight_dtype: torch.dtype = torch.float32):
        super().__init__()
        sizes = list(table_sizes)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 for n in sizes):
            raise ValueError(f"table_sizes must be positive int row counts, got {sizes[:8]}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not isinstance(optimizer, EmbeddingOptimizer):
            raise TypeError(f"optimizer must be an EmbeddingOptimizer (fuselab.core.embedding_optimizer), got "
                            f"{type(optimizer).__name__}")
        if pooling not in REDUCTIONS:
            raise ValueError(f"pooling must be one of {', '.join(REDUCTIONS)}, got {pooling!r}")
        if not (isinstance(lr, (int, float)) and lr >= 0):
            raise ValueError(f"lr must be a non-negative float, got {lr!r}")
        if weight_dtype not in KERNEL_WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {', '.join(map(str, KERNEL_WEIGHT_DTYPES))}, got "
                             f"{weight_dtype!r}")
        self.sizes = tuple(sizes)
        self.dim, self.optimizer, self.pooling = dim, optimizer, pooling
        self.deterministic, self.config = bool(deterministic), config
        # drawn on the generator's device (the global CPU generator by default), placed on ``device`` (default: the
        # default device, e.g. a ``with torch.device(...)`` context's)
        device = torch.device(device) if device is not None else torch.get_default_device()
        starts = torch.tensor([0, *sizes], dtype=torch.int64, device="cpu").cumsum(0)
        weight = torch.empty(int(starts[-1]), dim, device=device, dtype=weight_dtype)
        uniform_tables_(weight, sizes, generator if generator is not None else torch.default_generator)
        self.register_buffer("weight", weight)
        self.register_buffer("state", torch.zeros(optimizer.state_shape(weight.shape[0], dim), device=device,
                                                  dtype=state_dtype(weight_dtype)))
        if weight_dtype in HALF_WEIGHT_DTYPES:
            self.register_buffer("rounding_seed", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("row_offsets", starts[:-1].clone().to(device), persistent=False)
        self.register_buffer("table_sizes", torch.tensor(sizes, dtype=torch.int64, device=device), persistent=False)
        self.register_buffer("lr", torch.tensor(float(lr), dtype=torch.float32, device=device), persistent=False)
        self.grad_anchor = nn.Parameter(torch.empty(0, device=device))

    @property
    def num_features(self) -> int:
        return len(self.sizes)

    def set_lr(self, value: float) -> None:
        """Set the learning rate in place (``lr.fill_``: no recompilation, safe between CUDA graph replays)."""
        self.lr.fill_(value)

    def forward(self, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        """One id per feature: ids ``(B, F)`` int64/int32 raw ids (``id mod n_f`` applied in the kernel) ->
        ``(B, F, D)``. Bags: ids ``(N,)`` flat values, offsets ``(B*F + 1,)`` int64, bag ``b*F + f`` of feature
        ``f`` pooled by ``pooling`` (empty bags give zeros) -> ``(B, F, D)``."""
        return embedding_bag_collection(
            self.weight, self.state, self.lr, ids, self.table_sizes, self.row_offsets, offsets,
            anchor=self.grad_anchor if self.training else None, pooling=self.pooling, optimizer=self.optimizer,
            deterministic=self.deterministic, config=self.config,
            seed=self.rounding_seed if self.weight.dtype in HALF_WEIGHT_DTYPES else None)

    def extra_repr(self) -> str:
        return (f"tables={len(self.sizes)}, rows={self.weight.shape[0]}, dim={self.dim}, optimizer={self.optimizer}, "
                f"pooling={self.pooling}, deterministic={self.deterministic}, weight_dtype={self.weight.dtype}")
