"""The DLRM model: DenseArch -> SparseArch -> InteractionArch -> OverArch.

Shapes: ``B`` batch, ``F`` sparse features (26 for Criteo), ``D`` embedding dim, ``I = 13`` dense features.

Dot interaction pair order
--------------------------
The F+1 vectors are ``v_0 = dense_arch(dense)`` and ``v_1..v_F`` the F embeddings. The dot interaction keeps the
*strict lower triangle* of the Gram matrix ``Z = V Vᵀ`` in row-major order, i.e. the pairs

    (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), ..., (F,F-1)

so pair ``(i, j)`` with ``j < i`` sits at flat index ``i(i-1)/2 + j`` (with self-interaction the diagonal is
included: pairs ``(i, j)``, ``j <= i``, at index ``i(i+1)/2 + j``). This is facebookresearch/dlrm's order.
torchrec keeps the *upper* triangle row-major, ``(0,1), (0,2), ..., (0,F), (1,2), ...``; the same dot products in
another order. :func:`torchrec_permutation` gives the index map: ``ours[:, perm] == torchrec's``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import NUM_DENSE, DLRMConfig


@dataclass
class Batch:
    """One mini-batch: ``dense`` [B, 13] float32 (log-transformed), ``sparse`` [B, F] int64 (raw or hashed ids),
    ``labels`` [B] float32 in {0, 1}."""

    dense: Tensor
    sparse: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.sparse.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())


def _init_linear(layer: nn.Linear, gen: torch.Generator | None) -> None:
    # facebookresearch/dlrm's initialisation: W ~ N(0, sqrt(2/(fan_in+fan_out))), b ~ N(0, sqrt(1/fan_out))
    fan_out, fan_in = layer.weight.shape
    with torch.no_grad():
        layer.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)), generator=gen)
        layer.bias.normal_(0.0, math.sqrt(1.0 / fan_out), generator=gen)


def _mlp(widths: Sequence[int], relu_last: bool, gen: torch.Generator | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k in range(len(widths) - 1):
        linear = nn.Linear(widths[k], widths[k + 1])
        _init_linear(linear, gen)
        layers.append(linear)
        if k < len(widths) - 2 or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP: [B, I] -> [B, widths[-1]], ReLU after every layer (as both reference models)."""

    def __init__(self, in_features: int, widths: Sequence[int], generator: torch.Generator | None = None):
        super().__init__()
        self.out_features = int(widths[-1])
        self.mlp = _mlp([in_features, *widths], relu_last=True, gen=generator)

    def forward(self, dense: Tensor) -> Tensor:
        """dense [B, I] float -> [B, widths[-1]]"""
        return self.mlp(dense)


class SparseArch(nn.Module):
    """One embedding table per sparse feature: ids [B, F] int64 (already hashed into each table) -> [B, F, D].

    ``layout="fused"`` stores the F tables as row ranges of one weight (one lookup kernel per step);
    ``layout="per_table"`` is one ``nn.EmbeddingBag(mode="sum")`` per feature (bags of one id). Both
    initialise table ``t`` with U(-1/sqrt(rows_t), 1/sqrt(rows_t)) and give ``sparse=True`` gradients when
    ``sparse_grad`` (SGD and Adagrad handle them; only the looked-up rows are touched).
    """

    def __init__(self, table_sizes: Sequence[int], dim: int, layout: str = "fused", sparse_grad: bool = True,
                 generator: torch.Generator | None = None):
        super().__init__()
        if not table_sizes or any(int(n) <= 0 for n in table_sizes):
            raise ValueError(f"table_sizes must be positive row counts, got {list(table_sizes)[:8]}...")
        self.table_sizes = [int(n) for n in table_sizes]
        self.dim = int(dim)
        self.layout = layout
        if layout == "fused":
            offsets = torch.tensor([0, *self.table_sizes], dtype=torch.int64).cumsum(0)
            self.register_buffer("offsets", offsets[:-1].clone(), persistent=False)
            self.weight = nn.Parameter(torch.empty(int(offsets[-1]), dim))
            with torch.no_grad():
                for t, n in enumerate(self.table_sizes):
                    bound = 1.0 / math.sqrt(n)
                    self.weight[offsets[t]: offsets[t + 1]].uniform_(-bound, bound, generator=generator)
            self.sparse_grad = sparse_grad
        elif layout == "per_table":
            self.tables = nn.ModuleList()
            for n in self.table_sizes:
                bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=sparse_grad)
                with torch.no_grad():
                    bag.weight.uniform_(-1.0 / math.sqrt(n), 1.0 / math.sqrt(n), generator=generator)
                self.tables.append(bag)
        else:
            raise ValueError(f"layout must be 'fused' or 'per_table', got {layout!r}")

    @property
    def num_features(self) -> int:
        return len(self.table_sizes)

    def forward(self, ids: Tensor) -> Tensor:
        """ids [B, F] int64, ``0 <= ids[:, t] < table_sizes[t]`` -> [B, F, D]"""
        if self.layout == "fused":
            rows = ids + self.offsets
            return nn.functional.embedding(rows, self.weight, sparse=self.sparse_grad)
        return torch.stack([bag(ids[:, t: t + 1]) for t, bag in enumerate(self.tables)], dim=1)


def pair_indices(num_vectors: int, self_interaction: bool = False) -> tuple[Tensor, Tensor]:
    """Row and column of each kept Gram-matrix entry, strict lower triangle (or with diagonal) row-major."""
    rows, cols = [], []
    for i in range(num_vectors):
        for j in range(i + 1 if self_interaction else i):
            rows.append(i)
            cols.append(j)
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64)


def torchrec_permutation(num_sparse: int, self_interaction: bool = False) -> Tensor:
    """Index map from our pair order to torchrec's: ``ours[:, perm] == torchrec's`` (length (F+1)F/2).

    torchrec keeps the upper triangle row-major, pairs ``(r, c)``, ``r < c`` (``r <= c`` with the diagonal);
    the same dot product is our pair ``(c, r)`` at index ``c(c-1)/2 + r`` (``c(c+1)/2 + r``).
    """
    n = num_sparse + 1
    perm = []
    for r in range(n):
        for c in range(r if self_interaction else r + 1, n):
            perm.append(c * (c + 1) // 2 + r if self_interaction else c * (c - 1) // 2 + r)
    return torch.tensor(perm, dtype=torch.int64)


class InteractionArch(nn.Module):
    """Dense/sparse interaction: dense [B, D], emb [B, F, D] -> [B, out_features].

    ``"dot"``: ``[dense, Z[:, i, j] for the pairs of the module docstring]``, width D + (F+1)F/2
    (+ F+1 with self-interaction). ``"cat"``: ``[dense, emb.flatten(1)]``, width D_dense + F·D.
    """

    def __init__(self, num_sparse: int, dim: int, kind: str = "dot", self_interaction: bool = False,
                 dense_dim: int | None = None):
        super().__init__()
        if kind not in ("dot", "cat"):
            raise ValueError(f"interaction must be 'dot' or 'cat', got {kind!r}")
        self.kind = kind
        self.num_sparse = num_sparse
        dense_dim = dim if dense_dim is None else dense_dim
        if kind == "dot":
            if dense_dim != dim:
                raise ValueError(f"dot interaction needs the dense output width ({dense_dim}) == embedding dim ({dim})")
            rows, cols = pair_indices(num_sparse + 1, self_interaction)
            self.register_buffer("rows", rows, persistent=False)
            self.register_buffer("cols", cols, persistent=False)
            self.out_features = dim + len(rows)
        else:
            self.out_features = dense_dim + num_sparse * dim

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """dense [B, D], emb [B, F, D] -> [B, out_features]"""
        if self.kind == "cat":
            return torch.cat([dense, emb.flatten(1)], dim=1)
        vectors = torch.cat([dense.unsqueeze(1), emb.to(dense.dtype)], dim=1)  # [B, F+1, D]
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # [B, F+1, F+1]
        return torch.cat([dense, gram[:, self.rows, self.cols]], dim=1)


class OverArch(nn.Module):
    """Top MLP: [B, in] -> [B, 1] logit (ReLU between layers, none after the last)."""

    def __init__(self, in_features: int, widths: Sequence[int], generator: torch.Generator | None = None):
        super().__init__()
        self.mlp = _mlp([in_features, *widths], relu_last=False, gen=generator)

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(x)


class DLRM(nn.Module):
    """DLRM: ``forward(dense [B, 13], sparse [B, F] table-row ids) -> logits [B]`` (sigmoid at prediction).

    ``sparse`` must already be hashed into each table (see :class:`fuselab.dlrm.data.loader.Hasher`).
    Build from a config with :meth:`from_config`; the seed makes initialisation reproducible.
    """

    def __init__(self, table_sizes: Sequence[int], embedding_dim: int, bottom_mlp: Sequence[int],
                 top_mlp: Sequence[int], interaction: str = "dot", self_interaction: bool = False,
                 embedding_layout: str = "fused", sparse_grad: bool = True, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.dense_arch = DenseArch(NUM_DENSE, bottom_mlp, gen)
        self.sparse_arch = SparseArch(table_sizes, embedding_dim, embedding_layout, sparse_grad, gen)
        self.interaction_arch = InteractionArch(len(table_sizes), embedding_dim, interaction, self_interaction,
                                                dense_dim=self.dense_arch.out_features)
        self.over_arch = OverArch(self.interaction_arch.out_features, top_mlp, gen)
        self._dense_part = self.dense_forward

    @classmethod
    def from_config(cls, cfg: DLRMConfig, table_sizes: Sequence[int]) -> DLRM:
        return cls(table_sizes, cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp, cfg.interaction,
                   cfg.self_interaction, cfg.embedding_layout, cfg.sparse_grad, cfg.seed)

    def dense_forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """Everything but the embedding lookup: dense [B, 13], emb [B, F, D] -> logits [B]."""
        x = self.dense_arch(dense)
        return self.over_arch(self.interaction_arch(x, emb)).squeeze(1)

    def compile_dense(self, **kwargs) -> None:
        """``torch.compile`` the MLPs and the interaction (the lookup stays eager: sparse gradients)."""
        self._dense_part = torch.compile(self.dense_forward, **kwargs)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        """dense [B, 13] float, sparse [B, F] int64 -> logits [B]"""
        return self._dense_part(dense, self.sparse_arch(sparse))

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.sparse_arch.parameters())

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters() if not n.startswith("sparse_arch.")]
