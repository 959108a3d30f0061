"""Layers built on the fused ops: :class:`FusedLinear` and :class:`LoRALinear` (:mod:`fuselab.nn.linear`)."""

from .linear import LINEAR_BACKENDS, FusedLinear, LoRALinear, fused_linear

__all__ = ["LINEAR_BACKENDS", "FusedLinear", "LoRALinear", "fused_linear"]
