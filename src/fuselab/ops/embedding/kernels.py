"""Triton kernels of the embedding bag collection (launched by :mod:`fuselab.ops.embedding.launch`).

All tables live in one ``(R, D)`` weight (fp32, or fp16/bf16 with fp32 math); feature ``f``'s table is rows
``[row_offsets[f], row_offsets[f] + table_sizes[f])``. A raw id of feature ``f`` maps to ``row_offsets[f] + (id mod
table_sizes[f])`` (non-negative modulus) in every kernel, so no id can address outside its table. Row addresses are
int64 (``R*D`` may pass 2^31).

Variants are ``tl.constexpr`` flags: ``BAGS`` (CSR bags of ids, else one id per feature), ``MEAN`` (mean pooling,
else sum) and ``OPTIMIZER`` (0 sgd, 1 element-wise adagrad, 2 row-wise adagrad); the weight's dtype picks the
store (fp32 as is; fp16/bf16 stochastically rounded from a seed the update advances every step).

The update is deterministic: the launcher sorts the ``N`` global rows (stable); :func:`segment_update_kernel`
walks the sorted positions in chunks (a fixed grid, masked), sums each run of equal rows with a segmented scan,
and updates the rows whose run starts and ends inside the chunk; runs that cross a chunk boundary are finished by
:func:`carry_update_kernel` from the per-chunk partial sums. Same order of additions every run.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import stochastically_rounded

SGD: tl.constexpr = tl.constexpr(0)
ADAGRAD: tl.constexpr = tl.constexpr(1)
ROWWISE_ADAGRAD: tl.constexpr = tl.constexpr(2)


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


@triton.jit
def _apply_update(w_ptr, s_ptr, lr, rows, g, mask, eps, seed, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  OPTIMIZER: tl.constexpr):
    # rows: (P, 1) int64 distinct rows; g: (P, BLOCK_D) fp32 coalesced gradients; mask: (P, 1) rows to update.
    # Math in fp32; a half-precision weight is stored stochastically rounded (seed: this step's).
    # Bytes per row: read + write D*itemsize of weight; adagrad also D*4 of state each way, rowwise 4 each way.
    d = tl.arange(0, BLOCK_D)[None, :]
    m2 = mask & (d < D)
    at = rows * D + d
    w = tl.load(w_ptr + at, mask=m2, other=0.0).to(tl.float32)
    if OPTIMIZER == SGD:
        w = w - lr * g
    elif OPTIMIZER == ADAGRAD:
        s = tl.load(s_ptr + at, mask=m2, other=0.0) + g * g
        tl.store(s_ptr + at, s, mask=m2)
        w = w - lr * tl.div_rn(g, tl.sqrt_rn(s) + eps)
    else:
        sq = tl.sum(g * g, axis=1, keep_dims=True)
        s = tl.load(s_ptr + rows, mask=mask, other=0.0) + tl.div_rn(sq, tl.zeros_like(sq) + D)
        tl.store(s_ptr + rows, s, mask=mask)
        w = w - lr * tl.div_rn(g, tl.sqrt_rn(s) + eps)
    tl.store(w_ptr + at, stochastically_rounded(w, w_ptr.dtype.element_ty, seed, at), mask=m2)


@triton.jit
def _rounding_seed(seed_ptr, w_ptr):
    # this step's seed of the stochastic rounding of a half-precision weight (0, unread, for fp32)
    seed = 0
    if w_ptr.dtype.element_ty != tl.float32:
        seed = tl.load(seed_ptr)
    return seed


@triton.jit
def _position_grads(grad_ptr, bag_ptr, offsets_ptr, k, km, F, n_ids, s_gb, s_gf, s_gd,
                    BLOCK_D: tl.constexpr, D: tl.constexpr, BAGS: tl.constexpr, MEAN: tl.constexpr,
                    WIDE: tl.constexpr):
    # gradient (P, BLOCK_D) fp32 of id positions k: its bag's output gradient (/ length for MEAN; 0 outside bags).
    # Per-position values are (P, 1) columns in the result's 2-D layout: 1-D ones fail Triton 3.6's layout pass
    # at BLOCK_D > D (PassManager::run failed in make_ttgir)
    d = tl.arange(0, BLOCK_D)[None, :]
    k = _narrow(k, WIDE)[:, None]
    km = km[:, None]
    if BAGS:
        bag = _narrow(tl.load(bag_ptr + k, mask=km, other=0), WIDE)
        start, end = _bag_bounds(offsets_ptr, bag, km, n_ids)
        inside = km & (k >= start) & (k < end)
    else:
        bag = k
        inside = km
    at = grad_ptr + (bag // F) * s_gb + (bag % F) * s_gf
    g = tl.load(at + d * s_gd, mask=inside & (d < D), other=0.0).to(tl.float32)
    if MEAN and BAGS:
        g = g / tl.maximum(end - start, 1).to(tl.float32)
    return g


@triton.jit
def items_kernel(
    sorted_ptr,  # (N,) int32/int64 global rows, sorted ascending
    flags_ptr,  # (N,) int32 out (first pass): 1 where an item starts
    number_ptr,  # (N,) int64 in (second pass): the flags' inclusive prefix sum, each position's item + 1
    start_ptr,  # (N + 1,) int64 out (second pass): first position of each item, and N after the last
    count_ptr,  # (1,) int64 out (second pass): the number of items
    N,
    BLOCK: tl.constexpr, CHUNK: tl.constexpr, STARTS: tl.constexpr,
):
    # An item starts where the sorted row changes and where a chunk of CHUNK positions starts. The first pass
    # writes the flags (torch.cumsum numbers the items); the second writes each item's first position.
    # Bytes: read 2N keys (overlapping, cached); write 4N flags; second pass also reads 8N, writes 8 per item.
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = p < N
    row = tl.load(sorted_ptr + p, mask=m, other=-1)
    prev = tl.load(sorted_ptr + p - 1, mask=m & (p > 0), other=-1)
    cut = m & ((p % CHUNK == 0) | (row != prev))
    if STARTS:
        number = tl.load(number_ptr + p, mask=m, other=0)
        tl.store(start_ptr + number - 1, p, mask=cut)
        last = m & (p == N - 1)
        tl.store(start_ptr + number, tl.zeros_like(p) + N, mask=last)
        tl.store(count_ptr + tl.zeros_like(p), number, mask=last)
    else:
        tl.store(flags_ptr + p, cut.to(tl.int32), mask=m)


@triton.jit
def item_update_kernel(
    sorted_ptr,  # (N,) int32/int64 global rows, sorted ascending (stable)
    src_ptr,  # (N,) int64 the bag (b*F + f) whose output gradient each sorted position adds (its grad row)
    scale_ptr,  # bags: (N,) fp32 factor of each sorted position's gradient (rows_kernel's, sorted); unused otherwise
    start_ptr,  # (N + 1,) int64 first sorted position of each item; entry [n_items] holds N
    count_ptr,  # (1,) int64 number of items
    grad_ptr,  # (B, F, D) output gradient, any float dtype, strides (s_gb, s_gf, s_gd)
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, updated in place
    s_ptr,  # optimizer state: (R, D) fp32 adagrad, (R,) fp32 rowwise_adagrad, unused for sgd
    lr_ptr,  # () fp32 learning rate
    seed_ptr,  # () int64 rounding seed of a half-precision weight (advanced by rows_kernel); unused for fp32
    head_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of the split piece that starts at each chunk's start
    tail_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of the split piece that ends at each chunk's end
    N, F, s_gb, s_gf, s_gd, eps,  # N first: the launch keys it by class
    D: tl.constexpr, BLOCK_S: tl.constexpr, UNROLL: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
    OPTIMIZER: tl.constexpr, SCALED: tl.constexpr, FLAT_GRAD: tl.constexpr,
):
    # An item is a run of equal sorted rows inside one chunk of CHUNK positions: a whole segment (all the ids of one
    # row), or a piece of a segment longer than a chunk. A program takes BLOCK_S items at a time (a persistent
    # loop), gathers UNROLL gradient rows per item per step (BLOCK_S * UNROLL rows in flight), and sums each item;
    # a whole segment is applied here, a piece leaves its sum in head/tail for carry_update_kernel, which adds
    # the pieces of each long segment in chunk order. Per-item values are (BLOCK_S, 1) columns: 1-D ones fail
    # Triton 3.6's layout pass in such loops.
    # Bytes: read N sorted rows, sources (8) and scales (4), N gradient rows of D*itemsize (gathered); per distinct
    # row the update's read-modify-write (see _apply_update); write the split pieces' partial rows.
    n_items = tl.load(count_ptr)
    lr = tl.load(lr_ptr)
    seed = _rounding_seed(seed_ptr, w_ptr)
    d = tl.arange(0, BLOCK_D)[None, :]
    dm = d < D
    u = tl.arange(0, UNROLL)[None, :, None]
    for blk in range(tl.program_id(0), tl.cdiv(n_items, BLOCK_S), tl.num_programs(0)):
        i = (blk * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)[:, None]  # (BLOCK_S, 1)
        im = i < n_items
        start = tl.load(start_ptr + i, mask=im, other=0)
        length = tl.load(start_ptr + i + 1, mask=im, other=0) - start
        acc = tl.zeros((BLOCK_S, BLOCK_D), dtype=tl.float32)
        for j in range(0, tl.max(tl.max(length, axis=1), axis=0), UNROLL):
            pm = (j + u < length[:, :, None]) & im[:, :, None]  # (BLOCK_S, UNROLL, 1)
            pos = start[:, :, None] + j + u
            src = tl.load(src_ptr + pos, mask=pm, other=0)
            if FLAT_GRAD:  # s_gb == F * s_gf: bag b*F + f is row b*F + f (no 64-bit division per id)
                at = grad_ptr + src * s_gf + d[:, None, :] * s_gd
            else:
                at = grad_ptr + (src // F) * s_gb + (src % F) * s_gf + d[:, None, :] * s_gd
            g = tl.load(at, mask=pm & dm[:, None, :], other=0.0).to(tl.float32)
            if SCALED:
                g = g * tl.load(scale_ptr + pos, mask=pm, other=0.0)
            acc += tl.sum(g, axis=1)
        end = start + length
        row = tl.load(sorted_ptr + start, mask=im, other=-1).to(tl.int64)
        from_left = tl.load(sorted_ptr + start - 1, mask=im & (start > 0), other=-1).to(tl.int64) == row
        to_right = tl.load(sorted_ptr + end, mask=im & (end < N), other=-1).to(tl.int64) == row
        split = im & (from_left | to_right)
        _apply_update(w_ptr, s_ptr, lr, row, acc, im & ~split, eps, seed, D, BLOCK_D, OPTIMIZER)
        # whole partial rows, the zero columns past D included: the carry kernel reads them unmasked
        chunk = start // CHUNK
        whole_row = d < BLOCK_D
        tl.store(head_ptr + chunk * BLOCK_D + d, acc, mask=(split & (start == chunk * CHUNK)) & whole_row)
        tl.store(tail_ptr + chunk * BLOCK_D + d, acc, mask=(split & (end == chunk * CHUNK + CHUNK)) & whole_row)


@triton.jit
def carry_update_kernel(
    sorted_ptr,  # (N,) int32/int64 sorted global rows
    head_ptr,  # (n_chunks, BLOCK_D) fp32 first-run sums of segment_update_kernel
    tail_ptr,  # (n_chunks, BLOCK_D) fp32 last-run sums
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, updated in place
    s_ptr,  # optimizer state as in segment_update_kernel
    lr_ptr,  # () fp32
    seed_ptr,  # () int64 rounding seed, as in segment_update_kernel
    N, n_chunks, eps,
    D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
    OPTIMIZER: tl.constexpr,
):
    # A run that starts in this chunk and continues into the next: its sum is this chunk's last-run sum plus the
    # first-run sums of the following chunks that start with the same row, added BLOCK_C chunks at a time (in a
    # fixed order). Bytes: 3 keys per chunk; per crossing run, its chunks' partials and one row update.
    chunk = tl.program_id(0)
    cs = chunk.to(tl.int64) * CHUNK
    ce = tl.minimum(cs + CHUNK, N)
    row = tl.load(sorted_ptr + ce - 1).to(tl.int64)
    before = tl.load(sorted_ptr + cs - 1, mask=cs > 0, other=-1).to(tl.int64)
    after = tl.load(sorted_ptr + ce, mask=ce < N, other=-1).to(tl.int64)
    if (row != before) & (row == after):
        d = tl.arange(0, BLOCK_D)
        total = tl.load(tail_ptr + chunk * BLOCK_D + d)[None, :]
        c0 = chunk + 1
        more = c0 < n_chunks
        while more:
            c = c0 + tl.arange(0, BLOCK_C)
            cm = c < n_chunks
            starts = tl.load(sorted_ptr + c.to(tl.int64) * CHUNK, mask=cm, other=-1).to(tl.int64)
            match = cm & (starts == row)
            part = tl.load(head_ptr + c[:, None] * BLOCK_D + d[None, :], mask=match[:, None], other=0.0)
            total += tl.sum(part, axis=0)[None, :]
            more = tl.min(match.to(tl.int32), axis=0) == 1
            c0 += BLOCK_C
        lr = tl.load(lr_ptr)
        one = tl.zeros((1, 1), dtype=tl.int64)
        _apply_update(w_ptr, s_ptr, lr, row + one, total, one == 0, eps, _rounding_seed(seed_ptr, w_ptr), D, BLOCK_D,
                      OPTIMIZER)


@triton.jit
def atomic_sgd_kernel(
    grad_ptr,  # (B, F, D) output gradient, strides (s_gb, s_gf, s_gd)
    keys_ptr,  # (N,) global row of each id position (rows_kernel)
    bag_ptr,  # bags: (N,) int64; unused otherwise
    offsets_ptr,  # bags: (B*F + 1,) int64; unused otherwise
    w_ptr,  # (R, D) fp32 weight, updated in place with atomics
    lr_ptr,  # () fp32
    N, n_ids, F, s_gb, s_gf, s_gd,  # N and n_ids first: the launch keys them by class
    D: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, BAGS: tl.constexpr, MEAN: tl.constexpr,
    WIDE: tl.constexpr,
):
    # Non-deterministic SGD: w[row] += -lr * g per id position, no sort. Bytes: N keys, N gradient rows read,
    # N atomic row updates.
    p = _program(WIDE) * BLOCK_P + tl.arange(0, BLOCK_P)
    valid = p < N
    g = _position_grads(grad_ptr, bag_ptr, offsets_ptr, p, valid, F, n_ids, s_gb, s_gf, s_gd,
                        BLOCK_D, D, BAGS, MEAN, WIDE)
    row = tl.load(keys_ptr + p, mask=valid, other=0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    lr = tl.load(lr_ptr)
    tl.atomic_add(w_ptr + row[:, None] * D + d[None, :], -lr * g, mask=_rows_mask(valid, D, BLOCK_D),
                  sem="relaxed")
