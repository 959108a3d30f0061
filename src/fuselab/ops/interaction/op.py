"""The fused dot interaction: two :class:`~fuselab.ops.opdef.Op` and the public :func:`dot_interaction`.

``dot_interaction`` -> :func:`~fuselab.ops.interaction.checks.validate` ->
:class:`~fuselab.ops.interaction.checks.InteractionCall` -> :func:`~fuselab.ops.interaction.launch.plan` ->
:func:`~fuselab.ops.interaction.launch.forward` -> the kernel. :data:`FORWARD` (``fuselab::dot_interaction``,
differentiable) and :data:`BACKWARD` (``fuselab::dot_interaction_bwd``, what the forward's backward runs). Eager calls
skip the dispatcher (tens of µs of host time per call); under ``torch.compile`` the custom ops are traced (no graph
break). CUDA tensors run the Triton kernels, others the PyTorch reference (:mod:`fuselab.reference.interaction`);
``FUSELAB_BACKEND`` overrides (see :mod:`fuselab.backend`).

An eager call whose signature was planned skips the checks and the plan (every check reads what the signature holds);
its backward's plan is cached under the forward's signature and the gradient's. The backward keeps the inputs
``dense`` and ``emb`` (already alive in a DLRM: the bottom MLP's output and the lookup's output), nothing else.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from fuselab.backend import triton_for
from fuselab.ops.opdef import Op, tensor_signature

from . import checks, launch
from .checks import InteractionCall, InteractionGradCall

__all__ = ["BACKWARD", "FORWARD", "dot_interaction"]


def _custom_signature(inputs: tuple) -> tuple:
    """The signature of a custom op's inputs: its tensors' and its arguments (``pad_to`` by type and value)."""
    return ("custom", *[tensor_signature(t) if isinstance(t, torch.Tensor) else (type(t), t) for t in inputs])


class DotInteraction(Op):
    """``fuselab::dot_interaction``: ``[dense, pairs, zeros]`` of dense (B, D) and emb (B, F, D), ``(B, W)``."""

    name = "fuselab::dot_interaction"
    schema = "(Tensor dense, Tensor emb, bool self_interaction, SymInt pad_to) -> Tensor"
    differentiable = (0, 1)

    plan = staticmethod(launch.plan)
    forward = staticmethod(launch.forward)

    def call_of(self, inputs: tuple, signed: bool) -> InteractionCall:
        """Real tensors (a direct call of the custom op): the call a cached plan of their signature holds, else
        validated; fake ones: as they are."""
        dense, emb, self_interaction, pad_to = inputs
        if not signed:
            return checks.unchecked(emb, self_interaction, pad_to, False)
        signature = _custom_signature(inputs)
        plan = self.cached(signature)
        if plan is not None:
            return plan.call
        return checks.validate(dense, emb, self_interaction, pad_to, signature)

    def fake(self, call: InteractionCall, operands: tuple) -> torch.Tensor:
        return operands[0].new_empty((operands[1].shape[0], call.width))

    def setup_context(self, ctx, call: InteractionCall, operands: tuple, output: torch.Tensor) -> None:
        ctx.save_for_backward(*operands)

    def backward(self, ctx, grad: torch.Tensor) -> tuple:
        """:func:`_gradients`; with ``create_graph=True`` first order only (a double backward raises)."""
        if torch.is_grad_enabled():
            return _gradients_once(ctx, grad)
        return _gradients(ctx, grad)


class DotInteractionBackward(Op):
    """``fuselab::dot_interaction_bwd``: ``(grad_dense (B, D), grad_emb (B, F, D))`` from the output's gradient
    ``grad`` (B, W), contiguous in the inputs' dtype."""

    name = "fuselab::dot_interaction_bwd"
    schema = "(Tensor grad, Tensor dense, Tensor emb, bool self_interaction) -> (Tensor, Tensor)"

    plan = staticmethod(launch.plan_backward)
    forward = staticmethod(launch.backward)

    def call_of(self, inputs: tuple, signed: bool) -> InteractionGradCall:
        grad, dense, emb, self_interaction = inputs
        if not signed:
            return InteractionGradCall(self_interaction, False)
        signature = _custom_signature(inputs)
        plan = self.cached(signature)
        if plan is not None:
            return plan.call
        return checks.validate_gradient(grad, dense, emb, self_interaction, signature)

    def fake(self, call: InteractionGradCall, operands: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        _grad, dense, emb = operands
        return dense.new_empty(dense.shape), emb.new_empty(emb.shape)


FORWARD = DotInteraction()
BACKWARD = DotInteractionBackward()


def _gradients(ctx, grad: torch.Tensor) -> tuple:
    """Gradients of ``(dense, emb)``: one :data:`BACKWARD` launch. In the eager node its plan is cached under the
    forward's signature and the gradient's (the autograd thread, where every Python step costs several times its
    main-thread time, then only looks it up)."""
    call = ctx.call
    signature = None
    if getattr(ctx, "eager", False) and call.signature is not None:
        signature = ("bwd", call.signature, tensor_signature(grad))
    plan = BACKWARD.cached(signature)
    grad_call = plan.call if plan is not None else checks.gradient_call(call, signature)
    dense, emb = ctx.saved_tensors
    return BACKWARD.run_in_backward(ctx, grad_call, (grad, dense, emb), plan)


_gradients_once = once_differentiable(_gradients)  # the backward kernels are not differentiable


# ---------------------------------------------------------------------------------------------- public API
def dot_interaction(dense: torch.Tensor, emb: torch.Tensor, *, self_interaction: bool = False,
                    pad_to: int = 1) -> torch.Tensor:
    """DLRM dot interaction, fused: ``[dense, pairs..., zeros]``, differentiable.

    Args:
        dense: ``(B, D)`` (the bottom MLP's output), any strides.
        emb: ``(B, F, D)`` (the F embeddings of each row), any strides, the same dtype and device as ``dense``.
        self_interaction: also keep each vector's dot product with itself (the Gram matrix's diagonal).
        pad_to: round the output width up to a multiple of this (8 suits the next GEMM); the padding columns
            are zeros and their gradient is ignored.

    Returns:
        ``(B, W)`` contiguous, in the inputs' dtype: columns ``[0, D)`` are ``dense``; then the ``P`` dot products
        of the vectors ``v_0 = dense, v_1..v_F = emb[:, 0..F-1]``, pair ``(i, j)``, ``j < i``, at column
        ``D + i(i-1)/2 + j`` (``P = (F+1)F/2``); with ``self_interaction``, ``(i, j)``, ``j <= i``, at
        ``D + i(i+1)/2 + j`` (``P = (F+1)(F+2)/2``); then zeros up to ``W = ceil((D + P) / pad_to) * pad_to``.
        Dot products accumulate in float32. Gradients flow to ``dense`` and ``emb`` (first order only: a double
        backward raises).

    Limits: ``1 <= F <= 128``, ``1 <= D <= 256``. float64 runs on the PyTorch path only (CPU tensors, or
    ``FUSELAB_BACKEND=torch``).

    Raises:
        TypeError: ``dense``/``emb`` not tensors, not float32/bfloat16/float16 (float64 off the Triton path), of
            different dtypes; ``pad_to`` not an int.
        ValueError: ``dense`` not 2-D or ``emb`` not 3-D, different batch sizes, ``dense``'s width != ``emb``'s D,
            F or D outside the limits, ``pad_to < 1``, tensors on different devices.
    On every call: a repeated call's signature holds everything the checks read.
    """
    self_interaction = bool(self_interaction)
    signature = None
    if not torch.compiler.is_compiling():
        try:  # pad_to by type and value: True is not an int here
            signature = (tensor_signature(dense), tensor_signature(emb), self_interaction, type(pad_to), pad_to)
        except (AttributeError, TypeError):  # not tensors: validate names them
            signature = None
    plan = FORWARD.cached(signature)
    if plan is not None and triton_for(dense):  # a call of this signature passed the checks
        return FORWARD.run(plan.call, (dense, emb), plan)
    call = checks.validate(dense, emb, self_interaction, pad_to, signature)
    return FORWARD.run(call, (dense, emb))
