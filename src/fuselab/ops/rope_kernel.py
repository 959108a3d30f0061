"""Triton RoPE kernel and its launcher (no allocation, no validation: see :mod:`fuselab.ops.rope`).

Every layout is a set of strides over one logical (batch, seq, heads, head_dim) view; ``thd`` is
batch 1 with seq = total tokens, each token finding its sequence by a binary search over cu_seqlens.
One launch rotates q and k (any head counts). Grid: (token blocks, head splits). Each program takes
BLOCK_T tokens, computes their positions and loads (or computes) their cos/sin once, then walks all
q heads and all k heads of its split in [BLOCK_T, BLOCK_H, head_dim] tiles, loaded along head_dim
(16-byte vectors when the last stride is 1). Bytes: read q, k; write q_out, k_out; read
(tokens x rotary_dim/2) cos and sin values (or none, with in-kernel angles). Pass-through dims
(partial rotary) are copied only out of place. The backward is the same kernel with CONJ (sin negated).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fuselab.backend import interpreter_enabled

from ._launch import (
    INT32_MAX,
    cdiv,
    fast_memory,
    keep,
    launch,
    max_element_offset,
    next_power_of_2,
    relaunch,
    sm_count,
)

LAYOUTS = ("bshd", "sbhd", "bhsd", "thd")


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_tok, o_tok, tmask, h_start, h_end, sxh, sxd, soh, sod, c, s,
                  BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
                  COPY_PASS: tl.constexpr, INT64: tl.constexpr, LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr):
    # x_ptr/o_ptr: one tensor's input/output; x_tok/o_tok: (BLOCK_T,) element offsets of each token's
    # head 0; c, s: (BLOCK_T, 1, BLOCK_HALF) compute-dtype cos/sin (sin already sign-flipped if CONJ)
    jj = tl.arange(0, BLOCK_HALF)
    jmask = jj < HALF
    for h0 in range(h_start, h_end, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        m2 = tmask[:, None] & (hh < h_end)[None, :]
        if INT64:
            hh = hh.to(tl.int64)
        xrow = (x_tok[:, None] + hh[None, :] * sxh)[:, :, None]
        orow = (o_tok[:, None] + hh[None, :] * soh)[:, :, None]
        if INTERLEAVED:
            dd = tl.arange(0, 2 * BLOCK_HALF)
            m3 = m2[:, :, None] & (dd < 2 * HALF)[None, None, :]
            x = tl.load(x_ptr + xrow + dd[None, None, :] * sxd, mask=m3, other=0.0,
                        eviction_policy=LOAD_EVICT).to(c.dtype)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_HALF, 2)))
            o = tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), (BLOCK_T, BLOCK_H, 2 * BLOCK_HALF))
            tl.store(o_ptr + orow + dd[None, None, :] * sod, o.to(o_ptr.dtype.element_ty), mask=m3,
                     eviction_policy=STORE_EVICT)
        else:
            m3 = m2[:, :, None] & jmask[None, None, :]
            px = x_ptr + xrow + jj[None, None, :] * sxd
            x1 = tl.load(px, mask=m3, other=0.0, eviction_policy=LOAD_EVICT).to(c.dtype)
            x2 = tl.load(px + HALF * sxd, mask=m3, other=0.0, eviction_policy=LOAD_EVICT).to(c.dtype)
            po = o_ptr + orow + jj[None, None, :] * sod
            tl.store(po, (x1 * c - x2 * s).to(o_ptr.dtype.element_ty), mask=m3, eviction_policy=STORE_EVICT)
            tl.store(po + HALF * sod, (x2 * c + x1 * s).to(o_ptr.dtype.element_ty), mask=m3,
                     eviction_policy=STORE_EVICT)
        if COPY_PASS:
            pp = tl.arange(0, BLOCK_PASS)
            mp = m2[:, :, None] & (pp < PASS)[None, None, :]
            v = tl.load(x_ptr + xrow + (2 * HALF + pp[None, None, :]) * sxd, mask=mp, other=0.0,
                        eviction_policy=LOAD_EVICT)
            tl.store(o_ptr + orow + (2 * HALF + pp[None, None, :]) * sod, v.to(o_ptr.dtype.element_ty), mask=mp,
                     eviction_policy=STORE_EVICT)


@triton.jit
def _rope_kernel(
    q_ptr,  # (B, S, HQ, D) logical view of q (in backward: grad of q_out), any strides
    k_ptr,  # (B, S, HK, D) logical view of k; unused unless HAS_K
    qo_ptr,  # (B, S, HQ, D) output for q (== q_ptr in place)
    ko_ptr,  # (B, S, HK, D) output for k; unused unless HAS_K
    cos_ptr,  # (BC, R, HALF) table (BC broadcast by a zero stride); unused unless USE_TABLE
    sin_ptr,  # (BC, R, HALF) table; unused unless USE_TABLE
    freq_ptr,  # (HALF,) fp32 inverse frequencies; unused when USE_TABLE
    pos_ptr,  # (B, S) int positions (thd: (1, T)); unused unless POS_TENSOR
    off_ptr,  # (B,) int offsets per batch row / per sequence; unused unless OFF_TENSOR
    cu_ptr,  # (NSEQ + 1,) int cu_seqlens; unused unless VARLEN
    offset, mscale,  # the per-call scalars first: everything after them is cached per launch plan
    n_tokens, seqlen, n_rows, HQ, HK, q_chunk, k_chunk, nseq,
    sqb, sqs, sqh, sqd, skb, sks, skh, skd,
    soqb, soqs, soqh, soqd, sokb, soks, sokh, sokd,
    scb, scr, scd, ssb, ssr, ssd, spb, sps, so,
    BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJ: tl.constexpr, HAS_K: tl.constexpr, USE_TABLE: tl.constexpr,
    POS_TENSOR: tl.constexpr, OFF_TENSOR: tl.constexpr, VARLEN: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    COPY_PASS: tl.constexpr, INT64: tl.constexpr, F64: tl.constexpr,
    LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr,  # eviction hints of the q/k stream ("" = default)
):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < n_tokens
    tok = tl.where(tmask, tok, 0)
    if INT64:
        tok = tok.to(tl.int64)
    # (b, s): the token's batch row and sequence index in the logical view, which address memory
    b = tok // seqlen
    s = tok - b * seqlen
    if VARLEN:  # thd: seq = largest i with cu[i] <= tok (cu[nseq] == n_tokens > tok); pos within it
        lo = tl.zeros_like(tok)
        hi = tl.zeros_like(tok) + nseq
        for _ in tl.static_range(SEARCH_STEPS):
            mid = (lo + hi) // 2
            start = tl.load(cu_ptr + mid, mask=tmask, other=0)
            below = start <= tok
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        seq = lo
        pos = tok - tl.load(cu_ptr + seq, mask=tmask, other=0)
    else:
        seq = b
        pos = s
    if POS_TENSOR:
        pos = tl.load(pos_ptr + b * spb + s * sps, mask=tmask, other=0)
    elif OFF_TENSOR:
        pos = pos + tl.load(off_ptr + seq * so, mask=tmask, other=0)
    else:
        pos = pos + offset
    if F64:
        ct = tl.float64
    else:
        ct = tl.float32
    jj = tl.arange(0, BLOCK_HALF)
    jmask = tmask[:, None] & (jj < HALF)[None, :]
    if USE_TABLE:  # out-of-range positions are clamped to the table: never an out-of-bounds read
        pos = tl.minimum(tl.maximum(pos, 0), n_rows - 1)
        c = tl.load(cos_ptr + (b * scb + pos * scr)[:, None] + jj[None, :] * scd, mask=jmask, other=0.0).to(ct)
        sn = tl.load(sin_ptr + (b * ssb + pos * ssr)[:, None] + jj[None, :] * ssd, mask=jmask, other=0.0).to(ct)
    else:
        freq = tl.load(freq_ptr + jj, mask=jj < HALF, other=0.0).to(ct)
        angle = pos.to(ct)[:, None] * freq[None, :]
        c = tl.cos(angle) * mscale
        sn = tl.sin(angle) * mscale
    if CONJ:
        sn = -sn
    c = c[:, None, :]
    sn = sn[:, None, :]
    q_start = pid_h * q_chunk
    _rotate_heads(q_ptr, qo_ptr, b * sqb + s * sqs, b * soqb + s * soqs, tmask, q_start,
                  tl.minimum(q_start + q_chunk, HQ), sqh, sqd, soqh, soqd, c, sn,
                  BLOCK_T, BLOCK_HQ, HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, COPY_PASS, INT64,
                  LOAD_EVICT, STORE_EVICT)
    if HAS_K:
        k_start = pid_h * k_chunk
        _rotate_heads(k_ptr, ko_ptr, b * skb + s * sks, b * sokb + s * soks, tmask, k_start,
                      tl.minimum(k_start + k_chunk, HK), skh, skd, sokh, sokd, c, sn,
                      BLOCK_T, BLOCK_HK, HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, COPY_PASS, INT64,
                      LOAD_EVICT, STORE_EVICT)


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


#: eviction hints of the q/k loads and the output stores ("" is Triton's default)
LOAD_EVICTION = ""
STORE_EVICTION = ""

#: tile of one loop iteration, in elements (both halves of the rotary dims), by the device's DRAM bandwidth per SM.
#: On the H100 (25 GB/s per SM) 4096-element tiles with 8 warps were best at every large bshd shape (+1-2% over
#: 2048 / 4; ``probes/rope_tiles.txt``, ``probes/rope_small_h100.txt``). On the H200 (~37 GB/s per SM) those ran at
#: 0.87-0.94 of copy bandwidth and 2048-element tiles with 4 warps at 0.90-0.96, best or level at every shape
#: (``benchmarks/results/h200/probes/rope_plan.txt``, ``rope_small.txt``).
TILE_ELEMENTS = 4096
#: the tile on devices with :func:`~fuselab.ops._launch.fast_memory`
FAST_MEMORY_TILE_ELEMENTS = 2048
MAX_BLOCK_T = 16


def tile_elements(device: torch.device) -> int:
    """Elements per loop step of a RoPE program on ``device`` (see :data:`TILE_ELEMENTS`)."""
    return FAST_MEMORY_TILE_ELEMENTS if fast_memory(device) else TILE_ELEMENTS


@functools.lru_cache(maxsize=1024)
def _config(n_tokens: int, hq: int, hk: int, half: int, n_pass: int, sms: int, interp: bool, tile: int) -> tuple:
    """(BLOCK_T, BLOCK_HQ, BLOCK_HK, BLOCK_HALF, BLOCK_PASS, head splits, q chunk, k chunk, warps)."""
    block_half = next_power_of_2(half)
    row = 2 * block_half
    per_tile = max(1, tile // row)
    block_hq = min(next_power_of_2(hq), per_tile)
    block_hk = min(next_power_of_2(max(hk, 1)), per_tile)
    max_t = 64 if interp else MAX_BLOCK_T
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
                          interleaved=interleaved, conj=conj, inplace=inplace)
        keep(_PLANS, key, plan, limit=4096)
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


#: launch plans: (layout, shapes, strides, flags) -> (grid, int args, constexprs, 64-bit constexprs, extent)
_PLANS: dict[tuple, tuple] = {}


def _make_plan(q, k, kk, q_out, ko, cos, sin, positions, offsets, cu_seqlens, *, layout, half, interleaved, conj,
               inplace) -> tuple:
    batch, seqlen, hq, d = in_layout_order(q.shape, layout, 1)
    n_tokens = batch * seqlen
    if n_tokens == 0 or q.numel() == 0:
        return None, (), {}, {}, 0
    has_k = k is not None
    hk = (k.shape[1] if layout == "bhsd" else k.shape[-2]) if has_k else 0
    n_pass = d - 2 * half
    copy_pass = n_pass > 0 and not inplace
    cfg = _config(n_tokens, hq, hk, half, n_pass, sm_count(q.device), interpreter_enabled(), tile_elements(q.device))
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
        INT64=False, F64=q.dtype == torch.float64, LOAD_EVICT=LOAD_EVICTION, STORE_EVICT=STORE_EVICTION,
        num_warps=warps,
    )
    grid = (cdiv(n_tokens, block_t), splits)
    return grid, ints, constexprs, {**constexprs, "INT64": True}, extent
