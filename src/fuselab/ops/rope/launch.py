"""Plan and out-param launcher of the RoPE kernel (:mod:`fuselab.ops.rope.kernels`): no allocation, no validation
(:mod:`fuselab.ops.rope.checks`, :func:`fuselab.apply_rope`).

Every layout is a set of strides over one logical (batch, seq, heads, head_dim) view. Grid: (token blocks, head
splits). Bytes: read q, k; write q_out, k_out; read (tokens x rotary_dim/2) cos and sin values (or none, with
in-kernel angles). Pass-through dims are copied only out of place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.backend import interpreter_enabled
from fuselab.core.device import INT32_MAX, cdiv, fast_memory, max_element_offset, next_power_of_2, sm_count
from fuselab.ops._launch import launch, relaunch
from fuselab.ops.opdef import LaunchCache, memo
from fuselab.ops.tuning import current

from .kernels import _rope_kernel

LAYOUTS = ("bshd", "sbhd", "bhsd", "thd")


@dataclass(frozen=True, eq=False)
class RopeTuning:
    """The planner's knobs (:func:`fuselab.ops.tuning.override` changes them for a sweep).

    ``tile_elements``: tile of one loop iteration, in elements (both halves of the rotary dims). On the H100 (25 GB/s
    per SM) 4096-element tiles with 8 warps were best at every large bshd shape (+1-2% over 2048 / 4;
    ``probes/rope_tiles.txt``, ``probes/rope_small_h100.txt``). ``fast_memory_tile_elements``: the tile on devices
    with :func:`~fuselab.core.device.fast_memory`: on the H200 (~37 GB/s per SM) 4096-element tiles ran at 0.87-0.94
    of copy bandwidth and 2048-element tiles with 4 warps at 0.90-0.96, best or level at every shape
    (``benchmarks/results/h200/probes/rope_plan.txt``, ``rope_small.txt``). ``max_block_t``: most tokens per
    program. ``load_eviction``/``store_eviction``: eviction hints of the q/k loads and the output stores ("" is
    Triton's default).
    """

    tile_elements: int = 4096
    fast_memory_tile_elements: int = 2048
    max_block_t: int = 16
    load_eviction: str = ""
    store_eviction: str = ""


def in_layout_order(values, layout: str, absent: int) -> tuple[int, int, int, int]:
    """``values`` (a shape or strides, in ``layout``'s axis order) as (batch, seq, heads, head_dim); ``absent`` for
    the batch axis that thd does not have (1 for a size, 0 for a stride)."""
    v = values
    if layout == "bshd":
        return v[0], v[1], v[2], v[3]
    if layout == "sbhd":
        return v[1], v[0], v[2], v[3]
    if layout == "bhsd":
        return v[0], v[2], v[1], v[3]
    return absent, v[0], v[1], v[2]


def logical_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """Strides of ``t``'s (batch, seq, heads, head_dim) view in ``layout`` (thd: batch stride 0)."""
    return in_layout_order(t.stride(), layout, 0)



def tile_elements(device: torch.device, tuning: RopeTuning) -> int:
    """Elements per loop step of a RoPE program on ``device`` (see :class:`RopeTuning`)."""
    return tuning.fast_memory_tile_elements if fast_memory(device) else tuning.tile_elements


@memo(maxsize=1024)
def _config(n_tokens: int, hq: int, hk: int, half: int, n_pass: int, sms: int, interp: bool, tile: int,
            max_block_t: int) -> tuple:
    """(BLOCK_T, BLOCK_HQ, BLOCK_HK, BLOCK_HALF, BLOCK_PASS, head splits, q chunk, k chunk, warps)."""
    block_half = next_power_of_2(half)
    row = 2 * block_half
    per_tile = max(1, tile // row)
    block_hq = min(next_power_of_2(hq), per_tile)
    block_hk = min(next_power_of_2(max(hk, 1)), per_tile)
    max_t = 64 if interp else max_block_t
    block_t = max(1, min(max_t, per_tile // block_hq))
    # keep at least ~2 waves of programs: fewer tokens per program, then split the heads
    while block_t > 1 and cdiv(n_tokens, block_t) < 2 * sms:
        block_t //= 2
    splits = 1
    programs = cdiv(n_tokens, block_t)
    if programs < 2 * sms:  # few tokens (decode): smaller head blocks, spread over more programs
        want = cdiv(2 * sms, programs)
        block_hq = max(1, min(block_hq, next_power_of_2(cdiv(hq, want))))
        splits = max(1, min(want, cdiv(hq, block_hq)))
        block_hk = max(1, min(block_hk, next_power_of_2(cdiv(max(hk, 1), splits))))
    q_chunk = cdiv(cdiv(hq, splits), block_hq) * block_hq
    k_chunk = cdiv(cdiv(max(hk, 1), splits), block_hk) * block_hk
    # 8 warps on full 4096-element tiles: +1-2% at every large bshd shape on the H100 over 4
    # (benchmarks/results/h100/probes/rope_tiles.txt), 4 on 2048-element tiles, 2 on the small decode tiles
    elements = block_t * block_hq * row
    warps = 8 if elements >= 4096 else (4 if elements >= 2048 else 2)
    return block_t, block_hq, block_hk, block_half, next_power_of_2(max(n_pass, 1)), splits, q_chunk, k_chunk, warps


def rope_launch(q: torch.Tensor, k: torch.Tensor | None, q_out: torch.Tensor, k_out: torch.Tensor | None,
                cos: torch.Tensor | None, sin: torch.Tensor | None, inv_freq: torch.Tensor | None,
                positions: torch.Tensor | None, offsets: torch.Tensor | None, cu_seqlens: torch.Tensor | None, *,
                layout: str, half: int, interleaved: bool, conj: bool, offset: int = 0,
                mscale: float = 1.0) -> tuple | None:
    """Rotate q (and k) into q_out (and k_out); outputs may be the inputs (in place).

    Inputs must already be validated (:func:`fuselab.ops.rope.apply_rope` does it). ``cos``/``sin``
    are 2-D ``(R, half)`` or 3-D ``(BC, R, half)`` tables (BC 1 or batch); when None, ``inv_freq``
    (``(half,)`` fp32) and ``mscale`` give the angles. ``positions`` is (B, S) (thd: (1, T) or (T,)),
    ``offsets`` (B,) per batch row (thd: per sequence). Positions outside the table are clamped.
    Returns a record of the launch for :func:`rope_relaunch` (None when there was nothing to launch).
    """
    has_k = k is not None
    kk, ko = (k, k_out) if has_k else (q, q_out)
    inplace = q_out.data_ptr() == q.data_ptr()
    # flat key of everything the plan depends on (a nested or longer key costs microseconds per call)
    key = (layout, half, interleaved, conj, inplace, q.get_device(), q.dtype is torch.float64, q.shape, q.stride(),
           q_out.stride(), k.shape if has_k else None, kk.stride(), ko.stride(),
           cos.shape if cos is not None else inv_freq is None, cos.stride() if cos is not None else None,
           sin.stride() if sin is not None else None, positions.stride() if positions is not None else None,
           positions.shape if positions is not None else None, offsets.stride() if offsets is not None else None,
           cu_seqlens.shape if cu_seqlens is not None else None)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(q, k, kk, q_out, ko, cos, sin, positions, offsets, cu_seqlens, layout=layout, half=half,
                          interleaved=interleaved, conj=conj, inplace=inplace, tuning=current(RopeTuning))
        _PLANS.keep(key, plan)
    grid, ints, constexprs, constexprs64, extent = plan
    if grid is None:
        return None
    base = max(q.storage_offset(), kk.storage_offset(), q_out.storage_offset(), ko.storage_offset())
    wide = extent + base > INT32_MAX
    tensors = _tensors(q, kk, q_out, ko, cos, sin, inv_freq, positions, offsets, cu_seqlens)
    # offset and mscale may change every call (decoding): keyed by class; the plan's ints by value
    entry = launch(_rope_kernel, (key, wide), grid, tensors, (int(offset), float(mscale), *ints),
                   constexprs64 if wide else constexprs, dynamic=2)
    return entry, grid, ints


def _tensors(q, kk, q_out, ko, cos, sin, inv_freq, positions, offsets, cu_seqlens) -> tuple:
    """The kernel's tensor arguments; absent ones take q's place (never read)."""
    return (q, kk, q_out, ko, cos if cos is not None else q, sin if sin is not None else q,
            inv_freq if inv_freq is not None else q, positions if positions is not None else q,
            offsets if offsets is not None else q, cu_seqlens if cu_seqlens is not None else q)


def rope_relaunch(record: tuple, q: torch.Tensor, k: torch.Tensor | None, q_out: torch.Tensor,
                  k_out: torch.Tensor | None, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset: int,
                  mscale: float) -> None:
    """The launch :func:`rope_launch` returned ``record`` for, with new q/k and outputs: no plan, no key. The
    caller guarantees the same dtypes, shapes, strides, storage offsets and 16-byte alignment as that launch's
    tensors (the tables are the same tensors) and the same ``offset``/``mscale`` classes."""
    entry, grid, ints = record
    kk, ko = (k, k_out) if k is not None else (q, q_out)
    relaunch(entry, grid, _tensors(q, kk, q_out, ko, cos, sin, inv_freq, positions, offsets, cu_seqlens),
             (int(offset), float(mscale), *ints))


#: launch plans: (layout, shapes, strides, flags) -> (grid, int args, constexprs, 64-bit constexprs, extent), made
#: under the tuning in force (:func:`fuselab.ops.tuning.override` empties it)
_PLANS = LaunchCache("rope plans", limit=4096)


def _make_plan(q, k, kk, q_out, ko, cos, sin, positions, offsets, cu_seqlens, *, layout, half, interleaved, conj,
               inplace, tuning: RopeTuning) -> tuple:
    batch, seqlen, hq, d = in_layout_order(q.shape, layout, 1)
    n_tokens = batch * seqlen
    if n_tokens == 0 or (q.numel() == 0 and (k is None or k.numel() == 0)):
        return None, (), {}, {}, 0
    has_k = k is not None
    hk = (k.shape[1] if layout == "bhsd" else k.shape[-2]) if has_k else 0
    n_pass = d - 2 * half
    copy_pass = n_pass > 0 and not inplace
    cfg = _config(n_tokens, hq, hk, half, n_pass, sm_count(q.device), interpreter_enabled(),
                  tile_elements(q.device, tuning), tuning.max_block_t)
    block_t, block_hq, block_hk, block_half, block_pass, splits, q_chunk, k_chunk, warps = cfg
    sq_, sk_ = logical_strides(q, layout), logical_strides(kk, layout)
    soq, sok = logical_strides(q_out, layout), logical_strides(ko, layout)
    use_table = cos is not None
    if use_table:
        if cos.dim() == 2:
            n_rows, sc, ss = cos.shape[0], (0, *cos.stride()), (0, *sin.stride())
        else:
            n_rows = cos.shape[1]
            sc = (cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), cos.stride(2))
            ss = (sin.stride(0) if sin.shape[0] > 1 else 0, sin.stride(1), sin.stride(2))
    else:
        n_rows, sc, ss = 1, (0, 0, 0), (0, 0, 0)
    if positions is not None:
        p2 = positions.reshape(1, -1) if positions.dim() == 1 else positions
        sp = (p2.stride(0) if p2.shape[0] > 1 else 0, p2.stride(1))
    else:
        sp = (0, 0)
    varlen = cu_seqlens is not None and positions is None
    nseq = cu_seqlens.shape[0] - 1 if varlen else 1
    extent = max(max_element_offset(t) - t.storage_offset() for t in (q, kk, q_out, ko))
    if n_tokens * max(hq, hk, 1) * d > INT32_MAX:
        extent = max(extent, INT32_MAX + 1)
    ints = (n_tokens, seqlen, n_rows, hq, hk, q_chunk, k_chunk, nseq, *sq_, *sk_, *soq, *sok, *sc, *ss, *sp,
            offsets.stride(0) if offsets is not None else 0)
    constexprs = dict(
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, HALF=half, BLOCK_HALF=block_half,
        PASS=n_pass, BLOCK_PASS=block_pass, INTERLEAVED=interleaved, CONJ=conj, HAS_K=has_k,
        USE_TABLE=use_table, POS_TENSOR=positions is not None, OFF_TENSOR=offsets is not None,
        VARLEN=varlen, SEARCH_STEPS=max(1, nseq.bit_length()), COPY_PASS=copy_pass,
        INT64=False, F64=q.dtype == torch.float64, LOAD_EVICT=tuning.load_eviction,
        STORE_EVICT=tuning.store_eviction,
        num_warps=warps,
    )
    grid = (cdiv(n_tokens, block_t), splits)
    return grid, ints, constexprs, {**constexprs, "INT64": True}, extent
