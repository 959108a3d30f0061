"""The DLRM's MLP layer: ``y = act(x @ W.T + b)``, act ReLU or none, three implementations of one state.

Shapes: ``B`` batch, ``in`` / ``out`` the layer's widths, ``pad`` the zero columns that align its input.

:class:`LinearAct` holds ``weight`` ``(out, in + pad)`` and ``bias`` ``(out,)`` whatever computes it, so a model's
``state_dict`` does not depend on the implementation:

* ``"torch"``: ``F.linear`` + ``F.relu`` on the unpadded width (the pad columns are not read: ``nn.Linear`` +
  ``nn.ReLU``, bit for bit);
* ``"addmm"``: ``torch._addmm_activation`` (cuBLASLt's bias+ReLU epilogue; ``torch.addmm`` without activation) on the
  padded width, with its own backward (:class:`_AddmmReLU`: the epilogue has no autograd formula): the ReLU's
  gradient and the bias gradient in one :func:`fuselab.bias_act` backward launch, then cuBLAS's two products;
* ``"fused_linear"``: :func:`fuselab.nn.fused_linear` (cuBLAS matmul + fuselab's Triton epilogue), padded width.

Padding: a layer built with ``in_pad`` columns takes its input unpadded ``(B, in)`` or already padded
``(B, in + pad)`` with zero pad columns (the fused dot interaction writes them). The fused implementations pad an
unpadded input (16-byte rows in bf16 keep the GEMM on its fast path); the pad columns' weights start at zero and,
their inputs being zero, get zero gradient and stay zero. :data:`INPUT_ALIGN` is the alignment the DLRM pads its
MLP inputs to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.backend import triton_for
from fuselab.core.seeded import seeded_fill_
from fuselab.ops.bias_act.op import gradients as bias_act_gradients

from .linear import fused_linear

__all__ = ["INPUT_ALIGN", "MLP_IMPLS", "LinearAct", "mlp_layers"]

#: LinearAct implementations: F.linear + relu, cuBLASLt's bias+ReLU epilogue, fuselab's Triton epilogue
MLP_IMPLS = ("torch", "addmm", "fused_linear")
#: the DLRM pads the inputs of its MLPs (13 dense features, the dot interaction's output) to a multiple of this
INPUT_ALIGN = 8


class _AddmmReLU(torch.autograd.Function):
    """``relu(x @ weight.T + bias)`` through ``torch._addmm_activation`` (cuBLASLt's bias+ReLU epilogue on CUDA,
    which has no autograd formula). Backward on the Triton path: ``dz = grad * (y > 0)`` and ``db = Σ dz`` in one
    launch of :func:`fuselab.bias_act`'s backward (it reads grad and y once; ``threshold_backward`` + ``sum(0)`` read dz
    again, and the column sum of a narrow ``(B, N)`` runs far from the memory bound), then ``dx = dz W``,
    ``dW = dzᵀ x``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        y = torch._addmm_activation(bias, x, weight.t())
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight if ctx.needs_input_grad[0] else None, y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight, y = ctx.saved_tensors
        want_x, want_w, want_b = ctx.needs_input_grad
        if triton_for(grad):
            dt = grad.dtype
            dz, _, db = bias_act_gradients(ctx, (grad, y, None, 1.0, "relu", dt, dt, dt, True, False, want_b), None)
        else:  # the PyTorch path: nn.ReLU's backward and a column sum
            dz = torch.ops.aten.threshold_backward(grad, y, 0)
            db = dz.sum(0) if want_b else None
        return (dz.mm(weight) if want_x else None, dz.t().mm(x) if want_w else None, db if want_b else None)


class LinearAct(nn.Module):
    """``y = act(x @ W.T + b)``, act ReLU or none: x ``(B, in)`` or ``(B, in + in_pad)`` -> ``(B, out)``.

    ``impl``: one of :data:`MLP_IMPLS` (module docstring). Under autocast the fused implementations cast x, W, b to
    the autocast dtype themselves (as autocast does for ``nn.Linear``) and run with autocast off, so they take their
    fast paths. Initial values (facebookresearch/dlrm's): ``W ~ N(0, sqrt(2 / (in + out)))`` over the ``in`` real
    columns (the pad columns zero), ``b ~ N(0, sqrt(1 / out))``, drawn in that order from ``generator`` on its device
    (the global generator when None). Raises ValueError for an unknown ``impl`` or non-positive widths.
    """

    def __init__(self, in_features: int, out_features: int, *, relu: bool, impl: str = "torch", in_pad: int = 0,
                 generator: torch.Generator | None = None):
        super().__init__()
        if impl not in MLP_IMPLS:
            raise ValueError(f"mlp must be one of {MLP_IMPLS}, got {impl!r}")
        if in_features <= 0 or out_features <= 0 or in_pad < 0:
            raise ValueError(f"widths must be positive (in_pad >= 0), got in={in_features}, out={out_features}, "
                             f"in_pad={in_pad}")
        self.in_features, self.out_features, self.in_pad = in_features, out_features, in_pad
        self.relu, self.impl = relu, impl
        weight, bias = torch.empty(out_features, in_features), torch.empty(out_features)  # on the default device
        seeded_fill_(weight, generator,
                     lambda t: t.normal_(0.0, math.sqrt(2.0 / (in_features + out_features)), generator=generator))
        seeded_fill_(bias, generator, lambda t: t.normal_(0.0, math.sqrt(1.0 / out_features), generator=generator))
        self.weight = nn.Parameter(F.pad(weight, (0, in_pad)))
        self.bias = nn.Parameter(bias)

    def forward(self, x: Tensor) -> Tensor:
        """x ``(B, in)`` or ``(B, in + in_pad)`` (zero pad columns) -> ``(B, out)``"""
        padded = self.in_pad and x.shape[-1] == self.in_features + self.in_pad
        if self.impl == "torch":  # unpadded: the real columns, contiguous (the backward's GEMM as nn.Linear's)
            weight = self.weight if padded or not self.in_pad else self.weight[:, : self.in_features].contiguous()
            y = F.linear(x, weight, self.bias)
            return F.relu(y) if self.relu else y
        if self.in_pad and not padded:
            x = F.pad(x, (0, self.in_pad))
        device = x.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            with torch.autocast(device, enabled=False):
                return self._fused(x.to(dtype), self.weight.to(dtype), self.bias.to(dtype))
        return self._fused(x, self.weight, self.bias)

    def _fused(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        if self.impl == "fused_linear":
            return fused_linear(x, weight, bias, "relu" if self.relu else "none")
        return _AddmmReLU.apply(x, weight, bias) if self.relu else torch.addmm(bias, x, weight.t())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, in_pad={self.in_pad}, "
                f"relu={self.relu}, impl={self.impl!r}")


def mlp_layers(widths: Sequence[int], *, relu_last: bool, impl: str = "torch", in_pad: int = 0,
               generator: torch.Generator | None = None) -> nn.Sequential:
    """:class:`LinearAct` layers ``widths[0] -> widths[1] -> ... -> widths[-1]``, ReLU after each but the last
    (and after the last with ``relu_last``); ``in_pad`` zero columns on the first layer's input; initial values drawn
    layer by layer from ``generator``."""
    layers = [LinearAct(widths[k], widths[k + 1], relu=k < len(widths) - 2 or relu_last, impl=impl,
                        in_pad=in_pad if k == 0 else 0, generator=generator) for k in range(len(widths) - 1)]
    return nn.Sequential(*layers)
