"""Fused ops, one package per op with the same rooms: ``kernels.py`` (``@triton.jit`` only), ``checks.py``
(``validate(...) -> <Op>Call``), ``launch.py`` (tuning dataclass, ``plan(call, operands) -> <Op>Plan``, ``forward``:
allocate and launch), ``op.py`` (the :class:`~fuselab.ops.opdef.Op`: custom op, autograd, eager path, and the public
function). ``docs/architecture.md`` describes the contract.

Shared: :mod:`fuselab.ops.opdef` (the op contract and its caches), :mod:`fuselab.ops._launch` (the launch seam: a
fast path and its ``kernel[grid]`` fallback), :mod:`fuselab.ops._recordop` (the helper of the ops not yet on the
contract), :mod:`fuselab.ops._rounding` (round-to-nearest-even stores), :mod:`fuselab.ops._tickets`
(last-program-to-arrive counters and scratch), :mod:`fuselab.ops.tuning` (the tuning context).
"""

from .opdef import clear

__all__ = ["clear"]
