"""RoPE argument checks (see ``docs/rope.md``): :func:`validate` turns the arguments of :func:`fuselab.apply_rope`
(:class:`RopeArgs`) into a :class:`RopeCall` or raises ``TypeError``/``ValueError`` naming the argument;
a repeated call of a planned signature passes the checks of values again (:func:`fuselab.apply_rope`)."""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fuselab.core.checks import (
    require_disjoint,
    require_distinct_elements,
    require_float,
    require_same_device,
    require_tensor,
)
from fuselab.core.rope_layouts import LAYOUTS, ROPE_LAYOUTS, RopeLayout
from fuselab.core.rope_math import inv_freq_on, rope_frequencies
from fuselab.ops.opdef import LaunchCache

_INT_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class RopeArgs:
    """The arguments of one :func:`fuselab.apply_rope` call as given, but its ``layout`` (:func:`validate` takes it
    apart: the layout decides how every other argument is read)."""

    q: Any
    k: Any
    cos: Any
    sin: Any
    interleaved: bool = False
    inplace: bool = False
    positions: Any = None
    seqlen_offsets: Any = 0
    cu_seqlens: Any = None
    max_seqlen: Any = None
    base: Any = 10000.0
    scaling: Mapping[str, Any] | None = None
    rotary_dim: Any = None
    check_positions: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class RopeCall:
    """One validated rotation (of :func:`fuselab.apply_rope`, of its backward, of :mod:`fuselab.hf`).

    The custom op's arguments after its operands (:meth:`arguments`): ``layout`` (a name of
    :data:`fuselab.core.rope_layouts.ROPE_LAYOUTS`), ``half`` (rotary_dim // 2), ``interleaved``, ``conj`` (rotate by
    minus the angle: the backward) and ``mscale`` (cos/sin amplitude of in-kernel angles). Derived by the checks:
    ``inplace``; ``inv_freq`` (in-kernel angles: ``(half,)`` float32 on q's device); ``max_offset``, the largest int
    ``seqlen_offsets`` the checks accept (None: any >= 0); ``recheck``: the call's checks read values (positions or
    offsets on the host, cu_seqlens), so every call validates again; ``signature`` (see :mod:`fuselab.ops.opdef`).
    """

    layout: str
    half: int
    interleaved: bool
    conj: bool = False
    mscale: float = 1.0
    inplace: bool = False
    inv_freq: torch.Tensor | None = None
    max_offset: int | None = None
    recheck: bool = False
    signature: Hashable | None = None

    def arguments(self) -> tuple[str, int, bool, bool, float]:
        return self.layout, self.half, self.interleaved, self.conj, self.mscale


def conjugate(call: RopeCall, signature: Hashable | None) -> RopeCall:
    """The backward's rotation of ``call``: minus the angle, into fresh tensors."""
    return dataclasses.replace(call, conj=not call.conj, inplace=False, recheck=False, signature=signature)


#: id(cu_seqlens) -> (weakref, version, longest sequence)
_CU_CHECKED = LaunchCache("rope cu_seqlens checked", limit=64)


def check_cu_seqlens(cu: torch.Tensor, n_tokens: int) -> int:
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
    _CU_CHECKED.keep(id(cu), (weakref.ref(cu), cu._version, max(lengths)))
    return max(lengths)


def _check_qk(q, k, layout: RopeLayout) -> tuple[int, int, int]:
    """q's and k's dtype and rank for ``layout``, k's dims against q's; returns q's (batch, seq, head_dim)."""
    require_float("q", q)
    if q.dim() != layout.ndim:
        raise ValueError(f"q must have {layout.ndim} dims {layout.shape} for layout={layout.name!r}, got shape "
                         f"{tuple(q.shape)}")
    batch, seqlen, _, head_dim = (1 if axis is None else q.shape[axis] for axis in layout.axes)
    if k is not None:
        require_float("k", k)
        if k.dtype != q.dtype:
            raise ValueError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
        if k.dim() != layout.ndim:
            raise ValueError(f"k must have {layout.ndim} dims {layout.shape} for layout={layout.name!r}, "
                             f"got shape {tuple(k.shape)}")
        kb, ks, _, kd = (1 if axis is None else k.shape[axis] for axis in layout.axes)
        if (kb, ks, kd) != (batch, seqlen, head_dim):
            raise ValueError(f"k must match q in batch, seq and head_dim {layout.shape}: q has shape "
                             f"{tuple(q.shape)}, k has shape {tuple(k.shape)}")
    return batch, seqlen, head_dim


def _rotary_half(cos, sin, rotary_dim, head_dim: int) -> int:
    """The tables' shapes (or ``rotary_dim`` without tables); returns rotary_dim // 2."""
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
    return half


def split_offsets(seqlen_offsets, positions) -> tuple[torch.Tensor | None, int]:
    """``seqlen_offsets`` as (tensor or None, scalar offset); positions and a non-zero offset exclude each other."""
    offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
    if offsets is None and (isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, int)):
        raise TypeError(f"seqlen_offsets must be an int or an int tensor (batch,), got {type(seqlen_offsets).__name__}")
    offset = 0 if offsets is not None else seqlen_offsets
    if offset < 0:
        raise ValueError(f"seqlen_offsets must be >= 0, got {offset}")
    if positions is not None and (offsets is not None or offset != 0):
        raise ValueError("positions and seqlen_offsets are mutually exclusive: give one of them")
    return offsets, offset


def _check_index_tensors(args: RopeArgs, layout: RopeLayout, dims: tuple[int, int], offsets) -> None:
    """cu_seqlens (packed layouts only), positions and a seqlen_offsets tensor: dtypes and shapes (``dims``: q's
    batch and seq)."""
    positions, cu_seqlens = args.positions, args.cu_seqlens
    batch, seqlen = dims
    if layout.packed:
        if cu_seqlens is None and positions is None:
            raise ValueError(f"layout={layout.name!r} needs cu_seqlens (batch + 1,) int32, or positions "
                             f"(total_tokens,)")
    elif cu_seqlens is not None or args.max_seqlen is not None:
        raise ValueError(f"cu_seqlens and max_seqlen apply only to layout='thd', got layout={layout.name!r}")
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
        ok = positions.shape == (seqlen,) if layout.packed else (
            positions.dim() == 2 and positions.shape[1] == seqlen and positions.shape[0] in (1, batch))
        if not ok:
            want = "(total_tokens,)" if layout.packed else f"(batch, seq) = ({batch}, {seqlen}) or (1, {seqlen})"
            raise ValueError(f"positions must have shape {want}, got {tuple(positions.shape)}")
    if offsets is not None and (offsets.dtype not in _INT_DTYPES or offsets.shape != (n_seqs,)):
        raise ValueError(f"seqlen_offsets tensor must be int32/int64 of shape (batch,) = ({n_seqs},), got "
                         f"{offsets.dtype} of shape {tuple(offsets.shape)}")


def _host_checked(args: RopeArgs, offsets) -> torch.Tensor | None:
    """The positions or offsets tensor whose values the checks read on the host (CPU tensors; CUDA ones with
    ``check_positions``; none while compiling), or None."""
    host = args.positions if args.positions is not None else offsets
    if host is None or torch.compiler.is_compiling() or not (host.device.type == "cpu" or args.check_positions):
        return None
    return host


def _check_table_reach(args: RopeArgs, seqlen: int, offsets, offset: int, span: int | None) -> None:
    """Every row the positions or offsets reach exists in cos/sin (``span``: the longest sequence, ``seqlen`` for
    unpacked layouts)."""
    rows = args.cos.shape[0]
    if args.positions is None and offsets is None and span is not None and offset + span > rows:
        raise ValueError(f"cos/sin have {rows} rows (seqlen_ro) but seqlen_offsets + seqlen = {offset + span}: "
                         f"the table must have at least offset + seqlen rows")
    host = _host_checked(args, offsets)
    if host is not None and host.numel():
        lo, hi = int(host.min()), int(host.max())
        top = hi + 1 if args.positions is not None else hi + span
        if lo < 0 or top > rows:
            name = "positions" if args.positions is not None else "seqlen_offsets"
            raise ValueError(f"{name} reach table row {top - 1} (min {lo}) but cos/sin have {rows} rows: "
                             f"need 0 <= max(position) + 1 <= seqlen_ro")


def _longest(args: RopeArgs, layout: RopeLayout, seqlen: int) -> int | None:
    """The longest sequence: a packed layout's from cu_seqlens (checked against ``max_seqlen``), else ``max_seqlen``;
    seq for the others."""
    if not layout.packed:
        return seqlen
    if args.cu_seqlens is None or torch.compiler.is_compiling():
        return args.max_seqlen
    longest = check_cu_seqlens(args.cu_seqlens, seqlen)
    if args.max_seqlen is not None and args.max_seqlen < longest:
        raise ValueError(f"max_seqlen={args.max_seqlen} is shorter than the longest sequence in cu_seqlens "
                         f"({longest})")
    return longest


def validate(args: RopeArgs, layout: object, signature: Hashable | None = None) -> RopeCall:
    """All checks of :func:`fuselab.apply_rope` (``signature``: the call's, which ``apply_rope`` computes)."""
    q, k, cos = args.q, args.k, args.cos
    if args.inplace:
        check_inplace_leaves(q, k)
    require_tensor("q", q)
    view = ROPE_LAYOUTS.get(layout) if isinstance(layout, str) else None
    if view is None:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    batch, seqlen, head_dim = _check_qk(q, k, view)
    half = _rotary_half(cos, args.sin, args.rotary_dim, head_dim)
    if 2 * half > head_dim:
        raise ValueError(f"rotary_dim ({2 * half}) must be <= head_dim ({head_dim}) for q of shape {tuple(q.shape)}")
    offsets, offset = split_offsets(args.seqlen_offsets, args.positions)
    _check_index_tensors(args, view, (batch, seqlen), offsets)
    require_same_device(q=q, k=k, cos=cos, sin=args.sin, positions=args.positions, seqlen_offsets=offsets,
                        cu_seqlens=args.cu_seqlens)
    span = _longest(args, view, seqlen)
    if cos is not None:
        _check_table_reach(args, seqlen, offsets, offset, span)
    if args.positions is not None:
        max_offset = 0
    elif cos is None or offsets is not None:
        max_offset = None
    else:
        max_offset = cos.shape[0] - (span if span is not None else seqlen)
    recheck = args.cu_seqlens is not None or _host_checked(args, offsets) is not None
    if args.inplace and not torch.compiler.is_compiling():
        require_distinct_elements("q", q)
        if k is not None:
            require_distinct_elements("k", k)
        check_inplace_aliasing(q, k, reads(cos, args.sin, args.positions, offsets, args.cu_seqlens))
    # in-kernel angles: base and scaling are checked here (cached), before the backend is chosen, so a bad scaling
    # raises the same error on every path
    inv_freq, mscale = None, 1.0
    if cos is None:
        mscale = rope_frequencies(2 * half, args.base, args.scaling)[1]
        inv_freq = inv_freq_on(q.device, 2 * half, args.base, args.scaling)
    return RopeCall(layout=view.name, half=half, interleaved=bool(args.interleaved), mscale=mscale,
                    inplace=bool(args.inplace), inv_freq=inv_freq, max_offset=max_offset, recheck=recheck,
                    signature=signature)


def check_inplace_leaves(q, k) -> None:
    """``inplace=True`` on a leaf tensor that requires grad (with grad mode on) is an error on every path:
    ``ValueError`` naming it (in place on non-leaf tensors is recorded by autograd)."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("q", q), ("k", k)):
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf:
            raise ValueError(f"inplace=True on {name}, a leaf tensor that requires grad, is unsafe; use "
                             f"inplace=False (or rotate a non-leaf copy)")


def reads(cos, sin, positions, offsets, cu_seqlens) -> dict[str, torch.Tensor | None]:
    """The tensors the kernel reads besides q and k, by argument name (for :func:`check_inplace_aliasing`)."""
    return {"cos": cos, "sin": sin, "positions": positions, "seqlen_offsets": offsets, "cu_seqlens": cu_seqlens}


def check_inplace_aliasing(q: torch.Tensor, k: torch.Tensor | None, read: dict[str, torch.Tensor | None]) -> None:
    """In place, q and k must not overlap each other nor a tensor the kernel reads (``apply_rope(x, x, ...,
    inplace=True)`` would rotate x twice): ``ValueError`` naming both. Out of place, q and k may alias (the outputs
    are fresh). Runs on every in-place call: the actual tensors decide."""
    require_disjoint({"q": q, "k": k}, read)
