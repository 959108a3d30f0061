"""One mini-batch of Criteo rows: the unit the loaders hand out and the trainer and the model consume."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Batch"]


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
