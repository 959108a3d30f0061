"""Layers built on the fused epilogue: cuBLAS matmul (no bias) + one fused bias/residual/activation pass.

* :class:`FusedLinear` — ``act(x @ W.T + b)``, a drop-in for ``nn.Linear`` followed by an activation
  (functional form: :func:`fused_linear`).
* :class:`LoRALinear` — ``act(x @ W.T + b + (alpha/rank) · (x @ A.T) @ B.T)`` around a (frozen) ``nn.Linear``;
  the LoRA branch enters the epilogue as the scaled residual, so the sum never takes its own pass.

Both accept any leading dims ``(..., in_features)`` and the dtypes of :func:`fuselab.bias_act`.
In inference (no tensor requires grad) the epilogue runs in place on the fresh matmul output.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fuselab.ops.bias_act import ACTIVATIONS, bias_act


def _check_activation(activation: str) -> str:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
    return activation


def _any_requires_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str = "relu") -> torch.Tensor:
    """Functional :class:`FusedLinear`: ``act(x @ weight.T + bias)``, matmul without bias + fused epilogue.

    ``x`` ``(..., in)``, ``weight`` ``(out, in)``, ``bias`` ``(out,)`` or None. In inference (nothing requires
    grad) the epilogue runs in place on the fresh matmul output.
    """
    h = torch.matmul(x, weight.t())
    inplace = not _any_requires_grad(x, weight, bias)
    return bias_act(h, bias, activation=activation, inplace=inplace)


class FusedLinear(nn.Module):
    """``y = act(x @ W.T + b)``: ``torch.matmul`` without bias (cuBLAS) + the fused epilogue.

    Parameters are named and initialized like ``nn.Linear`` (``weight`` ``[out, in]``, ``bias`` ``[out]``,
    Kaiming-uniform), so ``load_state_dict`` from an ``nn.Linear`` works.

    Raises ``ValueError`` for an unknown activation or non-positive sizes.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "relu",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"in_features and out_features must be positive, got {in_features}, {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = _check_activation(activation)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # the nn.Linear initialization
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "relu") -> FusedLinear:
        """A FusedLinear sharing ``linear``'s parameters."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.activation = _check_activation(activation)
        layer.weight = linear.weight
        layer.bias = linear.bias
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation!r}")


class LoRALinear(nn.Module):
    """``act(x @ W.T + b + (alpha / rank) · (x @ A.T) @ B.T)`` with the sum, scale, bias and activation fused.

    Args:
        base: the ``nn.Linear`` to adapt; its parameters are frozen (``requires_grad=False``) unless
            ``freeze_base=False``.
        rank: LoRA rank r > 0. ``lora_A`` ``[r, in]`` is Kaiming-uniform (like ``nn.Linear``), ``lora_B``
            ``[out, r]`` starts at zero (the LoRA convention: the layer starts equal to ``base``).
        alpha: LoRA alpha; the branch is scaled by ``alpha / rank`` (a constant: no gradient).
        activation: one of :data:`fuselab.ACTIVATIONS` (``"none"`` for a plain adapted linear).

    Raises ``TypeError`` when ``base`` is not an ``nn.Linear``; ``ValueError`` for ``rank <= 0`` or an
    unknown activation.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 1.0, activation: str = "none",
                 freeze_base: bool = True) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base must be an nn.Linear, got {type(base).__name__}")
        if not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive int, got {rank!r}")
        self.base = base
        self.rank = rank
        self.alpha = float(alpha)
        self.scaling = self.alpha / rank
        self.activation = _check_activation(activation)
        if freeze_base:
            base.requires_grad_(False)
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=w.device, dtype=w.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=w.device, dtype=w.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.matmul(x, self.base.weight.t())
        lora = torch.matmul(torch.matmul(x, self.lora_A.t()), self.lora_B.t())
        inplace = not _any_requires_grad(x, self.base.weight, self.base.bias, self.lora_A, self.lora_B)
        return bias_act(h, self.base.bias, residual=lora, alpha=self.scaling, activation=self.activation,
                        inplace=inplace)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, activation={self.activation!r}"
