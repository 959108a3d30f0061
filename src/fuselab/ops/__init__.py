"""Fused ops, one package per op with the same rooms: ``kernels.py`` (``@triton.jit`` only), ``launch.py`` (tuning
dataclass, plans, out-param launchers), ``op.py`` (the :class:`~fuselab.ops.opdef.Op`: custom op, autograd, eager
path, and the public function), ``checks.py`` where the op has argument checks of its own.

Shared: :mod:`fuselab.ops.opdef` (the op-definition helper and its launch caches), :mod:`fuselab.ops._launch` (the
low-overhead Triton launch), :mod:`fuselab.ops._rounding` (round-to-nearest-even stores), :mod:`fuselab.ops._tickets`
(last-program-to-arrive counters and scratch), :mod:`fuselab.ops.tuning` (the tuning context).
"""

from .opdef import clear

__all__ = ["clear"]
