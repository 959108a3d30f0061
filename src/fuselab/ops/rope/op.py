"""Rotary position embedding (RoPE): the ops and the public :func:`apply_rope` (semantics: ``docs/rope.md``).

Two :class:`~fuselab.ops.opdef.Op` on the out-param launcher :func:`~fuselab.ops.rope.launch.rope_launch`:
:data:`ROPE` (``fuselab::rope``, out of place) and :data:`ROPE_` (``fuselab::rope_``, in place: q and k are marked
dirty), with one autograd formula: the backward is the same rotation with the conjugate sign (:func:`_backward`).

An eager call whose :func:`_call_key` a checked call kept skips the checks, the plan and the launch signature
(decoding: a dict lookup instead of tens of microseconds of host time); an int offset is still checked against the
table. The kept record holds what the checks computed (half, the largest int offset the table allows, inv_freq,
mscale) beside the launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fuselab.backend import triton_for
from fuselab.core.checks import require_tensor
from fuselab.core.rope_math import inv_freq_on, rope_frequencies
from fuselab.ops.opdef import Op, operand, scalar_class
from fuselab.ops.opdef import layout as tensor_layout
from fuselab.reference import rope as _ref

from .checks import check_inplace, dims, validate
from .launch import rope_launch, rope_relaunch

__all__ = ["ROPE", "ROPE_", "apply_rope", "run_rope"]

#: output allocator (tests swap in a poisoning one so unwritten elements show up as NaN)
_empty_like = torch.empty_like

_NO_GRADS = (None,) * 12  # the gradients of the inputs after q and k


def _kept(record, q, cos, offsets, layout, half, inv_freq, mscale) -> tuple | None:
    """What a call keeps under its key: (launch record, half, largest int offset the table allows or None,
    inv_freq, mscale)."""
    if record is None:
        return None
    limit = None if cos is None or offsets is not None else cos.shape[0] - dims(q, layout)[1]
    return record, half, limit, inv_freq, mscale


def _rotate(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout, half, interleaved, conj, offset, mscale,
            *, prepared=None) -> tuple:
    """q and k (or None) rotated into fresh tensors, one launch: ((q_out, k_out), kept record)."""
    q_out = _empty_like(q)
    k_out = _empty_like(k) if k is not None else None
    if prepared is not None:
        rope_relaunch(prepared[0], q, k, q_out, k_out, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset,
                      mscale)
        return (q_out, k_out), None
    record = rope_launch(q, k, q_out, k_out, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout,
                         half=half, interleaved=interleaved, conj=conj, offset=offset, mscale=mscale)
    return (q_out, k_out), _kept(record, q, cos, offsets, layout, half, inv_freq, mscale)


def _rotate_inplace(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout, half, interleaved, conj, offset,
                    mscale, *, prepared=None) -> tuple:
    """q and k (or None) rotated in place: ((q, k), kept record)."""
    if prepared is not None:
        rope_relaunch(prepared[0], q, k, q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset, mscale)
        return (q, k), None
    record = rope_launch(q, k, q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                         interleaved=interleaved, conj=conj, offset=offset, mscale=mscale)
    return (q, k), _kept(record, q, cos, offsets, layout, half, inv_freq, mscale)


def _rope_fake(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
               inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
               cu_seqlens: torch.Tensor | None, layout: str, half: int, interleaved: bool, conj: bool, offset: int,
               mscale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))


def _rope_inplace_fake(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
                       inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
                       cu_seqlens: torch.Tensor | None, layout: str, half: int, interleaved: bool, conj: bool,
                       offset: int, mscale: float) -> None:
    return None


def _setup_context(ctx, inputs, output) -> None:
    _q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, *params = inputs
    ctx.has_k = k is not None
    ctx.params = params
    ctx.save_for_backward(cos, sin, inv_freq, positions, offsets, cu_seqlens)


def _backward(ctx, grad_q, grad_k) -> tuple:
    """The same rotation with the conjugate sign, into fresh tensors (:data:`ROPE`). In eager autograd its launch
    is kept under the forward's key and the gradients' layouts: the backward runs on the autograd engine's thread,
    where every Python step costs several times its main-thread time."""
    tables = ctx.saved_tensors
    layout, half, interleaved, conj, offset, mscale = ctx.params
    grad_k = grad_k if ctx.has_k else None
    if grad_q is None:  # only k_out was used: rotate k alone (the launcher's q slot takes it)
        if grad_k is None:
            return None, None, *_NO_GRADS
        dk = ROPE.run_in_backward(ctx, (grad_k, None, *tables, layout, half, interleaved, not conj, offset, mscale))[0]
        return None, dk, *_NO_GRADS
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("backward", key, tensor_layout(grad_q), None if grad_k is None else tensor_layout(grad_k))
    dq, dk = ROPE.run_in_backward(ctx, (grad_q, grad_k, *tables, layout, half, interleaved, not conj, offset, mscale),
                                  key)
    return dq, (dk if ctx.has_k else None), *_NO_GRADS


def _launch_of(kept: tuple) -> tuple:
    """A kept record's launch (compiled entry, grid, every int argument): the backward's key of a call without one."""
    return kept[0]


ROPE = Op("fuselab::rope", eager=_rotate, fake=_rope_fake, setup_context=_setup_context, backward=_backward,
          differentiable=(0, 1), record_key=_launch_of)
ROPE_ = Op("fuselab::rope_", eager=_rotate_inplace, fake=_rope_inplace_fake, setup_context=_setup_context,
           backward=_backward, mutates_args=("q", "k"), differentiable=(0, 1), record_key=_launch_of)


# ---------------------------------------------------------------------------------------------- public API
def apply_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None, *,
               layout: str = "bshd", interleaved: bool = False, inplace: bool = False,
               positions: torch.Tensor | None = None, seqlen_offsets: int | torch.Tensor = 0,
               cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
               base: float = 10000.0, scaling: Mapping[str, Any] | None = None, rotary_dim: int | None = None,
               check_positions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q and k (one launch) by rotary position embedding; returns ``(q_out, k_out)``.

    Args:
        q: ``layout``-shaped float tensor: bshd ``(batch, seq, heads, head_dim)``, sbhd, bhsd, or thd
            ``(total_tokens, heads, head_dim)``. Any strides.
        k: like q with the same dtype, batch, seq and head_dim (any head count: GQA/MQA), or None (-> ``k_out``
            None).
        cos, sin: ``(seqlen_ro, rotary_dim // 2)`` tables (any float dtype, e.g. fp32 with bf16 q), or both
            None to compute the angles in the kernel from ``base``, ``scaling`` and ``rotary_dim`` (default head_dim).
        interleaved: False rotates halves (GPT-NeoX/Llama), True rotates pairs (0,1), (2,3)... (GPT-J).
        inplace: write into q and k (and return them). Pass-through dims are not touched.
        positions: int tensor of table rows per token, (batch, seq) or (1, seq); thd: (total_tokens,).
        seqlen_offsets: int or int tensor (batch,) added to each token's index in its sequence.
        cu_seqlens, max_seqlen: thd only; (batch + 1,) int32 cumulative lengths, longest sequence.
        check_positions: check tensor positions/offsets against the table on CUDA too (one host sync).

    Raises ``ValueError``/``TypeError`` naming the argument for bad shapes, dtypes (k of another dtype than q),
    devices, tables that are too short, bad cu_seqlens, both positions and seqlen_offsets, or ``inplace=True`` on a
    leaf tensor that requires grad (grad mode on; on every backend). Tensor positions/offsets are checked
    against the table on the host when they are on the CPU (or ``check_positions``); on CUDA, out-of-range
    rows are clamped to ``[0, seqlen_ro - 1]`` inside the kernel (never an out-of-bounds read).
    """
    op = ROPE_ if inplace else ROPE
    call = _call_key(q, k, cos, sin, layout, interleaved, inplace, positions, seqlen_offsets, cu_seqlens, max_seqlen,
                     base, scaling, rotary_dim, check_positions)
    try:  # no lookup without a key (under torch.compile: torch 2.11's dynamo cannot trace the cache's dict.get)
        prepared = None if call is None else op.launches.get(call)
    except TypeError:  # an unhashable argument in the key: validate names it
        prepared = None
    if prepared is not None and triton_for(q):  # a checked call of this key kept its launch
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
        if inplace and needs_grad:
            check_inplace(q, k)
        _, half, limit, inv_freq, mscale = prepared
        if type(seqlen_offsets) is int:
            if seqlen_offsets < 0 or (limit is not None and seqlen_offsets > limit):
                validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
                         check_positions)  # raises, naming the argument
            offsets, offset = None, seqlen_offsets
        else:
            offsets, offset = seqlen_offsets, 0
        # (q_out, k_out or None), or (q, k) in place
        return op.run((q, k, cos, sin, inv_freq, None, offsets, None, layout, half, interleaved, False, offset,
                       mscale), call, prepared, needs_grad)
    if inplace:
        check_inplace(q, k)
    require_tensor("q", q)
    half, offsets, offset = validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen,
                                     rotary_dim, check_positions)
    # in-kernel angles: base and scaling are checked here (cached), once and before the backend is chosen, so
    # a bad scaling raises the same ValueError/TypeError on every path
    inv_freq, mscale = (None, 1.0) if cos is not None else rope_frequencies(2 * half, base, scaling)
    if not triton_for(q):
        return _ref.apply_rope(q, k, cos, sin, layout=layout, interleaved=interleaved, inplace=inplace,
                               positions=positions, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                               base=base, scaling=scaling, rotary_dim=2 * half)
    if cos is None:
        inv_freq = inv_freq_on(q.device, 2 * half, base, scaling)
    return run_rope(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                    interleaved=interleaved, inplace=inplace, offset=offset, mscale=mscale, key=call)


def run_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
             inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
             cu_seqlens: torch.Tensor | None, *, layout: str, half: int, interleaved: bool, inplace: bool,
             offset: int, mscale: float, key: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validated arguments -> the Triton path (:data:`ROPE` or :data:`ROPE_`): ``(q_out, k_out)``. ``key``: keep
    the launch under it (:func:`_call_key`)."""
    op = ROPE_ if inplace else ROPE
    out = op.run((q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout, half, interleaved, False, offset,
                  mscale), key)
    if inplace:
        return q, k
    return out[0], (out[1] if k is not None else None)


def _call_key(q, k, cos, sin, layout, interleaved, inplace, positions, seqlen_offsets, cu_seqlens, max_seqlen, base,
              scaling, rotary_dim, check_positions) -> tuple | None:
    """Everything the checks and the forward launch of an eager call depend on besides tensor values and an int
    offset's value, or None when the call needs checks of values (positions, cu_seqlens, CPU offset tensors,
    ``check_positions``), has a scaling dict, or is being compiled. Per operand: shape, device, dtype, strides,
    storage offset, 16-byte alignment; an int offset by the class the launch specializes on. A key holding an
    unhashable argument makes the lookup answer None (then the checks name it)."""
    if (positions is not None or cu_seqlens is not None or check_positions or scaling is not None
            or torch.compiler.is_compiling()):
        return None
    if type(seqlen_offsets) is int:
        offsets = scalar_class(seqlen_offsets)
    elif type(seqlen_offsets) is torch.Tensor and seqlen_offsets.is_cuda:
        offsets = operand(seqlen_offsets)
    else:
        return None
    try:
        return (layout, interleaved, inplace, max_seqlen, rotary_dim, base, offsets, operand(q),
                None if k is None else operand(k), None if cos is None else operand(cos),
                None if sin is None else operand(sin))
    except AttributeError:  # not tensors: validate names them
        return None
