"""The elementwise pass of the GEMM family: a ``[M, N]`` operand through the GEMM's prologue, written out once, with
its column sums.

The backward's default plan (:attr:`fuselab.ops.gemm.spec.GemmTuning.backward` ``"cublas"``) forms dZ here in one
pass over dY (times act' of the kept output or pre-activation, or the kept ReLU bits; times the DCN multiplier;
rotated back by the inverse RoPE) and reduces the bias gradient in the same pass; cuBLAS then computes dX and dW
from dZ. The QKV projection's cuBLAS plan rotates q and k here in place. Each program walks ``rows_per_program`` rows
of one column block and keeps a ``[BM, BN]`` running sum; the last program of a column block to arrive (int32
tickets) sums the programs' partials in program order: the column sums are bit-identical from run to run.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded
from fuselab.ops._tickets import last_to_arrive, sum_partials

from .tiles import _cos_sin, _mask_words, _pair_cols, _positions, _prologue


@triton.jit
def _rotate_rows(OUT, A, WS, COS, SIN, FREQ, POS, OFF, CU, offset, mscale, m_lo, m_hi, pid_m, n0, N,
                 s_om, s_am, s_an, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, div_b, mod_b, div_s, mod_s, s_pb,
                 s_ps, n_seq, BM: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
                 CONJ: tl.constexpr, PS: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
                 USE_TABLE: tl.constexpr, POS_MODE: tl.constexpr, SEARCH_STEPS: tl.constexpr, WRITE: tl.constexpr,
                 COL_SUM: tl.constexpr):
    """The pass's rotation over rows m_lo .. m_hi of columns n0 .. n0 + BN: each pair's two columns loaded as
    [BM, BN / 2] tiles where they lie (no reshape of a [BM, BN] tile), rotated, written where WRITE; their column
    sums stored as this program's partial row of WS where COL_SUM."""
    c1, f, rot = _pair_cols(n0, BN, PS, HALF, HEAD_DIM, rot_cols)
    c2 = c1 + PS
    in1, in2 = c1 < N, c2 < N
    t1 = tl.zeros([BM, BN // 2], dtype=ACC)
    t2 = tl.zeros([BM, BN // 2], dtype=ACC)
    for m0 in tl.range(m_lo, m_hi, BM, num_stages=3):
        rows = m0 + tl.arange(0, BM)
        if INT64:
            rows = rows.to(tl.int64)
        inside = rows < m_hi
        rc = tl.where(inside, rows, 0)
        mask1, mask2 = inside[:, None] & in1[None, :], inside[:, None] & in2[None, :]
        x1 = tl.load(A + rc[:, None] * s_am + c1[None, :] * s_an, mask=mask1, other=0.0).to(ACC)
        x2 = tl.load(A + rc[:, None] * s_am + c2[None, :] * s_an, mask=mask2, other=0.0).to(ACC)
        pos = _positions(rc, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq, POS_MODE,
                         SEARCH_STEPS)
        c, s = _cos_sin(pos[:, None], f[None, :], rot[None, :] & (pos >= 0)[:, None], COS, SIN, FREQ, n_table,
                        s_ct, s_cf, s_st, s_sf, mscale, ACC, USE_TABLE, CONJ)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        if WRITE:
            tl.store(OUT + rows[:, None] * s_om + c1[None, :], rounded(y1, OUT.dtype.element_ty), mask=mask1)
            tl.store(OUT + rows[:, None] * s_om + c2[None, :], rounded(y2, OUT.dtype.element_ty), mask=mask2)
        if COL_SUM:
            t1 += tl.where(mask1, y1, 0.0)
            t2 += tl.where(mask2, y2, 0.0)
    if COL_SUM:
        tl.store(WS + pid_m * N + c1, tl.sum(t1, axis=0), mask=in1)
        tl.store(WS + pid_m * N + c2, tl.sum(t2, axis=0), mask=in2)


@triton.jit
def _pass_kernel(
    OUT,  # [M, N] the operand after the prologue (dZ), row stride s_om, unit column stride; written if WRITE
    A,  # [M, N] the operand (dY; the projection itself when rotated in place); s_am, s_an
    S,  # [M, N] kept output / pre-activation (s_sm, s_sn) or [M, cdiv(N, 8)] uint8 ReLU bits (row stride s_sm);
        # read if PRO_ACT or PRO_MASK
    G0,  # [M, N] DCN multiplier; s_gm, s_gn; read if PRO_X0
    DX0,  # [M, N] A ⊙ S (S the DCN's kept pre-product: the gradient of x0), plus A where DX0_PLUS_A, added to what
          # it holds where DX0_ACC (a cross network's layers summed); row stride s_om; written if DX0_OUT
    ACOPY,  # [M, N] A as read (the start of an in-place addmm), row stride s_om; written if COPY_OUT
    WS,  # [programs along M, N] fp32 (fp64) partial column sums; if COL_SUM
    DB,  # [N] fp32 (fp64) column sums of the operand after the prologue; written if COL_SUM
    COUNT,  # [cdiv(N, BN)] int32 ticket counters, zero before and after the launch; if COL_SUM
    COS,  # [n_table, HALF] RoPE cos table; s_ct, s_cf; read if ROPE and USE_TABLE
    SIN,  # [n_table, HALF] RoPE sin table; s_st, s_sf; read if ROPE and USE_TABLE
    FREQ,  # [HALF] fp32 inverse frequencies (in-kernel angles); read if ROPE and not USE_TABLE
    POS,  # [B, S] int positions (thd: [1, T]); strides s_pb, s_ps; read if POS_MODE == 2
    OFF,  # [B] (POS_MODE 1) or [n_seq] (POS_MODE 4) int offsets
    CU,  # [n_seq + 1] int cu_seqlens; read if POS_MODE >= 3
    offset, mscale,  # per-call values: everything after them is part of the launch plan
    M, N, rows_per_program,
    s_om, s_am, s_an, s_sm, s_sn, s_gm, s_gn,
    n_table, s_ct, s_cf, s_st, s_sf, rot_cols, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq,
    BM: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
    PRO_ACT: tl.constexpr, PRO_MASK: tl.constexpr, PRO_X0: tl.constexpr,
    ROPE: tl.constexpr, CONJ: tl.constexpr, ROPE_PS: tl.constexpr, ROPE_HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
    USE_TABLE: tl.constexpr, POS_MODE: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    WRITE: tl.constexpr, COL_SUM: tl.constexpr, SUM_ROWS: tl.constexpr, DX0_OUT: tl.constexpr,
    DX0_ACC: tl.constexpr, DX0_PLUS_A: tl.constexpr, COPY_OUT: tl.constexpr,
):
    # bytes: A (and S, G0; the rotation's cos and sin, L2-resident rows) read once, OUT (and DX0, ACOPY) written
    # once, the partial sums 2·programs·N·4
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    cmask = cols < N
    m_lo = pid_m * rows_per_program
    m_hi = tl.minimum(m_lo + rows_per_program, M)
    if ROPE:  # the rotation alone (no prologue with it): the two columns of each pair loaded as they lie
        _rotate_rows(OUT, A, WS, COS, SIN, FREQ, POS, OFF, CU, offset, mscale, m_lo, m_hi, pid_m, pid_n * BN, N,
                     s_om, s_am, s_an, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, div_b, mod_b, div_s, mod_s, s_pb,
                     s_ps, n_seq, BM, BN, ACC, INT64, CONJ, ROPE_PS, ROPE_HALF, HEAD_DIM, USE_TABLE, POS_MODE,
                     SEARCH_STEPS, WRITE, COL_SUM)
    else:
        total = tl.zeros([BM, BN], dtype=ACC)
        for m0 in tl.range(m_lo, m_hi, BM, num_stages=3):
            rows = m0 + tl.arange(0, BM)
            if INT64:
                rows = rows.to(tl.int64)
            inside = rows < m_hi
            rc = tl.where(inside, rows, 0)  # rows past the block read row 0 (their values are masked to zero)
            mask = inside[:, None] & cmask[None, :]
            a = tl.load(A + rc[:, None] * s_am + cols[None, :] * s_an, mask=mask, other=0.0).to(ACC)
            if COPY_OUT:
                tl.store(ACOPY + rows[:, None] * s_om + cols[None, :], a.to(ACOPY.dtype.element_ty), mask=mask)
            if DX0_OUT:
                d = a * tl.load(S + rc[:, None] * s_sm + cols[None, :] * s_sn, mask=mask, other=0.0).to(ACC)
                if DX0_PLUS_A:
                    d += a
                if DX0_ACC:
                    d += tl.load(DX0 + rows[:, None] * s_om + cols[None, :], mask=mask, other=0.0).to(ACC)
                tl.store(DX0 + rows[:, None] * s_om + cols[None, :], rounded(d, DX0.dtype.element_ty), mask=mask)
            if PRO_MASK:
                a = tl.where(_mask_words(S, rc, pid_n * BN, s_sm, N, BM, BN) != 0, a, 0.0)
            a = _prologue(a, rc, cols, cmask[None, :], S, G0, s_sm, s_sn, s_gm, s_gn, M, N, PRO_ACT, False, PRO_X0,
                          False, BM, BN, True)
            if WRITE:
                tl.store(OUT + rows[:, None] * s_om + cols[None, :], rounded(a, OUT.dtype.element_ty), mask=mask)
            if COL_SUM:
                total += tl.where(mask, a, 0.0)
        if COL_SUM:
            tl.store(WS + pid_m * N + cols, tl.sum(total, axis=0), mask=cmask)
    if COL_SUM:  # noqa: SIM102 (a constexpr test apart from the runtime one: the launch without sums has no tickets)
        if last_to_arrive(COUNT + pid_n, tl.num_programs(0)):
            sums = sum_partials(WS, N, cols, cmask, tl.num_programs(0), SUM_ROWS, BN, ACC)
            tl.store(DB + cols, sums.to(DB.dtype.element_ty), mask=cmask)
