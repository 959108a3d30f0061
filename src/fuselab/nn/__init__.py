"""Layers built on the fused ops: :class:`FusedLinear` and :class:`LoRALinear` (:mod:`fuselab.nn.linear`), and
:class:`EmbeddingBagCollection` (tables in one buffer, the optimizer fused into the backward:
:mod:`fuselab.ops.embedding`)."""

from fuselab.ops.embedding import EmbeddingBagCollection

from .linear import LINEAR_BACKENDS, FusedLinear, LoRALinear, fused_linear

__all__ = ["LINEAR_BACKENDS", "EmbeddingBagCollection", "FusedLinear", "LoRALinear", "fused_linear"]
