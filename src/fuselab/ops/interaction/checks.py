"""Dot-interaction argument checks (see ``docs/interaction.md``): :func:`validate` turns the arguments of
:func:`fuselab.dot_interaction` into an :class:`InteractionCall`, :func:`validate_gradient` those of the backward op
called directly into an :class:`InteractionGradCall`; each raises ``TypeError``/``ValueError`` naming the argument.
Every check reads shapes, dtypes and devices only, all of which a call's signature holds: a repeated call has none
left to run."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from fuselab.backend import triton_for
from fuselab.core.checks import FLOAT_DTYPES, require_ndim, require_tensor
from fuselab.reference.interaction import MAX_DIM, MAX_FEATURES, num_pairs, output_width


@dataclass(frozen=True, slots=True, eq=False)
class InteractionCall:
    """One validated forward. The custom op's arguments after its operands (:meth:`arguments`):
    ``self_interaction`` and ``pad_to``. Derived by the checks: ``width``, the output's W; ``triton``, the backend
    (the Triton kernels, else the PyTorch reference); ``signature`` (see :mod:`fuselab.ops.opdef`; None on the
    reference path, which has nothing to plan)."""

    self_interaction: bool
    pad_to: int
    width: int
    triton: bool
    signature: Hashable | None = None

    def arguments(self) -> tuple[bool, int]:
        return self.self_interaction, self.pad_to


@dataclass(frozen=True, slots=True, eq=False)
class InteractionGradCall:
    """One validated backward: the gradients of ``dense`` and ``emb`` from the output's gradient. The custom op's
    argument after its operands: ``self_interaction``; ``triton`` and ``signature`` as in :class:`InteractionCall`."""

    self_interaction: bool
    triton: bool
    signature: Hashable | None = None

    def arguments(self) -> tuple[bool]:
        return (self.self_interaction,)


def check_inputs(dense: object, emb: object, pad_to: object = 1) -> None:
    """TypeError/ValueError naming the argument unless dense (B, D) and emb (B, F, D) are valid operands.

    Rules: tensors of one floating dtype (float32, bfloat16, float16; float64 too, which only the PyTorch path
    runs), on one device; ``1 <= F <=`` :data:`MAX_FEATURES`, ``1 <= D <=`` :data:`MAX_DIM`; ``pad_to`` an int >= 1.
    """
    require_tensor("dense", dense)
    require_tensor("emb", emb)
    for name, t in (("dense", dense), ("emb", emb)):
        if t.dtype not in (*FLOAT_DTYPES, torch.float64):
            raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if dense.dtype != emb.dtype:
        raise TypeError(f"dense and emb must have the same dtype, got {dense.dtype} and {emb.dtype} "
                        "(cast one of them first)")
    if dense.device != emb.device:
        raise ValueError(f"dense is on {dense.device} but emb is on {emb.device}; both must share a device")
    require_ndim("dense", dense, 2, "(B, D)")
    require_ndim("emb", emb, 3, "(B, F, D)")
    b, f, d = emb.shape
    if dense.shape[0] != b:
        raise ValueError(f"dense has {dense.shape[0]} rows but emb has {b}; both need the batch size B first")
    if dense.shape[1] != d:
        raise ValueError(f"dense's width D={dense.shape[1]} must equal emb's vector length D={d} (emb (B, F, D))")
    if not 1 <= f <= MAX_FEATURES:
        raise ValueError(f"emb must have 1 <= F <= {MAX_FEATURES} features (emb (B, F, D)), got F={f}")
    if not 1 <= d <= MAX_DIM:
        raise ValueError(f"the vector length D must be in [1, {MAX_DIM}], got D={d}")
    if isinstance(pad_to, bool) or not isinstance(pad_to, int):
        raise TypeError(f"pad_to must be an int, got {type(pad_to).__name__}")
    if pad_to < 1:
        raise ValueError(f"pad_to must be >= 1, got {pad_to}")


def require_triton_dtype(t: torch.Tensor) -> None:
    """The Triton kernels' dtypes (float64 runs on the PyTorch path only)."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"the Triton kernels take float32, bfloat16 or float16, got {t.dtype} "
                        "(float64 runs on the PyTorch path: FUSELAB_BACKEND=torch)")


def validate(dense: object, emb: object, self_interaction: bool, pad_to: object,
             signature: Hashable | None) -> InteractionCall:
    """All checks of :func:`fuselab.dot_interaction` (``signature``: the call's), and the backend
    (:func:`fuselab.backend.triton_for`)."""
    check_inputs(dense, emb, pad_to)
    triton = triton_for(dense)
    if triton:
        require_triton_dtype(dense)
    _, f, d = emb.shape
    return InteractionCall(bool(self_interaction), pad_to, output_width(f, d, self_interaction, pad_to), triton,
                           signature if triton else None)


def unchecked(emb: torch.Tensor, self_interaction: bool, pad_to: int, triton: bool) -> InteractionCall:
    """The call of the custom op's inputs as they are (fake tensors; its registered autograd)."""
    _, f, d = emb.shape
    return InteractionCall(self_interaction, pad_to, output_width(f, d, self_interaction, pad_to), triton)


def gradient_call(call: InteractionCall, signature: Hashable | None) -> InteractionGradCall:
    """The backward of a checked forward ``call`` (autograd hands a gradient of the output's shape and device)."""
    return InteractionGradCall(call.self_interaction, call.triton, signature if call.triton else None)


def validate_gradient(grad: object, dense: object, emb: object, self_interaction: bool,
                      signature: Hashable | None) -> InteractionGradCall:
    """The checks of a direct call of the backward op: the inputs as :func:`check_inputs`, ``grad`` (B, W >= D + P)
    floating on their device (cast to their dtype before the launch); the backend as :func:`validate`'s."""
    check_inputs(dense, emb)
    triton = triton_for(dense)
    if triton:
        require_triton_dtype(dense)
    _require_wide("grad", grad, emb, self_interaction)
    if not grad.is_floating_point():
        raise TypeError(f"grad must have a floating dtype, got {grad.dtype}")
    if grad.device != dense.device:
        raise ValueError(f"grad is on {grad.device} but dense is on {dense.device}; all must share a device")
    return InteractionGradCall(bool(self_interaction), triton, signature if triton else None)


def _require_wide(name: str, t: object, emb: torch.Tensor, self_interaction: bool) -> None:
    """``t`` is a tensor ``(B, W >= D + P)``: an output or its gradient (its columns past D + P are padding)."""
    b, f, d = emb.shape
    pairs = num_pairs(f, self_interaction)
    require_tensor(name, t)
    if t.dim() != 2 or t.shape[0] != b or t.shape[1] < d + pairs:
        raise ValueError(f"{name} must be (B={b}, W >= {d + pairs}), got {tuple(t.shape)}")


# ---------------------------------------------------------------------------------------------- out-param launchers
def require_out(name: str, t: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """``t`` is a tensor of ``shape``, ``dtype`` and ``device`` (any strides)."""
    require_tensor(name, t)
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {shape} on {device}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def check_forward_out(dense: object, emb: object, out: object, self_interaction: bool) -> None:
    """The inputs and the output (B, W >= D + P) of :func:`fuselab.ops.interaction.launch.dot_interaction_fwd_`."""
    check_inputs(dense, emb)
    require_triton_dtype(dense)
    _require_wide("out", out, emb, self_interaction)
    require_out("out", out, (emb.shape[0], out.shape[1]), dense.dtype, dense.device)


def check_backward_outs(grad: object, dense: object, emb: object, grads: tuple[object, object],
                        self_interaction: bool) -> None:
    """The operands of :func:`fuselab.ops.interaction.launch.dot_interaction_bwd_`: ``grad`` (B, W >= D + P) in the
    inputs' dtype, ``grads`` = (grad_dense (B, D), grad_emb (B, F, D)), any strides."""
    check_inputs(dense, emb)
    require_triton_dtype(dense)
    _require_wide("grad", grad, emb, self_interaction)
    b, f, d = emb.shape
    require_out("grad", grad, (b, grad.shape[1]), dense.dtype, dense.device)
    require_out("grad_dense", grads[0], (b, d), dense.dtype, dense.device)
    require_out("grad_emb", grads[1], (b, f, d), emb.dtype, emb.device)
