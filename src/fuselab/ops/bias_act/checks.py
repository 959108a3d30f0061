"""Argument checks of :func:`fuselab.bias_act` (also used by the CUDA C++ backend, :mod:`fuselab.cuda`)."""

from __future__ import annotations

import math

import torch

from fuselab.core.activations import ACTIVATIONS
from fuselab.core.checks import require_float, require_same_device, require_tensor


def check_activation(activation: str) -> str:
    """``activation`` if it names one of :data:`~fuselab.core.activations.ACTIVATIONS`; else ``ValueError``
    listing them."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def check_args(x, bias, residual, alpha, activation) -> None:
    """The checks of :func:`fuselab.bias_act`: ``TypeError``/``ValueError`` naming the argument."""
    require_tensor("x", x)
    require_float("x", x)
    check_activation(activation)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a Python float, got {type(alpha).__name__}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dim (..., N), got a 0-dim tensor")
    n = x.shape[-1]
    if bias is not None:
        require_float("bias", bias)
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"bias must have shape ({n},) (the last dim of x), got {tuple(bias.shape)}")
    if residual is not None:
        require_float("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    require_same_device(x=x, bias=bias, residual=residual)


def rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[M, N]`` view (strides kept), M the product of the leading dims (named, not inferred: an
    empty ``t`` has no single M). Leading dims that cannot be merged without a copy (exotic >2-D strides) fall
    back to ``reshape``, i.e. a copy: documented limit."""
    if t.dim() == 2:
        return t
    shape = (math.prod(t.shape[:-1]), t.shape[-1])
    try:
        return t.view(shape)
    except RuntimeError:
        return t.reshape(shape)
