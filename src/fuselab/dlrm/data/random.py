"""Random device-resident DLRM batches for speed measurements (no dataset, no host in the loop)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["ID_DISTRIBUTIONS", "random_batches"]

ID_DISTRIBUTIONS = ("powerlaw", "uniform")
_SCRAMBLE = 2654435761  # a prime above every cardinality: id -> id * P mod n is a bijection


def random_batches(batch: int, sizes: Sequence[int], device: torch.device | str, ids: str = "powerlaw",
                   count: int = 4, seed: int = 1234, multi_hot_sizes: Sequence[int] | None = None
                   ) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``count`` batches ``(dense (B, 13) fp32, ids (B, F) int64, labels (B,) fp32)`` drawn on ``device``: ids
    uniform over each table, or power-law (rank r with probability ~ 1/r, ranks scattered over the table by a
    bijection); labels 1 with probability 0.25. ``multi_hot_sizes``: fixed-size bags, ids (B, S) with table f's
    bag in its columns (:mod:`fuselab.dlrm.bags`). Raises ``ValueError`` for an unknown ``ids``."""
    if ids not in ID_DISTRIBUTIONS:
        raise ValueError(f"ids must be one of {ID_DISTRIBUTIONS}, got {ids!r}")
    gen = torch.Generator(device=device).manual_seed(seed)
    n = torch.tensor(list(sizes), device=device)
    if multi_hot_sizes is not None:  # each column draws from its table
        n = n.repeat_interleave(torch.tensor(list(multi_hot_sizes), device=device))
    out = []
    for _ in range(count):
        u = torch.rand(batch, n.shape[0], device=device, generator=gen, dtype=torch.float64)
        if ids == "uniform":
            rows = (u * n).long().clamp_max(n - 1)
        else:
            rows = ((n.double() ** u).floor().long() - 1).clamp(0, None).minimum(n - 1) * _SCRAMBLE % n
        dense = torch.rand(batch, 13, device=device, generator=gen)
        labels = (torch.rand(batch, device=device, generator=gen) < 0.25).float()
        out.append((dense, rows, labels))
    return out
