"""Deterministic ``sum`` and ``mean`` over any axes, at the memory roofline.

Layers: the planner and out-param launcher (:mod:`fuselab.ops.reduce.launch`: kernel, tiles, split) and the Triton
kernels (:mod:`fuselab.ops.reduce.kernels`) -> the :class:`~fuselab.ops._recordop.RecordOp` :data:`REDUCE`
(``fuselab::reduce``; the gradient is a broadcast, scaled by ``1/n`` for the mean) -> the public :func:`sum` and
:func:`mean`. Tensors that are not on CUDA take the pure-PyTorch path (:mod:`fuselab.reference.reduce`) unless
``FUSELAB_BACKEND=triton`` (see :mod:`fuselab.backend`).
"""

from __future__ import annotations

import functools
import math

import torch

from fuselab.backend import triton_for, use_triton
from fuselab.ops._recordop import RecordOp
from fuselab.ops._tickets import scratch
from fuselab.reference import reduce as ref

from . import plan as planner

__all__ = ["mean", "sum"]

Dim = ref.Dim


@functools.cache
def _launch():
    """The launcher, imported on first use (Triton must not load before ``TRITON_INTERPRET`` is set)."""
    from fuselab.ops.reduce import launch

    return launch


def _plan_call(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool, out_dtype: torch.dtype) -> tuple:
    """(the tensor the kernels read: ``x`` or its one layout copy, (output shape, output dtype, plan,
    accumulation dtype))."""
    src, kept, red = planner.prepare(x, dims)
    return src, (ref.output_shape(x, dims, keepdim), out_dtype, planner.plan_reduction(src, kept, red),
                 ref.accumulate_dtype(x.dtype, out_dtype))


def _run_planned(src: torch.Tensor, dims: tuple[int, ...], planned: tuple, is_mean: bool) -> torch.Tensor:
    """Allocate the output (contiguous) and, for split reductions, the partials workspace; launch."""
    out_shape, out_dtype, plan, acc = planned[:4]
    out = torch.empty(out_shape, dtype=out_dtype, device=src.device)
    n = planner.workspace_numel(plan)
    workspace = scratch(src.device, (n,), acc) if n else None  # written before it is read: per-stream scratch
    _launch().reduce_into(src, dims, out, workspace, plan=plan, is_mean=is_mean)
    return out


def _reduce(x: torch.Tensor, dims: list[int], keepdim: bool, is_mean: bool, out_dtype: torch.dtype, *,
            prepared=None) -> tuple:
    """Allocating op: (the output (contiguous; for split reductions with an fp32 partials workspace), the plan when
    ``x`` is read in place, and the reduced axes: the record a call key keeps). ``prepared``: a kept record."""
    if prepared is not None:
        return _run_planned(x, (), prepared, is_mean), None
    dims = tuple(dims)
    src, planned = _plan_call(x, dims, keepdim, out_dtype)
    return _run_planned(src, dims, planned, is_mean), ((*planned, dims) if src is x else None)


def _reduce_fake(x: torch.Tensor, dims: list[int], keepdim: bool, is_mean: bool,
                 out_dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty(ref.output_shape(x, tuple(dims), keepdim), dtype=out_dtype)


def _setup_context(ctx, inputs, output) -> None:
    x, dims, keepdim, is_mean, _ = inputs
    ctx.x_shape = x.shape
    ctx.x_dtype = x.dtype
    ctx.dims = tuple(dims)
    ctx.keepdim = keepdim
    ctx.is_mean = is_mean


def _backward(ctx, grad: torch.Tensor):
    return broadcast_grad(grad, ctx.x_shape, ctx.x_dtype, ctx.dims, ctx.keepdim, ctx.is_mean), None, None, None, None


REDUCE = RecordOp("fuselab::reduce", eager=_reduce, fake=_reduce_fake, autograd=(_setup_context, _backward))


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


def _call_key(x: torch.Tensor, dim: Dim, keepdim: bool, dtype: torch.dtype | None, op: str) -> tuple | None:
    """What the checks and the plan of an eager call on the Triton path depend on: (shape, strides, dtype, device,
    dim, keepdim, dtype, op); None for calls that cannot keep a plan (integer/bool inputs are converted first, a
    copy the plan cannot stand for; compiling; not a plain tensor)."""
    if type(x) is not torch.Tensor or not x.is_floating_point() or torch.compiler.is_compiling():
        return None
    return x.shape, x.stride(), x.dtype, x.device, dim, keepdim, dtype, op


def _dispatch(x: torch.Tensor, dim: Dim, keepdim: bool, dtype: torch.dtype | None, op: str) -> torch.Tensor:
    key = _call_key(x, dim, keepdim, dtype, op)
    prepared = REDUCE.kept(key)
    if prepared is not None and triton_for(x):  # a checked call of this key kept its plan
        return REDUCE.run((x, list(prepared[4]), keepdim, op == "mean", prepared[1]), key, prepared)
    out_dtype = ref.result_dtype(x, dtype, op)
    dims = ref.normalize_dims(x, dim)
    if not isinstance(keepdim, bool):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    reference = ref.sum if op == "sum" else ref.mean
    if not use_triton(x.device):
        return reference(x, dims, keepdim, dtype=out_dtype)
    if not x.is_floating_point():
        x = x.to(out_dtype)  # integer/bool input with dtype=: converted first, as torch does (a copy)
    if x.numel() == 0:
        # empty input or empty reduced axes: torch's result (sum 0, mean NaN) and its warnings
        return reference(x, dims, keepdim, dtype=out_dtype)
    return REDUCE.run((x, list(dims), keepdim, op == "mean", out_dtype), key)


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
    """
    return _dispatch(x, dim, keepdim, dtype, "sum")


def mean(x: torch.Tensor, dim: Dim = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``dim``: deterministic, accumulated in float32; NaN over empty axes (as torch).

    Same arguments, dtypes, errors and determinism as :func:`sum`; the gradient is the output gradient
    broadcast over the reduced axes and divided by their element count.
    """
    return _dispatch(x, dim, keepdim, dtype, "mean")

