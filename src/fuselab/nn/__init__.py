"""Layers built on the fused ops: :class:`FusedLinear` and :class:`LoRALinear` (:mod:`fuselab.nn.linear`), the
DLRM's MLP layer :class:`LinearAct` (:mod:`fuselab.nn.mlp`), and :class:`EmbeddingBagCollection` (tables in one
buffer, the optimizer fused into the backward: :mod:`fuselab.ops.embedding`)."""

from fuselab.ops.embedding import EmbeddingBagCollection

from .linear import LINEAR_BACKENDS, FusedLinear, LoRALinear, fused_linear
from .mlp import LinearAct

__all__ = ["LINEAR_BACKENDS", "EmbeddingBagCollection", "FusedLinear", "LinearAct", "LoRALinear", "fused_linear"]
