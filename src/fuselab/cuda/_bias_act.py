"""CUDA C++ backend of the fused epilogue: ``fuselab.cuda.bias_act`` (source: ``bias_act.cu``).

Same semantics, arguments and errors as :func:`fuselab.bias_act` (without ``inplace``), forward and backward
(autograd through a ``torch.autograd.Function``; not registered as a custom op, so ``torch.compile`` graph-breaks
around it). Compiled with ``load_inline`` on first use (about a minute of nvcc, then cached by torch).

Limits: CUDA tensors of float32/float16/bfloat16 only (``RuntimeError`` otherwise, e.g. on CPU);
``bias``/``residual`` of another dtype are converted to ``x``'s dtype, and a ``residual``/``x``/grad whose last
dim is not unit-stride (or whose leading dims cannot be merged into rows) is copied first: the fast path is rows
with a unit inner stride, any row stride.
"""

from __future__ import annotations

import torch

from fuselab.core.activations import ACTIVATION_CODES, SAVED
from fuselab.core.checks import rows
from fuselab.ops.bias_act.checks import check_args

from ._build import load

#: the host functions of bias_act.cu and fused_linear.cu, built into one extension
_DECLARATIONS = """
#include <optional>
#include <vector>
std::vector<torch::Tensor> bias_act_forward(torch::Tensor x, std::optional<torch::Tensor> bias,
    std::optional<torch::Tensor> residual, double alpha, int64_t activation, bool save_pre,
    std::optional<torch::Tensor> out, int64_t stream_handle);
std::vector<torch::Tensor> bias_act_backward(torch::Tensor grad, std::optional<torch::Tensor> saved,
    std::optional<torch::Tensor> shift, double alpha, int64_t activation, bool want_x, bool want_residual,
    bool want_bias, int64_t stream_handle);
torch::Tensor fused_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
    int64_t activation);
"""

_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _extension():
    return load("fuselab_bias_act", _DECLARATIONS, ("bias_act_forward", "bias_act_backward", "fused_linear"))


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    """2-D view with a unit inner stride (copy otherwise)."""
    t2 = rows(t)
    if t2.shape[1] > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


class _BiasActCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, alpha: float, activation: str):
        kind = SAVED[activation]
        needs_grad = any(ctx.needs_input_grad[:3])
        save_pre = needs_grad and kind == "pre" and (bias is not None or residual is not None)
        x2 = _unit_rows(x)
        r2 = None if residual is None else _unit_rows(residual.to(x.dtype))
        b = None if bias is None else bias.to(x.dtype).contiguous()
        with torch.cuda.device(x.device):
            y, pre = _extension().bias_act_forward(x2, b, r2, alpha, ACTIVATION_CODES[activation], save_pre, None,
                                                   _stream(x.device))
        if needs_grad:
            if kind == "output":
                ctx.save_for_backward(y)
            elif kind == "pre":
                ctx.save_for_backward(pre if save_pre else x2)
        ctx.alpha, ctx.activation = alpha, activation
        ctx.meta = (x.shape, None if bias is None else bias.dtype, None if residual is None else residual.dtype)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        shape, bias_dtype, residual_dtype = ctx.meta
        saved = ctx.saved_tensors[0] if ctx.saved_tensors else None
        want_x = ctx.needs_input_grad[0]
        want_b = bias_dtype is not None and ctx.needs_input_grad[1]
        want_r = residual_dtype is not None and ctx.needs_input_grad[2]
        g2 = _unit_rows(grad)
        s2 = None if saved is None else _unit_rows(saved)
        with torch.cuda.device(grad.device):
            gx, gr, gb = _extension().bias_act_backward(g2, s2, None, ctx.alpha, ACTIVATION_CODES[ctx.activation],
                                                        want_x, want_r, want_b, _stream(grad.device))
        return (gx.view(shape) if want_x else None,
                gb.to(bias_dtype) if want_b else None,
                gr.view(shape).to(residual_dtype) if want_r else None,
                None, None)


def bias_act(
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    alpha: float = 1.0,
    activation: str = "relu",
) -> torch.Tensor:
    """``act(x + alpha * residual + bias)`` with the CUDA C++ kernels; see :func:`fuselab.bias_act`.

    Raises the same ``TypeError``/``ValueError`` as :func:`fuselab.bias_act`; ``TypeError`` for float64
    (not built); ``RuntimeError`` for tensors not on CUDA or without a CUDA device.
    """
    check_args(x, bias, residual, alpha, activation)
    if x.dtype not in _CUDA_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16 for the CUDA backend, got {x.dtype}")
    if x.device.type != "cuda":
        raise RuntimeError(f"the CUDA backend needs CUDA tensors, got x on {x.device}")
    return _BiasActCuda.apply(x, bias, residual, float(alpha), activation)
