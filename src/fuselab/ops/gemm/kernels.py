"""The Triton kernel of the GEMM family: ``C = epilogue(prologue(A) · B)`` in one persistent launch.

Every Triton GEMM of the family is this one kernel with other ``tl.constexpr`` flags and operands read through other
strides (``docs/gemm.md`` lists which launch computes what; the backward's default plan leaves its products to cuBLAS
after the elementwise pass of :mod:`fuselab.ops.gemm.pass_kernel`):

* ``A`` ``[P, R]`` and ``B`` ``[R, Q]``: any strides (a transposed operand is a pair of swapped strides), or host
  TMA descriptors (``A_DESC`` / ``B_DESC``; ``*_DESC_T`` when the descriptor holds the transposed matrix).
* the prologue on ``A`` as it is loaded (the backward's ``dZ`` is never materialised unless ``WRITE_A``): times the
  activation's derivative from a kept tensor (the output or the pre-activation) or from a 1-bit ReLU mask, times a
  DCN multiplier, rotated by the inverse RoPE; its row sums (``ROW_SUM``: the bias gradient when A = dZᵀ), a
  product with a block of ones. A computed in registers runs its MMA synchronously (``SYNC_DOT``, see
  :func:`_k_step`).
* the LoRA side product (``LORA``): ``T = s·(A·L1)`` accumulated beside the main loop, ``C += T·L2``.
* the epilogue on the accumulator: ``act(x0 ⊙ (acc + bias) + alpha·res)``, rotated by RoPE, keeping the
  pre-activation or the ReLU bits, cast on the store.
* split-R (``SPLIT > 1``, weight gradients with few output tiles): each split writes fp32 partials, the last split
  of a tile to arrive (int32 tickets, :mod:`fuselab.ops._tickets`) sums them in split order and runs the epilogue:
  deterministic, no float atomics.

Tiles are walked by a persistent loop (grid = a few programs per SM), in groups of ``GROUP`` row tiles for L2
reuse. Loads of ``A``/``B`` clamp their row/column indices instead of masking them (the rows past ``P`` are
computed and not stored); only the reduction axis is masked (``EVEN_R`` drops that mask). Arithmetic after the
loads is fp32 (the interpreter cannot do bf16 arithmetic); ``DOT`` is the operand dtype of ``tl.dot`` (bf16/fp16 on
GPUs, fp32 under the interpreter, fp64 for fp64).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded
from fuselab.ops._tickets import last_to_arrive
from fuselab.ops.bias_act.kernels import _act

from .tiles import _load, _positions, _prologue, _rope_cols


# ---------------------------------------------------------------------------------------------- tile walk
@triton.jit
def _tile_coords(unit, n_tiles, tiles_p, tiles_q, GROUP: tl.constexpr):
    """(tile, split, pid_p, pid_q) of work unit ``unit``: all tiles of split 0 first, each split's tiles in groups
    of ``GROUP`` row tiles (column-major inside a group) so that neighbouring programs share A rows and B columns."""
    split = unit // n_tiles
    tile = unit - split * n_tiles
    per_group = GROUP * tiles_q
    first_p = (tile // per_group) * GROUP
    size = tl.minimum(tiles_p - first_p, GROUP)
    pid_p = first_p + (tile % per_group) % size
    pid_q = (tile % per_group) // size
    return tile, split, pid_p, pid_q


# ---------------------------------------------------------------------------------------------- epilogue
@triton.jit
def _keep_bits(KEPT, z, p, q0, P, Q, s_kt, BP: tl.constexpr, BQ: tl.constexpr):
    """Store the ReLU bits (z > 0; NaN passes, as relu's gradient does) of the [BP, BQ] tile as uint8 words,
    8 columns each: KEPT is [P, cdiv(Q, 8)] with row stride s_kt."""
    bit = tl.where((z <= 0.0) | (q0 + tl.arange(0, BQ) >= Q)[None, :], 0, 1)
    words = tl.sum(tl.reshape(bit, (BP, BQ // 8, 8)) << tl.arange(0, 8)[None, None, :], axis=2)
    w = q0 // 8 + tl.arange(0, BQ // 8)
    tl.store(KEPT + p[:, None] * s_kt + w[None, :], words.to(tl.uint8), mask=(p < P)[:, None] & (w * 8 < Q)[None, :])


@triton.jit
def _epilogue(acc, p, q, q0, P, Q, C, BIAS, X0, RES, KEPT, alpha, s_cp, s_cq, s_bias, s_xp, s_xq, s_rp, s_rq, s_kt,
              rope_pos, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
              HAS_BIAS: tl.constexpr, EPI_X0: tl.constexpr, HAS_RES: tl.constexpr, EPI_ROPE: tl.constexpr,
              KEEP: tl.constexpr, ACT: tl.constexpr, ROPE_PS: tl.constexpr, ROPE_HALF: tl.constexpr,
              HEAD_DIM: tl.constexpr, USE_TABLE: tl.constexpr, BP: tl.constexpr, BQ: tl.constexpr):
    """C = act(z), z = rope(x0 ⊙ (acc + bias) + alpha·res) (each term where its flag is on); KEEP 1 stores z
    (contiguous [P, Q], row stride s_kt), KEEP 2 its ReLU bits, KEEP 3 acc + bias (the DCN's pre-product, whose
    product with dY is the gradient of x0)."""
    cmask = (p < P)[:, None] & (q < Q)[None, :]
    z = acc
    if HAS_BIAS:
        z = z + tl.load(BIAS + q * s_bias, mask=q < Q, other=0.0).to(acc.dtype)[None, :]
    if KEEP == 3:
        tl.store(KEPT + p[:, None] * s_kt + q[None, :], rounded(z, KEPT.dtype.element_ty), mask=cmask)
    if EPI_X0:
        z = z * tl.load(X0 + p[:, None] * s_xp + q[None, :] * s_xq, mask=cmask, other=0.0).to(acc.dtype)
    if HAS_RES:
        z = z + alpha * tl.load(RES + p[:, None] * s_rp + q[None, :] * s_rq, mask=cmask, other=0.0).to(acc.dtype)
    if EPI_ROPE:
        z = _rope_cols(z, rope_pos, q0, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
                       BP, BQ, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, False)
    if KEEP == 1:
        tl.store(KEPT + p[:, None] * s_kt + q[None, :], rounded(z, KEPT.dtype.element_ty), mask=cmask)
    elif KEEP == 2:
        _keep_bits(KEPT, z, p, q0, P, Q, s_kt, BP, BQ)
    tl.store(C + p[:, None] * s_cp + q[None, :] * s_cq, rounded(_act(z, ACT), C.dtype.element_ty), mask=cmask)


@triton.jit
def _split_sum(acc, rs, p, q, P, Q, split, tile, pid_q, WS, DBS, COUNT, SPLIT: tl.constexpr, ROW_SUM: tl.constexpr):
    """Store this split's partial product (and row sums); the last split of the tile to arrive (int32 ticket) sums
    all of them in split order. Returns (whether this program finishes the tile, the sums)."""
    cmask = (p < P)[:, None] & (q < Q)[None, :]
    p64 = p.to(tl.int64)
    tl.store(WS + (p64 + split * P)[:, None] * Q + q[None, :], acc, mask=cmask)
    if ROW_SUM and pid_q == 0:
        tl.store(DBS + p64 + split * P, rs, mask=p < P)
    done = last_to_arrive(COUNT + tile, SPLIT)
    if done:
        acc = tl.zeros_like(acc)
        rs = tl.zeros_like(rs)
        for s in range(SPLIT):  # a loop, not unrolled: SPLIT tiles of partials
            acc += tl.load(WS + (p64 + s * P)[:, None] * Q + q[None, :], mask=cmask, other=0.0, cache_modifier=".cg")
            if ROW_SUM:
                rs += tl.load(DBS + p64 + s * P, mask=p < P, other=0.0, cache_modifier=".cg")
    return done, acc, rs


# ---------------------------------------------------------------------------------------------- the kernel
@triton.jit
def _load_tile(X, rows, cols, s_row, s_col, mask, row0, col0, DESC: tl.constexpr, DESC_T: tl.constexpr,
               MASKED: tl.constexpr):
    """A [len(rows), len(cols)] tile: through a TMA descriptor (DESC; DESC_T: the descriptor holds the transposed
    matrix, the box is loaded and transposed; out-of-range elements read as zero) or through pointers."""
    if DESC:
        if DESC_T:
            t = tl.trans(X.load([col0, row0]))
        else:
            t = X.load([row0, col0])
    else:
        t = _load(X + rows[:, None] * s_row + cols[None, :] * s_col, mask, MASKED)
    return t


@triton.jit
def _k_step(acc, acc_l, rs, r0, p, pa, qb, pid_p, pid_q, pos_p, A, B, S, G0, AOUT, L1, P, R, s_ap, s_ar, s_br, s_bq,
            s_sp, s_sr, s_gp, s_gr, s_l1r, s_l1j, rank, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps,
            n_seq, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
            MASKED: tl.constexpr, BP: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr, DOT: tl.constexpr,
            ACC: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr, A_DESC: tl.constexpr,
            A_DESC_T: tl.constexpr, B_DESC: tl.constexpr, B_DESC_T: tl.constexpr, PRO_ACT: tl.constexpr,
            PRO_MASK: tl.constexpr, PRO_X0: tl.constexpr, PRO_ROPE: tl.constexpr, N_ALONG_P: tl.constexpr,
            ROW_SUM: tl.constexpr, WRITE_A: tl.constexpr, LORA: tl.constexpr, RANK_B: tl.constexpr,
            ROPE_PS: tl.constexpr, ROPE_HALF: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TABLE: tl.constexpr,
            POS_MODE: tl.constexpr, SEARCH_STEPS: tl.constexpr, SYNC_DOT: tl.constexpr):
    """One BR-wide step of the reduction from column r0: acc += prologue(A)·B (and the LoRA side product, the row
    sums rs [BP, 16] in column 0, the materialised A). MASKED: the step that reaches past R (the one tail step;
    others are unmasked, so that their loads vectorize and pipeline)."""
    PROLOGUE: tl.constexpr = PRO_ACT != 0 or PRO_MASK or PRO_X0 or PRO_ROPE or WRITE_A
    r = r0 + tl.arange(0, BR)
    if INT64:
        r = r.to(tl.int64)
    mask_a = (r < R)[None, :]
    mask_b = (r < R)[:, None]
    a = _load_tile(A, pa, r, s_ap, s_ar, mask_a, pid_p * BP, r0, A_DESC, A_DESC_T, MASKED)
    if PROLOGUE:
        af = _prologue(a.to(ACC), pa, r, mask_a, S, G0, s_sp, s_sr, s_gp, s_gr, P, R, PRO_ACT, PRO_MASK,
                       PRO_X0, N_ALONG_P, BP, BR, MASKED)
        if PRO_ROPE:
            if N_ALONG_P:  # p = n (dYᵀ): rotate along p with the positions of the tokens r
                pos_r = _positions(tl.where(r < R, r, 0), OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps,
                                   n_seq, POS_MODE, SEARCH_STEPS)
                af = tl.trans(_rope_cols(tl.trans(af), pos_r, pid_p * BP, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st,
                                         s_sf, rot_cols, mscale, BR, BP, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, True))
            else:
                af = _rope_cols(af, pos_p, r0, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale, BP,
                                BR, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, True)
        if WRITE_A and pid_q == 0:
            tl.store(AOUT + p[:, None] * R + r[None, :], rounded(af, AOUT.dtype.element_ty),
                     mask=(p < P)[:, None] & (r < R)[None, :])
        a = af
    a = a.to(DOT)
    b = _load_tile(B, r, qb, s_br, s_bq, mask_b, r0, pid_q * BQ, B_DESC, B_DESC_T, MASKED).to(DOT)
    if ROW_SUM:  # through the MMA, A times a block of ones in column 0: A keeps MMA readers only (Triton 3.6 gives a
        # pipelined tile that registers also read one buffer too few for the wgmma still reading it); first, so
        # that its wait leaves the main product in flight
        ones = tl.where(tl.arange(0, 16)[None, :] == 0, 1.0, 0.0) + tl.zeros([BR, 16], dtype=tl.float32)
        rs = tl.dot(a, ones.to(DOT), rs, input_precision=PRECISION, out_dtype=ACC)
    acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC)
    if LORA:
        j = tl.arange(0, RANK_B)
        l1 = tl.load(L1 + r[:, None] * s_l1r + j[None, :] * s_l1j,
                     mask=(r < R)[:, None] & (j < rank)[None, :], other=0.0)
        acc_l = tl.dot(a, l1.to(DOT), acc_l, input_precision=PRECISION, out_dtype=ACC)
    if SYNC_DOT:  # A computed in registers: a use of the accumulators in the loop keeps the MMA synchronous (Triton
        # 3.6 lets the next step's prologue overwrite the registers an asynchronous wgmma still reads,
        # triton-lang/triton#9433); R > 0 always, unknown to the compiler
        acc = tl.where(R > 0, acc, 0.0)
        if ROW_SUM:
            rs = tl.where(R > 0, rs, 0.0)
        if LORA:
            acc_l = tl.where(R > 0, acc_l, 0.0)
    return acc, acc_l, rs


@triton.jit
def _gemm_kernel(
    C,  # [P, Q] output; s_cp, s_cq
    A,  # [P, R] left operand (or its TMA descriptor): x, dY (prologue) or dYᵀ (weight gradients); s_ap, s_ar
    B,  # [R, Q] right operand (or its TMA descriptor): Wᵀ, W, x, ...; s_br, s_bq
    BIAS,  # [Q] bias added in the epilogue; stride s_bias; read if HAS_BIAS
    X0,  # [P, Q] DCN multiplier of the epilogue; s_xp, s_xq; read if EPI_X0
    RES,  # [P, Q] residual of the epilogue (scaled by alpha); s_rp, s_rq; read if HAS_RES
    KEPT,  # [P, Q] pre-activation (KEEP 1) or acc + bias (KEEP 3), or [P, cdiv(Q, 8)] uint8 ReLU bits (KEEP 2);
           # row stride s_kt
    L1,  # [R, RANK] LoRA factor beside the main loop (x·Aᵀ: L1 = Aᵀ); s_l1r, s_l1j; read if LORA
    L2,  # [RANK, Q] LoRA factor of the epilogue product (L2 = Bᵀ); s_l2j, s_l2q; read if LORA
    T,  # [P, RANK] contiguous side output lora_scale·(A·L1), written by the column-0 tiles; if LORA
    S,  # [P, R] kept tensor of the prologue's act' (y or z; s_sp, s_sr) or its ReLU bits ([rows of n, cdiv(n, 8)]
        # uint8, row stride s_sp); read if PRO_ACT or PRO_MASK
    G0,  # [P, R] DCN multiplier of the prologue; s_gp, s_gr; read if PRO_X0
    AOUT,  # [P, R] contiguous prologue'd A (dZ materialised once), written by the column-0 tiles; if WRITE_A
    DB,  # [P] row sums of the prologue'd A (the bias gradient when A = dZᵀ); written if ROW_SUM
    WS,  # [SPLIT, P, Q] fp32 (fp64) partial products; if SPLIT > 1
    DBS,  # [SPLIT, P] fp32 (fp64) partial row sums; if SPLIT > 1 and ROW_SUM
    COUNT,  # [tiles] int32 ticket counters, zero before and after the launch; if SPLIT > 1
    COS,  # [n_table, HALF] RoPE cos table; s_ct, s_cf; read if USE_TABLE
    SIN,  # [n_table, HALF] RoPE sin table; s_st, s_sf; read if USE_TABLE
    FREQ,  # [HALF] fp32 inverse frequencies (in-kernel angles); read if a RoPE flag is on and not USE_TABLE
    POS,  # [B, S] int positions (thd: [1, T]); strides s_pb, s_ps; read if POS_MODE == 2
    OFF,  # [B] (POS_MODE 1) or [n_seq] (POS_MODE 3) int offsets
    CU,  # [n_seq + 1] int cu_seqlens; read if POS_MODE == 3
    alpha, lora_scale, offset, mscale,  # per-call values: everything after them is part of the launch plan
    P, Q, R, k_per_split,
    s_cp, s_cq, s_ap, s_ar, s_br, s_bq, s_bias, s_xp, s_xq, s_rp, s_rq, s_kt,
    s_l1r, s_l1j, s_l2j, s_l2q, s_sp, s_sr, s_gp, s_gr, rank,
    n_table, s_ct, s_cf, s_st, s_sf, rot_cols, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq,
    BP: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr,
    EVEN_R: tl.constexpr, EVEN_P: tl.constexpr, EVEN_Q: tl.constexpr, DOT: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr,
    A_DESC: tl.constexpr, A_DESC_T: tl.constexpr, B_DESC: tl.constexpr, B_DESC_T: tl.constexpr,
    PRO_ACT: tl.constexpr, PRO_MASK: tl.constexpr, PRO_X0: tl.constexpr, PRO_ROPE: tl.constexpr,
    N_ALONG_P: tl.constexpr, ROW_SUM: tl.constexpr, WRITE_A: tl.constexpr, LORA: tl.constexpr, RANK_B: tl.constexpr,
    HAS_BIAS: tl.constexpr, EPI_X0: tl.constexpr, HAS_RES: tl.constexpr, EPI_ROPE: tl.constexpr,
    KEEP: tl.constexpr, ACT: tl.constexpr,
    ROPE_PS: tl.constexpr, ROPE_HALF: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TABLE: tl.constexpr,
    POS_MODE: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPEC: tl.constexpr, SYNC_DOT: tl.constexpr,
):
    # flops 2·P·Q·R (+ 2·P·RANK·(R + Q) with LORA); bytes: A and B once per tile row/column (L2 reuse across the
    # group), C (+ kept z or bits) once, the epilogue operands once, the partials 2·SPLIT·P·Q·4 when split
    pid = tl.program_id(0)
    tiles_p = tl.cdiv(P, BP)
    tiles_q = tl.cdiv(Q, BQ)
    n_tiles = tiles_p * tiles_q
    k_full = R // BR  # unmasked steps; a tail step follows when BR does not divide R
    for unit in tl.range(pid, n_tiles * SPLIT, tl.num_programs(0), flatten=FLATTEN, warp_specialize=WARP_SPEC):
        tile, split, pid_p, pid_q = _tile_coords(unit, n_tiles, tiles_p, tiles_q, GROUP)
        p = pid_p * BP + tl.arange(0, BP)
        q = pid_q * BQ + tl.arange(0, BQ)
        if INT64:
            p = p.to(tl.int64)
            q = q.to(tl.int64)
        if EVEN_P:  # rows past P are read clamped to row 0 (never stored); even tiles need no clamp and vectorize
            pa = p
        else:
            pa = tl.where(p < P, p, 0)
        if EVEN_Q:
            qb = q
        else:
            qb = tl.where(q < Q, q, 0)
        pos_p = pa
        if PRO_ROPE and not N_ALONG_P:
            pos_p = _positions(pa, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq, POS_MODE,
                               SEARCH_STEPS)
        acc = tl.zeros([BP, BQ], dtype=ACC)
        acc_l = tl.zeros([BP, RANK_B], dtype=ACC)
        rs = tl.zeros([BP, 16], dtype=ACC)
        k_lo = split * k_per_split
        for kk in tl.range(k_lo, tl.minimum(k_lo + k_per_split, k_full), num_stages=NUM_STAGES):
            acc, acc_l, rs = _k_step(
                acc, acc_l, rs, kk * BR, p, pa, qb, pid_p, pid_q, pos_p, A, B, S, G0, AOUT, L1, P, R, s_ap, s_ar, s_br,
                s_bq, s_sp, s_sr, s_gp, s_gr, s_l1r, s_l1j, rank, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s,
                s_pb, s_ps, n_seq, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale, False, BP, BQ, BR,
                DOT, ACC, PRECISION, INT64, A_DESC, A_DESC_T, B_DESC, B_DESC_T, PRO_ACT, PRO_MASK, PRO_X0, PRO_ROPE,
                N_ALONG_P, ROW_SUM, WRITE_A, LORA, RANK_B, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, POS_MODE,
                SEARCH_STEPS, SYNC_DOT)
        if not EVEN_R and split == SPLIT - 1:  # the tail step, masked, in the last split
            acc, acc_l, rs = _k_step(
                acc, acc_l, rs, k_full * BR, p, pa, qb, pid_p, pid_q, pos_p, A, B, S, G0, AOUT, L1, P, R, s_ap,
                s_ar, s_br, s_bq, s_sp, s_sr, s_gp, s_gr, s_l1r, s_l1j, rank, OFF, POS, CU, offset, div_b, mod_b,
                div_s, mod_s, s_pb, s_ps, n_seq, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
                True, BP, BQ, BR, DOT, ACC, PRECISION, INT64, A_DESC, A_DESC_T, B_DESC, B_DESC_T, PRO_ACT,
                PRO_MASK, PRO_X0, PRO_ROPE, N_ALONG_P, ROW_SUM, WRITE_A, LORA, RANK_B, ROPE_PS, ROPE_HALF,
                HEAD_DIM, USE_TABLE, POS_MODE, SEARCH_STEPS, SYNC_DOT)
        if LORA:
            j = tl.arange(0, RANK_B)
            t = acc_l * lora_scale
            if pid_q == 0:
                tl.store(T + p[:, None] * rank + j[None, :], rounded(t, T.dtype.element_ty),
                         mask=(p < P)[:, None] & (j < rank)[None, :])
            l2 = tl.load(L2 + j[:, None] * s_l2j + qb[None, :] * s_l2q, mask=(j < rank)[:, None], other=0.0)
            acc = tl.dot(t.to(DOT), l2.to(DOT), acc, input_precision=PRECISION, out_dtype=ACC)
        row_sums = tl.sum(rs, axis=1)  # column 0 of rs: the others are zero
        done = True
        if SPLIT > 1:
            done, acc, row_sums = _split_sum(acc, row_sums, p, q, P, Q, split, tile, pid_q, WS, DBS, COUNT, SPLIT,
                                             ROW_SUM)
        if done:
            if ROW_SUM and pid_q == 0:
                tl.store(DB + p, rounded(row_sums, DB.dtype.element_ty), mask=p < P)
            rope_pos = pa
            if EPI_ROPE:
                rope_pos = _positions(pa, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq,
                                      POS_MODE, SEARCH_STEPS)
            _epilogue(acc, p, q, pid_q * BQ, P, Q, C, BIAS, X0, RES, KEPT, alpha, s_cp, s_cq, s_bias, s_xp, s_xq,
                      s_rp, s_rq, s_kt, rope_pos, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
                      HAS_BIAS, EPI_X0, HAS_RES, EPI_ROPE, KEEP, ACT, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, BP, BQ)


# ---------------------------------------------------------------------------------------------- master weights
@triton.jit
def _cast_update_kernel(
    W,  # [n] fp32 (fp64) master weights, contiguous, updated in place
    G,  # [n] gradient (any float dtype: the low-precision copy's gradient), contiguous
    LOW,  # [n] low-precision copy of W, contiguous, written from the updated W
    S,  # [n] fp32 Adagrad sum of squares, contiguous, updated in place; if ADAGRAD
    LR,  # [] fp32 learning rate tensor (a CUDA graph reads its current value); if LR_TENSOR
    lr, eps, weight_decay,  # Python floats (lr unused when LR_TENSOR)
    n,
    ADAGRAD: tl.constexpr, LR_TENSOR: tl.constexpr, DECAY: tl.constexpr, BLOCK: tl.constexpr,
):
    # bytes: read W (4), G, S (4) when Adagrad; write W (4), LOW, S (4): the optimizer's own pass plus the copy's write
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(W + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(w.dtype)
    if DECAY:
        g = g + weight_decay * w
    if LR_TENSOR:
        step = tl.load(LR).to(w.dtype)
    else:
        step = lr
    if ADAGRAD:
        s = tl.load(S + offs, mask=mask, other=0.0).to(w.dtype) + g * g
        tl.store(S + offs, s.to(S.dtype.element_ty), mask=mask)
        w = w - step * g / (tl.sqrt(s) + eps)
    else:
        w = w - step * g
    tl.store(W + offs, w, mask=mask)
    tl.store(LOW + offs, rounded(w, LOW.dtype.element_ty), mask=mask)
