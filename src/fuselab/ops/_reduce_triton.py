"""Triton kernels and launchers of ``fuselab.sum``/``fuselab.mean`` (deterministic, fixed two-stage trees).

Every reduction is planned as ``out[o, i] = Σ_r x[o·s_o + r·s_r + i·s_i]`` (:class:`ReducePlan`): the
reduced axes coalesce into one axis ``r`` of ``R`` elements and the kept axes into at most two
groups ``o`` and ``i`` (``K = O·I`` outputs, written contiguously in the output's axis order).
Strided and permuted views are read in place whenever that holds; otherwise the input is copied
once into ``(kept..., reduced...)`` order (see :func:`plan_reduction`).

Two kernels, chosen by which axis is contiguous:

* ``_rows_kernel`` (the reduced axis has the smallest stride: ``dim=-1``, full reductions): each
  program owns ``ROWS`` outputs and streams their rows in ``[ROWS, BLOCK_R]`` tiles of ~16 KiB
  (wide vector loads, several in flight per thread), accumulating element-wise in fp32 and
  reducing the tile once at the end.
* ``_cols_kernel`` (a kept axis is contiguous: ``dim=0``, middle axes): each program owns
  ``BLOCK_I`` contiguous columns (coalesced rows of ≥ 128 B) and streams ``[BLOCK_R, BLOCK_I]``
  tiles down the reduced axis.

Parallelism when there are few outputs: the reduced axis is split into ``SPLIT`` fixed chunks
(grid axis 1). Each program writes its fp32 partial to ``[SPLIT, K]``; the last of the ``SPLIT``
programs of an output tile to finish (an int32 ticket, :mod:`fuselab.ops._tickets`) sums that
tile's partials in split order and writes the result: one launch, no float atomics, so the same
shape on the same device gives the same bits on every run. Bytes: read the input once, write ``K``
outputs (+ ``2·SPLIT·K·4`` bytes of partials, kept ≤ a few percent of the input, served from L2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._launch import INT32_MAX, cdiv, needs_int64, next_power_of_2, sm_count
from ._launch import launch as launch_kernel
from ._tickets import final_sum_rows, last_to_arrive, sum_partials, ticket_counters

#: bytes each program loads per loop iteration (enough in flight to cover DRAM latency), by element size. H100
#: sweeps (benchmarks/sweeps/reduce_sweep.py): 8 KiB beats 16 KiB by 1-4% for bf16; fp32 is best at 16-32 KiB
TILE_BYTES = {2: 8192, 4: 16384, 8: 16384}
#: the rows kernel's tile when each program reads whole rows (no split of the reduced axis): 8 KiB for every dtype.
#: dim=-1 of 10000² fp32 at 16 KiB wastes half of its last, masked tile per row (10000 = 2·4096 + 1808): 0.91 of copy
#: bandwidth against 0.95-0.96 at 8 KiB (benchmarks/results/h100/probes/reduce_rows_probe.txt)
ROW_TILE_BYTES = 8192
#: the same under the interpreter (CPU): larger tiles, fewer (serially run) programs
INTERPRETER_TILE_BYTES = 262144
#: programs per SM a split reduction of the rows kernel aims for (grid ≈ 8 x SMs; with ROW_WARPS and ROWS_MAXNREG
#: two of them are resident per SM, so a split plan runs ~4 short waves: measured faster than one wave of 8-warp
#: programs capped at 32 registers, benchmarks/results/h100/probes/reduce_rows_probe.txt)
PROGRAMS_PER_SM = 8
#: register cap of the rows kernel. 32 (to fit 8 resident 8-warp programs per SM, session 11) starved the loads: the
#: compiler then issues a tile's loads in batches. At 64 with ROW_WARPS, H100 under the lab's dirty flush: dim=-1 of
#: 10000² fp32 0.92 -> 0.95 of copy bandwidth (torch.compile 0.94), of 8192² bf16 0.86 -> 0.90, of 65536x512 bf16
#: 0.77 -> 0.80; all of 8192² bf16 0.79 -> 0.81, of 10000² fp32 0.91 -> 0.93 (reduce_rows_probe.txt)
ROWS_MAXNREG = 64
#: warps of a rows-kernel program whose tile is one row of at least ROW_TILE_BYTES (every dim=-1 and all-element plan of
#: long rows): 16, Inductor's choice too, fewer bytes per thread and more warps to hide DRAM latency; packed short
#: rows (65536x512) keep 8 (16 was 6% slower there)
ROW_WARPS = 16
#: the same for the cols kernel, which needs 40-48 registers (5-6 resident per SM; capping it at 32 spills): 4 per SM
#: ran dim=0 of 8192x8192 / 65536x512 bf16 5-8% faster than 8
COLS_PROGRAMS_PER_SM = 4
#: narrowest column tile of the cols kernel, in bytes per row, by element size: the planner narrows the tile (more
#: tiles, fewer splits) down to this. bf16: one 128-byte line; fp32: 1 KiB. H100, dim=0, A/B in alternating rounds
#: (benchmarks/results/h100/probes/reduce_split_ab.txt): 10000² fp32 0.851 (512 B) -> 0.888 (1 KiB) of copy
#: bandwidth; 8192² bf16 0.785 at 128 B, 0.59-0.62 at 1 KiB
MIN_COL_BYTES = {2: 128, 4: 1024, 8: 1024}
#: cache eviction hint of the input loads (read once), by element size. "evict_first" keeps the stream from
#: displacing other L2 contents: after an L2 flush that wrote (do_bench's), the flush's dirty lines, whose
#: write-back would otherwise share DRAM bandwidth with the read. On the H100 it lifts the 64-134 MB bf16 cases by
#: 8-33% (benchmarks/sweeps/l2_probe.py) but costs the 0.4-1 GB fp32 ones 2-4%. "" is Triton's default policy.
STREAM_EVICTION = {2: "evict_first", 4: "", 8: ""}
#: smallest split at which the programs of a split reduction read the reduced axis interleaved (program s of S: blocks
#: s, s+S, s+2S, ...) rather than in S contiguous chunks (see _chunk), by kernel; None: never. Same A/B: dim=0 of
#: 65536x512 bf16 (split 64) 0.636 -> 0.673; 10000² fp32 and 8192² bf16 (split 5-14) 1-8% slower interleaved, the
#: rows kernel's all-element plans (split ~1024) 0.5-1.5% slower
INTERLEAVE_MIN_SPLIT = {"rows": None, "cols": 16}
#: widest column tile of the cols kernel (1 KiB rows on GPUs), and most rows per program of the rows
#: kernel, as a fraction of the tile
MAX_COL_FRACTION = 16

_TL_ACC = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _cast_out(v, out_ptr, OUT_BF16: tl.constexpr):
    """``v`` in the output dtype. bf16 is rounded to nearest even with integer ops, because the
    interpreter truncates fp32 -> bf16 casts (the GPU rounds to nearest even): same bits on both."""
    if OUT_BF16:
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(out_ptr.dtype.element_ty)


@triton.jit
def _store_result(total, idx, mask, out_ptr, part_ptr, count_ptr, tile, split, n_split, n_outputs, n_reduced,
                  WIDTH: tl.constexpr, SPLIT_R: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr,
                  IS_MEAN: tl.constexpr, OUT_BF16: tl.constexpr):
    """Write ``total`` (``[WIDTH]`` sums of this program's chunk, for outputs ``idx``) to ``out_ptr``; with a split,
    store it as partial ``[split, idx]`` and let the last of the tile's programs sum all of them in split order."""
    done = True
    if SPLIT_R:
        tl.store(part_ptr + split * n_outputs + idx, total, mask=mask)
        done = last_to_arrive(count_ptr + tile, n_split)
        if done:
            total = sum_partials(part_ptr, n_outputs, idx, mask, n_split, BLOCK_S, WIDTH, ACC)
    if done:
        if IS_MEAN:
            total = total / n_reduced
        tl.store(out_ptr + idx, _cast_out(total, out_ptr, OUT_BF16), mask=mask)


@triton.jit
def _chunk(split, n_split, R, r_per_split, BLOCK_R: tl.constexpr, SPLIT_R: tl.constexpr, INTERLEAVE: tl.constexpr):
    """Which blocks of the reduced axis program ``split`` of ``n_split`` reads: full blocks at ``r_start + b*step``
    for ``b < n_full``, then (if the kernel has a tail) the masked block at ``tail_start`` up to ``r_end``.

    Without a split: all of ``[0, R)``. Contiguous chunks: ``[split*r_per_split, +r_per_split)``. Interleaved
    (grid-stride): blocks ``split, split + n_split, ...``, so the programs running at any moment read neighbouring
    blocks (one window of memory) instead of ``n_split`` streams ``r_per_split`` apart; the ragged last block belongs
    to program ``(R // BLOCK_R) % n_split``, the others get an empty tail (``r_end == tail_start``)."""
    if SPLIT_R:
        if INTERLEAVE:
            n_blocks = R // BLOCK_R
            r_start = split * BLOCK_R
            step = n_split.to(r_start.dtype) * BLOCK_R
            n_full = (n_blocks - split + n_split - 1) // n_split
            tail_start = n_blocks * BLOCK_R
            r_end = tl.where(n_blocks % n_split == split, R, tail_start)
        else:
            r_start = split * r_per_split
            step = BLOCK_R
            r_end = tl.minimum(r_start + r_per_split, R)
            n_full = (r_end - r_start) // BLOCK_R
            tail_start = r_start + n_full * BLOCK_R
    else:
        r_start = 0
        step = BLOCK_R
        r_end = R
        n_full = R // BLOCK_R
        tail_start = n_full * BLOCK_R
    return r_start, step, n_full, tail_start, r_end


@triton.jit
def _rows_kernel(
    x_ptr,  # input; element (o, i, r) at o*s_o + i*s_i + r*s_r, o < K // I, i < I, r < R
    out_ptr,  # [K] result (output dtype)
    part_ptr,  # [SPLIT, K] partials (ACC dtype); only if SPLIT_R
    count_ptr,  # [cdiv(K, ROWS)] int32 ticket counters, zero before and after; only if SPLIT_R
    K, I, R, s_o, s_i, s_r,
    r_per_split,  # reduced elements per split (a multiple of BLOCK_R); R when SPLIT == 1
    n_reduced,  # divisor of the mean (IS_MEAN only)
    ROWS: tl.constexpr, BLOCK_R: tl.constexpr, HAS_I: tl.constexpr, R_CONTIG: tl.constexpr,
    SPLIT_R: tl.constexpr, HAS_TAIL: tl.constexpr, ACC: tl.constexpr, BLOCK_S: tl.constexpr,
    IS_MEAN: tl.constexpr, OUT_BF16: tl.constexpr, INT64: tl.constexpr, EVICT: tl.constexpr, INTERLEAVE: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    if INT64:
        pid = pid.to(tl.int64)
        split = split.to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_mask = rows < K
    if HAS_I:
        row_off = (rows // I) * s_o + (rows % I) * s_i
    else:
        row_off = rows * s_o
    r_start, step, n_full, tail_start, r_end = _chunk(split, n_split, R, r_per_split, BLOCK_R, SPLIT_R, INTERLEAVE)
    cols = tl.arange(0, BLOCK_R)
    if INT64:
        cols = cols.to(tl.int64)
    acc = tl.zeros([ROWS, BLOCK_R], dtype=ACC)
    # full blocks: only the (per-row constant) row mask, so loads stay vectorized
    for b in range(0, n_full):
        r = r_start + b * step + cols
        if R_CONTIG:
            offs = row_off[:, None] + r[None, :]
        else:
            offs = row_off[:, None] + r[None, :] * s_r
        acc += tl.load(x_ptr + offs, mask=row_mask[:, None], other=0.0, eviction_policy=EVICT).to(ACC)
    if HAS_TAIL:  # the ragged end (R is not a multiple of BLOCK_R); r_end is tail_start where another program has it
        r = tail_start + cols
        if R_CONTIG:
            offs = row_off[:, None] + r[None, :]
        else:
            offs = row_off[:, None] + r[None, :] * s_r
        mask = row_mask[:, None] & (r < r_end)[None, :]
        acc += tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(ACC)
    _store_result(tl.sum(acc, axis=1), rows, row_mask, out_ptr, part_ptr, count_ptr, pid, split, n_split, K,
                  n_reduced, ROWS, SPLIT_R, BLOCK_S, ACC, IS_MEAN, OUT_BF16)


@triton.jit
def _cols_kernel(
    x_ptr,  # input; element (o, r, i) at o*s_o + r*s_r + i*s_i, o < O, r < R, i < I
    out_ptr,  # [O*I] result (output dtype)
    part_ptr,  # [SPLIT, O*I] partials (ACC dtype); only if SPLIT_R
    count_ptr,  # [O * cdiv(I, BLOCK_I)] int32 ticket counters, zero before and after; only if SPLIT_R
    O, I, R, s_o, s_r, s_i,
    r_per_split,  # reduced elements per split (a multiple of BLOCK_R); R when SPLIT == 1
    n_reduced,  # divisor of the mean (IS_MEAN only)
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, I_CONTIG: tl.constexpr, SPLIT_R: tl.constexpr,
    HAS_TAIL: tl.constexpr, ACC: tl.constexpr, BLOCK_S: tl.constexpr, IS_MEAN: tl.constexpr,
    OUT_BF16: tl.constexpr, INT64: tl.constexpr, EVICT: tl.constexpr, INTERLEAVE: tl.constexpr,
):
    pid = tl.program_id(0)  # o * blocks_of_i + block of i
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    if INT64:
        pid = pid.to(tl.int64)
        split = split.to(tl.int64)
    i_blocks = tl.cdiv(I, BLOCK_I)
    o = pid // i_blocks
    cols = (pid % i_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < I
    if I_CONTIG:
        col_off = o * s_o + cols
    else:
        col_off = o * s_o + cols * s_i
    r_start, step, n_full, tail_start, r_end = _chunk(split, n_split, R, r_per_split, BLOCK_R, SPLIT_R, INTERLEAVE)
    rr = tl.arange(0, BLOCK_R)
    if INT64:
        rr = rr.to(tl.int64)
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=ACC)
    for b in range(0, n_full):
        r = r_start + b * step + rr
        offs = r[:, None] * s_r + col_off[None, :]
        acc += tl.load(x_ptr + offs, mask=col_mask[None, :], other=0.0, eviction_policy=EVICT).to(ACC)
    if HAS_TAIL:
        r = tail_start + rr
        offs = r[:, None] * s_r + col_off[None, :]
        mask = (r < r_end)[:, None] & col_mask[None, :]
        acc += tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(ACC)
    _store_result(tl.sum(acc, axis=0), o * I + cols, col_mask, out_ptr, part_ptr, count_ptr, pid, split, n_split,
                  O * I, n_reduced, BLOCK_I, SPLIT_R, BLOCK_S, ACC, IS_MEAN, OUT_BF16)


@dataclass(frozen=True)
class ReducePlan:
    """``out[o*I + i] = Σ_{r<R} x[o*s_o + r*s_r + i*s_i]``; ``kind`` is ``"rows"`` or ``"cols"``."""

    kind: str
    O: int
    I: int
    R: int
    s_o: int
    s_i: int
    s_r: int
    block_r: int
    block_i: int  # cols: columns per program; rows: rows (outputs) per program
    split: int  # chunks of the reduced axis (grid axis 1); > 1 means a second stage
    r_per_split: int
    num_warps: int
    interleave: bool  # split programs read every split-th block (see _chunk), not one contiguous chunk each

    @property
    def K(self) -> int:
        return self.O * self.I

    @property
    def grid(self) -> tuple[int, int]:
        if self.kind == "rows":
            return (cdiv(self.K, self.block_i), self.split)
        return (self.O * cdiv(self.I, self.block_i), self.split)


def _coalesce(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (size, stride) axes, outer to inner, where the outer stride equals size·stride of the inner."""
    merged: list[tuple[int, int]] = []
    for size, stride in dims:
        if size == 1:
            continue
        if merged and merged[-1][1] == size * stride:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged


@functools.lru_cache(maxsize=4096)
def _strided_layout(shape: tuple[int, ...], stride: tuple[int, ...], dims: tuple[int, ...]):
    """(kept groups, reduced axis) of a tensor read in place, or ``None`` when it needs a copy."""
    kept = _coalesce([(shape[d], stride[d]) for d in range(len(shape)) if d not in dims])
    # the order of the reduced axes is free: largest stride outermost, then merge
    red = _coalesce(sorted(((shape[d], stride[d]) for d in dims), key=lambda t: -t[1]))
    if len(kept) > 2 or len(red) > 1:
        return None
    return tuple(kept), (red[0] if red else (1, 0))


Groups = tuple[tuple[int, int], ...]  # (size, stride) axes


def prepare(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, Groups, tuple[int, int]]:
    """The tensor the kernels read (``x`` itself when its strides allow, else one copy) and its layout.

    The copy happens only when the reduced axes cannot be merged into one strided axis (e.g.
    ``dim=(0, 2)`` of a contiguous 3-d tensor) or the kept axes need more than two strided groups.
    """
    layout = _strided_layout(tuple(x.shape), x.stride(), dims)
    if layout is None:
        kept_axes = [d for d in range(x.dim()) if d not in dims]
        x = x.permute(*kept_axes, *dims).contiguous()
        layout = _strided_layout(tuple(x.shape), x.stride(), tuple(range(len(kept_axes), x.dim())))
        assert layout is not None
    return x, *layout


def plan_reduction(x: torch.Tensor, kept, red: tuple[int, int]) -> ReducePlan:
    """Pick kernel, tile sizes and split for reading ``x`` with the layout from :func:`prepare`."""
    on_gpu = x.device.type == "cuda"
    return _plan(tuple(kept), tuple(red), x.element_size(), on_gpu, sm_count(x.device), PROGRAMS_PER_SM,
                 COLS_PROGRAMS_PER_SM)


@functools.lru_cache(maxsize=4096)
def _plan(kept: tuple[tuple[int, int], ...], red: tuple[int, int], elsize: int, on_gpu: bool, sms: int,
          rows_per_sm: int, cols_per_sm: int) -> ReducePlan:
    R, s_r = red
    tile = (TILE_BYTES.get(elsize, 16384) if on_gpu else INTERPRETER_TILE_BYTES) // elsize
    inner_stride = kept[-1][1] if kept else None
    use_rows = inner_stride is None or abs(s_r) <= abs(inner_stride)
    if use_rows:
        if len(kept) == 2:
            (O, s_o), (I, s_i) = kept
        elif len(kept) == 1:
            (O, s_o), (I, s_i) = kept[0], (1, 0)
        else:
            O, s_o, I, s_i = 1, 0, 1, 0
        # one pass per row first (ROW_TILE_BYTES); a plan that must split the rows takes the larger split tile
        for tile_bytes in (ROW_TILE_BYTES, TILE_BYTES.get(elsize, 16384)):
            tile = (tile_bytes if on_gpu else INTERPRETER_TILE_BYTES) // elsize
            block_r = min(next_power_of_2(R), tile)
            rows = max(1, min(tile // block_r, tile // MAX_COL_FRACTION, next_power_of_2(O * I)))
            tiles = cdiv(O * I, rows)
            split, r_per_split, interleave = _split(R, block_r, tiles, sms * rows_per_sm, "rows")
            if split == 1:
                break
        warps = ROW_WARPS if rows == 1 and block_r * elsize >= ROW_TILE_BYTES else 8 if rows * block_r >= 4096 else 4
        return ReducePlan("rows", O, I, R, s_o, s_i, s_r, block_r, rows, split, r_per_split, warps, interleave)
    if len(kept) == 2:
        (O, s_o), (I, s_i) = kept
    else:
        (O, s_o), (I, s_i) = (1, 0), kept[0]
    target = sms * cols_per_sm
    # widest column tile (≤ 1 KiB rows) that still leaves enough tiles to keep splits small
    block_i = min(next_power_of_2(I), max(1, tile // MAX_COL_FRACTION))
    min_block_i = max(1, MIN_COL_BYTES.get(elsize, 128) // elsize)
    while block_i > min_block_i and O * cdiv(I, block_i) < target // 8:
        block_i //= 2
    block_r = max(1, min(tile // block_i, next_power_of_2(R)))
    tiles = O * cdiv(I, block_i)
    split, r_per_split, interleave = _split(R, block_r, tiles, target, "cols")
    warps = 8 if block_r * block_i >= 4096 else 4
    return ReducePlan("cols", O, I, R, s_o, s_i, s_r, block_r, block_i, split, r_per_split, warps, interleave)


def _split(R: int, block_r: int, tiles: int, target: int, kind: str) -> tuple[int, int, bool]:
    """``(split, r_per_split, interleave)``: chunks of the reduced axis so that ``tiles·split`` ≈ ``target`` programs,
    each chunk a multiple of ``block_r``; read interleaved from ``INTERLEAVE_MIN_SPLIT[kind]`` splits up.

    The split is rounded to what chunks of whole blocks allow in both orders: an interleaved split kept exact (66
    instead of 64 for dim=0 of 65536x512 bf16) ran 12% slower on the H100 (probes/reduce_waves_ab.txt)."""
    if tiles >= target or block_r * 2 >= R:
        return 1, R, False
    split = min(cdiv(target, tiles), cdiv(R, block_r))
    r_per_split = cdiv(cdiv(R, split), block_r) * block_r
    split = cdiv(R, r_per_split)
    if split <= 1:
        return 1, R, False
    threshold = INTERLEAVE_MIN_SPLIT[kind]
    return split, r_per_split, threshold is not None and split >= threshold


def workspace_numel(plan: ReducePlan) -> int:
    """fp32 (fp64) elements of the stage-1 partials ``[split, K]`` (0 without a second stage)."""
    return plan.split * plan.K if plan.split > 1 else 0


def launch(x: torch.Tensor, plan: ReducePlan, out: torch.Tensor, partials: torch.Tensor | None, *, is_mean: bool,
           acc_dtype: torch.dtype) -> None:
    """The one kernel launch of ``plan`` on ``x``, writing ``out`` (and ``partials`` ``[split, K]`` on the way,
    when ``plan.split > 1``)."""
    split = plan.split > 1
    int64 = needs_int64(x, out) or plan.K * plan.split > INT32_MAX
    evict = STREAM_EVICTION.get(x.element_size(), "")
    tiles = plan.grid[0]
    # plan.block_i outputs per tile: rows of the rows kernel, columns of the cols kernel
    block_s = final_sum_rows(plan.split, plan.block_i) if split else 1
    key = (plan, is_mean, acc_dtype, out.dtype, int64, evict)
    tensors = (x, out, partials if split else out, ticket_counters(x.device, tiles) if split else out)

    def constexprs() -> dict:  # built only the first time this signature launches
        common = dict(EVICT=evict, SPLIT_R=split, INTERLEAVE=plan.interleave, HAS_TAIL=plan.R % plan.block_r != 0,
                      ACC=_TL_ACC[acc_dtype], BLOCK_S=block_s, OUT_BF16=out.dtype == torch.bfloat16, IS_MEAN=is_mean,
                      INT64=int64, num_warps=plan.num_warps)
        if plan.kind == "rows":
            cap = {"maxnreg": ROWS_MAXNREG} if x.is_cuda else {}  # a CUDA compile option (not the interpreter's)
            return dict(ROWS=plan.block_i, BLOCK_R=plan.block_r, HAS_I=plan.I > 1, R_CONTIG=plan.s_r == 1, **common,
                        **cap)
        return dict(BLOCK_R=plan.block_r, BLOCK_I=plan.block_i, I_CONTIG=plan.s_i == 1, **common)

    if plan.kind == "rows":
        scalars = (plan.K, plan.I, plan.R, plan.s_o, plan.s_i, plan.s_r, plan.r_per_split, plan.R)
        launch_kernel(_rows_kernel, key, plan.grid, tensors, scalars, constexprs)
    else:
        scalars = (plan.O, plan.I, plan.R, plan.s_o, plan.s_r, plan.s_i, plan.r_per_split, plan.R)
        launch_kernel(_cols_kernel, key, plan.grid, tensors, scalars, constexprs)


def reduce_into(x: torch.Tensor, dims: tuple[int, ...], out: torch.Tensor, workspace: torch.Tensor | None, *,
                plan: ReducePlan, is_mean: bool) -> None:
    """Launcher: reduce ``x`` (already laid out by :func:`prepare`) over ``dims`` into ``out``, in one launch.

    ``out`` is contiguous with ``plan.K`` elements; ``workspace`` holds :func:`workspace_numel`
    accumulator-dtype elements (``None`` when that is 0) for the partials ``[split, K]`` of a split
    reduction, which the last program of each output tile sums in split order.
    """
    if out.numel() != plan.K or not out.is_contiguous():
        raise ValueError(f"out must be contiguous with {plan.K} elements, got shape {tuple(out.shape)}")
    if plan.split == 1:
        launch(x, plan, out, None, is_mean=is_mean, acc_dtype=_acc(x, out))
        return
    if workspace is None or workspace.numel() < workspace_numel(plan):
        raise ValueError(f"workspace must hold {workspace_numel(plan)} elements")
    partials = workspace[: workspace_numel(plan)].view(plan.split, plan.K)
    launch(x, plan, out, partials, is_mean=is_mean, acc_dtype=workspace.dtype)


def _acc(x: torch.Tensor, out: torch.Tensor) -> torch.dtype:
    return torch.float64 if torch.float64 in (x.dtype, out.dtype) else torch.float32
