"""Fixed-size bags (MLPerf's multi-hot): every sample holds ``sizes[f]`` ids of table ``f``.

A batch stores them as ids ``(B, S)``, ``S = sum(sizes)``, table ``f`` in columns ``[prefix[f], prefix[f] +
sizes[f])``. As bags (what the embedding modules pool) that is the flat ids ``(B*S,)`` in row-major order, bag
``b*F + f`` covering ``[b*S + prefix[f], b*S + prefix[f] + sizes[f])``: no copy, and offsets that depend on B
alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["FixedBags", "check_sizes"]


def check_sizes(sizes: Sequence[int], num_tables: int) -> list[int]:
    """``sizes`` as a list of ``num_tables`` positive ints; ``ValueError`` naming what is wrong."""
    out = [int(n) for n in sizes]
    if len(out) != num_tables or any(n < 1 for n in out):
        raise ValueError(f"multi_hot_sizes must be {num_tables} positive ints (one per table), got {out[:8]}")
    return out


class FixedBags(nn.Module):
    """``forward(ids (B, S)) -> (flat ids (B*S,), offsets (B*F + 1,))`` for fixed bag ``sizes`` (offsets memoized
    per B and device). Raises ``ValueError`` for ids of another width."""

    def __init__(self, sizes: Sequence[int]):
        super().__init__()
        self.sizes = [int(n) for n in sizes]
        if not self.sizes or any(n < 1 for n in self.sizes):
            raise ValueError(f"bag sizes must be positive, got {self.sizes[:8]}")
        self.width = sum(self.sizes)
        prefix = torch.tensor([0, *self.sizes[:-1]], dtype=torch.int64).cumsum(0)
        self.register_buffer("prefix", prefix, persistent=False)
        self._offsets: dict[tuple[int, torch.device], Tensor] = {}

    def offsets(self, batch: int) -> Tensor:
        """(B*F + 1,) int64 on the module's device."""
        key = (batch, self.prefix.device)
        found = self._offsets.get(key)
        if found is None:
            starts = torch.arange(batch, device=self.prefix.device)[:, None] * self.width + self.prefix
            end = torch.tensor([batch * self.width], device=self.prefix.device)
            found = self._offsets[key] = torch.cat([starts.reshape(-1), end])
        return found

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        if ids.dim() != 2 or ids.shape[1] != self.width:
            raise ValueError(f"multi-hot ids must be (B, {self.width}) (the sum of the bag sizes), got "
                             f"{tuple(ids.shape)}")
        return ids.reshape(-1), self.offsets(ids.shape[0])
