"""RoPE argument checks: shapes per layout, dtypes, tables, positions, offsets, cu_seqlens, in place under autograd
(see ``docs/rope.md``)."""

from __future__ import annotations

import itertools
import weakref

import torch

from fuselab.core.checks import require_float, require_same_device, require_tensor
from fuselab.ops.opdef import LaunchCache

from .launch import LAYOUTS, in_layout_order

SHAPES = {"bshd": "(batch, seq, heads, head_dim)", "sbhd": "(seq, batch, heads, head_dim)",
          "bhsd": "(batch, heads, seq, head_dim)", "thd": "(total_tokens, heads, head_dim)"}
_INT_DTYPES = (torch.int32, torch.int64)


def dims(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(batch, seq, heads, head_dim) of ``t`` in ``layout`` (thd: batch 1, seq = tokens)."""
    return in_layout_order(t.shape, layout, 1)


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


def _check_qk(q, k, layout: str) -> tuple[int, int, int]:
    """q's and k's dtype and rank for ``layout``, k's dims against q's; returns q's (batch, seq, head_dim)."""
    require_float("q", q)
    ndim = 3 if layout == "thd" else 4
    if q.dim() != ndim:
        raise ValueError(f"q must have {ndim} dims {SHAPES[layout]} for layout={layout!r}, got shape {tuple(q.shape)}")
    batch, seqlen, _, head_dim = dims(q, layout)
    if k is not None:
        require_float("k", k)
        if k.dtype != q.dtype:
            raise ValueError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
        if k.dim() != ndim:
            raise ValueError(f"k must have {ndim} dims {SHAPES[layout]} for layout={layout!r}, "
                             f"got shape {tuple(k.shape)}")
        kb, ks, _, kd = dims(k, layout)
        if (kb, ks, kd) != (batch, seqlen, head_dim):
            raise ValueError(f"k must match q in batch, seq and head_dim {SHAPES[layout]}: q has shape "
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


def _split_offsets(seqlen_offsets, positions) -> tuple[torch.Tensor | None, int]:
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


def _check_index_tensors(layout: str, batch: int, seqlen: int, positions, offsets, cu_seqlens, max_seqlen) -> None:
    """cu_seqlens (thd only), positions and a seqlen_offsets tensor: dtypes and shapes."""
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


def _check_table_reach(cos, layout: str, seqlen: int, positions, offsets, offset: int, max_seqlen,
                       check_positions: bool, compiling: bool) -> None:
    """Every row the positions or offsets reach exists in cos/sin (values read on the host: always for CPU tensors,
    for device tensors only with ``check_positions``; never while compiling)."""
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


def validate(q, k, cos, sin, layout, positions, seqlen_offsets, cu_seqlens, max_seqlen, rotary_dim,
             check_positions) -> tuple[int, torch.Tensor | None, int]:
    """All argument checks; returns (half, offsets tensor or None, scalar offset)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    batch, seqlen, head_dim = _check_qk(q, k, layout)
    half = _rotary_half(cos, sin, rotary_dim, head_dim)
    if 2 * half > head_dim:
        raise ValueError(f"rotary_dim ({2 * half}) must be <= head_dim ({head_dim}) for q of shape {tuple(q.shape)}")
    offsets, offset = _split_offsets(seqlen_offsets, positions)
    _check_index_tensors(layout, batch, seqlen, positions, offsets, cu_seqlens, max_seqlen)
    require_same_device(q=q, k=k, cos=cos, sin=sin, positions=positions, seqlen_offsets=offsets,
                        cu_seqlens=cu_seqlens)
    compiling = torch.compiler.is_compiling()
    if cu_seqlens is not None and not compiling:
        longest = check_cu_seqlens(cu_seqlens, seqlen)
        if max_seqlen is not None and max_seqlen < longest:
            raise ValueError(f"max_seqlen={max_seqlen} is shorter than the longest sequence in cu_seqlens ({longest})")
        max_seqlen = longest
    if cos is not None:
        _check_table_reach(cos, layout, seqlen, positions, offsets, offset, max_seqlen, check_positions, compiling)
    return half, offsets, offset


def check_inplace(q: torch.Tensor, k: torch.Tensor | None) -> None:
    """``inplace=True`` on a leaf tensor that requires grad (with grad mode on) is an error on every path:
    ``ValueError`` naming it (in place on non-leaf tensors is recorded by autograd)."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("q", q), ("k", k)):
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf:
            raise ValueError(f"inplace=True on {name}, a leaf tensor that requires grad, is unsafe; use "
                             f"inplace=False (or rotate a non-leaf copy)")
