"""A whole DCNv2 cross network, ``x_{l+1} = x0 ⊙ (x_l Wᵀ + b) + x_l`` (low rank: ``x0 ⊙ ((x_l Vᵀ) Wᵀ + b) + x_l``)
for l = 0 .. L-1, as one op: ``fuselab::dcn_cross_net`` and the public :func:`dcn_cross_net` (``docs/gemm.md``).

The layers are :func:`~fuselab.ops.gemm.dcn_cross`'s; one op over all of them lets the backward add every layer's
gradient of x0 in the elementwise pass that forms the layer's other terms (one read and one write of dx0 per
layer) instead of autograd's separate sums of the per-layer gradients (two reads and a write each), and write the
first layer's dxl (x0 is its input) onto dx0 as well. The op runs where its backward is that pass: the Triton
kernels under the ``"cublas"`` backward plan, with x0 needing a gradient; elsewhere :func:`dcn_cross_net` is the
loop of :func:`~fuselab.ops.gemm.dcn_cross` calls (under ``torch.compile`` that choice is made when it traces).
"""

from __future__ import annotations

import torch

from fuselab.backend import use_triton
from fuselab.ops._recordop import RecordOp, layout
from fuselab.ops.tuning import current

from .checks import validate_dcn
from .dcn import dcn_cross
from .lazy import steps
from .spec import GemmTuning

__all__ = ["DCN_NET", "dcn_cross_net"]


def _shapes(x0: torch.Tensor, weight: torch.Tensor, weight_v: torch.Tensor) -> tuple:
    """(y, h, u, inter) shapes: y [M, N], h [L, M, rank] (empty at full rank), u [L, M, N], inter [L-1, M, N]."""
    layers, n, rank = weight.shape
    m = x0.shape[0]
    return (m, n), ((layers, m, rank) if weight_v.numel() else (0,)), (layers, m, n), (layers - 1, m, n)


def _forward(x0, weight, bias, weight_v, *, prepared=None) -> tuple:
    """((y, h, u, inter), None): the last layer's output and what the backward reads."""
    y, h, u, inter = (x0.new_empty(s) for s in _shapes(x0, weight, weight_v))
    steps().dcn_net_forward(x0, weight, bias, weight_v if weight_v.numel() else None, y, h if h.numel() else None,
                            u, inter)
    return (y, h, u, inter), None


def _forward_fake(x0: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, weight_v: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(x0.new_empty(s) for s in _shapes(x0, weight, weight_v))


def _setup_context(ctx, inputs, output) -> None:
    x0, weight, bias, weight_v = inputs
    _, h, u, inter = output
    ctx.mark_non_differentiable(h, u, inter)
    ctx.save_for_backward(x0, weight, weight_v, h, u, inter)
    ctx.bias_dtype = bias.dtype


def _backward(ctx, grad_y, grad_h, grad_u, grad_inter) -> tuple:
    """Gradients of (x0, weight, bias, weight_v): one :data:`DCN_NET_BACKWARD` call (the other outputs' gradients
    are ignored)."""
    x0, weight, weight_v, h, u, inter = ctx.saved_tensors
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("dcn_net_bwd", key, layout(grad_y))
    dx0, dw, db, dv = DCN_NET_BACKWARD.run_in_backward(ctx, (grad_y, x0, weight, weight_v, h, u, inter), key)
    return dx0, dw, db.to(ctx.bias_dtype), dv if weight_v.numel() else None


DCN_NET = RecordOp("fuselab::dcn_cross_net", eager=_forward, fake=_forward_fake,
                   autograd=(_setup_context, _backward), differentiable=(0, 1, 2, 3))


def _backward_launch(grad, x0, weight, weight_v, h, u, inter, *, prepared=None) -> tuple:
    """((dx0, dw, db, dv), None)."""
    return steps().dcn_net_backward(grad, x0, weight, weight_v if weight_v.numel() else None,
                                    h if h.numel() else None, u, inter), None


def _backward_fake(grad: torch.Tensor, x0: torch.Tensor, weight: torch.Tensor, weight_v: torch.Tensor,
                   h: torch.Tensor, u: torch.Tensor, inter: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    acc = torch.float64 if x0.dtype == torch.float64 else torch.float32
    return (torch.empty_like(x0), torch.empty_like(weight), x0.new_empty(weight.shape[:2], dtype=acc),
            torch.empty_like(weight_v))


DCN_NET_BACKWARD = RecordOp("fuselab::dcn_cross_net_bwd", eager=_backward_launch, fake=_backward_fake)


@torch.compiler.assume_constant_result
def _one_op_on(device: str) -> bool:
    """Whether the cross network runs as one op on ``device``: the Triton kernels and the ``"cublas"`` backward plan
    (whose pass sums x0's gradient). A constant to ``torch.compile`` (the tuning is read when it traces)."""
    return use_triton(device) and current(GemmTuning).backward == "cublas"


def dcn_cross_net(x0: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  weight_v: torch.Tensor | None = None) -> torch.Tensor:
    """L DCNv2 cross layers: ``x_{l+1} = x0 ⊙ (x_l @ weight[l].T + bias[l]) + x_l`` from ``x_0 = x0``, or with
    ``weight_v`` the low-rank form ``x0 ⊙ ((x_l @ weight_v[l].T) @ weight[l].T + bias[l]) + x_l``; the same values
    as L calls of :func:`~fuselab.ops.gemm.dcn_cross` (torchrec's ``LowRankCrossNet``). Differentiable in every
    input.

    Args:
        x0: ``(M, N)``. weight: ``(L, N, N)``, or ``(L, N, rank)`` with ``weight_v`` ``(L, rank, N)``.
        bias: ``(L, N)``.

    Every tensor has x0's dtype (bfloat16/float16/float32; float64 accepted) and device. Under autograd the op keeps
    each layer's output, its low-rank intermediate and its pre-product (L·M·(2N + rank) values) for the backward.

    Raises:
        TypeError: non-floating tensors, another dtype than x0's.
        ValueError: shapes that do not match (the message names the argument and the shape expected), tensors on
            different devices, L = 0.
    """
    if x0.dim() != 2 or weight.dim() != 3 or bias.dim() != 2:
        raise ValueError(f"x0 must be (M, N), weight (L, N, rank) and bias (L, N), got x0 {tuple(x0.shape)}, "
                         f"weight {tuple(weight.shape)}, bias {tuple(bias.shape)}")
    if weight.shape[0] == 0 or bias.shape[0] != weight.shape[0] or (
            weight_v is not None and (weight_v.dim() != 3 or weight_v.shape[0] != weight.shape[0])):
        raise ValueError(f"weight, bias (and weight_v) must hold the same L >= 1 layers, got weight "
                         f"{tuple(weight.shape)}, bias {tuple(bias.shape)}"
                         + ("" if weight_v is None else f", weight_v {tuple(weight_v.shape)}"))
    validate_dcn(x0, x0, weight[0], bias[0], None if weight_v is None else weight_v[0])
    if not (torch.is_grad_enabled() and x0.requires_grad and x0.numel() > 0 and _one_op_on(str(x0.device))):
        x = x0
        for layer in range(weight.shape[0]):
            x = dcn_cross(x0, x, weight[layer], bias[layer], weight_v=None if weight_v is None else weight_v[layer])
        return x
    v = weight_v if weight_v is not None else x0.new_empty(0)
    return DCN_NET.run((x0, weight, bias, v), needs_grad=True)[0]
