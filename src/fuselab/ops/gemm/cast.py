"""Master weights without casts: an optimizer step on fp32 weights that also writes their low-precision copy, so a
training step reads the bf16 copy in its GEMMs and casts no weight (``cast_update_``, the op
``fuselab::cast_update_``; ``docs/gemm.md``). One pass per parameter: read the master weight, its gradient (the
copy's, in the copy's dtype) and the Adagrad state; write the weight, the state and the copy."""

from __future__ import annotations

import torch

from fuselab.backend import use_triton
from fuselab.core.checks import require_float, require_same_device, require_tensor
from fuselab.ops._recordop import RecordOp
from fuselab.reference.gemm import CAST_UPDATE_OPTIMIZERS, cast_update

from .lazy import launchers
from .spec import CastStep

__all__ = ["CAST_UPDATE", "cast_update_"]


def _update(master, low, state, grad, lr_tensor, *options, prepared=None) -> tuple:
    """(master, low, state) updated in place; (outputs, None). ``options``: (lr, eps, weight_decay, optimizer)."""
    lr, eps, weight_decay, optimizer = options
    if master.numel() == 0:
        return (master, low, state), None
    if not use_triton(master.device):
        with torch.no_grad():
            step = float(lr_tensor) if lr_tensor is not None else lr
            w, s, copy = cast_update(master, grad, state, optimizer=optimizer, lr=step, weight_decay=weight_decay,
                                     eps=eps, low_dtype=low.dtype)
            master.copy_(w)
            low.copy_(copy)
            if state is not None:
                state.copy_(s)
        return (master, low, state), None
    launchers().cast_update(master, grad, low, state, lr_tensor, CastStep(optimizer, lr, eps, weight_decay))
    return (master, low, state), None


def _update_fake(master: torch.Tensor, low: torch.Tensor, state: torch.Tensor | None, grad: torch.Tensor,
                 lr_tensor: torch.Tensor | None, lr: float, eps: float, weight_decay: float, optimizer: str) -> None:
    return None


CAST_UPDATE = RecordOp("fuselab::cast_update_", eager=_update, fake=_update_fake,
                       mutates_args=("master", "low", "state"))


def _check(master, low, grad, state, optimizer: str, lr) -> None:
    """TypeError/ValueError naming the argument."""
    for name, t in (("master", master), ("low", low), ("grad", grad)):
        require_float(name, t)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if master.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"master must be float32 (float64 accepted), got {master.dtype}")
    for name, t in (("low", low), ("grad", grad)):
        if t.shape != master.shape:
            raise ValueError(f"{name} must have master's shape {tuple(master.shape)}, got {tuple(t.shape)}")
    if optimizer not in CAST_UPDATE_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(CAST_UPDATE_OPTIMIZERS)}, got {optimizer!r}")
    if optimizer == "adagrad":
        require_tensor("state", state)
        if state.shape != master.shape or state.dtype != master.dtype or not state.is_contiguous():
            raise ValueError(f"state must be a contiguous {master.dtype} tensor of master's shape "
                             f"{tuple(master.shape)}")
    elif state is not None:
        raise ValueError("state is Adagrad's sum of squares: give it only with optimizer='adagrad'")
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1 or not lr.is_floating_point():
            raise ValueError(f"lr must be a float or a 1-element floating tensor, got {lr.dtype} {tuple(lr.shape)}")
    elif isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise TypeError(f"lr must be a float or a 1-element floating tensor, got {type(lr).__name__}")
    require_same_device(master=master, low=low, grad=grad, state=state,
                        lr=lr if isinstance(lr, torch.Tensor) else None)


@torch.no_grad()
def cast_update_(master: torch.Tensor, grad: torch.Tensor, low: torch.Tensor, *, lr: float | torch.Tensor,
                 optimizer: str = "sgd", state: torch.Tensor | None = None, eps: float = 1e-10,
                 weight_decay: float = 0.0) -> torch.Tensor:
    """One optimizer step on fp32 ``master`` weights that also writes their low-precision copy ``low`` (in place),
    in one pass: ``g = grad + weight_decay·master``; ``sgd``: ``master -= lr·g``; ``adagrad``: ``state += g²``,
    ``master -= lr·g / (sqrt(state) + eps)`` (torch.optim.Adagrad's update); then ``low = master`` rounded to nearest.

    Args:
        master: float32 weights (float64 accepted), contiguous. grad: the gradient, of master's shape, any floating
            dtype (typically the low-precision copy's gradient: no cast of it either). low: the copy (bf16/fp16),
            master's shape. lr: a float, or a 1-element tensor on the device (read by the kernel: a captured CUDA
            graph follows its current value). state: Adagrad's sum of squares (master's dtype and shape).

    Returns ``low``. Raises TypeError/ValueError naming the argument (shapes, dtypes, contiguity, an unknown
    optimizer, state given or missing, devices).
    """
    _check(master, low, grad, state, optimizer, lr)
    lr_tensor = lr.reshape(()) if isinstance(lr, torch.Tensor) else None
    CAST_UPDATE.run((master, low, state, grad, lr_tensor, 0.0 if lr_tensor is not None else float(lr), float(eps),
                     float(weight_decay), optimizer), needs_grad=False)
    return low
