"""The RoPE layouts, defined once: each name, the shape it stands for, and where each logical axis (batch, seq, heads,
head_dim) sits in a tensor of that layout. The reference, the checks and the launch planner all read them here.

Every layout is a view of one logical ``(batch, seq, heads, head_dim)`` tensor; ``thd`` (packed variable-length
sequences, ``(total_tokens, heads, head_dim)``) has no batch axis: batch 1, seq = total tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeLayout:
    """One layout: its ``name``, the ``shape`` it stands for, and ``axes``: the tensor axis of batch (None for
    ``thd``), seq, heads and head_dim."""

    name: str
    shape: str
    axes: tuple[int | None, int, int, int]

    @property
    def ndim(self) -> int:
        return 3 if self.axes[0] is None else 4

    def logical(self, values: Sequence[int], absent: int) -> tuple[int, int, int, int]:
        """``values`` (a tensor's shape or strides, in this layout's axis order) as (batch, seq, heads, head_dim);
        ``absent`` stands for thd's missing batch axis (1 for a size, 0 for a stride)."""
        b, s, h, d = self.axes
        return (absent if b is None else values[b]), values[s], values[h], values[d]

    def to_bshd(self, t: torch.Tensor) -> torch.Tensor:
        """A (batch, seq, heads, head_dim) view of ``t`` (thd: batch 1, seq = tokens)."""
        return t.unsqueeze(0) if self.axes[0] is None else t.permute(self.axes)

    def from_bshd(self, t: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`to_bshd`: a (batch, seq, heads, head_dim) tensor viewed in this layout."""
        if self.axes[0] is None:
            return t.squeeze(0)
        return t.permute(tuple(self.axes.index(axis) for axis in range(4)))


ROPE_LAYOUTS: dict[str, RopeLayout] = {layout.name: layout for layout in (
    RopeLayout("bshd", "(batch, seq, heads, head_dim)", (0, 1, 2, 3)),
    RopeLayout("sbhd", "(seq, batch, heads, head_dim)", (1, 0, 2, 3)),
    RopeLayout("bhsd", "(batch, heads, seq, head_dim)", (0, 2, 1, 3)),
    RopeLayout("thd", "(total_tokens, heads, head_dim)", (None, 0, 1, 2)),
)}

#: the layout names, in the order the docs list them
LAYOUTS: tuple[str, ...] = tuple(ROPE_LAYOUTS)


def rope_layout(name: object) -> RopeLayout:
    """The layout called ``name``; ``ValueError`` naming ``layout`` and listing the names otherwise."""
    try:
        return ROPE_LAYOUTS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {name!r}") from None
