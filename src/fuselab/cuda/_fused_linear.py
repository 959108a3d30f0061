"""CUDA C++ backend of :class:`fuselab.nn.FusedLinear`: ``fuselab.cuda.fused_linear`` (source: ``fused_linear.cu``).

``act(x @ weight.T + bias)`` as one C++ autograd node: a cuBLAS matmul without bias, then the fused epilogue
kernel of ``bias_act.cu`` in place on the matmul output; the backward (the fused kernel: ``dz`` and the bias
gradient in one pass over the incoming gradient, then two matmuls) runs no Python. That is its point: the Triton
path's backward is a Python function, which costs more host time than a small layer's GPU work (the 4-layer
DLRM MLP at batch 65536 in bf16 is host-bound through it; see ``benchmarks/notes/bias_act.md``).

Limits: CUDA tensors of float32/float16/bfloat16 only; not a custom op, so ``torch.compile`` graph-breaks around
it (use the default backend under torch.compile); no double backward.
"""

from __future__ import annotations

import torch

from fuselab.core.activations import ACTIVATION_CODES
from fuselab.core.checks import require_tensor
from fuselab.cuda._bias_act import _CUDA_DTYPES, _extension
from fuselab.ops.bias_act.checks import check_activation


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str) -> None:
    """The TypeError/ValueError/RuntimeError that names what is wrong, run after the C++ checks failed."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            require_tensor(name, t)
    if x.dtype not in _CUDA_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16 for the CUDA backend, got {x.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be (..., in_features) and weight (out_features, in_features); got x "
                         f"{tuple(x.shape)} and weight {tuple(weight.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"bias must be ({weight.shape[0]},) (out_features), got {tuple(bias.shape)}")
    check_activation(activation)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if x.device.type != "cuda":
        raise RuntimeError(f"the CUDA backend needs CUDA tensors, got x on {x.device}")


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str = "relu") -> torch.Tensor:
    """``act(x @ weight.T + bias)`` with cuBLAS and the CUDA C++ epilogue; gradients for all three tensors.

    ``x`` ``(..., in)`` (any strides: a non-contiguous ``x`` whose leading dims do not merge is copied for the
    matmul), ``weight`` ``(out, in)``, ``bias`` ``(out,)`` or None, one dtype. Same values as
    :func:`fuselab.nn.fused_linear` (fp32 math in the epilogue).

    Saved for the backward: ``x`` (if ``weight`` needs grad), ``weight`` (if ``x`` needs grad), and the output
    (relu, relu2, sigmoid) or the matmul output and the bias (silu, gelu, gelu_tanh), or nothing (none).

    Raises ``TypeError`` for non-tensors, dtypes other than float32/float16/bfloat16 or mixed dtypes;
    ``ValueError`` for shapes that do not match, tensors on different devices, an unknown activation;
    ``RuntimeError`` for tensors not on CUDA, or without a CUDA device / when the extension does not build.
    """
    # tensors are validated in C++ (host time: this runs per layer per step); a failed check is explained here
    act = ACTIVATION_CODES.get(activation) if isinstance(activation, str) else None
    if act is None:
        _check(x, weight, bias, activation)
    try:
        return _extension().fused_linear(x, weight, bias, act)
    except (RuntimeError, TypeError):
        _check(x, weight, bias, activation)
        raise
