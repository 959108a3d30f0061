"""The DLRM's interaction arch: the dense vector meets the F pooled embeddings.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim.

Kinds: ``dot`` (pairwise dot products in facebookresearch/dlrm's pair order, see :func:`pair_indices`; through the
fused :func:`fuselab.ops.interaction.dot_interaction` when given, optionally zero-padded), ``cat`` (concatenation)
and ``dcn`` (DCNv2's low-rank cross network, :class:`fuselab.dlrm.dcn.InteractionDCNArch`: MLPerf's DLRM-DCNv2).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .dcn import InteractionDCNArch

__all__ = ["INTERACTIONS", "InteractionArch", "pair_indices", "torchrec_permutation"]

INTERACTIONS = ("dot", "cat", "dcn")


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

    ``"dot"``: ``[dense, Z[:, i, j] for the pairs of fuselab.dlrm.model's docstring]``, width D + (F+1)F/2
    (+ F+1 with self-interaction). ``"cat"``: ``[dense, emb.flatten(1)]``, width D_dense + F·D. ``"dcn"``: the
    DCNv2 cross network over ``[dense, emb]`` flattened (``dcn_num_layers`` layers of rank ``dcn_low_rank``, initial
    values from ``generator``), width (F+1)·D.
    ``dot_fn``: the fused dot interaction (:func:`fuselab.ops.interaction.dot_interaction`); None: ``bmm`` + gather.
    With ``dot_fn``, ``pad_to`` rounds ``out_features`` up to a multiple of it (zero columns at the end);
    ``width`` is the unpadded width. emb is cast to dense's dtype (bf16 under autocast).
    """

    def __init__(self, num_sparse: int, dim: int, kind: str = "dot", self_interaction: bool = False,
                 dense_dim: int | None = None, dot_fn=None, pad_to: int = 1, dcn_num_layers: int = 3,
                 dcn_low_rank: int = 512, generator: torch.Generator | None = None):
        super().__init__()
        if kind not in INTERACTIONS:
            raise ValueError(f"interaction must be one of {INTERACTIONS}, got {kind!r}")
        if not isinstance(pad_to, int) or pad_to < 1 or (pad_to > 1 and (dot_fn is None or kind != "dot")):
            raise ValueError(f"pad_to must be 1, or a positive int with the fused dot interaction, got {pad_to!r}")
        self.kind = kind
        self.num_sparse = num_sparse
        self.self_interaction = self_interaction
        self.dot_fn = dot_fn if kind == "dot" else None
        self.pad_to = pad_to
        dense_dim = dim if dense_dim is None else dense_dim
        self.dcn = None
        if kind == "dcn":
            if dense_dim != dim:
                raise ValueError(f"dcn interaction needs the dense output width ({dense_dim}) == embedding dim ({dim})")
            self.dcn = InteractionDCNArch(num_sparse, dim, dcn_num_layers, dcn_low_rank, generator)
            self.width = self.dcn.out_features
        elif kind == "dot":
            if dense_dim != dim:
                raise ValueError(f"dot interaction needs the dense output width ({dense_dim}) == embedding dim ({dim})")
            rows, cols = pair_indices(num_sparse + 1, self_interaction)
            self.register_buffer("rows", rows, persistent=False)
            self.register_buffer("cols", cols, persistent=False)
            self.width = dim + len(rows)
        else:
            self.width = dense_dim + num_sparse * dim
        self.out_features = -(-self.width // pad_to) * pad_to

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """dense [B, D], emb [B, F, D] -> [B, out_features]"""
        if self.kind == "cat":
            return torch.cat([dense, emb.flatten(1)], dim=1)
        if self.dcn is not None:
            return self.dcn(dense, emb)
        emb = emb.to(dense.dtype)
        if self.dot_fn is not None:
            return self.dot_fn(dense, emb, self_interaction=self.self_interaction, pad_to=self.pad_to)
        vectors = torch.cat([dense.unsqueeze(1), emb], dim=1)  # [B, F+1, D]
        gram = torch.bmm(vectors, vectors.transpose(1, 2))  # [B, F+1, F+1]
        return torch.cat([dense, gram[:, self.rows, self.cols]], dim=1)
