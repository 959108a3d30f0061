"""Float32 matmul precision for a block of code: the one place that sets and restores torch's global setting."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["float32_matmul_precision"]


@contextlib.contextmanager
def float32_matmul_precision(value: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(value)`` ("highest", "high" or "medium") for the block, restored after
    it (also when the block raises)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)
