"""Rotary position embedding (RoPE): the ops and the public :func:`apply_rope` (semantics: ``docs/rope.md``).

``apply_rope`` -> :func:`~fuselab.ops.rope.checks.validate` -> :class:`~fuselab.ops.rope.checks.RopeCall` ->
:func:`~fuselab.ops.rope.launch.plan` -> :func:`~fuselab.ops.rope.launch.forward` -> the kernel. Two
:class:`~fuselab.ops.opdef.Op`: :data:`ROPE` (``fuselab::rope``, out of place) and :data:`ROPE_` (``fuselab::rope_``,
in place: q and k are marked dirty), with one autograd formula: the backward is the same rotation with the conjugate
sign, out of place. An eager call whose signature was planned skips the checks and the plan (decoding: a dict lookup
instead of tens of microseconds of host time); its int offset, and in place the leaves and the aliasing of q and k,
are checked on every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fuselab.backend import triton_for
from fuselab.ops.opdef import Op, scalar_class, tensor_signature
from fuselab.reference import rope as _ref

from . import checks, launch
from .checks import RopeArgs, RopeCall

__all__ = ["ROPE", "ROPE_", "apply_rope", "rotate_by_tables"]

_SCHEMA_INPUTS = ("Tensor q, Tensor? k, Tensor? cos, Tensor? sin, Tensor? inv_freq, Tensor? positions, "
                  "Tensor? offsets, Tensor? cu_seqlens, int offset, str layout, int half, bool interleaved, "
                  "bool conj, float mscale")


def _call_of(inputs: tuple, signed: bool, inplace: bool) -> RopeCall:
    """The call of the custom ops' inputs (checked by the public function that made them, or by ``opcheck``)."""
    q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset, layout, half, interleaved, conj, mscale = inputs
    signature = None
    if signed:
        signature = ("custom", inplace, layout, half, interleaved, conj, mscale, scalar_class(offset),
                     *[None if t is None else tensor_signature(t)
                       for t in (q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens)])
    return RopeCall(layout=layout, half=half, interleaved=interleaved, conj=conj, mscale=mscale, inplace=inplace,
                    inv_freq=inv_freq, signature=signature)


class Rope(Op):
    """``fuselab::rope``: q and k (or None) rotated into fresh tensors, one launch: ``(q_out, k_out)``."""

    name = "fuselab::rope"
    schema = f"({_SCHEMA_INPUTS}) -> (Tensor, Tensor)"
    differentiable = (0, 1)

    plan = staticmethod(launch.plan)
    forward = staticmethod(launch.forward)

    def call_of(self, inputs: tuple, signed: bool) -> RopeCall:
        return _call_of(inputs, signed, bool(self.mutates))

    def fake(self, call: RopeCall, operands: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = operands[0], operands[1]
        return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))

    def setup_context(self, ctx, call: RopeCall, operands: tuple, outputs: Any) -> None:
        _q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset = operands
        ctx.has_k, ctx.offset = k is not None, offset
        ctx.save_for_backward(cos, sin, inv_freq, positions, offsets, cu_seqlens)

    def backward(self, ctx, grad_q: torch.Tensor | None, grad_k: torch.Tensor | None) -> tuple:
        """The same rotation with the conjugate sign, into fresh tensors (:data:`ROPE`). In the eager node its plan is
        cached under the forward's signature and the gradients' (any strides: an expanded ``out.sum()`` gradient
        too): the backward runs on the autograd engine's thread, where every Python step costs several times its
        main-thread time."""
        grad_k = grad_k if ctx.has_k else None
        if grad_q is None:  # only k_out was used: rotate k alone (q's slot takes it)
            if grad_k is None:
                return (None,) * 9
            return None, _conjugate(ctx, grad_k, None)[0], *(None,) * 7
        dq, dk = _conjugate(ctx, grad_q, grad_k)
        return dq, (dk if ctx.has_k else None), *(None,) * 7  # traced, a None k's slot holds an empty tensor


class RopeInplace(Rope):
    """``fuselab::rope_``: q and k (or None) rotated in place (the forward returns them)."""

    name = "fuselab::rope_"
    schema = f"({_SCHEMA_INPUTS.replace('Tensor q, Tensor? k', 'Tensor(a0!) q, Tensor(a1!)? k')}) -> ()"
    mutates = ("q", "k")

    def fake(self, call: RopeCall, operands: tuple) -> None:
        return None


ROPE = Rope()
ROPE_ = RopeInplace()


def _conjugate(ctx, g1: torch.Tensor, g2: torch.Tensor | None) -> tuple:
    """``g1`` (and ``g2``) rotated by minus the forward's angles (:data:`ROPE`)."""
    call = ctx.call
    signature = None
    if getattr(ctx, "eager", False) and call.signature is not None:
        signature = ("conj", call.signature, tensor_signature(g1), None if g2 is None else tensor_signature(g2))
    plan = ROPE.cached(signature)
    conj = plan.call if plan is not None else checks.conjugate(call, signature)
    return ROPE.run_in_backward(ctx, conj, (g1, g2, *ctx.saved_tensors, ctx.offset), plan)


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
    devices, tables that are too short, bad cu_seqlens, both positions and seqlen_offsets; with ``inplace=True``:
    a leaf tensor that requires grad (grad mode on), q or k whose elements share memory, q and k that overlap each
    other or a table (out of place they may alias). On every backend, and on every call (a repeated call is checked
    like its first). Tensor positions/offsets are checked against the table on the host when they are on the CPU
    (or ``check_positions``); on CUDA, out-of-range rows are clamped to ``[0, seqlen_ro - 1]`` inside the kernel
    (never an out-of-bounds read).
    """
    op = ROPE_ if inplace else ROPE
    signature = None
    if not torch.compiler.is_compiling():
        try:  # everything the checks and the plan read besides values; an int offset by its specialization class
            signature = (layout, interleaved, inplace, max_seqlen, rotary_dim, base, check_positions,
                         None if scaling is None else tuple(sorted(scaling.items())),
                         scalar_class(seqlen_offsets) if type(seqlen_offsets) is not torch.Tensor
                         else tensor_signature(seqlen_offsets), tensor_signature(q),
                         None if k is None else tensor_signature(k), None if cos is None else tensor_signature(cos),
                         None if sin is None else tensor_signature(sin),
                         None if positions is None else tensor_signature(positions),
                         None if cu_seqlens is None else tensor_signature(cu_seqlens))
        except (AttributeError, TypeError):  # not tensors, a scaling that is no dict: validate names them
            signature = None
    plan = op.cached(signature)
    if plan is not None and triton_for(q):  # a call of this signature passed the checks and was planned
        call = plan.call
        if type(seqlen_offsets) is int:
            offsets, offset = None, seqlen_offsets
            fits = offset >= 0 and (call.max_offset is None or offset <= call.max_offset)
        else:
            offsets, offset, fits = seqlen_offsets, 0, True
        if fits and not call.recheck:
            needs_grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
            if inplace:
                checks.check_inplace_leaves(q, k)
                checks.check_inplace_aliasing(q, k, checks.reads(cos, sin, positions, offsets, cu_seqlens))
            out = op.run(call, (q, k, cos, sin, call.inv_freq, positions, offsets, cu_seqlens, offset), plan,
                         needs_grad)
            return out if not inplace else (q, k)
    call = checks.validate(RopeArgs(q, k, cos, sin, interleaved=interleaved, inplace=inplace, positions=positions,
                                    seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                    base=base, scaling=scaling, rotary_dim=rotary_dim,
                                    check_positions=check_positions), layout, signature)
    if not triton_for(q):
        return _ref.apply_rope(q, k, cos, sin, layout=layout, interleaved=interleaved, inplace=inplace,
                               positions=positions, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                               base=base, scaling=scaling, rotary_dim=2 * call.half)
    offsets, offset = (seqlen_offsets, 0) if isinstance(seqlen_offsets, torch.Tensor) else (None, seqlen_offsets)
    return _run(op, call, (q, k, cos, sin, call.inv_freq, positions, offsets, cu_seqlens, offset), plan)


def _run(op: Rope, call: RopeCall, operands: tuple, plan: launch.RopePlan | None = None) -> tuple:
    """``op`` on a validated call: ``(q_out, k_out or None)``, or ``(q, k)`` in place."""
    out = op.run(call, operands, plan)
    if op.mutates:
        return operands[0], operands[1]
    return out[0], (out[1] if operands[1] is not None else None)


def rotate_by_tables(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                     layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q and k rotated out of place by per-token tables the caller checked: ``(batch or 1, seq, half)`` views, row
    ``s`` for the token at sequence index ``s`` (:mod:`fuselab.hf`'s path)."""
    signature = None
    if not torch.compiler.is_compiling():
        signature = ("tables", layout, tensor_signature(q), None if k is None else tensor_signature(k),
                     tensor_signature(cos), tensor_signature(sin))
    plan = ROPE.cached(signature)
    call = plan.call if plan is not None else RopeCall(layout=layout, half=cos.shape[-1], interleaved=False,
                                                       signature=signature)
    return _run(ROPE, call, (q, k, cos, sin, None, None, None, None, 0), plan)
