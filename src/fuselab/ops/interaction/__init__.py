"""Fused DLRM dot interaction: ``[dense, pairwise dot products, zero padding]`` without a Gram matrix in memory.

Modules: :mod:`.kernels` (Triton), :mod:`.checks` (``validate(...) -> InteractionCall``), :mod:`.launch` (tuning,
``plan(call, operands)``, ``forward(plan, operands)`` and the backward's, the out-param launchers), :mod:`.op` (the
:class:`~fuselab.ops.opdef.Op` objects: custom ops, fakes, autograd, eager path; the public :func:`dot_interaction`).
The PyTorch reference is :mod:`fuselab.reference.interaction`.
"""

from fuselab.ops.interaction.op import dot_interaction

__all__ = ["dot_interaction"]
