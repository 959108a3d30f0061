"""The fused dot interaction: two :class:`~fuselab.ops._recordop.RecordOp` and the public :func:`dot_interaction`.

:data:`FORWARD` (``fuselab::dot_interaction``, differentiable through :func:`_backward`) and :data:`BACKWARD`
(``fuselab::dot_interaction_bwd``), each on an out-param launcher of :mod:`fuselab.ops.interaction.launch`. Eager
calls skip the dispatcher (tens of µs of host time per call); under ``torch.compile`` the custom ops are traced (no
graph break). CUDA tensors run the Triton kernels, others the PyTorch reference (:mod:`fuselab.reference.interaction`);
``FUSELAB_BACKEND`` overrides (see :mod:`fuselab.backend`).

An eager call whose :func:`_call_key` a checked call kept skips the checks, the plan and Triton's argument binding;
its backward repeats the launch kept under the forward's key and the gradient's layout. The backward keeps the
inputs ``dense`` and ``emb`` (already alive in a DLRM: the bottom MLP's output and the lookup's output), nothing else.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from fuselab.backend import triton_for
from fuselab.ops._recordop import RecordOp, layout, operand
from fuselab.ops.interaction.launch import (
    check_inputs,
    dot_interaction_bwd_,
    launch_bwd,
    launch_bwd_again,
    launch_fwd,
    launch_fwd_again,
)
from fuselab.reference import interaction as ref

__all__ = ["BACKWARD", "FORWARD", "dot_interaction"]


# ---------------------------------------------------------------------------------------------- forward
def _forward(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, pad_to: int, *,
             prepared=None) -> tuple:
    """((B, W) contiguous in the inputs' dtype, launch record). ``prepared`` (a kept ``(record, width)``) repeats that
    launch; otherwise the inputs are checked (a direct call of the custom op) and the launch planned."""
    if prepared is not None:
        out = torch.empty((dense.shape[0], prepared[1]), dtype=dense.dtype, device=dense.device)
        launch_fwd_again(prepared[0], dense, emb, out)
        return out, None
    check_inputs(dense, emb, pad_to)
    b, f, d = emb.shape
    if not triton_for(dense):
        with torch.no_grad():
            return ref.dot_interaction(dense, emb, self_interaction, pad_to), None
    width = ref.output_width(f, d, self_interaction, pad_to)
    out = torch.empty((b, width), dtype=dense.dtype, device=dense.device)
    record = launch_fwd(dense, emb, out, self_interaction)
    return out, (None if record is None else (record, width))


def _forward_fake(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, pad_to: int) -> torch.Tensor:
    b, f, d = emb.shape
    return dense.new_empty((b, ref.output_width(f, d, self_interaction, pad_to)))


def _setup_context(ctx, inputs, output) -> None:
    dense, emb, self_interaction, _pad_to = inputs
    ctx.save_for_backward(dense, emb)
    ctx.self_interaction = self_interaction


def _gradients(ctx, grad: torch.Tensor) -> tuple:
    """Gradients of ``(dense, emb, self_interaction, pad_to)``: one :data:`BACKWARD` launch, kept in eager autograd
    under the forward's key and the gradient's layout (the autograd thread then skips the plan)."""
    dense, emb = ctx.saved_tensors
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("bwd", key, layout(grad))
    grad_dense, grad_emb = BACKWARD.run_in_backward(ctx, (grad, dense, emb, ctx.self_interaction), key)
    return (grad_dense if ctx.needs_input_grad[0] else None, grad_emb if ctx.needs_input_grad[1] else None,
            None, None)


_gradients_once = once_differentiable(_gradients)  # the backward kernels are not differentiable


def _backward(ctx, grad: torch.Tensor) -> tuple:
    """:func:`_gradients`; with ``create_graph=True`` first order only (a double backward raises)."""
    if torch.is_grad_enabled():
        return _gradients_once(ctx, grad)
    return _gradients(ctx, grad)


FORWARD = RecordOp("fuselab::dot_interaction", eager=_forward, fake=_forward_fake,
                   autograd=(_setup_context, _backward), differentiable=(0, 1))


# ---------------------------------------------------------------------------------------------- backward
def _backward_launch(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, *,
                     prepared=None) -> tuple:
    """((grad_dense (B, D), grad_emb (B, F, D)) contiguous in the inputs' dtype, launch record). The record is kept
    only for a gradient read as it is (not cast to the inputs' dtype first)."""
    cast = grad.dtype != dense.dtype
    if cast:  # e.g. an upstream op that returned float32 for a bf16 output
        grad = grad.to(dense.dtype)
    if prepared is not None:
        grad_dense = torch.empty(dense.shape, dtype=dense.dtype, device=dense.device)
        grad_emb = torch.empty(emb.shape, dtype=emb.dtype, device=emb.device)
        launch_bwd_again(prepared, grad, dense, emb, grad_dense, grad_emb)
        return (grad_dense, grad_emb), None
    if not triton_for(dense):
        with torch.no_grad():
            return ref.dot_interaction_backward(grad, dense, emb, self_interaction), None
    grad_dense = torch.empty(dense.shape, dtype=dense.dtype, device=dense.device)
    grad_emb = torch.empty(emb.shape, dtype=emb.dtype, device=emb.device)
    b, f, d = emb.shape
    if (grad.dim() == 2 and grad.shape[0] == b and grad.shape[1] >= d + ref.num_pairs(f, self_interaction)
            and grad.device == dense.device):
        record = launch_bwd(grad, dense, emb, grad_dense, grad_emb, self_interaction)  # autograd's grad
    else:  # a direct call of the custom op: the checked launcher names what is wrong
        record = dot_interaction_bwd_(grad, dense, emb, grad_dense, grad_emb, self_interaction)
    return (grad_dense, grad_emb), (None if cast else record)


def _backward_fake(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor,
                   self_interaction: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return dense.new_empty(dense.shape), emb.new_empty(emb.shape)


BACKWARD = RecordOp("fuselab::dot_interaction_bwd", eager=_backward_launch, fake=_backward_fake)


# ---------------------------------------------------------------------------------------------- public API
def _call_key(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, pad_to: int) -> tuple:
    """Everything the checks and the forward launch of an eager call depend on besides tensor values: each
    operand's shape, device, dtype, strides, storage offset and 16-byte alignment, the flag, ``pad_to`` (and its
    type: ``True`` is not an int here). Raises AttributeError/TypeError for non-tensors (the checks name them)."""
    return operand(dense), operand(emb), self_interaction, type(pad_to), pad_to


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
    """
    self_interaction = bool(self_interaction)
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = _call_key(dense, emb, self_interaction, pad_to)
            prepared = FORWARD.launches.get(key)
        except (AttributeError, TypeError):  # not tensors, an unhashable pad_to: the checks name them
            key = prepared = None
        if prepared is not None and triton_for(dense):  # a call of this key passed the checks below before
            return FORWARD.run((dense, emb, self_interaction, pad_to), key, prepared)
    check_inputs(dense, emb, pad_to)
    return FORWARD.run((dense, emb, self_interaction, pad_to), key)
