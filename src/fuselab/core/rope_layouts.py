"""The RoPE layouts, defined once: each name, the shape it stands for, and where each logical axis (batch, seq, heads,
head_dim) sits in a tensor of that layout. Data only: the reference, the checks and the launch planner read it.

Every layout is a view of one logical ``(batch, seq, heads, head_dim)`` tensor; ``thd`` (packed variable-length
sequences, ``(total_tokens, heads, head_dim)``) has no batch axis: batch 1, seq = total tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeLayout:
    """One layout: its ``name``, the ``shape`` it stands for, ``axes``: the tensor axis of batch (None when
    ``packed``), seq, heads and head_dim; ``ndim``; ``inverse``: the permutation that takes a (batch, seq, heads,
    head_dim) tensor back to this layout (None when packed)."""

    name: str
    shape: str
    axes: tuple[int | None, int, int, int]
    ndim: int
    packed: bool
    inverse: tuple[int, ...] | None


def _layout(name: str, shape: str, axes: tuple[int | None, int, int, int]) -> RopeLayout:
    packed = axes[0] is None
    inverse = None if packed else tuple(axes.index(axis) for axis in range(4))
    return RopeLayout(name, shape, axes, 3 if packed else 4, packed, inverse)


ROPE_LAYOUTS: dict[str, RopeLayout] = {layout.name: layout for layout in (
    _layout("bshd", "(batch, seq, heads, head_dim)", (0, 1, 2, 3)),
    _layout("sbhd", "(seq, batch, heads, head_dim)", (1, 0, 2, 3)),
    _layout("bhsd", "(batch, heads, seq, head_dim)", (0, 2, 1, 3)),
    _layout("thd", "(total_tokens, heads, head_dim)", (None, 0, 1, 2)),
)}

#: the layout names, in the order the docs list them
LAYOUTS: tuple[str, ...] = tuple(ROPE_LAYOUTS)
