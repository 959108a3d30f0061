"""The fused linear layer ``act(x Wᵀ + b + alpha·r + s·(x Aᵀ) Bᵀ)``: the ops ``fuselab::gemm`` and
``fuselab::gemm_bwd`` and the public :func:`gemm` (semantics, errors and limits: ``docs/gemm.md``).

Forward: one launch (the LoRA product beside the main loop; the pre-activation or the ReLU bits kept for the backward).
Backward: dX = dZ·W (+ U·A with U = s·dZ·B, the LoRA side product of the same launch), dW = dZᵀ·x with the bias
gradient as its row sums, dB = dZᵀ·T, dA = Uᵀ·x: each one launch, dZ = dY ⊙ act' formed as dY is loaded (or
written once beside dX: :attr:`~fuselab.ops.gemm.launch.GemmTuning.materialize_dz`).
"""

from __future__ import annotations

import math

import torch

from fuselab.backend import triton_for, use_triton
from fuselab.core.checks import rows
from fuselab.core.device import cdiv
from fuselab.ops._recordop import RecordOp, layout
from fuselab.reference import gemm as ref
from fuselab.reference.bias_act import activation_grad, compute_dtype
from fuselab.reference.gemm import LoRA

from .checks import GemmCall, LinearBackward, LinearOptions, resolve_keep, signature_of, validate
from .lazy import steps

__all__ = ["BACKWARD", "FORWARD", "gemm"]

_NOTHING = torch.empty(0)


def _kept_shape(keep: str, m: int, n: int) -> tuple[int, ...]:
    return {"pre": (m, n), "mask": (m, cdiv(n, 8))}.get(keep, (0,))


# ---------------------------------------------------------------------------------------------- forward
def _forward(*inputs, prepared=None) -> tuple:
    """((y, kept, t), plan) of the custom op's inputs (:attr:`GemmCall.inputs`): y ``(..., N)`` in ``out_dtype``;
    kept the pre-activation ``[M, N]`` or the ReLU bits ``[M, ceil(N/8)]`` (empty otherwise); t = s·(x Aᵀ)
    ``[M, rank]`` (empty without LoRA)."""
    call = GemmCall.from_inputs(inputs)
    x, n, keep = call.x, call.N, call.keep
    y = x.new_empty((*x.shape[:-1], n), dtype=call.out_dtype)
    kept = x.new_empty(_kept_shape(keep, call.M, n), dtype=torch.uint8 if keep == "mask" else x.dtype)
    t = x.new_empty((call.M, call.rank)) if call.rank else x.new_empty(0)
    if call.M == 0 or n == 0:
        return (y, kept, t), None
    if not use_triton(x.device):
        _forward_torch(call, y, kept, t)
        return (y, kept, t), None
    return (y, kept, t), steps().linear_forward(call, y.view(call.M, n), kept, t if call.rank else None, prepared)


def _forward_torch(call: GemmCall, y, kept, t) -> None:
    """The forward on the PyTorch path (same outputs as the kernel)."""
    with torch.no_grad():
        acc = compute_dtype(call.x.dtype)
        xa = rows(call.x).to(acc)
        z = xa @ call.weight.to(acc).t()
        if call.bias is not None:
            z = z + call.bias.to(acc)
        if call.residual is not None:
            z = z + call.alpha * rows(call.residual).to(acc)
        if call.lora is not None:
            t.copy_(call.lora.scale * (xa @ call.lora.a.to(acc).t()))
            z = z + t.to(acc) @ call.lora.b.to(acc).t()
        if call.keep == "pre":
            kept.copy_(z)
        elif call.keep == "mask":
            kept.copy_(ref.pack_bits(~(z <= 0)))
        y.view(z.shape).copy_(ref.apply_activation(z, call.activation))


def _forward_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                  lora_a: torch.Tensor | None, lora_b: torch.Tensor | None, alpha: float, lora_scale: float,
                  activation: str, keep: str,
                  out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = weight.shape[0]
    m = math.prod(x.shape[:-1])
    rank = 0 if lora_a is None else lora_a.shape[0]
    return (x.new_empty((*x.shape[:-1], n), dtype=out_dtype),
            x.new_empty(_kept_shape(keep, m, n), dtype=torch.uint8 if keep == "mask" else x.dtype),
            x.new_empty((m, rank)) if rank else x.new_empty(0))


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, residual, lora_a, lora_b, alpha, lora_scale, activation, keep, _ = inputs
    y, kept, t = output
    ctx.mark_non_differentiable(kept, t)
    want = ctx.needs_input_grad
    saved = y if keep == "output" else kept if keep in ("pre", "mask") else None
    ctx.save_for_backward(x if (want[1] or want[4]) else None, weight if want[0] else None, saved,
                          lora_a, lora_b, t if want[5] else None)
    ctx.flags = (alpha, lora_scale, activation, keep)
    ctx.dtypes = (bias.dtype if bias is not None else x.dtype, residual.dtype if residual is not None else x.dtype)
    ctx.x_shape = x.shape


def _backward(ctx, grad_y, grad_kept, grad_t) -> tuple:
    """Gradients of (x, weight, bias, residual, lora_a, lora_b): one :data:`BACKWARD` call. ``grad_kept`` and
    ``grad_t`` (of non-differentiable outputs) are ignored."""
    x, weight, saved, lora_a, lora_b, t = ctx.saved_tensors
    alpha, lora_scale, activation, keep = ctx.flags
    want = [bool(w) for w in ctx.needs_input_grad[:6]]
    want_r = want[3]
    want[3] = want_r and keep != "nothing"  # dZ from the op only where it is not dY itself
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("gemm_bwd", key, tuple(want), layout(grad_y))
    dx, dw, db, dz, da, dlb = BACKWARD.run_in_backward(
        ctx, (grad_y, x, weight, saved, lora_a, lora_b, t, alpha, lora_scale, activation, keep, want), key)
    bias_dtype, residual_dtype = ctx.dtypes
    dr = None
    if want_r:
        dz = dz.view(grad_y.shape) if want[3] else grad_y
        dr = (alpha * dz if alpha != 1.0 else dz).to(residual_dtype)
    return (dx.view(ctx.x_shape) if want[0] else None, dw if want[1] else None,
            db.to(bias_dtype) if want[2] else None, dr, da if want[4] else None, dlb if want[5] else None,
            None, None, None, None, None)


FORWARD = RecordOp("fuselab::gemm", eager=_forward, fake=_forward_fake, autograd=(_setup_context, _backward),
               differentiable=(0, 1, 2, 3, 4, 5))


# ---------------------------------------------------------------------------------------------- backward
def _backward_torch(grad: torch.Tensor, b: LinearBackward) -> tuple:
    """The backward on the PyTorch path (the same gradients as the launches)."""
    acc = compute_dtype(grad.dtype)
    g = rows(grad).to(acc)
    if b.keep == "mask":
        dz = g * ref.unpack_bits(b.saved, g.shape[1]).to(acc)
    elif b.keep in ("output", "pre"):
        dz = g * activation_grad(b.saved.view(g.shape), b.activation)
    else:
        dz = g
    dt, want = b.dtype, b.want
    u = b.lora_scale * (dz @ b.lora_b.to(acc)) if b.lora_a is not None else None
    dx = dz @ b.weight.to(acc) + (u @ b.lora_a.to(acc) if u is not None else 0) if want[0] else None
    x2 = rows(b.x).to(acc) if b.x is not None else None
    return (None if dx is None else dx.to(dt), (dz.t() @ x2).to(dt) if want[1] else None,
            dz.sum(0) if want[2] else None, dz.to(dt) if want[3] else None,
            (u.t() @ x2).to(dt) if want[4] else None, (dz.t() @ b.t.to(acc)).to(dt) if want[5] else None)


def _backward_launch(grad, *inputs, prepared=None) -> tuple:
    """((dx [M, K], dw, db [N] fp32/fp64, dz [M, N] when residual's gradient is wanted, da, dlb), None) of dY and the
    rest of the backward op's inputs (:class:`LinearBackward`)."""
    b = LinearBackward.from_inputs(inputs)
    if not use_triton(grad.device):
        return _backward_torch(grad, b), None
    return steps().linear_backward(grad, b), None


def _backward_fake(grad: torch.Tensor, x: torch.Tensor | None, weight: torch.Tensor | None,
                   saved: torch.Tensor | None, lora_a: torch.Tensor | None, lora_b: torch.Tensor | None,
                   t: torch.Tensor | None, alpha: float, lora_scale: float, activation: str, keep: str,
                   want: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    m, n = math.prod(grad.shape[:-1]), grad.shape[-1]
    dtype = (x if x is not None else weight).dtype
    shapes = ((m, weight.shape[1]) if want[0] else 0, (n, x.shape[-1]) if want[1] else 0, n if want[2] else 0,
              (m, n) if want[3] else 0, lora_a.shape if want[4] else 0, lora_b.shape if want[5] else 0)
    return tuple(grad.new_empty(shape, dtype=compute_dtype(dtype) if i == 2 else dtype)
                 for i, shape in enumerate(shapes))


BACKWARD = RecordOp("fuselab::gemm_bwd", eager=_backward_launch, fake=_backward_fake)


# ---------------------------------------------------------------------------------------------- public API
def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         residual: torch.Tensor | None = None, alpha: float = 1.0, activation: str = "none", lora: LoRA | None = None,
         keep: str = "auto", out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``act(x @ weight.T + bias + alpha * residual + lora.scale * (x @ lora.a.T) @ lora.b.T)`` in one launch,
    differentiable (``docs/gemm.md``).

    Args:
        x: ``(..., in_features)``, bfloat16/float16/float32 (float64 accepted), any strides.
        weight: ``(out_features, in_features)`` of x's dtype, any strides (``nn.Linear``'s layout).
        bias: ``(out_features,)`` or None, any floating dtype.
        residual: ``(..., out_features)`` or None, added before the activation, scaled by ``alpha``.
        activation: one of :data:`fuselab.ACTIVATIONS`.
        lora: a :class:`~fuselab.reference.gemm.LoRA` ``(a [rank, in], b [out, rank], scale)``, rank 1-128, computed
            in the same launch.
        keep: what the forward writes for the backward: ``"auto"`` (the output for relu/relu2/sigmoid, the
            pre-activation for silu/gelu/gelu_tanh), ``"output"``, ``"pre"``, or ``"mask"`` (relu: 1 bit per element).
        out_dtype: the output's dtype (default x's); the accumulation is float32 (float64 for float64).

    fp32 operands use TF32 when ``torch.get_float32_matmul_precision()`` is not ``"highest"``, as torch's matmul.
    CUDA tensors run the Triton kernels, others the PyTorch reference path (``FUSELAB_BACKEND`` overrides).

    Raises:
        TypeError: a non-floating tensor, weight or LoRA factors of another dtype than x, a non-float ``alpha`` or
            ``lora.scale``, a non-floating ``out_dtype``.
        ValueError: shapes that do not match (the message names the argument and the shape expected), an unknown
            activation or ``keep``, ``keep="mask"`` without relu, ``keep="output"`` for silu/gelu/gelu_tanh, LoRA
            rank above 128, tensors on different devices.
    """
    options = LinearOptions(alpha, activation, keep, out_dtype)
    compiling = torch.compiler.is_compiling()
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad
        for t in (x, weight, bias, residual, *((lora.a, lora.b) if isinstance(lora, LoRA) else ())))
    key = prepared = None
    if not compiling:
        try:
            key = signature_of(x, weight, bias, residual, lora, options, needs_grad)
            prepared = FORWARD.launches.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the checks name the argument
            key = None
    if prepared is None or not triton_for(x):
        call = validate(x, weight, bias, residual, lora, options, needs_grad)
        if not compiling and not use_triton(x.device):
            return ref.linear(x, weight, bias, residual=residual, alpha=call.alpha, activation=call.activation,
                              lora=lora, out_dtype=call.out_dtype)
        keep_, out = call.keep, call.out_dtype
    else:
        keep_, out = resolve_keep(activation, keep, needs_grad), out_dtype or x.dtype
    la, lb, scale = (None, None, 1.0) if lora is None else (lora.a, lora.b, float(lora.scale))
    inputs = (x, weight, bias, residual, la, lb, float(alpha), scale, activation, keep_, out)  # GemmCall.inputs
    return FORWARD.run(inputs, key, prepared, needs_grad)[0]
