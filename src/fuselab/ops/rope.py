"""Rotary position embedding (RoPE): public API, validation, torch.library ops, autograd.

Layers: :func:`fuselab.ops.rope_kernel.rope_launch` (out-param launcher) -> ``fuselab::rope`` /
``fuselab::rope_`` custom ops (+ fake impls, + autograd for the out-of-place op) -> :func:`apply_rope`.
Eager calls go straight to the launcher (the custom-op dispatcher costs tens of microseconds of host
time per call, which matters in decoding and starves the GPU in training): without grad directly, with
grad through :class:`_RopeFunction`; ``torch.compile`` always sees the custom
ops (no graph break). The semantics are documented in ``docs/rope.md``.
"""

import itertools
import os
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from fuselab.backend import ENV_VAR, use_triton
from fuselab.reference import rope as _ref

from ._launch import keep, layout
from ._validate import require_float, require_same_device, require_tensor
from .rope_angles import inv_freq_on, rope_cos_sin, rope_frequencies
from .rope_kernel import LAYOUTS, rope_launch, rope_relaunch

__all__ = ["LAYOUTS", "apply_rope", "rope_cos_sin", "rope_frequencies"]

SHAPES = {"bshd": "(batch, seq, heads, head_dim)", "sbhd": "(seq, batch, heads, head_dim)",
          "bhsd": "(batch, heads, seq, head_dim)", "thd": "(total_tokens, heads, head_dim)"}
_INT_DTYPES = (torch.int32, torch.int64)
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
    def forward(ctx, q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, params, inplace):
        tables = (cos, sin, inv_freq, positions, offsets, cu_seqlens)
        if inplace:
            q_out, k_out = q, k
            ctx.mark_dirty(*((q,) if k is None else (q, k)))
            record = rope_launch(q, k, q, k, *tables, **params)
        else:
            q_out, k_out, record = _rotated(q, k, tables, params)
        ctx.has_k = k is not None
        ctx.params = params
        ctx.save_for_backward(cos, sin, inv_freq, positions, offsets, cu_seqlens)
        ctx.entry = None if record is None or torch.compiler.is_compiling() else record[0]
        ctx.prepared = _PREPARED.get(ctx.entry)
        return q_out, k_out

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        grad_k = grad_k if ctx.has_k else None
        prepared = ctx.prepared
        if prepared is not None and grad_q is not None and _layouts(grad_q, grad_k) == prepared[1]:
            dq, dk = _empty_like(grad_q), (_empty_like(grad_k) if grad_k is not None else None)
            params = ctx.params
            rope_relaunch(prepared[0], grad_q, grad_k, dq, dk, *ctx.saved_tensors, params["offset"], params["mscale"])
        else:
            dq, dk, record = _rotate_back(ctx, grad_q, grad_k)
            if ctx.entry is not None and record is not None and grad_q is not None:
                keep(_PREPARED, ctx.entry, (record, _layouts(grad_q, grad_k)))
        return dq, dk, None, None, None, None, None, None, None, None


#: backward launches by the forward's launch entry (see :class:`_RopeFunction`): (record of
#: :func:`~fuselab.ops.rope_kernel.rope_launch`, the gradients' layout it was made for)
_PREPARED: dict[tuple | None, tuple] = {}


def _layouts(grad_q: torch.Tensor, grad_k: torch.Tensor | None) -> tuple:
    """What a prepared backward launch assumes of its gradients (:func:`~fuselab.ops._launch.layout`)."""
    return layout(grad_q), None if grad_k is None else layout(grad_k)


def _rotated(q: torch.Tensor, k: torch.Tensor | None, tables: tuple, params: dict) -> tuple:
    """``q`` and ``k`` (or None) rotated into fresh tensors, one launch: (q_out, k_out, launch record)."""
    q_out = _empty_like(q)
    k_out = _empty_like(k) if k is not None else None
    return q_out, k_out, rope_launch(q, k, q_out, k_out, *tables, **params)


def _rotate_back(ctx, grad_q, grad_k) -> tuple:
    """The backward: the same rotation with the conjugate sign, into fresh tensors: (dq, dk, launch record)."""
    params = {**ctx.params, "conj": not ctx.params["conj"]}
    if grad_q is None:  # only k_out was used: rotate k alone (the launcher's q slot takes it)
        if grad_k is None:
            return None, None, None
        return None, _rotated(grad_k, None, ctx.saved_tensors, params)[0], None
    return _rotated(grad_q, grad_k, ctx.saved_tensors, params)


# ---------------------------------------------------------------------------------------------- validation
def _dims(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(batch, seq, heads, head_dim) of ``t`` in ``layout`` (thd: batch 1, seq = tokens)."""
    s = t.shape
    if layout == "bshd":
        return s[0], s[1], s[2], s[3]
    if layout == "sbhd":
        return s[1], s[0], s[2], s[3]
    if layout == "bhsd":
        return s[0], s[2], s[1], s[3]
    return 1, s[0], s[1], s[2]


_CU_CHECKED: dict[int, tuple] = {}  # id(cu_seqlens) -> (weakref, version, longest sequence)


def _check_cu_seqlens(cu: torch.Tensor, n_tokens: int) -> int:
    """Validate cu_seqlens values once per tensor version (one host sync on CUDA); returns the longest sequence."""
    hit = _CU_CHECKED.get(id(cu))
    if hit is not None and hit[0]() is cu and hit[1] == cu._version:
        return hit[2]
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {values[0]}")
    lengths = [b - a for a, b in itertools.pairwise(values)]
    if min(lengths) < 0:
        raise ValueError(f"cu_seqlens must be non-decreasing, got {values[:8]}{'...' if len(values) > 8 else ''}")
    if values[-1] != n_tokens:
        raise ValueError(f"cu_seqlens must end at total_tokens = q.shape[0] = {n_tokens}, got {values[-1]}")
    if len(_CU_CHECKED) > 64:
        _CU_CHECKED.clear()
    _CU_CHECKED[id(cu)] = (weakref.ref(cu), cu._version, max(lengths))
    return max(lengths)


def _validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
              check_positions) -> tuple[int, torch.Tensor | None, int]:
    """All argument checks; returns (half, offsets tensor or None, scalar offset)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    require_float("q", q)
    ndim = 3 if layout == "thd" else 4
    if q.dim() != ndim:
        raise ValueError(f"q must have {ndim} dims {SHAPES[layout]} for layout={layout!r}, got shape {tuple(q.shape)}")
    batch, seqlen, _, head_dim = _dims(q, layout)
    if k is not None:
        require_float("k", k)
        if k.dim() != ndim:
            raise ValueError(f"k must have {ndim} dims {SHAPES[layout]} for layout={layout!r}, "
                             f"got shape {tuple(k.shape)}")
        kb, ks, _, kd = _dims(k, layout)
        if (kb, ks, kd) != (batch, seqlen, head_dim):
            raise ValueError(f"k must match q in batch, seq and head_dim {SHAPES[layout]}: q has shape "
                             f"{tuple(q.shape)}, k has shape {tuple(k.shape)}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must both be tensors (seqlen_ro, rotary_dim // 2) or both None")
    if cos is not None:
        require_float("cos", cos)
        require_float("sin", sin)
        if cos.dim() != 2:
            raise ValueError(f"cos must have shape (seqlen_ro, rotary_dim // 2), got {tuple(cos.shape)}")
        if sin.shape != cos.shape:
            raise ValueError(f"sin must have the shape of cos {tuple(cos.shape)}, got {tuple(sin.shape)}")
        half = cos.shape[1]
        if rotary_dim is not None and rotary_dim != 2 * half:
            raise ValueError(f"rotary_dim={rotary_dim} disagrees with cos: 2 * cos.shape[-1] = {2 * half}")
        if cos.shape[0] == 0 or half == 0:
            raise ValueError(f"cos must be non-empty (seqlen_ro, rotary_dim // 2), got {tuple(cos.shape)}")
    else:
        rdim = head_dim if rotary_dim is None else rotary_dim
        if isinstance(rdim, bool) or not isinstance(rdim, int) or rdim <= 0 or rdim % 2:
            raise ValueError(f"rotary_dim must be a positive even int, got {rdim!r}")
        half = rdim // 2
    if 2 * half > head_dim:
        raise ValueError(f"rotary_dim ({2 * half}) must be <= head_dim ({head_dim}) for q of shape {tuple(q.shape)}")
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    if offsets is None and (isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, int)):
        raise TypeError(f"seqlen_offsets must be an int or an int tensor (batch,), got {type(seqlen_offsets).__name__}")
    offset = 0 if offsets is not None else seqlen_offsets
    if offset < 0:
        raise ValueError(f"seqlen_offsets must be >= 0, got {offset}")
    if positions is not None and (offsets is not None or offset != 0):
        raise ValueError("positions and seqlen_offsets are mutually exclusive: give one of them")
    if layout == "thd":
        if cu_seqlens is None and positions is None:
            raise ValueError("layout='thd' needs cu_seqlens (batch + 1,) int32, or positions (total_tokens,)")
    elif cu_seqlens is not None or max_seqlen is not None:
        raise ValueError(f"cu_seqlens and max_seqlen apply only to layout='thd', got layout={layout!r}")
    n_seqs = batch
    if cu_seqlens is not None:
        require_tensor("cu_seqlens", cu_seqlens)
        if cu_seqlens.dtype not in _INT_DTYPES or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
            raise ValueError(f"cu_seqlens must be a 1-D int32/int64 tensor (batch + 1,), got "
                             f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
        n_seqs = cu_seqlens.shape[0] - 1
    if positions is not None:
        require_tensor("positions", positions)
        if positions.dtype not in _INT_DTYPES:
            raise TypeError(f"positions must be an int32/int64 tensor, got {positions.dtype}")
        ok = positions.shape == (seqlen,) if layout == "thd" else (
            positions.dim() == 2 and positions.shape[1] == seqlen and positions.shape[0] in (1, batch))
        if not ok:
            want = "(total_tokens,)" if layout == "thd" else f"(batch, seq) = ({batch}, {seqlen}) or (1, {seqlen})"
            raise ValueError(f"positions must have shape {want}, got {tuple(positions.shape)}")
    if offsets is not None and (offsets.dtype not in _INT_DTYPES or offsets.shape != (n_seqs,)):
        raise ValueError(f"seqlen_offsets tensor must be int32/int64 of shape (batch,) = ({n_seqs},), got "
                         f"{offsets.dtype} of shape {tuple(offsets.shape)}")
    require_same_device(q=q, k=k, cos=cos, sin=sin, positions=positions, seqlen_offsets=offsets,
                        cu_seqlens=cu_seqlens)
    compiling = torch.compiler.is_compiling()
    if cu_seqlens is not None and not compiling:
        longest = _check_cu_seqlens(cu_seqlens, seqlen)
        if max_seqlen is not None and max_seqlen < longest:
            raise ValueError(f"max_seqlen={max_seqlen} is shorter than the longest sequence in cu_seqlens ({longest})")
        max_seqlen = longest
    if cos is not None:
        rows = cos.shape[0]
        span = max_seqlen if layout == "thd" else seqlen
        if positions is None and offsets is None and span is not None and offset + span > rows:
            raise ValueError(f"cos/sin have {rows} rows (seqlen_ro) but seqlen_offsets + seqlen = {offset + span}: "
                             f"the table must have at least offset + seqlen rows")
        host = positions if positions is not None else offsets
        if host is not None and not compiling and (host.device.type == "cpu" or check_positions) and host.numel():
            lo, hi = int(host.min()), int(host.max())
            top = hi + 1 if positions is not None else hi + (max_seqlen if layout == "thd" else seqlen)
            if lo < 0 or top > rows:
                name = "positions" if positions is not None else "seqlen_offsets"
                raise ValueError(f"{name} reach table row {top - 1} (min {lo}) but cos/sin have {rows} rows: "
                                 f"need 0 <= max(position) + 1 <= seqlen_ro")
    return half, offsets, offset


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
    half = _fast_validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
                          check_positions)
    if half is None:
        require_tensor("q", q)
        half, offsets, offset = _validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen,
                                          rotary_dim, check_positions)
    else:
        offsets, offset = (seqlen_offsets, 0) if isinstance(seqlen_offsets, torch.Tensor) else (None, seqlen_offsets)
    # in-kernel angles: base and scaling are checked here (cached), once and before the backend is chosen, so
    # a bad scaling raises the same ValueError/TypeError on every path
    inv_freq, mscale = (None, 1.0) if cos is not None else rope_frequencies(2 * half, base, scaling)
    if not _triton_for(q):
        return _ref.apply_rope(q, k, cos, sin, layout=layout, interleaved=interleaved, inplace=inplace,
                               positions=positions, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                               base=base, scaling=scaling, rotary_dim=2 * half)
    if cos is None:
        inv_freq = inv_freq_on(q.device, 2 * half, base, scaling)
    return run_rope(q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, layout=layout, half=half,
                    interleaved=interleaved, inplace=inplace, offset=offset, mscale=mscale)


def run_rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor | None, sin: torch.Tensor | None,
             inv_freq: torch.Tensor | None, positions: torch.Tensor | None, offsets: torch.Tensor | None,
             cu_seqlens: torch.Tensor | None, *, layout: str, half: int, interleaved: bool, inplace: bool,
             offset: int, mscale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validated arguments -> the Triton path: direct launch (eager, no grad), custom op or autograd.Function."""
    args = (cos, sin, inv_freq, positions, offsets, cu_seqlens)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
    compiling = torch.compiler.is_compiling()
    params = dict(layout=layout, half=half, interleaved=interleaved, conj=False, offset=offset, mscale=mscale)
    # autograd: one Function (the in-place custom op has no autograd formula, so in place always takes it)
    if needs_grad and (inplace or not compiling):
        return _RopeFunction.apply(q, k, *args, params, inplace)
    if inplace:
        if compiling:
            _rope_inplace_op(q, k, *args, layout, half, interleaved, False, offset, mscale)
        else:
            rope_launch(q, k, q, k, *args, **params)
        return q, k
    if compiling:
        q_out, k_out = _rope_op(q, k, *args, layout, half, interleaved, False, offset, mscale)
        return q_out, (k_out if k is not None else None)
    return _rotated(q, k, args, params)[:2]


# ---------------------------------------------------------------------------------------------- fast path
#: shapes/dtypes/devices -> (half, largest valid scalar offset or None); filled by full validations
_VALIDATED: dict[tuple, tuple[int, int | None]] = {}


def _fast_validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
                   check_positions) -> int | None:
    """``half`` when these argument shapes were validated before and no value check is needed, else None.

    Covers the hot paths (training and decoding with an int offset or CUDA offsets): a dict lookup on
    shapes, dtypes and devices plus the scalar offset range check, instead of the full :func:`_validate`.
    """
    if positions is not None or cu_seqlens is not None or check_positions or torch.compiler.is_compiling():
        return None
    try:
        if type(seqlen_offsets) is int:
            off_key = None
        elif isinstance(seqlen_offsets, torch.Tensor) and seqlen_offsets.is_cuda:
            off_key = (seqlen_offsets.shape, seqlen_offsets.dtype, seqlen_offsets.device)
        else:
            return None
        key = (layout, q.shape, q.dtype, q.device, None if k is None else (k.shape, k.dtype, k.device),
               None if cos is None else (cos.shape, cos.dtype, cos.device, sin.shape, sin.dtype, sin.device),
               off_key, max_seqlen, rotary_dim)
    except AttributeError:
        return None
    hit = _VALIDATED.get(key)
    if hit is None:
        half, offsets, _ = _validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen,
                                     rotary_dim, check_positions)
        limit = None
        if cos is not None and offsets is None:
            limit = cos.shape[0] - _dims(q, layout)[1]
        if len(_VALIDATED) > 1024:
            _VALIDATED.clear()
        _VALIDATED[key] = (half, limit)
        return half
    half, limit = hit
    if off_key is None and (seqlen_offsets < 0 or (limit is not None and seqlen_offsets > limit)):
        _validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
                  check_positions)  # raises the full error message
    return half


def _triton_for(q: torch.Tensor) -> bool:
    """:func:`fuselab.backend.use_triton` with a shortcut for the common CUDA case."""
    backend = os.environ.get(ENV_VAR)
    if q.is_cuda and (backend is None or backend == "auto" or backend == "triton"):
        return True
    return use_triton(q.device)
