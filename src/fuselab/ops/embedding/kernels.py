"""Triton kernels of the embedding bag collection's lookups and of the update's first pass (launched by
:mod:`fuselab.ops.embedding.launch`; the update's other kernels: :mod:`fuselab.ops.embedding.update_kernels`).

All tables live in one ``(R, D)`` weight (fp32, or fp16/bf16 with fp32 math); feature ``f``'s table is rows
``[row_offsets[f], row_offsets[f] + table_sizes[f])``. A raw id of feature ``f`` maps to ``row_offsets[f] + (id mod
table_sizes[f])`` (non-negative modulus) in every kernel, so no id can address outside its table. Row addresses are
int64 (``R*D`` may pass 2^31).

Variants are ``tl.constexpr`` flags: ``BAGS`` (CSR bags of ids, else one id per feature), ``MEAN`` (mean pooling,
else sum) and, in the update, ``OPTIMIZER`` (0 sgd, 1 element-wise adagrad, 2 row-wise adagrad).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _program(WIDE: tl.constexpr):
    # this program's index, int64 when position math may pass 2^31
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    return pid


@triton.jit
def _narrow(index, WIDE: tl.constexpr):
    # an int64 position index as int32 when every position fits (cheaper division and modulus)
    if not WIDE:
        index = index.to(tl.int32)
    return index


@triton.jit
def _rows_mask(rows_ok, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # (P, BLOCK_D) mask of P rows x D columns; when D == BLOCK_D it is constant along D, which lets the compiler
    # use 16-byte vector loads and stores (a `d < D` term would hide that)
    if D == BLOCK_D:
        m = tl.broadcast_to(rows_ok[:, None], (rows_ok.shape[0], BLOCK_D))
    else:
        m = rows_ok[:, None] & (tl.arange(0, BLOCK_D) < D)[None, :]
    return m


@triton.jit
def _global_row(raw, feature, sizes_ptr, row_offsets_ptr, mask):
    # raw: ids of any integer dtype; feature: their feature index (same shape); sizes_ptr/row_offsets_ptr: (F,) int64
    n = tl.load(sizes_ptr + feature, mask=mask, other=1)
    base = tl.load(row_offsets_ptr + feature, mask=mask, other=0)
    return base + _wrapped(raw, n)


@triton.jit
def _wrapped(raw, n):
    # raw mod n, non-negative (int64). The 64-bit remainder costs ~100 instructions per id, so it runs only when some
    # id of the tile is outside [0, n): ids a loader already hashed into their tables skip it
    r = raw.to(tl.int64)
    if tl.max(((r < 0) | (r >= n)).to(tl.int32)) > 0:
        r = r % n  # C remainder: the sign of raw
        r = tl.where(r < 0, r + n, r)
    return r


@triton.jit
def _bag_bounds(offsets_ptr, bag, mask, n_ids):
    # offsets_ptr: (B*F + 1,) int64 CSR offsets; bag: bag indices. Clamped into [0, n_ids], end >= start.
    start = tl.load(offsets_ptr + bag, mask=mask, other=0)
    end = tl.load(offsets_ptr + bag + 1, mask=mask, other=0)
    start = tl.minimum(tl.maximum(start, 0), n_ids)
    end = tl.minimum(tl.maximum(end, start), n_ids)
    return start, end


@triton.jit
def lookup_kernel(
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, contiguous
    ids_ptr,  # one id: (B, F) any integer dtype, strides (s_ib, s_if); bags: (N,) stride s_ib
    offsets_ptr,  # bags: (B*F + 1,) int64 CSR offsets; unused otherwise
    sizes_ptr,  # (F,) int64 rows per table
    row_offsets_ptr,  # (F,) int64 first row of each table
    out_ptr,  # (B*F, D) fp32 output, contiguous
    n_ids, num_bags, F, s_ib, s_if,  # n_ids first: the launch keys it by class (it changes with every batch of bags)
    D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BAGS: tl.constexpr, MEAN: tl.constexpr,
    WIDE: tl.constexpr, UNROLL: tl.constexpr,
):
    # Bytes: one id: read B*F ids + B*F rows of D*4, write B*F*D*4. Bags: read N ids + N rows, write B*F*D*4.
    # Position math in int32 unless WIDE (an output or ids offset past 2^31); row addresses are always int64.
    # One id: a program takes BLOCK_ROWS consecutive outputs (grid (cdiv(B*F, BLOCK_ROWS), 1)). Bags: a program
    # takes BLOCK_ROWS batch rows of one feature (grid (cdiv(B, BLOCK_ROWS), F)), so that the bags it loops over
    # have that feature's lengths (multi-hot features differ widely: 1 to 100 ids in MLPerf's DLRM-DCNv2).
    d = tl.arange(0, BLOCK_D)
    if BAGS:
        b = _program(WIDE) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        jm = b < num_bags // F
        feature = tl.zeros_like(b) + tl.program_id(1)
        j = b * F + feature
    else:
        j = _program(WIDE) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        jm = j < num_bags
        feature = j % F
    if BAGS:
        # UNROLL ids of each bag per step (BLOCK_ROWS * UNROLL rows in flight); per-bag values are (BLOCK_ROWS, 1)
        # columns in the 2-D layout: 1-D ones in this loop fail Triton 3.6's layout pass (PassManager::run failed in
        # make_ttgir) at 32-64 rows x 4 warps
        start, end = _bag_bounds(offsets_ptr, j[:, None], jm[:, None], n_ids)
        length = (end - start)[:, :, None]  # (BLOCK_ROWS, 1, 1)
        n_rows = tl.load(sizes_ptr + tl.program_id(1))  # the program's table, read once
        base = tl.load(row_offsets_ptr + tl.program_id(1))
        u = tl.arange(0, UNROLL)[None, :, None]
        dd = d[None, None, :]
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for i in range(0, tl.max(tl.max(tl.max(length, axis=2), axis=1), axis=0), UNROLL):
            m = jm[:, None, None] & (i + u < length)  # (BLOCK_ROWS, UNROLL, 1)
            raw = tl.load(ids_ptr + (start[:, :, None] + i + u) * s_ib, mask=m, other=0)
            row = base + _wrapped(raw, n_rows)
            acc += tl.sum(tl.load(w_ptr + row * D + dd, mask=m & (dd < D), other=0.0).to(tl.float32), axis=1)
        if MEAN:
            acc = acc / tl.maximum(end - start, 1).to(tl.float32)
    else:
        raw = tl.load(ids_ptr + (j // F) * s_ib + feature * s_if, mask=jm, other=0)
        row = _global_row(raw, feature, sizes_ptr, row_offsets_ptr, jm)
        acc = tl.load(w_ptr + row[:, None] * D + d[None, :], mask=_rows_mask(jm, D, BLOCK_D), other=0.0)
        acc = acc.to(tl.float32)
    tl.store(out_ptr + j[:, None] * D + d[None, :], acc, mask=_rows_mask(jm, D, BLOCK_D))


@triton.jit
def rows_kernel(
    ids_ptr,  # one id: (B, F) integer, strides (s_ib, s_if); bags: (N,) stride s_ib
    bag_ptr,  # bags: (N,) int64 bag of each id position (searchsorted over the offsets); unused otherwise
    sizes_ptr,  # (F,) int64
    row_offsets_ptr,  # (F,) int64
    keys_ptr,  # (N,) int32 or int64 out: global row of each id position (the sort keys)
    offsets_ptr,  # bags: (B*F + 1,) int64 CSR offsets; unused otherwise
    scale_ptr,  # bags: (N,) fp32 out: the gradient's factor at each position (1 sum, 1/length mean, 0 outside
    # every bag); unused otherwise
    seed_ptr,  # () int64 seed of the stochastic rounding of half-precision weights; unused unless STOCHASTIC
    n_pos, n_ids, F, s_ib, s_if,
    BLOCK: tl.constexpr, BAGS: tl.constexpr, MEAN: tl.constexpr, WIDE: tl.constexpr, STOCHASTIC: tl.constexpr,
):
    # Bytes: read N ids (+ N*8 bag indices and their bounds), write N keys (+ N*4 scales). The first kernel of every
    # update: it advances the rounding seed, which the update's later kernels read (stream order), so each step
    # draws new random bits.
    p = _program(WIDE) * BLOCK + tl.arange(0, BLOCK)
    if STOCHASTIC:  # noqa: SIM102 (a constexpr test: Triton has no `and` of a constexpr and a tensor)
        if tl.program_id(0) == 0:
            tl.store(seed_ptr, tl.load(seed_ptr) + 1)
    m = p < n_pos
    if BAGS:
        bag = _narrow(tl.load(bag_ptr + p, mask=m, other=0), WIDE)
        feature = bag % F
        raw = tl.load(ids_ptr + p * s_ib, mask=m, other=0)
        start, end = _bag_bounds(offsets_ptr, bag, m, n_ids)
        scale = tl.where((p >= start) & (p < end), 1.0, 0.0)
        if MEAN:
            scale = scale / tl.maximum(end - start, 1).to(tl.float32)
        tl.store(scale_ptr + p, scale, mask=m)
    else:
        feature = p % F
        raw = tl.load(ids_ptr + (p // F) * s_ib + feature * s_if, mask=m, other=0)
    row = _global_row(raw, feature, sizes_ptr, row_offsets_ptr, m)
    tl.store(keys_ptr + p, row.to(keys_ptr.dtype.element_ty), mask=m)
