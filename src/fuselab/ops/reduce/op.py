"""Deterministic ``sum`` and ``mean`` over any axes, at the memory roofline (semantics: ``docs/reduce.md``).

``sum``/``mean`` -> :func:`~fuselab.ops.reduce.checks.validate` -> :class:`~fuselab.ops.reduce.checks.ReduceCall`
-> :func:`~fuselab.ops.reduce.launch.plan` (the schedule of :mod:`fuselab.ops.reduce.plan`) ->
:func:`~fuselab.ops.reduce.launch.forward` -> the kernel. One :class:`~fuselab.ops.opdef.Op`, :data:`REDUCE`
(``fuselab::reduce``; the gradient is a broadcast, scaled by ``1/n`` for the mean). Tensors that are not on CUDA take
the pure-PyTorch path (:mod:`fuselab.reference.reduce`) unless ``FUSELAB_BACKEND=triton`` (see
:mod:`fuselab.backend`). An eager call whose signature was planned skips the checks and the plan.
"""

from __future__ import annotations

import math

import torch

from fuselab.backend import triton_for
from fuselab.ops.opdef import Op, tensor_signature
from fuselab.reference import reduce as ref

from . import checks, launch
from .checks import ReduceCall

__all__ = ["REDUCE", "mean", "sum"]

Dim = ref.Dim


class Reduce(Op):
    """``fuselab::reduce``: the sum or mean of x over ``dims`` into a new contiguous tensor, one launch."""

    name = "fuselab::reduce"
    schema = "(Tensor x, int[] dims, bool keepdim, bool is_mean, ScalarType out_dtype) -> Tensor"

    plan = staticmethod(launch.plan)
    forward = staticmethod(launch.forward)

    def call_of(self, inputs: tuple, signed: bool) -> ReduceCall:
        x, dims, keepdim, is_mean, out_dtype = inputs
        dims = tuple(dims)
        signature = ("custom", tensor_signature(x), dims, keepdim, is_mean, out_dtype) if signed else None
        return checks.reduce_call(x, dims, keepdim, "mean" if is_mean else "sum", out_dtype, signature)

    def fake(self, call: ReduceCall, operands: tuple) -> torch.Tensor:
        return operands[0].new_empty(call.out_shape, dtype=call.out_dtype)

    def setup_context(self, ctx, call: ReduceCall, operands: tuple, output: torch.Tensor) -> None:
        ctx.x_shape, ctx.x_dtype = operands[0].shape, operands[0].dtype

    def backward(self, ctx, grad: torch.Tensor) -> tuple[torch.Tensor]:
        call = ctx.call
        return (broadcast_grad(grad, ctx.x_shape, ctx.x_dtype, call.dims, call.keepdim, call.is_mean),)


REDUCE = Reduce()


def broadcast_grad(grad: torch.Tensor, x_shape, x_dtype: torch.dtype, dims: tuple[int, ...], keepdim: bool,
                   is_mean: bool) -> torch.Tensor:
    """d(sum)/dx: ``grad`` broadcast back over the reduced axes (an expanded view, no copy);
    the mean scales it by ``1/n`` first (in the accumulation dtype, on the small output)."""
    if is_mean:
        n = math.prod(x_shape[d] for d in dims)
        grad = (grad.to(ref.accumulate_dtype(grad.dtype, x_dtype)) / n)
    grad = grad.to(x_dtype)
    if not keepdim:
        for d in dims:  # ascending: each unsqueeze restores an axis at its original position
            grad = grad.unsqueeze(d)
    return grad.expand(x_shape)


def _reduce(x: torch.Tensor, dim: Dim, keepdim: bool, dtype: torch.dtype | None, reduction: str) -> torch.Tensor:
    """:func:`sum` or :func:`mean` (``reduction``)."""
    signature = plan = None
    if type(x) is torch.Tensor and x.is_floating_point() and not torch.compiler.is_compiling():
        # integer/bool inputs are converted first (a copy the plan cannot stand for): never cached. The types of dim
        # and keepdim too: 1 == True == 1.0 as dict keys, and the checks refuse the last two
        try:
            signature = (tensor_signature(x), dim, type(dim) if type(dim) is not tuple else tuple(map(type, dim)),
                         keepdim, type(keepdim), dtype, reduction)
            plan = REDUCE.plans.get(signature)
        except TypeError:  # an unhashable dim (a list): validated, never cached
            signature = None
    if plan is not None and triton_for(x):  # a call of this signature passed the checks and was planned
        return REDUCE.run(plan.call, (x,), plan)
    call = checks.validate(x, dim, keepdim, dtype, reduction, signature)
    reference = ref.sum if reduction == "sum" else ref.mean
    if not triton_for(x):
        return reference(x, call.dims, keepdim, dtype=call.out_dtype)
    if not x.is_floating_point():
        x = x.to(call.out_dtype)  # integer/bool input with dtype=: converted first, as torch does (a copy)
    if x.numel() == 0:
        # empty input or empty reduced axes: torch's result (sum 0, mean NaN) and its warnings
        return reference(x, call.dims, keepdim, dtype=call.out_dtype)
    return REDUCE.run(call, (x,))


def sum(x: torch.Tensor, dim: Dim = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum of ``x`` over ``dim``: deterministic, accumulated in float32.

    Args:
        x: float32, bfloat16 or float16 tensor (float64 accumulates in float64; integer/bool inputs
            need ``dtype``), any shape and strides, on CUDA (Triton kernels) or any other device
            (pure PyTorch).
        dim: ``None`` or ``()`` for every element, an axis (negative counts from the end), or a tuple of axes.
        keepdim: keep the reduced axes with size 1.
        dtype: output dtype (float32, bfloat16, float16, float64); default: ``x.dtype``.

    Returns:
        A new contiguous tensor of shape ``x.shape`` without (or with size-1) reduced axes. The same
        input on the same device gives the same bits on every run (fixed reduction trees, no atomics).
        Empty reduced axes give 0, like ``torch.sum``. The gradient is the output gradient broadcast
        over the reduced axes.

    Raises:
        TypeError: ``x`` is not a tensor, is complex, or is integer/bool without ``dtype``; ``dtype``
            is not a floating dtype; ``dim`` is not an int/tuple of ints; ``keepdim`` is not a bool.
        ValueError: an axis in ``dim`` is out of range or repeated.
        On every backend, and on every call (a repeated call is checked like its first).
    """
    return _reduce(x, dim, keepdim, dtype, "sum")


def mean(x: torch.Tensor, dim: Dim = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``dim``: deterministic, accumulated in float32; NaN over empty axes (as torch).

    Same arguments, dtypes, errors and determinism as :func:`sum`; the gradient is the output gradient
    broadcast over the reduced axes and divided by their element count.
    """
    return _reduce(x, dim, keepdim, dtype, "mean")
