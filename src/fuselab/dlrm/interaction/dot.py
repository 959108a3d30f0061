"""The dot interaction: the dense vector and every pooled embedding, and their pairwise dot products.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim (= the dense arch's output width).

Pair order: the F+1 vectors are ``v_0 = dense`` and ``v_1..v_F`` the embeddings; the output keeps ``dense`` and the
*strict lower triangle* of the Gram matrix ``Z = V Vᵀ`` row-major, i.e. the pairs

    (1,0), (2,0), (2,1), (3,0), (3,1), (3,2), ..., (F,F-1)

so pair ``(i, j)`` with ``j < i`` sits at flat index ``i(i-1)/2 + j`` (with self-interaction the diagonal is
included: pairs ``(i, j)``, ``j <= i``, at index ``i(i+1)/2 + j``). This is facebookresearch/dlrm's order.
torchrec keeps the *upper* triangle row-major, ``(0,1), (0,2), ..., (0,F), (1,2), ...``; the same dot products in
another order. :func:`torchrec_permutation` gives the index map: ``ours[:, perm] == torchrec's``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from fuselab.nn.mlp import INPUT_ALIGN
from fuselab.ops.interaction import dot_interaction

from .base import InteractionConfig

__all__ = ["DotConfig", "DotInteraction", "pair_indices", "torchrec_permutation"]


@dataclass(frozen=True)
class DotConfig(InteractionConfig):
    """``{"kind": "dot", "self_interaction": false}``: with ``self_interaction`` each vector's squared norm too."""

    kind: ClassVar[str] = "dot"
    self_interaction: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.self_interaction, bool):
            raise ValueError(f"interaction.self_interaction must be true or false, got {self.self_interaction!r}")


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


class DotInteraction(nn.Module):
    """dense ``(B, D)``, emb ``(B, F, D)`` -> ``(B, out_features)``, ``out_features = D + (F+1)F/2`` (``+ F+1`` with
    self-interaction): ``[dense, Z[:, i, j] for the pairs]`` (module docstring), emb cast to dense's dtype (bf16
    under autocast).

    ``fused``: :func:`fuselab.ops.interaction.dot_interaction`, whose output carries zero columns up to a multiple of
    :data:`~fuselab.nn.mlp.INPUT_ALIGN` (written by the kernel: the over arch's first layer reads them as its pad);
    else ``bmm`` + gather, unpadded. Raises ValueError when ``dense_dim != dim``.
    """

    config_class = DotConfig

    def __init__(self, config: DotConfig, *, num_sparse: int, dim: int, dense_dim: int, fused: bool = False,
                 generator: torch.Generator | None = None):
        super().__init__()
        config.check_widths(dense_dim, dim)
        self.self_interaction, self.fused = config.self_interaction, fused
        rows, cols = pair_indices(num_sparse + 1, config.self_interaction)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.out_features = dim + len(rows)

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """dense (B, D), emb (B, F, D) -> (B, out_features), fused: zero-padded to a multiple of INPUT_ALIGN"""
        emb = emb.to(dense.dtype)
        if self.fused:
            return dot_interaction(dense, emb, self_interaction=self.self_interaction, pad_to=INPUT_ALIGN)
        vectors = torch.cat([dense.unsqueeze(1), emb], dim=1)  # (B, F+1, D)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # (B, F+1, F+1)
        return torch.cat([dense, gram[:, self.rows, self.cols]], dim=1)
