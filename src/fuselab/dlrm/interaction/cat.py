"""The cat interaction: the dense vector and the pooled embeddings side by side.

Shapes: ``B`` batch, ``F`` sparse features, ``D`` embedding dim, ``D_dense`` the dense arch's output width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from .base import InteractionConfig

__all__ = ["CatConfig", "CatInteraction"]


@dataclass(frozen=True)
class CatConfig(InteractionConfig):
    """``{"kind": "cat"}``: no options; any dense width."""

    kind: ClassVar[str] = "cat"
    needs_equal_widths: ClassVar[bool] = False


class CatInteraction(nn.Module):
    """dense ``(B, D_dense)``, emb ``(B, F, D)`` -> ``[dense, emb.flatten(1)]`` ``(B, D_dense + F·D)``. One
    implementation for both kernel paths (``fused`` is accepted and changes nothing)."""

    config_class = CatConfig

    def __init__(self, config: CatConfig, *, num_sparse: int, dim: int, dense_dim: int, fused: bool = False,
                 generator: torch.Generator | None = None):
        super().__init__()
        self.out_features = dense_dim + num_sparse * dim

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """dense (B, D_dense), emb (B, F, D) -> (B, D_dense + F·D)"""
        return torch.cat([dense, emb.flatten(1)], dim=1)
