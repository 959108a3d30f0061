"""Fused bias + scaled residual + activation: ``y = act(x + alpha * residual + bias)``, forward and backward.

Three :class:`~fuselab.ops._recordop.RecordOp`: :data:`FORWARD` (``fuselab::bias_act_fwd``, differentiable through
:func:`_backward`), :data:`BACKWARD` (``fuselab::bias_act_bwd``) and :data:`INPLACE` (``fuselab::bias_act_``), each
on the out-param launchers of :mod:`fuselab.ops.bias_act.launch`; then the public :func:`bias_act`.

What the backward keeps per element of ``x`` (see :data:`fuselab.core.activations.SAVED`):
``none`` nothing; ``relu``/``relu2``/``sigmoid`` the output ``y`` (no extra memory when the next layer keeps
its input, as every Linear does); ``silu``/``gelu``/``gelu_tanh`` the pre-activation ``z`` in ``x``'s dtype
when there is a residual; without one, ``x`` itself (and the bias), from which the backward rebuilds
``z = x + bias``: no extra write in the forward.
"""

from __future__ import annotations

import functools
import math

import torch

from fuselab.backend import triton_for, use_triton
from fuselab.core.activations import ACTIVATIONS, SAVED
from fuselab.ops._recordop import RecordOp, layout, operand
from fuselab.reference import bias_act as ref

from .checks import check_args, rows

__all__ = ["ACTIVATIONS", "BACKWARD", "FORWARD", "INPLACE", "bias_act"]


@functools.cache
def _launch():
    """The launchers, imported on first use (Triton must not load before ``TRITON_INTERPRET`` is set)."""
    from fuselab.ops.bias_act import launch

    return launch


def needs_pre(activation: str, residual) -> bool:
    """The backward needs a separately stored pre-activation: z = x + alpha*r + b has a residual in it.
    (Without residual the backward rebuilds z = x + bias from the saved x: no extra write in the forward.)"""
    return SAVED[activation] == "pre" and residual is not None


# ---------------------------------------------------------------------------------------------- forward
def _forward(x, bias, residual, alpha: float, activation: str, save_pre: bool, *, prepared=None) -> tuple:
    """((y contiguous like x, z when ``save_pre`` else None), launch record). The record is None off the Triton
    path, or when an operand had to be copied into rows (the launch then read the copy, not the caller's
    tensor); ``prepared`` repeats a kept record's launch."""
    y = x.new_empty(x.shape)
    pre = x.new_empty(x.shape) if save_pre else None
    if x.numel() == 0:  # no rows or an empty last dim: nothing to compute
        return (y, pre), None
    if prepared is not None:
        _launch().bias_act_fwd_again(prepared, x, bias, residual, y, pre, alpha)
        return (y, pre), None
    if use_triton(x.device):
        x2, r2 = rows(x), None if residual is None else rows(residual)
        record = _launch().bias_act_fwd_(x2, bias, r2, rows(y), rows(pre) if save_pre else None, alpha, activation)
        if x2.data_ptr() != x.data_ptr() or (residual is not None and r2.data_ptr() != residual.data_ptr()):
            record = None
        return (y, pre), record
    with torch.no_grad():
        acc = ref.compute_dtype(x.dtype)
        z = x.to(acc)
        if residual is not None:
            z = z + alpha * residual.to(acc)
        if bias is not None:
            z = z + bias.to(acc)
        y.copy_(ref.activation(z, activation))
        if save_pre:
            pre.copy_(z)
    return (y, pre), None


def _forward_fake(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, alpha: float,
                  activation: str, save_pre: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape if save_pre else (0,))


def _setup_context(ctx, inputs, output) -> None:
    x, bias, residual, alpha, activation, save_pre = inputs
    y, pre = output
    if pre is not None:  # the second output (z, or an empty tensor when z is not kept)
        ctx.mark_non_differentiable(pre)
    kind = SAVED[activation]
    if kind == "output":
        ctx.save_for_backward(y)
    elif kind == "pre":
        if needs_pre(activation, residual) and not save_pre:
            raise RuntimeError("fuselab::bias_act_fwd ran without save_pre but its backward needs z")
        if save_pre:
            ctx.save_for_backward(pre)
        else:  # the backward rebuilds z = x + bias
            ctx.save_for_backward(x, bias)
    else:
        ctx.save_for_backward()
    ctx.alpha, ctx.activation = alpha, activation
    ctx.dtypes = (x.dtype, (residual if residual is not None else x).dtype, (bias if bias is not None else x).dtype)
    ctx.present = (bias is not None, residual is not None)


def _backward(ctx, grad_y, grad_pre) -> tuple:
    """Gradients of ``(x, bias, residual, alpha, activation, save_pre)``: one :data:`BACKWARD` launch. In eager
    autograd its launch is kept under the forward's key and the gradient's layout (the autograd thread then
    skips the plan). ``grad_pre`` (of the non-differentiable z) is ignored."""
    saved_tensors = ctx.saved_tensors
    saved = saved_tensors[0] if saved_tensors else None
    shift = saved_tensors[1] if len(saved_tensors) > 1 else None
    has_bias, has_residual = ctx.present
    want_x = ctx.needs_input_grad[0]
    want_b = has_bias and ctx.needs_input_grad[1]
    want_r = has_residual and ctx.needs_input_grad[2]
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("bias_act", key, want_x, want_r, want_b, layout(grad_y))
    gx, gr, gb = BACKWARD.run_in_backward(
        ctx, (grad_y, saved, shift, ctx.alpha, ctx.activation, *ctx.dtypes, want_x, want_r, want_b), key)
    return (gx if want_x else None, gb if want_b else None, gr if want_r else None, None, None, None)


FORWARD = RecordOp("fuselab::bias_act_fwd", eager=_forward, fake=_forward_fake,
                   autograd=(_setup_context, _backward), differentiable=(0, 1, 2))


# ---------------------------------------------------------------------------------------------- backward
def _backward_launch(grad, saved, shift, alpha: float, activation: str, x_dtype, residual_dtype, bias_dtype,
                     want_x: bool, want_residual: bool, want_bias: bool, *, prepared=None) -> tuple:
    """((grad_x, grad_residual, grad_bias), launch record): None for the gradients not wanted. The record is kept
    only for a contiguous gradient read in place (what ``prepared`` launches assume)."""
    dev = grad.device
    if prepared is not None:  # gradients laid out like the prepared launch's: empty_like is the cheapest allocation
        gx = torch.empty_like(grad, dtype=x_dtype) if want_x else None
        gr = torch.empty_like(grad, dtype=residual_dtype) if want_residual else None
        gb = torch.empty(grad.shape[-1], dtype=bias_dtype, device=dev) if want_bias else None
        _launch().bias_act_bwd_again(prepared, grad, saved, shift, alpha, gx, gr, gb)
        return (gx, gr, gb), None
    if not use_triton(dev):
        if shift is not None:
            saved = saved.to(ref.compute_dtype(saved.dtype)) + shift.to(ref.compute_dtype(saved.dtype))
        grads = ref.bias_act_backward(grad, saved, alpha, activation, x_dtype if want_x else None,
                                      residual_dtype if want_residual else None, bias_dtype if want_bias else None)
        return grads, None
    launch = _launch()
    n = grad.shape[-1]
    gx = torch.empty(grad.shape, dtype=x_dtype, device=dev) if want_x else None
    gr = torch.empty(grad.shape, dtype=residual_dtype, device=dev) if want_residual else None
    gb = torch.empty(n, dtype=bias_dtype, device=dev) if want_bias else None
    if grad.numel() == 0:  # no rows (the bias gradient sums none: zeros) or an empty last dim
        return (gx, gr, None if gb is None else gb.zero_()), None
    g2 = rows(grad)
    partial = launch.bias_grad_partials(g2.shape[0], n, grad.dtype, dev) if want_bias else None
    record = launch.bias_act_bwd_(g2, None if saved is None else rows(saved), shift, alpha, activation,
                                  None if gx is None else rows(gx), None if gr is None else rows(gr), partial, gb)
    if not (grad.is_contiguous() and g2.stride() == (n, 1) and grad.data_ptr() & 15 == 0
            and (saved is None or saved.dim() == 2 or saved.is_contiguous())):
        record = None
    return (gx, gr, gb), record


def _backward_fake(grad: torch.Tensor, saved: torch.Tensor | None, shift: torch.Tensor | None, alpha: float,
                   activation: str, x_dtype: torch.dtype, residual_dtype: torch.dtype, bias_dtype: torch.dtype,
                   want_x: bool, want_residual: bool,
                   want_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (grad.new_empty(grad.shape, dtype=x_dtype) if want_x else grad.new_empty(0),
            grad.new_empty(grad.shape, dtype=residual_dtype) if want_residual else grad.new_empty(0),
            grad.new_empty(grad.shape[-1], dtype=bias_dtype) if want_bias else grad.new_empty(0))


BACKWARD = RecordOp("fuselab::bias_act_bwd", eager=_backward_launch, fake=_backward_fake)


# ---------------------------------------------------------------------------------------------- in place
def _inplace(x, bias, residual, alpha: float, activation: str, *, prepared=None) -> tuple:
    """x = act(x + alpha * residual + bias) in place: (x, None)."""
    if not use_triton(x.device):
        with torch.no_grad():
            x.copy_(ref.bias_act(x, bias, residual, alpha, activation))
        return x, None
    launch = _launch()
    r2 = None if residual is None else rows(residual)
    try:
        x2 = x if x.dim() == 2 else x.view(math.prod(x.shape[:-1]), x.shape[-1])
    except RuntimeError:  # leading dims cannot be viewed as rows: compute into a buffer, copy back (documented)
        x2 = None
    if x2 is not None:
        launch.bias_act_fwd_(x2, bias, r2, x2, None, alpha, activation)
    else:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        launch.bias_act_fwd_(rows(x), bias, r2, rows(out), None, alpha, activation)
        x.copy_(out)
    return x, None


def _inplace_fake(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, alpha: float,
                  activation: str) -> None:
    return None


INPLACE = RecordOp("fuselab::bias_act_", eager=_inplace, fake=_inplace_fake, mutates_args=("x",))


# ---------------------------------------------------------------------------------------------- public API
def _requires_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _call_key(x, bias, residual, alpha, activation: str, needs_grad: bool) -> tuple:
    """Everything an eager call's checks and forward launch depend on besides tensor values: each operand's
    shape, strides, dtype, device, storage offset and 16-byte alignment, ``alpha``'s type, the activation and
    whether autograd records the call (it decides whether z is written). Raises AttributeError/TypeError for
    non-tensor operands or an unhashable activation (the checks then name the argument)."""
    return (operand(x), type(alpha), activation, needs_grad, None if bias is None else operand(bias),
            None if residual is None else operand(residual))


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
            requires grad, or when grad mode is on and ``bias``/``residual`` require grad.
    """
    key = None
    compiling = torch.compiler.is_compiling()
    if not inplace and not compiling:
        try:
            needs_grad = _requires_grad(x, bias, residual)
            key = _call_key(x, bias, residual, alpha, activation, needs_grad)
            prepared = FORWARD.launches.get(key)
        except (AttributeError, TypeError):  # not a tensor, an unhashable activation: the checks name it
            key = prepared = None
        if prepared is not None and triton_for(x):  # a call of this key passed the checks below before
            save_pre = needs_grad and needs_pre(activation, residual)
            return FORWARD.run((x, bias, residual, float(alpha), activation, save_pre), key, prepared, needs_grad)[0]
    check_args(x, bias, residual, alpha, activation)
    alpha = float(alpha)
    if inplace:
        if x.requires_grad:
            raise ValueError("inplace=True on x that requires grad is unsafe; use inplace=False")
        if _requires_grad(bias, residual):
            raise ValueError("inplace=True does not support autograd: bias/residual require grad; "
                             "use inplace=False")
        INPLACE.run((x, bias, residual, alpha, activation), needs_grad=False)
        return x
    needs_grad = _requires_grad(x, bias, residual)
    if not compiling and not use_triton(x.device):
        return ref.bias_act(x, bias, residual, alpha, activation)
    save_pre = needs_grad and needs_pre(activation, residual)
    return FORWARD.run((x, bias, residual, alpha, activation, save_pre), key, None, needs_grad)[0]
