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
    r = raw.to(tl.int64) % n  # C remainder: the sign of raw
    return base + tl.where(r < 0, r + n, r)


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
    WIDE: tl.constexpr,
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
        # the loop works on (BLOCK_ROWS, 1) columns, in the accumulator's 2-D layout: with 1-D per-row values in
        # this loop, Triton 3.6's layout pass fails to compile (PassManager::run failed in make_ttgir) at 32-64
        # rows x 4 warps
        start, end = _bag_bounds(offsets_ptr, j[:, None], jm[:, None], n_ids)
        length = end - start
        acc = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for i in range(0, tl.max(tl.max(length, axis=1), axis=0)):
            m = jm[:, None] & (i < length)
            raw = tl.load(ids_ptr + (start + i) * s_ib, mask=m, other=0)
            row = _global_row(raw, feature[:, None], sizes_ptr, row_offsets_ptr, m)
            acc += tl.load(w_ptr + row * D + d[None, :], mask=m & (d < D)[None, :], other=0.0).to(tl.float32)
        if MEAN:
            acc = acc / tl.maximum(length, 1).to(tl.float32)
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
    seed_ptr,  # () int64 seed of the stochastic rounding of half-precision weights; unused unless STOCHASTIC
    n_pos, F, s_ib, s_if,
    BLOCK: tl.constexpr, BAGS: tl.constexpr, WIDE: tl.constexpr, STOCHASTIC: tl.constexpr,
):
    # Bytes: read N ids (+ N*8 bag indices), write N keys. The first kernel of every update: it advances the
    # rounding seed, which the update's later kernels read (stream order), so each step draws new random bits.
    p = _program(WIDE) * BLOCK + tl.arange(0, BLOCK)
    if STOCHASTIC:  # noqa: SIM102 (a constexpr test: Triton has no `and` of a constexpr and a tensor)
        if tl.program_id(0) == 0:
            tl.store(seed_ptr, tl.load(seed_ptr) + 1)
    m = p < n_pos
    if BAGS:
        feature = _narrow(tl.load(bag_ptr + p, mask=m, other=0), WIDE) % F
        raw = tl.load(ids_ptr + p * s_ib, mask=m, other=0)
    else:
        feature = p % F
        raw = tl.load(ids_ptr + (p // F) * s_ib + feature * s_if, mask=m, other=0)
    row = _global_row(raw, feature, sizes_ptr, row_offsets_ptr, m)
    tl.store(keys_ptr + p, row.to(keys_ptr.dtype.element_ty), mask=m)


@triton.jit
def _apply_update(w_ptr, s_ptr, lr, rows, g, mask, eps, seed, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  OPTIMIZER: tl.constexpr):
    # rows: (P,) int64 distinct rows; g: (P, BLOCK_D) fp32 coalesced gradients; mask: (P,) rows to update.
    # Math in fp32; a half-precision weight is stored stochastically rounded (seed: this step's).
    # Bytes per row: read + write D*itemsize of weight; adagrad also D*4 of state each way, rowwise 4 each way.
    d = tl.arange(0, BLOCK_D)
    m2 = _rows_mask(mask, D, BLOCK_D)
    w_at = w_ptr + rows[:, None] * D + d[None, :]
    w = tl.load(w_at, mask=m2, other=0.0).to(tl.float32)
    if OPTIMIZER == SGD:
        w = w - lr * g
    elif OPTIMIZER == ADAGRAD:
        s_at = s_ptr + rows[:, None] * D + d[None, :]
        s = tl.load(s_at, mask=m2, other=0.0) + g * g
        tl.store(s_at, s, mask=m2)
        w = w - lr * tl.div_rn(g, tl.sqrt_rn(s) + eps)
    else:
        sq = tl.sum(g * g, axis=1)
        s = tl.load(s_ptr + rows, mask=mask, other=0.0) + tl.div_rn(sq, tl.zeros_like(sq) + D)
        tl.store(s_ptr + rows, s, mask=mask)
        w = w - lr * tl.div_rn(g, tl.sqrt_rn(s)[:, None] + eps)
    tl.store(w_at, stochastically_rounded(w, w_ptr.dtype.element_ty, seed, rows[:, None] * D + d[None, :]), mask=m2)


@triton.jit
def _rounding_seed(seed_ptr, w_ptr):
    # this step's seed of the stochastic rounding of a half-precision weight (0, unread, for fp32)
    seed = 0
    if w_ptr.dtype.element_ty != tl.float32:
        seed = tl.load(seed_ptr)
    return seed


@triton.jit
def _segment_add(v1, f1, v2, f2):
    # segmented sum: a run restarts where the flag is set
    return tl.where(f2 != 0, v2, v1 + v2), f1 | f2


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
def segment_update_kernel(
    sorted_ptr,  # (N,) int32/int64 global rows, sorted ascending (stable)
    perm_ptr,  # (N,) int64 id position of each sorted position
    grad_ptr,  # (B, F, D) output gradient, any float dtype, strides (s_gb, s_gf, s_gd)
    bag_ptr,  # bags: (N,) int64 bag of each id position; unused otherwise
    offsets_ptr,  # bags: (B*F + 1,) int64; unused otherwise
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, updated in place
    s_ptr,  # optimizer state: (R, D) fp32 adagrad, (R,) fp32 rowwise_adagrad, unused for sgd
    lr_ptr,  # () fp32 learning rate
    seed_ptr,  # () int64 rounding seed of a half-precision weight (advanced by rows_kernel); unused for fp32
    head_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of each chunk's first run
    tail_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of each chunk's last run
    N, n_ids, F, s_gb, s_gf, s_gd, eps,  # N and n_ids first: the launch keys them by class
    D: tl.constexpr, BLOCK_P: tl.constexpr, STEPS: tl.constexpr, BLOCK_D: tl.constexpr,
    OPTIMIZER: tl.constexpr, BAGS: tl.constexpr, MEAN: tl.constexpr, WIDE: tl.constexpr,
):
    # A chunk of STEPS * BLOCK_P sorted positions per program, walked BLOCK_P at a time: each step's runs are summed
    # by a segmented scan, and the sum of the run that continues into the next step is carried in registers. Runs
    # that start and end inside the chunk are applied here; the chunk's first and last runs also leave their sums
    # in head/tail for carry_update_kernel (runs that cross chunks). Long chunks keep the carry kernel's walk along
    # a hot row short (a row with 10^6 ids spans 10^3 chunks of 1024).
    # Bytes: read N keys (three overlapping loads, cached), N*8 perm, N gradient rows of D*itemsize (gathered);
    # per distinct row the update's read-modify-write (see _apply_update); write 2*BLOCK_D*4 partials per chunk.
    chunk = tl.program_id(0)
    cs = chunk.to(tl.int64) * (BLOCK_P * STEPS)
    last = tl.minimum(cs + BLOCK_P * STEPS, N) - 1
    before = tl.load(sorted_ptr + cs - 1, mask=cs > 0, other=-1).to(tl.int64)
    first = tl.load(sorted_ptr + cs).to(tl.int64)
    lr = tl.load(lr_ptr)
    seed = _rounding_seed(seed_ptr, w_ptr)
    d = tl.arange(0, BLOCK_D)
    carry = tl.zeros((BLOCK_D,), dtype=tl.float32)
    carry_row = tl.full((), -1, tl.int64)  # the row of the run `carry` sums (none before the first step)
    head = tl.zeros((BLOCK_D,), dtype=tl.float32)
    tail = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for step in range(STEPS):
        p = cs + step * BLOCK_P + tl.arange(0, BLOCK_P)
        valid = p <= last
        row = tl.load(sorted_ptr + p, mask=valid, other=-1).to(tl.int64)
        prev = tl.load(sorted_ptr + p - 1, mask=valid & (p > 0), other=-1).to(tl.int64)
        nxt = tl.load(sorted_ptr + p + 1, mask=valid & (p + 1 < N), other=-1).to(tl.int64)
        k = tl.load(perm_ptr + p, mask=valid, other=0)
        g = _position_grads(grad_ptr, bag_ptr, offsets_ptr, k, valid, F, n_ids, s_gb, s_gf, s_gd,
                            BLOCK_D, D, BAGS, MEAN, WIDE)
        flag = tl.broadcast_to(((row != prev) | (p == cs)).to(tl.int32)[:, None], (BLOCK_P, BLOCK_D))
        run_sum, _ = tl.associative_scan((g, flag), 0, _segment_add)
        # the step's leading run continues the previous step's last run where the rows match (sorted: exactly the
        # positions of that row)
        run_sum += tl.where((row == carry_row)[:, None], carry[None, :], 0.0)
        is_tail = valid & (row != nxt)
        _apply_update(w_ptr, s_ptr, lr, row, run_sum, is_tail & (row != before), eps, seed, D, BLOCK_D,
                      OPTIMIZER)
        head += tl.sum(tl.where((valid & (row == first) & (is_tail | (p == last)))[:, None], run_sum, 0.0), axis=0)
        tail += tl.sum(tl.where((p == last)[:, None], run_sum, 0.0), axis=0)
        step_last = p == cs + step * BLOCK_P + BLOCK_P - 1
        carry = tl.sum(tl.where(step_last[:, None], run_sum, 0.0), axis=0)
        carry_row = tl.max(tl.where(step_last, row, -1), axis=0)
    tl.store(head_ptr + chunk * BLOCK_D + d, head)
    tl.store(tail_ptr + chunk * BLOCK_D + d, tail)


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
        one = tl.arange(0, 1)
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
