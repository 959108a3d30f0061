"""Fused bias + scaled residual + activation: ``y = act(x + alpha * residual + bias)``, forward and backward.

``bias_act`` -> :func:`~fuselab.ops.bias_act.checks.validate` -> :class:`~fuselab.ops.bias_act.checks.BiasActCall`
-> :func:`~fuselab.ops.bias_act.launch.plan` -> :func:`~fuselab.ops.bias_act.launch.forward` -> the kernel. Three
:class:`~fuselab.ops.opdef.Op`: :data:`FORWARD` (``fuselab::bias_act_fwd``, differentiable: its backward is one
:data:`BACKWARD` call), :data:`BACKWARD` (``fuselab::bias_act_bwd``) and :data:`INPLACE` (``fuselab::bias_act_``,
x marked dirty); then the public :func:`bias_act`. An eager call whose signature was planned skips the checks and
the plan; in place, the leaves that require grad and the overlap of x with bias and residual are checked on every
call.

What the backward keeps per element of ``x`` (see :data:`fuselab.core.activations.SAVED`):
``none`` nothing; ``relu``/``relu2``/``sigmoid`` the output ``y`` (no extra memory when the next layer keeps
its input, as every Linear does); ``silu``/``gelu``/``gelu_tanh`` the pre-activation ``z`` in ``x``'s dtype
when there is a residual; without one, ``x`` itself (and the bias), from which the backward rebuilds
``z = x + bias``: no extra write in the forward.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

from fuselab.backend import triton_for
from fuselab.core.activations import ACTIVATIONS, SAVED
from fuselab.ops.opdef import Op, tensor_signature
from fuselab.reference import bias_act as ref

from . import checks, launch
from .checks import BiasActCall, BiasActGradCall, needs_pre

__all__ = ["ACTIVATIONS", "BACKWARD", "FORWARD", "INPLACE", "bias_act", "gradients"]

_INPUTS = "Tensor x, Tensor? bias, Tensor? residual, float alpha, str activation"


def _signed(tag: str, inputs: tuple, n_tensors: int) -> tuple:
    """The signature of a custom op's inputs: ``tag``, the leading tensors' signatures, the rest by value (``alpha``
    by its type)."""
    return (tag, *[None if t is None else tensor_signature(t) for t in inputs[:n_tensors]], type(inputs[n_tensors]),
            *inputs[n_tensors + 1:])


# ---------------------------------------------------------------------------------------------- forward
class BiasActForward(Op):
    """``fuselab::bias_act_fwd``: ``(y, z)`` (z empty unless ``save_pre``), one launch."""

    name = "fuselab::bias_act_fwd"
    schema = f"({_INPUTS}, bool save_pre) -> (Tensor, Tensor)"
    differentiable = (0, 1, 2)

    plan = staticmethod(launch.plan)
    forward = staticmethod(launch.forward)

    def call_of(self, inputs: tuple, signed: bool) -> BiasActCall:
        return BiasActCall(inputs[4], save_pre=inputs[5], signature=_signed("custom", inputs, 3) if signed else None)

    def fake(self, call: BiasActCall, operands: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        x = operands[0]
        return x.new_empty(x.shape), x.new_empty(x.shape if call.save_pre else (0,))

    def setup_context(self, ctx, call: BiasActCall, operands: tuple, outputs: Any) -> None:
        x, bias, residual, alpha = operands
        y, pre = outputs
        if pre is not None:  # the second output (z, or an empty tensor when z is not kept)
            ctx.mark_non_differentiable(pre)
        kind = SAVED[call.activation]
        if kind == "output":
            ctx.save_for_backward(y)
        elif kind == "pre":
            if needs_pre(call.activation, residual) and not call.save_pre:
                raise RuntimeError("fuselab::bias_act_fwd ran without save_pre but its backward needs z")
            if call.save_pre:
                ctx.save_for_backward(pre)
            else:  # the backward rebuilds z = x + bias
                ctx.save_for_backward(x, bias)
        else:
            ctx.save_for_backward()
        # which gradients are wanted: the eager node's inputs are (call, plan, *operands), the custom op's the
        # operands first
        wanted = ctx.needs_input_grad[2:5] if getattr(ctx, "eager", False) else ctx.needs_input_grad[:3]
        ctx.alpha, ctx.x_dtype = alpha, x.dtype
        ctx.residual_dtype = (residual if residual is not None else x).dtype
        ctx.bias_dtype = (bias if bias is not None else x).dtype
        ctx.want_x, ctx.want_bias, ctx.want_residual = wanted[0], bias is not None and wanted[1], \
            residual is not None and wanted[2]

    def backward(self, ctx, grad_y: torch.Tensor, grad_pre: torch.Tensor | None) -> tuple:
        """Gradients of ``(x, bias, residual, alpha)``: one :data:`BACKWARD` call. In the eager node its plan is
        cached under the forward's signature and the gradient's (the autograd thread then only looks it up).
        ``grad_pre`` (of the non-differentiable z) is ignored."""
        saved_tensors = ctx.saved_tensors
        saved = saved_tensors[0] if saved_tensors else None
        shift = saved_tensors[1] if len(saved_tensors) > 1 else None
        want_x, want_residual, want_bias = ctx.want_x, ctx.want_residual, ctx.want_bias
        signature = None
        if getattr(ctx, "eager", False) and ctx.call.signature is not None:
            signature = ("grad", ctx.call.signature, want_x, want_residual, want_bias, tensor_signature(grad_y))
        plan = BACKWARD.plans.get(signature)  # hashable or None: the forward's signature was looked up
        if plan is not None:
            call = plan.call
        else:
            call = BiasActGradCall(ctx.call.activation, ctx.x_dtype, ctx.residual_dtype, ctx.bias_dtype, want_x,
                                   want_residual, want_bias, signature)
        gx, gr, gb = BACKWARD.run_in_backward(ctx, call, (grad_y, saved, shift, ctx.alpha), plan)
        return gx if want_x else None, gb if want_bias else None, gr if want_residual else None, None


FORWARD = BiasActForward()


# ---------------------------------------------------------------------------------------------- backward
class BiasActBackward(Op):
    """``fuselab::bias_act_bwd``: ``(grad_x, grad_residual, grad_bias)`` (empty where not wanted), one launch."""

    name = "fuselab::bias_act_bwd"
    schema = ("(Tensor grad, Tensor? saved, Tensor? shift, float alpha, str activation, ScalarType x_dtype, "
              "ScalarType residual_dtype, ScalarType bias_dtype, bool want_x, bool want_residual, bool want_bias) "
              "-> (Tensor, Tensor, Tensor)")

    plan = staticmethod(launch.plan_grad)
    forward = staticmethod(launch.forward_grad)

    def call_of(self, inputs: tuple, signed: bool) -> BiasActGradCall:
        return BiasActGradCall(*inputs[4:], signature=_signed("custom", inputs, 3) if signed else None)

    def fake(self, call: BiasActGradCall, operands: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        grad = operands[0]
        return (grad.new_empty(grad.shape, dtype=call.x_dtype) if call.want_x else grad.new_empty(0),
                grad.new_empty(grad.shape, dtype=call.residual_dtype) if call.want_residual else grad.new_empty(0),
                grad.new_empty(grad.shape[-1], dtype=call.bias_dtype) if call.want_bias else grad.new_empty(0))


BACKWARD = BiasActBackward()


def gradients(ctx, inputs: tuple, signature: Hashable | None) -> tuple:
    """:data:`BACKWARD` inside another op's backward (:class:`fuselab.nn.FusedLinear`'s): ``inputs`` as the custom op
    takes them, ``signature`` the call's (derived from the calling op's and the gradient's layout; None: planned
    anew; hashable). ``(grad_x, grad_residual, grad_bias)``."""
    plan = BACKWARD.plans.get(signature)
    call = plan.call if plan is not None else BiasActGradCall(*inputs[4:], signature=signature)
    return BACKWARD.run_in_backward(ctx, call, inputs[:4], plan)


# ---------------------------------------------------------------------------------------------- in place
class BiasActInplace(Op):
    """``fuselab::bias_act_``: x overwritten with the result (marked dirty), one launch."""

    name = "fuselab::bias_act_"
    schema = f"({_INPUTS.replace('Tensor x', 'Tensor(a0!) x')}) -> ()"
    mutates = ("x",)

    plan = staticmethod(launch.plan)
    forward = staticmethod(launch.forward_inplace)

    def call_of(self, inputs: tuple, signed: bool) -> BiasActCall:
        return BiasActCall(inputs[4], inplace=True, signature=_signed("custom", inputs, 3) if signed else None)

    def fake(self, call: BiasActCall, operands: tuple) -> None:
        return None


INPLACE = BiasActInplace()


# ---------------------------------------------------------------------------------------------- public API
def bias_act(
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    activation: str = "relu",
    inplace: bool = False,
) -> torch.Tensor:
    """``act(x + alpha * residual + bias)`` in one fused pass, differentiable.

    Args:
        x: ``(..., N)``, float32/bfloat16/float16 (float64 accepted, computed in float64), any strides.
        bias: ``(N,)`` or None, broadcast over the rows; may have another floating dtype than ``x``.
        residual: tensor of ``x``'s shape or None (e.g. a LoRA branch or a skip connection), any strides.
        alpha: Python float scaling ``residual``. It is a constant: no gradient flows to it.
        activation: one of :data:`ACTIVATIONS`: ``none``, ``relu``, ``relu2`` (relu squared), ``sigmoid``,
            ``silu``, ``gelu`` (exact, erf), ``gelu_tanh`` (tanh approximation).
        inplace: write the result into ``x`` and return ``x`` (inference only).

    Returns:
        ``y`` with ``x``'s shape and dtype, contiguous (when not in place). Math is float32 inside.

    Gradients flow to ``x``, ``residual`` (``alpha * grad``) and ``bias`` (fused column sum, deterministic).
    CUDA tensors run the Triton kernels, others the PyTorch reference (``FUSELAB_BACKEND`` overrides).
    A 2-D ``x`` (or one whose leading dims merge into rows without a copy) is read through its strides;
    other >2-D strided inputs are first copied by ``reshape``.

    Raises:
        TypeError: ``x``/``bias``/``residual`` not a floating tensor (integer dtypes), ``alpha`` not a float.
        ValueError: ``bias`` not of shape ``(N,)``; ``residual`` of another shape; unknown ``activation``
            (the message lists the valid ones); tensors on different devices; ``inplace=True`` when ``x``
            requires grad, or when grad mode is on and ``bias``/``residual`` require grad, or when ``x``'s elements
            share memory or ``x`` overlaps ``bias`` or ``residual``. On every backend, and on every call (a
            repeated call is checked like its first).
    """
    op = INPLACE if inplace else FORWARD
    signature = plan = None
    if not torch.compiler.is_compiling():
        try:  # everything the checks and the plan read besides values; alpha by its type (it is passed as a float)
            needs_grad = torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)
                                                      or (residual is not None and residual.requires_grad))
            signature = (tensor_signature(x), type(alpha), activation, needs_grad, inplace,
                         None if bias is None else tensor_signature(bias),
                         None if residual is None else tensor_signature(residual))
            plan = op.plans.get(signature)
        except (AttributeError, TypeError):  # not a tensor, an unhashable activation: validate names it
            signature = None
    if plan is not None and triton_for(x):  # a call of this signature passed the checks and was planned
        if inplace:
            checks.check_inplace(x, bias, residual)
            op.run(plan.call, (x, bias, residual, float(alpha)), plan, False)
            return x
        return op.run(plan.call, (x, bias, residual, float(alpha)), plan, needs_grad)[0]
    call = checks.validate(x, bias, residual, alpha, activation, inplace, signature)
    if not triton_for(x):
        if inplace:
            with torch.no_grad():
                x.copy_(ref.bias_act(x, bias, residual, float(alpha), activation))
            return x
        return ref.bias_act(x, bias, residual, float(alpha), activation)
    out = op.run(call, (x, bias, residual, float(alpha)))
    return x if inplace else out[0]
