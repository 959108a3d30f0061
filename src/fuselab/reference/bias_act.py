"""Pure-PyTorch bias + scaled residual + activation: the CPU path and the tests' oracle.

``bias_act(x, bias, residual, alpha, activation) = act(x + alpha * residual + bias)``.
Low-precision inputs are computed in float32 and the result cast back to ``x.dtype``
(the fused kernels do the same); float64 stays float64, so the lab can call this on
float64 copies as the exact reference. Everything here is differentiable by autograd.

``activation_grad`` / ``bias_act_backward`` are the backward formulas written from the
tensor the fused op saves (the output for relu/relu2/sigmoid, the pre-activation for
silu/gelu/gelu_tanh, nothing for none): the oracle of the backward kernel, which reads
what the forward saved instead of differentiating the forward.
"""

from __future__ import annotations

import math

import torch

from fuselab.core.activations import ACTIVATIONS, SAVED

__all__ = ["ACTIVATIONS", "SAVED", "activation", "activation_grad", "bias_act", "bias_act_backward", "compute_dtype"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_C = 0.044715


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def activation(z: torch.Tensor, name: str) -> torch.Tensor:
    """``act(z)`` for one of :data:`ACTIVATIONS` (gelu is the exact erf form)."""
    if name == "none":
        return z
    if name == "relu":
        return torch.relu(z)
    if name == "relu2":
        return torch.relu(z).square()
    if name == "sigmoid":
        return torch.sigmoid(z)
    if name == "silu":
        return z * torch.sigmoid(z)
    if name == "gelu":
        return 0.5 * z * (1.0 + torch.erf(z * _INV_SQRT_2))
    if name == "gelu_tanh":
        return 0.5 * z * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (z + _GELU_C * z * z * z)))
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")


def bias_act(
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    activation_name: str = "relu",
) -> torch.Tensor:
    """``act(x + alpha * residual + bias)`` in float32 (float64 for float64 x), cast to ``x.dtype``."""
    acc = compute_dtype(x.dtype)
    z = x.to(acc)
    if residual is not None:
        z = z + alpha * residual.to(acc)
    if bias is not None:
        z = z + bias.to(acc)
    return activation(z, activation_name).to(x.dtype)


def activation_grad(saved: torch.Tensor | None, name: str) -> torch.Tensor | float:
    """``act'(z)`` from what the fused op saved (see :data:`SAVED`), in the compute dtype."""
    if name == "none":
        return 1.0
    assert saved is not None
    s = saved.to(compute_dtype(saved.dtype))
    if name == "relu":  # s = y; where y is NaN the gradient passes, as in torch's threshold_backward
        return (s <= 0).logical_not().to(s.dtype)
    if name == "relu2":  # s = y = relu(z)^2, act' = 2 relu(z) = 2 sqrt(y)
        return 2.0 * torch.sqrt(s)
    if name == "sigmoid":  # s = y
        return s * (1.0 - s)
    if name == "silu":  # s = z
        sig = torch.sigmoid(s)
        return sig * (1.0 + s * (1.0 - sig))
    if name == "gelu":  # s = z
        return 0.5 * (1.0 + torch.erf(s * _INV_SQRT_2)) + s * torch.exp(-0.5 * s * s) * _INV_SQRT_2PI
    if name == "gelu_tanh":  # s = z; gelu_tanh(z) = z * sigmoid(2u), u = k (z + c z^3)
        sig = torch.sigmoid(2.0 * _SQRT_2_OVER_PI * (s + _GELU_C * s * s * s))
        du = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * s * s)
        return sig + s * sig * (1.0 - sig) * du
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")


def bias_act_backward(
    grad: torch.Tensor,
    saved: torch.Tensor | None,
    alpha: float,
    activation_name: str,
    x_dtype: torch.dtype | None,
    residual_dtype: torch.dtype | None,
    bias_dtype: torch.dtype | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_residual, grad_bias); a ``None`` dtype means that gradient is not wanted."""
    dz = grad.to(compute_dtype(grad.dtype)) * activation_grad(saved, activation_name)
    grad_x = None if x_dtype is None else dz.to(x_dtype)
    grad_r = None if residual_dtype is None else (alpha * dz).to(residual_dtype)
    # rows named, not inferred (-1 has no single value for an empty dz); no rows: a zero bias gradient
    grad_b = None if bias_dtype is None else dz.reshape(math.prod(dz.shape[:-1]), dz.shape[-1]).sum(0).to(bias_dtype)
    return grad_x, grad_r, grad_b
