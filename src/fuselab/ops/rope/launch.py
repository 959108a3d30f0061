"""Plan and launch of the RoPE kernel (:mod:`fuselab.ops.rope.kernels`) for a validated call
(:mod:`fuselab.ops.rope.checks`): :func:`plan`, and :func:`forward`, which allocates the outputs and launches.

Every layout is a set of strides over one logical (batch, seq, heads, head_dim) view
(:mod:`fuselab.core.rope_layouts`). Grid: (token blocks, head splits). Bytes: read q, k; write q_out, k_out; read
(tokens x rotary_dim/2) cos and sin values (or none, with in-kernel angles). Pass-through dims are copied only out of
place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.backend import interpreter_enabled
from fuselab.core.device import INT32_MAX, cdiv, fast_memory, next_power_of_2, sm_count
from fuselab.core.rope_layouts import ROPE_LAYOUTS, RopeLayout
from fuselab.ops._launch import Launch
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current

from .checks import RopeCall
from .kernels import _rope_kernel


@dataclass(frozen=True, eq=False)
class RopeTuning:
    """The planner's knobs (:func:`fuselab.ops.tuning.override` changes them for a sweep).

    ``tile_elements``: tile of one loop iteration, in elements (both halves of the rotary dims).
    ``fast_memory_tile_elements``: the tile on devices with :func:`~fuselab.core.device.fast_memory`, whose higher
    bandwidth per multiprocessor favours smaller tiles (the measurements: ``benchmarks/notes/rope.md#planner-knobs``).
    ``max_block_t``: most tokens per program. ``load_eviction``/``store_eviction``: eviction hints of the q/k loads
    and the output stores ("" is Triton's default).
    """

    tile_elements: int = 4096
    fast_memory_tile_elements: int = 2048
    max_block_t: int = 16
    load_eviction: str = ""
    store_eviction: str = ""


@dataclass(frozen=True)
class RopeBlocks:
    """The work split of one launch: tokens per program, heads per tile of q and k, the rotary half and pass-through
    dims padded to powers of 2, head splits (grid axis 1), heads of q and k per split, warps."""

    block_t: int
    block_hq: int
    block_hk: int
    block_half: int
    block_pass: int
    splits: int
    q_chunk: int
    k_chunk: int
    warps: int


@dataclass(frozen=True, eq=False)
class RopePlan:
    """A planned rotation: its call and its kernel launch (None: nothing to rotate), for outputs allocated like q and
    k (``torch.empty_like``), or into q and k in place."""

    call: RopeCall
    launch: Launch | None


#: output allocator (tests swap in a poisoning one so unwritten elements show up as NaN)
_empty_like = torch.empty_like


def tile_elements(device: torch.device, tuning: RopeTuning) -> int:
    """Elements per loop step of a RoPE program on ``device`` (see :class:`RopeTuning`)."""
    return tuning.fast_memory_tile_elements if fast_memory(device) else tuning.tile_elements


@memo(maxsize=1024)
def blocks(n_tokens: int, heads: tuple[int, int], half: int, n_pass: int, device: torch.device,
           tuning: RopeTuning) -> RopeBlocks:
    """The work split for ``n_tokens`` tokens of ``heads`` = (q heads, k heads) on ``device``."""
    hq, hk = heads
    block_half = next_power_of_2(half)
    row = 2 * block_half
    per_tile = max(1, tile_elements(device, tuning) // row)
    block_hq = min(next_power_of_2(hq), per_tile)
    block_hk = min(next_power_of_2(max(hk, 1)), per_tile)
    sms = sm_count(device)
    block_t = max(1, min(64 if interpreter_enabled() else tuning.max_block_t, per_tile // block_hq))
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
    # 8 warps on full 4096-element tiles, 4 on 2048-element tiles, 2 on the small decode tiles
    # (benchmarks/notes/rope.md#planner-knobs)
    elements = block_t * block_hq * row
    return RopeBlocks(block_t=block_t, block_hq=block_hq, block_hk=block_hk, block_half=block_half,
                      block_pass=next_power_of_2(max(n_pass, 1)), splits=splits,
                      q_chunk=cdiv(cdiv(hq, splits), block_hq) * block_hq,
                      k_chunk=cdiv(cdiv(max(hk, 1), splits), block_hk) * block_hk,
                      warps=8 if elements >= 4096 else (4 if elements >= 2048 else 2))


def _fresh_stride(t: torch.Tensor) -> tuple[int, ...]:
    """The strides ``torch.empty_like(t)`` gives (t's own when they are dense, else a dense order like t's)."""
    return torch.empty_like(t, device="meta").stride()


def _logical(values, layout: RopeLayout, absent: int) -> tuple[int, int, int, int]:
    """``values`` (a shape or strides in ``layout``'s axis order) as (batch, seq, heads, head_dim); ``absent`` stands
    for a packed layout's batch axis (1 for a size, 0 for a stride)."""
    b, s, h, d = layout.axes
    return (absent if b is None else values[b]), values[s], values[h], values[d]


def _reach(shape, stride) -> int:
    """Largest element offset reachable through ``stride`` from element 0."""
    return sum((n - 1) * abs(s) for n, s in zip(shape, stride)) if all(shape) else 0


def _table_strides(call: RopeCall, cos: torch.Tensor | None, sin: torch.Tensor | None) -> tuple[int, tuple, tuple]:
    """(table rows, cos strides, sin strides) of the kernel's (BC, R, HALF) view: a 2-D table (the public API's)
    broadcast over batch by a zero stride, a 3-D one (``fuselab.hf``'s, BC 1 or batch) as it is."""
    if cos is None:
        return 1, (0, 0, 0), (0, 0, 0)
    if cos.dim() == 2:
        return cos.shape[0], (0, *cos.stride()), (0, *sin.stride())
    return cos.shape[1], (cos.stride(0) if cos.shape[0] > 1 else 0, *cos.stride()[1:]), \
        (sin.stride(0) if sin.shape[0] > 1 else 0, *sin.stride()[1:])


def _index_strides(positions: torch.Tensor | None, offsets: torch.Tensor | None) -> tuple[int, int, int]:
    """(positions' batch and seq strides (thd's (T,) as (1, T)), the offsets' stride)."""
    sp = (0, 0)
    if positions is not None:
        p2 = positions.reshape(1, -1) if positions.dim() == 1 else positions
        sp = (p2.stride(0) if p2.shape[0] > 1 else 0, p2.stride(1))
    return *sp, (offsets.stride(0) if offsets is not None else 0)


def plan(call: RopeCall, operands: tuple) -> RopePlan:
    """The launch of ``call`` on operands laid out like ``operands`` (``fuselab::rope``'s: q, k, cos, sin, inv_freq,
    positions, offsets, cu_seqlens, offset), under the tuning in force."""
    q, k, cos, sin, _inv_freq, positions, offsets, cu_seqlens, _offset = operands
    layout: RopeLayout = ROPE_LAYOUTS[call.layout]
    q_out = q.stride() if call.inplace else _fresh_stride(q)
    k_out = None if k is None else (k.stride() if call.inplace else _fresh_stride(k))
    batch, seqlen, hq, d = _logical(q.shape, layout, 1)
    n_tokens = batch * seqlen
    if n_tokens == 0 or (q.numel() == 0 and (k is None or k.numel() == 0)):
        return RopePlan(call, None)
    hk = _logical(k.shape, layout, 1)[2] if k is not None else 0
    n_pass = d - 2 * call.half
    tuning = current(RopeTuning)
    split = blocks(n_tokens, (hq, hk), call.half, n_pass, q.device, tuning)
    # absent k: q takes its slot (never read: HAS_K is off)
    kk, k_shape, ko = (k, k.shape, k_out) if k is not None else (q, q.shape, q_out)
    n_rows, sc, ss = _table_strides(call, cos, sin)
    varlen = cu_seqlens is not None and positions is None
    nseq = cu_seqlens.shape[0] - 1 if varlen else 1
    extent = max(_reach(q.shape, q.stride()), _reach(k_shape, kk.stride()), _reach(q.shape, q_out),
                 _reach(k_shape, ko)) + max(q.storage_offset(), kk.storage_offset())
    wide = extent > INT32_MAX or n_tokens * max(hq, hk, 1) * d > INT32_MAX
    ints = (n_tokens, seqlen, n_rows, hq, hk, split.q_chunk, split.k_chunk, nseq,
            *_logical(q.stride(), layout, 0), *_logical(kk.stride(), layout, 0), *_logical(q_out, layout, 0),
            *_logical(ko, layout, 0), *sc, *ss, *_index_strides(positions, offsets))
    constexprs = dict(
        BLOCK_T=split.block_t, BLOCK_HQ=split.block_hq, BLOCK_HK=split.block_hk, HALF=call.half,
        BLOCK_HALF=split.block_half, PASS=n_pass, BLOCK_PASS=split.block_pass, INTERLEAVED=call.interleaved,
        CONJ=call.conj, HAS_K=k is not None, USE_TABLE=cos is not None, POS_TENSOR=positions is not None,
        OFF_TENSOR=offsets is not None, VARLEN=varlen, SEARCH_STEPS=max(1, nseq.bit_length()),
        COPY_PASS=n_pass > 0 and not call.inplace, INT64=wide, F64=q.dtype == torch.float64,
        LOAD_EVICT=tuning.load_eviction, STORE_EVICT=tuning.store_eviction, num_warps=split.warps,
    )
    grid = (cdiv(n_tokens, split.block_t), split.splits)
    launch = Launch(_rope_kernel, grid, (float(call.mscale), *ints), constexprs)
    return RopePlan(call, launch)


def forward(plan: RopePlan, operands: tuple) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q and k (or None) of ``operands`` rotated as planned: into fresh tensors laid out like them, or in place
    (then q and k themselves are returned)."""
    q, k = operands[0], operands[1]
    if plan.call.inplace:
        q_out, k_out = q, k
    else:
        q_out = _empty_like(q)
        k_out = _empty_like(k) if k is not None else None
    rotate(plan, operands, q_out, k_out)
    return q_out, k_out


def rotate(plan: RopePlan, operands: tuple, q_out: torch.Tensor, k_out: torch.Tensor | None) -> None:
    """Rotate the operands' q (and k) into ``q_out`` (and ``k_out``), which may be q and k (in place), as planned:
    positions outside the table are clamped to its rows inside the kernel (never an out-of-bounds read)."""
    launch = plan.launch
    if launch is None:
        return
    q, k, cos, sin, inv_freq, positions, offsets, cu_seqlens, offset = operands
    if k is None:
        k, k_out = q, q_out
    launch((q, k, q_out, k_out, q if cos is None else cos, q if sin is None else sin,
            q if inv_freq is None else inv_freq, q if positions is None else positions,
            q if offsets is None else offsets, q if cu_seqlens is None else cu_seqlens), (offset,))
