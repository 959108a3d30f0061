"""Triton kernels of ``fuselab.sum``/``fuselab.mean`` (deterministic, fixed two-stage trees).

They run a :class:`~fuselab.ops.reduce.plan.ReduceSchedule` (``out[o, i] = Σ_r x[o·s_o + r·s_r + i·s_i]``; how a
reduction becomes one: :mod:`fuselab.ops.reduce.plan`). Two kernels, chosen by which axis is contiguous:

* ``_rows_kernel`` (the reduced axis has the smallest stride: ``dim=-1``, full reductions): each
  program owns ``ROWS`` outputs and streams their rows in ``[ROWS, BLOCK_R]`` tiles of 8-16 KiB
  (wide vector loads, several in flight per thread), accumulating element-wise in fp32 and
  reducing the tile once at the end.
* ``_cols_kernel`` (a kept axis is contiguous: ``dim=0``, middle axes): each program owns
  ``BLOCK_I`` contiguous columns (coalesced rows of ≥ 128 B) and streams ``[BLOCK_R, BLOCK_I]``
  tiles down the reduced axis. ``_cols_tma_kernel`` runs the same plans (``plan.stages > 0``: large
  fp32 inputs on Hopper) through TMA boxes, several in flight per program.

Parallelism when there are few outputs: the reduced axis is split into ``SPLIT`` fixed chunks
(grid axis 1). Each program writes its fp32 partial to ``[SPLIT, K]``; the last of the ``SPLIT``
programs of an output tile to finish (an int32 ticket, :mod:`fuselab.ops._tickets`) sums that
tile's partials in split order and writes the result: one launch, no float atomics, so the same
shape on the same device gives the same bits on every run. Bytes: read the input once, write ``K``
outputs (+ ``2·SPLIT·K·4`` bytes of partials, kept ≤ a few percent of the input, served from L2).

Work stealing (plans with ``steal > 0``): instead of one program per (tile, chunk) item, a grid of resident
programs takes items from an atomic counter until none is left, so no SM idles while another finishes a long
program. Each item's partial still lands at ``[chunk, outputs]``, and the last program to finish sums them in chunk
order: which program read which item does not change the bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded
from fuselab.ops._tickets import last_to_arrive, sum_partials


@triton.jit
def _store_out(total, idx, mask, out_ptr, n_reduced, IS_MEAN: tl.constexpr):
    """Write finished sums ``total`` to outputs ``idx``: divided by ``n_reduced`` for a mean, in the output dtype."""
    if IS_MEAN:
        total = total / n_reduced
    tl.store(out_ptr + idx, rounded(total, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_result(total, idx, mask, out_ptr, part_ptr, count_ptr, tile, split, n_split, n_outputs, n_reduced,
                  WIDTH: tl.constexpr, SPLIT_R: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr,
                  IS_MEAN: tl.constexpr):
    """Write ``total`` (``[WIDTH]`` sums of this program's chunk, for outputs ``idx``) to ``out_ptr``; with a split,
    store it as partial ``[split, idx]`` and let the last of the tile's programs sum all of them in split order."""
    done = True
    if SPLIT_R:
        tl.store(part_ptr + split * n_outputs + idx, total, mask=mask)
        done = last_to_arrive(count_ptr + tile, n_split)
        if done:
            total = sum_partials(part_ptr, n_outputs, idx, mask, n_split, BLOCK_S, WIDTH, ACC)
    if done:
        _store_out(total, idx, mask, out_ptr, n_reduced, IS_MEAN)


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
def _grab(count_ptr):
    """The next work item of a stealing launch: a ticket from the launch's item counter (``count_ptr[0]``)."""
    return tl.atomic_add(count_ptr, 1, sem="relaxed", scope="gpu")


@triton.jit
def _item_coords(item, n_tiles, INT64: tl.constexpr):
    """(output tile, split) of a stealing item. Items run split-major: the programs reading at one moment cover all
    tiles of neighbouring chunks (one window of memory)."""
    if INT64:
        item = item.to(tl.int64)
    return item % n_tiles, item // n_tiles


@triton.jit
def _program_coords(INT64: tl.constexpr):
    """(output tile, split) of a program of a grid with one program per item."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    if INT64:
        tile = tile.to(tl.int64)
        split = split.to(tl.int64)
    return tile, split


@triton.jit
def _store_item(total, idx, mask, out_ptr, part_ptr, split, n_outputs, n_reduced, SPLIT_R: tl.constexpr,
                IS_MEAN: tl.constexpr):
    """A stealing item's sums: partial ``[split, idx]`` of a split plan, else the outputs themselves."""
    if SPLIT_R:
        tl.store(part_ptr + split * n_outputs + idx, total, mask=mask)
    else:
        _store_out(total, idx, mask, out_ptr, n_reduced, IS_MEAN)


@triton.jit
def _steal_done(out_ptr, part_ptr, count_ptr, n_outputs, n_split, n_reduced, WIDTH: tl.constexpr,
                SPLIT_R: tl.constexpr, BLOCK_S: tl.constexpr, ACC: tl.constexpr, IS_MEAN: tl.constexpr):
    """End of a stealing program: the last program to finish (a ticket on ``count_ptr[1]``) zeroes the item counter
    and, for a split plan, sums every output's partials in split order (so the bits do not depend on which program
    read which item)."""
    if last_to_arrive(count_ptr + 1, tl.num_programs(0)):
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
        if SPLIT_R:
            for start in range(0, n_outputs, WIDTH):
                idx = start + tl.arange(0, WIDTH)
                mask = idx < n_outputs
                total = sum_partials(part_ptr, n_outputs, idx, mask, n_split, BLOCK_S, WIDTH, ACC)
                _store_out(total, idx, mask, out_ptr, n_reduced, IS_MEAN)


@triton.jit
def _rows_item(x_ptr, tile, split, n_split, K, I, R, s_o, s_i, s_r, r_per_split, ROWS: tl.constexpr,
               BLOCK_R: tl.constexpr, HAS_I: tl.constexpr, R_CONTIG: tl.constexpr, SPLIT_R: tl.constexpr,
               HAS_TAIL: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr, EVICT: tl.constexpr,
               INTERLEAVE: tl.constexpr):
    """One work item of the rows kernel: the ``[ROWS]`` sums of output tile ``tile`` over chunk ``split`` of the
    reduced axis, and those outputs' indices and mask (``tile`` and ``split`` are int64 where INT64)."""
    rows = tile * ROWS + tl.arange(0, ROWS)
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
    return tl.sum(acc, axis=1), rows, row_mask


@triton.jit
def _rows_kernel(
    x_ptr,  # input; element (o, i, r) at o*s_o + i*s_i + r*s_r, o < K // I, i < I, r < R
    out_ptr,  # [K] result (output dtype)
    part_ptr,  # [n_split, K] partials (ACC dtype); only if SPLIT_R
    count_ptr,  # int32 counters, zero before and after: [n_tiles] tickets if SPLIT_R, [2] if STEAL (see _steal_done)
    K, I, R, s_o, s_i, s_r,
    r_per_split,  # reduced elements per split (a multiple of BLOCK_R); R when n_split == 1
    n_reduced,  # divisor of the mean (IS_MEAN only)
    n_tiles, n_split,  # output tiles of ROWS outputs, chunks of the reduced axis
    ROWS: tl.constexpr, BLOCK_R: tl.constexpr, HAS_I: tl.constexpr, R_CONTIG: tl.constexpr,
    SPLIT_R: tl.constexpr, HAS_TAIL: tl.constexpr, ACC: tl.constexpr, BLOCK_S: tl.constexpr,
    IS_MEAN: tl.constexpr, INT64: tl.constexpr, EVICT: tl.constexpr, INTERLEAVE: tl.constexpr,
    STEAL: tl.constexpr,
):
    if STEAL:
        item = _grab(count_ptr)
        while item < n_tiles * n_split:
            ahead = _grab(count_ptr)  # the next item, asked for before this one is read
            tile, split = _item_coords(item, n_tiles, INT64)
            total, rows, row_mask = _rows_item(x_ptr, tile, split, n_split, K, I, R, s_o, s_i, s_r,
                                               r_per_split, ROWS, BLOCK_R, HAS_I, R_CONTIG, SPLIT_R, HAS_TAIL, ACC,
                                               INT64, EVICT, False)
            _store_item(total, rows, row_mask, out_ptr, part_ptr, split, K, n_reduced, SPLIT_R, IS_MEAN)
            item = ahead
        _steal_done(out_ptr, part_ptr, count_ptr, K, n_split, n_reduced, ROWS, SPLIT_R, BLOCK_S, ACC, IS_MEAN)
    else:
        tile, split = _program_coords(INT64)
        total, rows, row_mask = _rows_item(x_ptr, tile, split, n_split, K, I, R, s_o, s_i, s_r, r_per_split, ROWS,
                                           BLOCK_R, HAS_I, R_CONTIG, SPLIT_R, HAS_TAIL, ACC, INT64, EVICT, INTERLEAVE)
        _store_result(total, rows, row_mask, out_ptr, part_ptr, count_ptr, tile, split, n_split, K, n_reduced, ROWS,
                      SPLIT_R, BLOCK_S, ACC, IS_MEAN)


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
    HAS_TAIL: tl.constexpr, ACC: tl.constexpr, BLOCK_S: tl.constexpr, IS_MEAN: tl.constexpr, INT64: tl.constexpr,
    EVICT: tl.constexpr, INTERLEAVE: tl.constexpr,
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
                  O * I, n_reduced, BLOCK_I, SPLIT_R, BLOCK_S, ACC, IS_MEAN)


@triton.jit
def _cols_tma_kernel(
    out_ptr,  # [I] result (output dtype)
    x_desc,  # TMA descriptor of x as [R, I] (row stride s_r, contiguous columns), box [BLOCK_R, BLOCK_I]
    part_ptr,  # [SPLIT, I] partials (ACC dtype); only if SPLIT_R
    count_ptr,  # [cdiv(I, BLOCK_I)] int32 ticket counters, zero before and after; only if SPLIT_R
    I, R,
    r_per_split,  # reduced elements per split (a multiple of BLOCK_R); R when SPLIT == 1
    n_reduced,  # divisor of the mean (IS_MEAN only)
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STAGES: tl.constexpr, SPLIT_R: tl.constexpr, ACC: tl.constexpr,
    BLOCK_S: tl.constexpr, IS_MEAN: tl.constexpr,
):
    """The cols kernel of an ``O == 1`` plan read through TMA (``plan.stages > 0``): each program streams
    ``[BLOCK_R, BLOCK_I]`` boxes of its chunk into shared memory with ``STAGES`` in flight; the copy engine fills
    rows past R and columns past I with zeros, so the loop has no masks and no per-element addresses. Bytes: read
    R*I elements, write I (+ SPLIT*I partials, written once and read once). A kernel of its own rather than a flag
    of ``_cols_kernel``: a constexpr branch there changed ptxas's registers for the shipped plans."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    col0 = tile * BLOCK_I
    r_start = split * r_per_split  # < R + r_per_split: TMA coordinates are int32
    r_end = tl.minimum(r_start + r_per_split, R)
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=ACC)
    for r in tl.range(r_start, r_end, BLOCK_R, num_stages=STAGES):
        acc += x_desc.load([r, col0]).to(ACC)
    cols = col0 + tl.arange(0, BLOCK_I)
    _store_result(tl.sum(acc, axis=0), cols, cols < I, out_ptr, part_ptr, count_ptr, tile, split.to(tl.int64),
                  tl.num_programs(1), I, n_reduced, BLOCK_I, SPLIT_R, BLOCK_S, ACC, IS_MEAN)
