"""Rotary position embedding (RoPE): public API, validation, torch.library ops, autograd.

Layers: :func:`fuselab.ops.rope_kernel.rope_launch` (out-param launcher) -> ``fuselab::rope`` /
``fuselab::rope_`` custom ops (+ fake impls, + autograd for the out-of-place op) -> :func:`apply_rope`.
Eager calls go straight to the launcher (the custom-op dispatcher costs tens of microseconds of host
time per call, which matters in decoding and starves the GPU in training): without grad directly, with
grad through :class:`_RopeFunction`; ``torch.compile`` always sees the custom
ops (no graph break). The semantics are documented in ``docs/rope.md``.
"""

from collections.abc import Mapping
from typing import Any

import torch

from fuselab.backend import triton_for
from fuselab.reference import rope as _ref

from ._launch import keep, operand, scalar_class
from ._launch import layout as tensor_layout
from ._validate import require_tensor
from .rope_angles import inv_freq_on, rope_cos_sin, rope_frequencies
from .rope_checks import dims, validate
from .rope_kernel import LAYOUTS, rope_launch, rope_relaunch

__all__ = ["LAYOUTS", "apply_rope", "rope_cos_sin", "rope_frequencies"]

#: output allocator (tests swap in a poisoning one so unwritten elements show up as NaN)
_empty_like = torch.empty_like


# ---------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("fuselab::rope", mutates_args=())
def _rope_op(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
             inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
             cu_seqlens: torch.Tensor | None, layout: str, half: int, interleaved: bool, conj: bool,
             offset: int, mscale: float) -> tuple[torch.Tensor, torch.Tensor]:
    q_out = _empty_like(q)
    k_out = _empty_like(k) if k is not None else q.new_empty(0)
    rope_launch(q, k, q_out, k_out if k is not None else None, cos, sin, inv_freq, positions, offsets, cu_seqlens,
                layout=layout, half=half, interleaved=interleaved, conj=conj, offset=offset, mscale=mscale)
    return q_out, k_out


@_rope_op.register_fake
def _(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout, half, interleaved, conj, offset, mscale):
    return torch.empty_like(q), (torch.empty_like(k) if k is not None else q.new_empty(0))


def _setup_context(ctx, inputs, output):
    _q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, *params = inputs
    ctx.has_k = k is not None
    ctx.params = params
    ctx.save_for_backward(cos, sin, inv_freq, positions, offsets, cu_seqlens)


def _backward(ctx, grad_q, grad_k):
    cos, sin, inv_freq, positions, offsets, cu_seqlens = ctx.saved_tensors
    layout, half, interleaved, conj, offset, mscale = ctx.params
    dq, dk = _rope_op(grad_q, grad_k if ctx.has_k else None, cos, sin, inv_freq, positions, offsets, cu_seqlens,
                      layout, half, interleaved, not conj, offset, mscale)
    return dq, (dk if ctx.has_k else None), None, None, None, None, None, None, None, None, None, None, None, None


_rope_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("fuselab::rope_", mutates_args=("q", "k"))
def _rope_inplace_op(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
                     cu_seqlens: torch.Tensor | None, layout: str, half: int, interleaved: bool, conj: bool,
                     offset: int, mscale: float) -> None:
    rope_launch(q, k, q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                interleaved=interleaved, conj=conj, offset=offset, mscale=mscale)


@_rope_inplace_op.register_fake
def _(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout, half, interleaved, conj, offset, mscale):
    return None


class _RopeFunction(torch.autograd.Function):
    """Rotation under eager autograd, straight to the launcher (in place: q and k are marked dirty). The
    custom-op dispatcher and its autograd wrapper cost tens of microseconds of host time per call, which
    starved the GPU in forward+backward; ``torch.compile`` still traces ``fuselab::rope`` / ``fuselab::rope_``
    (no graph break).

    The backward runs on the autograd engine's thread, where each Python step costs several times its
    main-thread time. A backward whose forward launch was the same (same compiled entry: layout, shapes,
    strides, dtypes, tables) and whose gradients have the layout an earlier such backward saw repeats that
    backward's launch (:data:`_PREPARED`, :func:`~fuselab.ops.rope_kernel.rope_relaunch`): no plan, no key."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, params, inplace, record):
        # record: the forward launch of an earlier call of this layout (apply_rope's _call_key), or None
        tables = (cos, sin, inv_freq, positions, offsets, cu_seqlens)
        if inplace:
            q_out, k_out = q, k
            ctx.mark_dirty(*((q,) if k is None else (q, k)))
        if record is not None:
            q_out, k_out = _rotate_again(record, q, k, tables, params["offset"], params["mscale"], inplace)
        elif inplace:
            record = rope_launch(q, k, q, k, *tables, **params)
        else:
            q_out, k_out, record = _rotated(q, k, tables, params)
        ctx.has_k = k is not None
        ctx.params = params
        ctx.save_for_backward(cos, sin, inv_freq, positions, offsets, cu_seqlens)
        ctx.record = record  # read back through the outputs' grad_fn (this ctx) by _run
        ctx.entry = None if record is None or torch.compiler.is_compiling() else record[0]
        ctx.prepared = _PREPARED.get(ctx.entry)
        return q_out, k_out

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        grad_k = grad_k if ctx.has_k else None
        prepared = ctx.prepared
        if prepared is not None and grad_q is not None and _layouts(grad_q, grad_k) == prepared[1]:
            params = ctx.params
            dq, dk = _rotate_again(prepared[0], grad_q, grad_k, ctx.saved_tensors, params["offset"], params["mscale"],
                                   False)
        else:
            dq, dk, record = _rotate_back(ctx, grad_q, grad_k)
            if ctx.entry is not None and record is not None and grad_q is not None:
                keep(_PREPARED, ctx.entry, (record, _layouts(grad_q, grad_k)))
        return dq, dk, None, None, None, None, None, None, None, None, None


#: backward launches by the forward's launch entry (see :class:`_RopeFunction`): (record of
#: :func:`~fuselab.ops.rope_kernel.rope_launch`, the gradients' layout it was made for)
_PREPARED: dict[tuple | None, tuple] = {}


def _layouts(grad_q: torch.Tensor, grad_k: torch.Tensor | None) -> tuple:
    """What a prepared backward launch assumes of its gradients (:func:`~fuselab.ops._launch.layout`)."""
    return tensor_layout(grad_q), None if grad_k is None else tensor_layout(grad_k)


def _rotated(q: torch.Tensor, k: torch.Tensor | None, tables: tuple, params: dict) -> tuple:
    """``q`` and ``k`` (or None) rotated into fresh tensors, one launch: (q_out, k_out, launch record)."""
    q_out = _empty_like(q)
    k_out = _empty_like(k) if k is not None else None
    return q_out, k_out, rope_launch(q, k, q_out, k_out, *tables, **params)


def _rotate_again(record: tuple, q: torch.Tensor, k: torch.Tensor | None, tables: tuple, offset: int, mscale: float,
                  inplace: bool) -> tuple:
    """Repeat a kept launch (:func:`~fuselab.ops.rope_kernel.rope_relaunch`) on new q and k: in place, or into fresh
    tensors (``empty_like`` lays them out as it did for the launch that was kept). Returns (q_out, k_out)."""
    if inplace:
        q_out, k_out = q, k
    else:
        q_out, k_out = _empty_like(q), (_empty_like(k) if k is not None else None)
    rope_relaunch(record, q, k, q_out, k_out, *tables, offset, mscale)
    return q_out, k_out


def _rotate_back(ctx, grad_q, grad_k) -> tuple:
    """The backward: the same rotation with the conjugate sign, into fresh tensors: (dq, dk, launch record)."""
    params = {**ctx.params, "conj": not ctx.params["conj"]}
    if grad_q is None:  # only k_out was used: rotate k alone (the launcher's q slot takes it)
        if grad_k is None:
            return None, None, None
        return None, _rotated(grad_k, None, ctx.saved_tensors, params)[0], None
    return _rotated(grad_q, grad_k, ctx.saved_tensors, params)


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
        k: like q with the same batch, seq and head_dim (any head count: GQA/MQA), or None (-> ``k_out`` None).
        cos, sin: ``(seqlen_ro, rotary_dim // 2)`` tables (any float dtype, e.g. fp32 with bf16 q), or both
            None to compute the angles in the kernel from ``base``, ``scaling`` and ``rotary_dim`` (default head_dim).
        interleaved: False rotates halves (GPT-NeoX/Llama), True rotates pairs (0,1), (2,3)... (GPT-J).
        inplace: write into q and k (and return them). Pass-through dims are not touched.
        positions: int tensor of table rows per token, (batch, seq) or (1, seq); thd: (total_tokens,).
        seqlen_offsets: int or int tensor (batch,) added to each token's index in its sequence.
        cu_seqlens, max_seqlen: thd only; (batch + 1,) int32 cumulative lengths, longest sequence.
        check_positions: check tensor positions/offsets against the table on CUDA too (one host sync).

    Raises ``ValueError``/``TypeError`` naming the argument for bad shapes, dtypes, devices, tables that are
    too short, bad cu_seqlens, or both positions and seqlen_offsets. Tensor positions/offsets are checked
    against the table on the host when they are on the CPU (or ``check_positions``); on CUDA, out-of-range
    rows are clamped to ``[0, seqlen_ro - 1]`` inside the kernel (never an out-of-bounds read).
    """
    call = _call_key(q, k, cos, sin, layout, interleaved, inplace, positions, seqlen_offsets, cu_seqlens, max_seqlen,
                     base, scaling, rotary_dim, check_positions)
    try:
        prepared = _CALLS.get(call)
    except TypeError:  # an unhashable argument (validate names it): no key
        call = prepared = None
    if prepared is not None and triton_for(q):  # a checked call of this layout kept its launch
        half, limit, inv_freq, mscale, record = prepared
        if type(seqlen_offsets) is int:
            if seqlen_offsets < 0 or (limit is not None and seqlen_offsets > limit):
                validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
                         check_positions)  # raises, naming the argument
            offsets, offset = None, seqlen_offsets
        else:
            offsets, offset = seqlen_offsets, 0
        if not _needs_grad(q, k):  # decoding's hot path: the kept launch on new tensors, no plan, no autograd
            return _rotate_again(record, q, k, (cos, sin, inv_freq, None, offsets, None), offset, mscale, inplace)
        return _run(q, k, cos, sin, inv_freq, None, offsets, None, layout=layout, half=half, interleaved=interleaved,
                    inplace=inplace, offset=offset, mscale=mscale, record=record)[:2]
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
    q_out, k_out, record = _run(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                                interleaved=interleaved, inplace=inplace, offset=offset, mscale=mscale)
    if call is not None and record is not None:
        limit = None if cos is None or offsets is not None else cos.shape[0] - dims(q, layout)[1]
        keep(_CALLS, call, (half, limit, inv_freq, mscale, record))
    return q_out, k_out


def run_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
             inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
             cu_seqlens: torch.Tensor | None, *, layout: str, half: int, interleaved: bool, inplace: bool,
             offset: int, mscale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validated arguments -> the Triton path: direct launch (eager, no grad), custom op or autograd.Function."""
    return _run(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                interleaved=interleaved, inplace=inplace, offset=offset, mscale=mscale)[:2]


def _run(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, *, layout, half, interleaved, inplace, offset,
         mscale, record=None) -> tuple:
    """:func:`run_rope`, also returning the forward launch's record (None under torch.compile or when nothing was
    launched). ``record``: the forward of an autograd call repeats that launch (:func:`_call_key`) instead of planning
    one (calls without grad repeat it in :func:`apply_rope`)."""
    args = (cos, sin, inv_freq, positions, offsets, cu_seqlens)
    needs_grad = _needs_grad(q, k)
    compiling = torch.compiler.is_compiling()
    params = dict(layout=layout, half=half, interleaved=interleaved, conj=False, offset=offset, mscale=mscale)
    # autograd: one Function (the in-place custom op has no autograd formula, so in place always takes it)
    if needs_grad and (inplace or not compiling):
        q_out, k_out = _RopeFunction.apply(q, k, *args, params, inplace, record)
        return q_out, k_out, q_out.grad_fn.record
    if inplace:
        if compiling:
            _rope_inplace_op(q, k, *args, layout, half, interleaved, False, offset, mscale)
            return q, k, None
        return q, k, rope_launch(q, k, q, k, *args, **params)
    if compiling:
        q_out, k_out = _rope_op(q, k, *args, layout, half, interleaved, False, offset, mscale)
        return q_out, (k_out if k is not None else None), None
    return _rotated(q, k, args, params)


def _needs_grad(q: torch.Tensor, k: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))


# ---------------------------------------------------------------------------------------------- fast path
#: eager calls by :func:`_call_key` -> (half, largest int offset the table allows or None, inv_freq or None,
#: mscale, forward launch record); kept by calls that passed :func:`~fuselab.ops.rope_checks.validate`
_CALLS: dict[tuple, tuple] = {}


def _call_key(q, k, cos, sin, layout, interleaved, inplace, positions, seqlen_offsets, cu_seqlens, max_seqlen, base,
              scaling, rotary_dim, check_positions) -> tuple | None:
    """Everything the checks and the forward launch of an eager call depend on besides tensor values and an int
    offset's value, or None when the call needs checks of values (positions, cu_seqlens, CPU offset tensors,
    ``check_positions``), has a scaling dict, or is being compiled. Per operand: shape, device, dtype, strides,
    storage offset, 16-byte alignment; an int offset by the class the launch specializes on.

    A call whose key a checked call kept skips the checks, the plan and the launch signature (decoding: a
    dict lookup instead of tens of microseconds of host time); an int offset is still checked against the
    table. A key holding an unhashable argument makes the caller's lookup raise TypeError (then: no key)."""
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
