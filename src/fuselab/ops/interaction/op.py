"""The fused dot interaction as an op: allocating forward/backward -> ``torch.library`` custom ops
``fuselab::dot_interaction`` / ``fuselab::dot_interaction_bwd`` (fake kernels, ``register_autograd``) -> the public
:func:`dot_interaction`.

Eager calls skip the dispatcher (tens of µs of host time per call): without grad they go straight to the
allocating forward, with grad through :class:`_DotInteractionFunction`; under ``torch.compile`` the custom ops are
traced (no graph break). CUDA tensors run the Triton kernels, others the PyTorch reference
(:mod:`fuselab.reference.interaction`); ``FUSELAB_BACKEND`` overrides (see :mod:`fuselab.backend`).

The backward keeps the inputs ``dense`` and ``emb`` (already alive in a DLRM: the bottom MLP's output and the
lookup's output), nothing else.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from fuselab.backend import triton_for
from fuselab.ops.interaction.launch import check_inputs, dot_interaction_bwd_, launch_bwd, launch_fwd
from fuselab.reference import interaction as ref


def _forward(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, pad_to: int) -> torch.Tensor:
    """Allocating forward: (B, W) contiguous, in the inputs' dtype."""
    b, f, d = emb.shape
    if not triton_for(dense):
        with torch.no_grad():
            return ref.dot_interaction(dense, emb, self_interaction, pad_to)
    out = torch.empty((b, ref.output_width(f, d, self_interaction, pad_to)), dtype=dense.dtype, device=dense.device)
    launch_fwd(dense, emb, out, self_interaction)  # dense and emb checked by the caller
    return out


def _backward(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor,
              self_interaction: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocating backward: (grad_dense (B, D), grad_emb (B, F, D)) contiguous, in the inputs' dtype."""
    if grad.dtype != dense.dtype:  # e.g. an upstream op that returned float32 for a bf16 output
        grad = grad.to(dense.dtype)
    if not triton_for(dense):
        with torch.no_grad():
            return ref.dot_interaction_backward(grad, dense, emb, self_interaction)
    grad_dense = torch.empty(dense.shape, dtype=dense.dtype, device=dense.device)
    grad_emb = torch.empty(emb.shape, dtype=emb.dtype, device=emb.device)
    b, f, d = emb.shape
    if (grad.dim() == 2 and grad.shape[0] == b and grad.shape[1] >= d + ref.num_pairs(f, self_interaction)
            and grad.device == dense.device):
        launch_bwd(grad, dense, emb, grad_dense, grad_emb, self_interaction)  # autograd's grad of a checked call
    else:  # a direct call of the custom op: the checked launcher names what is wrong
        dot_interaction_bwd_(grad, dense, emb, grad_dense, grad_emb, self_interaction)
    return grad_dense, grad_emb


@torch.library.custom_op("fuselab::dot_interaction", mutates_args=())
def _fwd_op(dense: torch.Tensor, emb: torch.Tensor, self_interaction: bool, pad_to: int) -> torch.Tensor:
    check_inputs(dense, emb, pad_to)
    return _forward(dense, emb, self_interaction, pad_to)


@_fwd_op.register_fake
def _(dense, emb, self_interaction, pad_to):
    b, f, d = emb.shape
    return dense.new_empty((b, ref.output_width(f, d, self_interaction, pad_to)))


@torch.library.custom_op("fuselab::dot_interaction_bwd", mutates_args=())
def _bwd_op(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor,
            self_interaction: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward(grad, dense, emb, self_interaction)


@_bwd_op.register_fake
def _(grad, dense, emb, self_interaction):
    return dense.new_empty(dense.shape), emb.new_empty(emb.shape)


def _setup_context(ctx, inputs, output) -> None:
    dense, emb, self_interaction, _pad_to = inputs
    ctx.save_for_backward(dense, emb)
    ctx.self_interaction = self_interaction


def _autograd_backward(ctx, grad):
    dense, emb = ctx.saved_tensors
    grad_dense, grad_emb = torch.ops.fuselab.dot_interaction_bwd(grad, dense, emb, ctx.self_interaction)
    return (grad_dense if ctx.needs_input_grad[0] else None, grad_emb if ctx.needs_input_grad[1] else None,
            None, None)


torch.library.register_autograd("fuselab::dot_interaction", _autograd_backward, setup_context=_setup_context)


class _DotInteractionFunction(torch.autograd.Function):
    """Eager autograd straight to :func:`_forward` / :func:`_backward` (no dispatcher on either side)."""

    @staticmethod
    def forward(ctx, dense, emb, self_interaction, pad_to):
        out = _forward(dense, emb, self_interaction, pad_to)
        _setup_context(ctx, (dense, emb, self_interaction, pad_to), out)
        return out

    @staticmethod
    @once_differentiable  # the backward kernels are not differentiable: double backward raises
    def backward(ctx, grad):
        dense, emb = ctx.saved_tensors
        grad_dense, grad_emb = _backward(grad, dense, emb, ctx.self_interaction)
        return (grad_dense if ctx.needs_input_grad[0] else None, grad_emb if ctx.needs_input_grad[1] else None,
                None, None)


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
    check_inputs(dense, emb, pad_to)
    self_interaction = bool(self_interaction)
    if torch.compiler.is_compiling():
        return torch.ops.fuselab.dot_interaction(dense, emb, self_interaction, pad_to)
    if torch.is_grad_enabled() and (dense.requires_grad or emb.requires_grad):
        return _DotInteractionFunction.apply(dense, emb, self_interaction, pad_to)
    return _forward(dense, emb, self_interaction, pad_to)
