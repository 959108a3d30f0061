"""The DCNv2 cross layer ``x0 ⊙ (xl Wᵀ + b) + xl`` (low rank: ``x0 ⊙ ((xl Vᵀ) Wᵀ + b) + xl``) with the cross
product in the GEMM's epilogue: the op ``fuselab::dcn_cross`` and the public :func:`dcn_cross` (``docs/gemm.md``).

Forward: one launch (full rank) or two (h = xl Vᵀ, then the epilogue GEMM); when x0's gradient will be wanted
under the default backward plan, the epilogue also keeps the pre-product u = h Wᵀ + b ([M, N], one more write).
Backward: dx0 = dY ⊙ u, gx = dY ⊙ x0 with the bias gradient its column sums, and dY copied into dxl, in one
elementwise pass (without u: dx0 by the forward's epilogue again); dW = gxᵀ·h, dT = gx·W, dxl += dT·V in place,
dV = dTᵀ·xl by cuBLAS (the ``"fused"`` plan: the Triton kernel forms gx as it loads dY).
"""

from __future__ import annotations

import math

import torch

from fuselab.backend import use_triton
from fuselab.core.checks import rows
from fuselab.ops._recordop import RecordOp, layout
from fuselab.ops.tuning import current
from fuselab.reference import gemm as ref

from .checks import validate_dcn
from .lazy import steps
from .spec import GemmTuning

__all__ = ["DCN", "dcn_cross"]


# ---------------------------------------------------------------------------------------------- op
def _keeps_pre(keep_pre: bool, xl: torch.Tensor) -> bool:
    """Whether the forward keeps the pre-product for x0's gradient: asked for (x0 needs a gradient), kernels that
    run, and the backward plan that reads it (``"cublas"``: its elementwise pass forms dx0 from it)."""
    return (keep_pre and xl.numel() > 0 and use_triton(xl.device)
            and current(GemmTuning).backward == "cublas")


def _forward(x0, xl, weight, bias, weight_v, keep_pre, *, prepared=None) -> tuple:
    """((y like xl, h = xl Vᵀ [M, rank] or empty, u = h Wᵀ + b [M, N] where ``keep_pre`` or empty), None)."""
    y = torch.empty_like(xl, memory_format=torch.contiguous_format)
    m = math.prod(xl.shape[:-1])
    h = xl.new_empty((m, weight.shape[1])) if weight_v is not None else xl.new_empty(0)
    keep = _keeps_pre(keep_pre, xl)
    u = xl.new_empty((m, xl.shape[-1])) if keep else xl.new_empty(0)
    if y.numel() == 0:
        return (y, h, u), None
    if not use_triton(xl.device):
        with torch.no_grad():
            if weight_v is not None:
                h.copy_(ref.linear(rows(xl), weight_v))
            y.copy_(ref.dcn_cross(x0, xl, weight, bias, weight_v))
        return (y, h, u), None
    steps().dcn_forward(x0, xl, weight, bias, weight_v, y.view(m, -1), h if weight_v is not None else None,
                        u if keep else None)
    return (y, h, u), None


def _forward_fake(x0: torch.Tensor, xl: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  weight_v: torch.Tensor | None, keep_pre: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = math.prod(xl.shape[:-1])
    keep = _keeps_pre(keep_pre, xl)
    return (xl.new_empty(xl.shape), xl.new_empty((m, weight.shape[1]) if weight_v is not None else (0,)),
            xl.new_empty((m, xl.shape[-1]) if keep else (0,)))


def _setup_context(ctx, inputs, output) -> None:
    x0, xl, weight, bias, weight_v, _ = inputs
    _, h, u = output
    ctx.mark_non_differentiable(h, u)
    ctx.save_for_backward(x0, xl, weight, bias, weight_v, h if weight_v is not None else None,
                          u if u.numel() else None)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad_y, grad_h, grad_u) -> tuple:
    """Gradients of (x0, xl, weight, bias, weight_v): one :data:`DCN_BACKWARD` call (``grad_h``, ``grad_u`` are
    ignored)."""
    x0, xl, weight, bias, weight_v, h, u = ctx.saved_tensors
    want = [bool(w) for w in ctx.needs_input_grad[:5]]
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("dcn_bwd", key, tuple(want), layout(grad_y))
    dx0, dxl, dw, db, dv = DCN_BACKWARD.run_in_backward(ctx, (grad_y, x0, xl, weight, bias, weight_v, h, u, want),
                                                        key)
    return (dx0.view(xl.shape) if want[0] else None, dxl.view(xl.shape) if want[1] else None,
            dw if want[2] else None, db.to(ctx.bias_dtype) if want[3] else None, dv if want[4] else None, None)


DCN = RecordOp("fuselab::dcn_cross", eager=_forward, fake=_forward_fake, autograd=(_setup_context, _backward),
               differentiable=(0, 1, 2, 3, 4))


def _backward_launch(grad, *inputs, prepared=None) -> tuple:
    """((dx0, dxl, dw, db, dv), None) of dY and (x0, xl, weight, bias, weight_v, h, u, want)."""
    if grad.numel() == 0 or not use_triton(grad.device):
        return _backward_torch(grad, inputs), None
    return steps().dcn_backward(grad, *inputs), None


def _backward_torch(grad: torch.Tensor, inputs: tuple) -> tuple:
    """The backward on the PyTorch path: autograd through the reference (float32; float64 stays)."""
    x0, xl, weight, bias, weight_v, _, _, want = inputs
    acc = torch.float64 if xl.dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(acc).requires_grad_(w) if t is not None else None
              for t, w in zip((x0, xl, weight, bias, weight_v), want)]
    with torch.enable_grad():
        y = ref.dcn_cross(*leaves)
        wanted = [t for t, w in zip(leaves, want) if w]
        grads = iter(torch.autograd.grad(y, wanted, grad.to(acc)) if wanted else ())
    return tuple((next(grads).to(acc if i == 3 else xl.dtype)) if w else grad.new_empty(0)
                 for i, w in enumerate(want))


def _backward_fake(grad: torch.Tensor, x0: torch.Tensor, xl: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None, weight_v: torch.Tensor | None, h: torch.Tensor | None,
                   u: torch.Tensor | None, want: list[bool]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = math.prod(xl.shape[:-1]), xl.shape[-1]
    acc = torch.float64 if xl.dtype == torch.float64 else torch.float32
    shapes = ((m, n), (m, n), weight.shape, (n,), None if weight_v is None else weight_v.shape)
    return tuple(grad.new_empty(s, dtype=acc if i == 3 else xl.dtype) if w else grad.new_empty(0)
                 for i, (w, s) in enumerate(zip(want, shapes)))


DCN_BACKWARD = RecordOp("fuselab::dcn_cross_bwd", eager=_backward_launch, fake=_backward_fake)


def dcn_cross(x0: torch.Tensor, xl: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              weight_v: torch.Tensor | None = None) -> torch.Tensor:
    """One DCNv2 cross layer, ``x0 ⊙ (xl @ weight.T + bias) + xl``, with the cross product and the residual in the
    GEMM's epilogue; with ``weight_v`` the low-rank form ``x0 ⊙ ((xl @ weight_v.T) @ weight.T + bias) + xl``
    (torchrec's ``LowRankCrossNet`` layer with V = ``weight_v``, W = ``weight``). Differentiable in every input.

    Args:
        x0: ``(..., N)`` the cross network's input; xl: ``(..., N)`` this layer's input (x0 for the first layer).
        weight: ``(N, N)``, or ``(N, rank)`` with ``weight_v`` ``(rank, N)``. bias: ``(N,)`` or None.

    x0, xl and the weights share one dtype (bfloat16/float16/float32; float64 accepted). The output has xl's shape
    and dtype; the low-rank intermediate ``xl Vᵀ`` is kept in that dtype for the backward, and so is the pre-product
    ``(xl Vᵀ) Wᵀ + b`` (the size of the output) when x0 needs a gradient under the default backward plan
    (``GemmTuning.backward="cublas"``).

    Raises:
        TypeError: non-floating tensors, x0/weights of another dtype than xl.
        ValueError: shapes that do not match (the message names the argument and the shape expected), tensors on
            different devices.
    """
    call = validate_dcn(x0, xl, weight, bias, weight_v)
    if not torch.compiler.is_compiling() and not use_triton(xl.device):
        return ref.dcn_cross(x0, xl, weight, bias, weight_v)
    return DCN.run((*call.inputs, torch.is_grad_enabled() and x0.requires_grad))[0]
