"""Triton kernels of the embedding update after :func:`~fuselab.ops.embedding.kernels.rows_kernel` (launched by
:mod:`fuselab.ops.embedding.launch`).

Deterministic: the launcher sorts the ``N`` global rows (stable) and cuts the sorted positions into chunks of
``CHUNK``. A chunk sums each run of equal rows in it and applies the runs that start and end inside it; a run that
crosses a chunk boundary leaves one partial sum per chunk (``head``: the piece at the chunk's start, ``tail``: at
its end), which :func:`carry_update_kernel` adds in chunk order and applies. Two ways to sum a chunk's runs:
:func:`item_update_kernel` (runs numbered as items by :func:`items_kernel`; a warp gathers several gradient rows of
an item per step: long multi-hot segments at large D) and :func:`segment_update_kernel` (a segmented scan over
contiguous sorted positions: one id per feature at small D, where most runs are a few positions long). Same order
of additions every run. The weight's dtype picks the store (fp32 as is; fp16/bf16 stochastically rounded from a
seed the rows kernel advances every step). :func:`atomic_sgd_kernel`: the non-deterministic SGD, no sort.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import stochastically_rounded

from .kernels import _bag_bounds, _narrow, _program, _rows_mask

SGD: tl.constexpr = tl.constexpr(0)
ADAGRAD: tl.constexpr = tl.constexpr(1)
ROWWISE_ADAGRAD: tl.constexpr = tl.constexpr(2)


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
def _segment_add(v1, f1, v2, f2):
    # segmented sum: a run restarts where the flag is set
    return tl.where(f2 != 0, v2, v1 + v2), f1 | f2


@triton.jit
def segment_update_kernel(
    sorted_ptr,  # (N,) int32/int64 global rows, sorted ascending (stable)
    perm_ptr,  # (N,) int64 id position of each sorted position: its bag b*F + f (one id per feature)
    grad_ptr,  # (B, F, D) output gradient, any float dtype, strides (s_gb, s_gf, s_gd)
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, updated in place
    s_ptr,  # optimizer state: (R, D) fp32 adagrad, (R,) fp32 rowwise_adagrad, unused for sgd
    lr_ptr,  # () fp32 learning rate
    seed_ptr,  # () int64 rounding seed of a half-precision weight (advanced by rows_kernel); unused for fp32
    head_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of each chunk's first run (the piece at its start)
    tail_ptr,  # (n_chunks, BLOCK_D) fp32 out: sum of each chunk's last run (the piece at its end)
    N, F, s_gb, s_gf, s_gd, eps,  # N first: the launch keys it by class
    D: tl.constexpr, BLOCK_P: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, OPTIMIZER: tl.constexpr,
    FLAT_GRAD: tl.constexpr,
):
    # One chunk of CHUNK sorted positions per program, walked BLOCK_P contiguous positions at a time: a segmented
    # scan sums each step's runs, and the sum of the run that continues into the next step is carried. Runs that
    # start and end inside the chunk are applied here. Per-position values are (BLOCK_P, 1) columns.
    # Bytes: read N keys (three overlapping loads, cached), N*8 positions, N gradient rows of D*itemsize
    # (gathered); per distinct row the update's read-modify-write (see _apply_update); write 2*BLOCK_D*4 per chunk.
    chunk = tl.program_id(0)
    cs = chunk.to(tl.int64) * CHUNK
    last = tl.minimum(cs + CHUNK, N) - 1
    before = tl.load(sorted_ptr + cs - 1, mask=cs > 0, other=-1).to(tl.int64)
    first = tl.load(sorted_ptr + cs).to(tl.int64)
    lr = tl.load(lr_ptr)
    seed = _rounding_seed(seed_ptr, w_ptr)
    d = tl.arange(0, BLOCK_D)[None, :]
    carry = tl.zeros((1, BLOCK_D), dtype=tl.float32)
    carry_row = tl.full((), -1, tl.int64)  # the row of the run `carry` sums (none before the first step)
    head = tl.zeros((1, BLOCK_D), dtype=tl.float32)
    tail = tl.zeros((1, BLOCK_D), dtype=tl.float32)
    for step in range(0, CHUNK, BLOCK_P):
        p = cs + step + tl.arange(0, BLOCK_P)[:, None]  # (BLOCK_P, 1)
        valid = p <= last
        row = tl.load(sorted_ptr + p, mask=valid, other=-1).to(tl.int64)
        prev = tl.load(sorted_ptr + p - 1, mask=valid & (p > 0), other=-1).to(tl.int64)
        nxt = tl.load(sorted_ptr + p + 1, mask=valid & (p + 1 < N), other=-1).to(tl.int64)
        bag = tl.load(perm_ptr + p, mask=valid, other=0)
        if FLAT_GRAD:  # s_gb == F * s_gf: bag b*F + f is row b*F + f (no 64-bit division per id)
            at = grad_ptr + bag * s_gf + d * s_gd
        else:
            at = grad_ptr + (bag // F) * s_gb + (bag % F) * s_gf + d * s_gd
        g = tl.load(at, mask=valid & (d < D), other=0.0).to(tl.float32)
        flag = tl.broadcast_to(((row != prev) | (p == cs + step)).to(tl.int32), (BLOCK_P, BLOCK_D))
        run_sum, _ = tl.associative_scan((g, flag), 0, _segment_add)
        # the step's leading run continues the last step's last run where the rows match (sorted: exactly the
        # positions of that row)
        run_sum += tl.where(row == carry_row, carry, 0.0)
        ends = valid & (row != nxt)  # a run ends here (one that goes on past the chunk does not)
        _apply_update(w_ptr, s_ptr, lr, row, run_sum, ends & (row != before), eps, seed, D, BLOCK_D, OPTIMIZER)
        head += tl.sum(tl.where(valid & (row == first) & (ends | (p == last)), run_sum, 0.0), axis=0, keep_dims=True)
        tail += tl.sum(tl.where(p == last, run_sum, 0.0), axis=0, keep_dims=True)
        step_last = p == cs + step + BLOCK_P - 1
        carry = tl.sum(tl.where(step_last, run_sum, 0.0), axis=0, keep_dims=True)
        carry_row = tl.max(tl.where(step_last, row, -1))
    tl.store(head_ptr + chunk * BLOCK_D + d, head)
    tl.store(tail_ptr + chunk * BLOCK_D + d, tail)


@triton.jit
def carry_update_kernel(
    sorted_ptr,  # (N,) int32/int64 sorted global rows
    head_ptr,  # (n_chunks, BLOCK_D) fp32 sum of the piece at each chunk's start (item or segment kernel)
    tail_ptr,  # (n_chunks, BLOCK_D) fp32 sum of the piece at each chunk's end
    w_ptr,  # (R, D) fp32, fp16 or bf16 weight, updated in place
    s_ptr,  # optimizer state as in item_update_kernel
    lr_ptr,  # () fp32
    seed_ptr,  # () int64 rounding seed, as in item_update_kernel
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
