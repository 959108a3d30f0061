"""Argument checks of :func:`fuselab.bias_act` (see ``docs/bias_act.md``): :func:`validate` turns its arguments into a
:class:`BiasActCall` or raises ``TypeError``/``ValueError`` naming the argument; :func:`check_inplace` holds the
checks of values an in-place call runs on every call. :func:`check_args`, :func:`check_activation` and :func:`rows`
serve the CUDA C++ backend (:mod:`fuselab.cuda`) and the GEMM family too."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from fuselab.core.activations import ACTIVATIONS, SAVED
from fuselab.core.checks import (
    require_disjoint,
    require_distinct_elements,
    require_float,
    require_same_device,
    require_tensor,
)


@dataclass(frozen=True, slots=True, eq=False)
class BiasActCall:
    """One validated epilogue ``act(x + alpha * residual + bias)`` (of :func:`fuselab.bias_act`, or of
    :class:`fuselab.nn.FusedLinear` on its matmul output).

    The custom op's arguments after its operands (:meth:`arguments`): ``activation`` (a name of
    :data:`~fuselab.core.activations.ACTIVATIONS`) and, out of place, ``save_pre`` (the forward also writes the
    pre-activation z for the backward). Derived by the checks: ``inplace`` (the result is written into x);
    ``signature`` (see :mod:`fuselab.ops.opdef`)."""

    activation: str
    save_pre: bool = False
    inplace: bool = False
    signature: Hashable | None = None

    def arguments(self) -> tuple:
        return (self.activation,) if self.inplace else (self.activation, self.save_pre)


@dataclass(frozen=True, slots=True, eq=False)
class BiasActGradCall:
    """One backward of the epilogue: ``dz = grad * act'(saved [+ shift])``; ``grad_x = dz``, ``grad_residual = alpha *
    dz``, ``grad_bias`` the column sum of dz, each in its input's dtype and only where ``want_*`` asks for it. Its
    fields are the custom op's arguments after the operands (:meth:`arguments`), in that order."""

    activation: str
    x_dtype: torch.dtype
    residual_dtype: torch.dtype
    bias_dtype: torch.dtype
    want_x: bool
    want_residual: bool
    want_bias: bool
    signature: Hashable | None = None

    def arguments(self) -> tuple:
        return (self.activation, self.x_dtype, self.residual_dtype, self.bias_dtype, self.want_x, self.want_residual,
                self.want_bias)


def check_activation(activation: str) -> str:
    """``activation`` if it names one of :data:`~fuselab.core.activations.ACTIVATIONS`; else ``ValueError``
    listing them."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def check_args(x, bias, residual, alpha, activation) -> None:
    """The checks of :func:`fuselab.bias_act`'s tensors, ``alpha`` and ``activation``: ``TypeError``/``ValueError``
    naming the argument."""
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


def needs_pre(activation: str, residual) -> bool:
    """Whether the backward needs a separately stored pre-activation: z = x + alpha*r + b has a residual in it.
    (Without a residual the backward rebuilds z = x + bias from the saved x: no extra write in the forward.)"""
    return SAVED[activation] == "pre" and residual is not None


def check_inplace(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> None:
    """The checks of values of ``inplace=True``, on every call (the actual tensors decide): no gradient can flow
    through an in-place result, so ``x`` must not require grad, nor (grad mode on) ``bias``/``residual``; and ``x``
    must not overlap ``bias`` or ``residual`` (the kernel would read elements it already wrote). ``ValueError``
    naming them."""
    if x.requires_grad:
        raise ValueError("inplace=True on x that requires grad is unsafe; use inplace=False")
    if torch.is_grad_enabled() and ((bias is not None and bias.requires_grad)
                                    or (residual is not None and residual.requires_grad)):
        raise ValueError("inplace=True does not support autograd: bias/residual require grad; use inplace=False")
    if not torch.compiler.is_compiling():
        require_disjoint({"x": x}, {"bias": bias, "residual": residual})


def validate(x, bias, residual, alpha, activation, inplace: bool, signature: Hashable | None = None) -> BiasActCall:
    """All checks of :func:`fuselab.bias_act` (``signature``: the call's, which ``bias_act`` computes)."""
    check_args(x, bias, residual, alpha, activation)
    if inplace:
        check_inplace(x, bias, residual)
        if not torch.compiler.is_compiling():
            require_distinct_elements("x", x)
        return BiasActCall(activation, inplace=True, signature=signature)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)
                                              or (residual is not None and residual.requires_grad))
    return BiasActCall(activation, save_pre=needs_grad and needs_pre(activation, residual), signature=signature)


