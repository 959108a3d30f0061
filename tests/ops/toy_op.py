"""A complete small op on the op contract: ``scale(x, w) = x * w``, ``w`` one weight per column of a 2-D ``x``.

In the package its parts would be the rooms of ``ops/scale/`` (marked below); ``docs/architecture.md`` shows this
file, and ``tests/ops/test_opdef.py`` runs it and checks that the doc shows it as it is.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuselab.core.checks import require_float, require_same_device, require_tensor
from fuselab.ops._launch import Launch
from fuselab.ops.opdef import Op, tensor_signature


# ------------------------------------------------------------------------------ kernels.py
@triton.jit
def _scale_kernel(x_ptr,  # (M, N), any strides
                  w_ptr,  # (N,), any stride
                  y_ptr,  # (M, N), contiguous
                  M, N, sxm, sxn, sw, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask)
    w = tl.load(w_ptr + cols * sw, mask=cols < N)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], x * w[None, :], mask=mask)


# ------------------------------------------------------------------------------ checks.py
@dataclass(frozen=True, slots=True, eq=False)
class ScaleCall:
    """A validated call: nothing to derive here but its signature."""

    signature: Hashable | None

    def arguments(self) -> tuple:
        return ()  # the custom op takes the operands only


def validate(x, w, signature: Hashable | None) -> ScaleCall:
    require_tensor("x", x)
    require_float("x", x)
    require_float("w", w)
    if x.dim() != 2 or w.shape != (x.shape[1],):
        raise ValueError(f"x must be (M, N) and w (N,), got {tuple(x.shape)} and {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise ValueError(f"w must have x's dtype {x.dtype}, got {w.dtype}")
    require_same_device(x=x, w=w)
    return ScaleCall(signature)


# ------------------------------------------------------------------------------ launch.py
@dataclass(frozen=True, eq=False)
class ScalePlan:
    call: ScaleCall
    launch: Launch | None  # None: nothing to compute


def plan(call: ScaleCall, operands: tuple) -> ScalePlan:
    x, w = operands
    m, n = x.shape
    if x.numel() == 0:
        return ScalePlan(call, None)
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 32))
    return ScalePlan(call, Launch(_scale_kernel, grid, (m, n, *x.stride(), w.stride(0)),
                                  {"BLOCK_M": 16, "BLOCK_N": 32}))


def forward(plan: ScalePlan, operands: tuple) -> torch.Tensor:
    x, w = operands
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if plan.launch is not None:
        plan.launch((x, w, y))
    return y


# ------------------------------------------------------------------------------ op.py
class Scale(Op):
    name = "fuselab_toy::scale"
    schema = "(Tensor x, Tensor w) -> Tensor"
    differentiable = (0, 1)

    plan = staticmethod(plan)
    forward = staticmethod(forward)

    def call_of(self, inputs: tuple, signed: bool) -> ScaleCall:
        return ScaleCall(tuple(map(tensor_signature, inputs)) if signed else None)

    def fake(self, call: ScaleCall, operands: tuple) -> torch.Tensor:
        return operands[0].new_empty(operands[0].shape)

    def setup_context(self, ctx, call: ScaleCall, operands: tuple, y: torch.Tensor) -> None:
        ctx.save_for_backward(*operands)

    def backward(self, ctx, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        signature = None  # the gradient's plan: cached under the forward's signature and the gradient's layout
        if getattr(ctx, "eager", False) and ctx.call.signature is not None:
            signature = ("backward", ctx.call.signature, tensor_signature(grad_y))
        cached = SCALE.cached(signature)
        call = cached.call if cached is not None else ScaleCall(signature)
        grad_x = SCALE.run_in_backward(ctx, call, (grad_y, w), cached)
        return grad_x, (grad_y * x).sum(0)


SCALE = Scale()


def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x * w`` (``x``: (M, N) float, any strides; ``w``: (N,), x's dtype and device), differentiable.
    Raises ``TypeError``/``ValueError`` naming the argument."""
    signature = None
    if not torch.compiler.is_compiling() and isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor):
        signature = (tensor_signature(x), tensor_signature(w))  # else validate names the argument
    cached = SCALE.cached(signature)
    call = cached.call if cached is not None else validate(x, w, signature)
    return SCALE.run(call, (x, w), cached)
