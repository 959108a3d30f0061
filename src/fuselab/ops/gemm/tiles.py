"""Tile transforms shared by the GEMM kernel (:mod:`fuselab.ops.gemm.kernels`) and the elementwise pass
(:mod:`fuselab.ops.gemm.pass_kernel`): a token's RoPE position and the rotation of a tile's columns, the kept ReLU
bits, and the backward's prologue (act' of a kept tensor or the bits, the DCN multiplier). Arithmetic is in the
compute dtype of the tile handed in (fp32; fp64 for fp64)."""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops.bias_act.kernels import _act_grad


# ---------------------------------------------------------------------------------------------- RoPE
@triton.jit
def _positions(rows, OFF, POS, CU, offset, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq,
               POS_MODE: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """Table row of each token ``rows`` ([BM] int): token m is (batch b, index s) = ((m // div_b) % mod_b,
    (m // div_s) % mod_s). POS_MODE 0: s + offset; 1: s + OFF[b]; 2: POS[b * s_pb + s * s_ps]; packed sequences
    (thd), seq found by a binary search over CU: 3: m - CU[seq] + offset; 4: m - CU[seq] + OFF[seq]."""
    b = (rows // div_b) % mod_b
    s = (rows // div_s) % mod_s
    if POS_MODE == 0:
        pos = s + offset
    elif POS_MODE == 1:
        pos = s + tl.load(OFF + b)
    elif POS_MODE == 2:
        pos = tl.load(POS + b * s_pb + s * s_ps)
    else:
        lo = tl.zeros_like(rows)
        hi = tl.zeros_like(rows) + n_seq
        for _ in tl.static_range(SEARCH_STEPS):
            mid = (lo + hi) // 2
            below = tl.load(CU + mid) <= rows
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        pos = rows - tl.load(CU + lo)
        if POS_MODE == 3:
            pos = pos + offset
        else:
            pos = pos + tl.load(OFF + lo)
    return pos


@triton.jit
def _cos_sin(pos, f, valid, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, mscale, DT: tl.constexpr,
             USE_TABLE: tl.constexpr, CONJ: tl.constexpr):
    """(cos, sin) in ``DT`` of the angles of positions ``pos`` at frequency indices ``f`` (broadcastable to one
    shape), 1 and 0 where not ``valid``; sin negated for CONJ (the inverse rotation). From the tables (rows clamped
    to them: never an out-of-bounds read), or as ``fuselab.apply_rope`` computes them: position times the fp32
    frequency in ``DT``, times ``mscale``."""
    if USE_TABLE:
        p = tl.minimum(tl.maximum(pos, 0), n_table - 1)
        c = tl.load(COS + p * s_ct + f * s_cf, mask=valid, other=1.0).to(DT)
        s = tl.load(SIN + p * s_st + f * s_sf, mask=valid, other=0.0).to(DT)
    else:
        angle = pos.to(DT) * tl.load(FREQ + f).to(DT)
        c = tl.where(valid, tl.cos(angle) * mscale, 1.0)
        s = tl.where(valid, tl.sin(angle) * mscale, 0.0)
    if CONJ:
        s = -s
    return c, s


@triton.jit
def _pair_cols(n0, BN: tl.constexpr, PS: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr, rot_cols):
    """The BN / 2 rotation pairs of the columns n0 .. n0 + BN (BN a multiple of 2·PS): (first column of each pair,
    its frequency index, whether it is rotated). Pair (i, i + PS) inside each group of 2·PS columns; frequency index
    f of a pair = its rank inside the head; f >= HALF (partial rotary) and columns from ``rot_cols`` (v) pass."""
    i = tl.arange(0, BN // 2)
    c1 = n0 + (i // PS) * (2 * PS) + i % PS
    f = ((c1 % HEAD_DIM) // (2 * PS)) * PS + i % PS
    rot = (f < HALF) & (c1 < rot_cols)
    return c1, tl.where(rot, f, 0), rot


@triton.jit
def _rope_cols(v, pos, n0, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, rot_cols, mscale,
               BM: tl.constexpr, BN: tl.constexpr, PS: tl.constexpr, HALF: tl.constexpr, HEAD_DIM: tl.constexpr,
               USE_TABLE: tl.constexpr, CONJ: tl.constexpr):
    """``v`` [BM, BN] (compute dtype, columns n0.. of a fused q|k|v row, in registers: the GEMM's epilogue) with the
    columns below ``rot_cols`` (q and k) rotated by the angles of their row's position ``pos`` [BM]: pairs
    (i, i + PS) inside each group of 2·PS columns (PS = HALF: neox half-split; PS = 1: interleaved pairs); frequency
    index f of a pair = its rank inside the head, f >= HALF passes (partial rotary). CONJ: the inverse rotation (the
    backward)."""
    G: tl.constexpr = BN // (2 * PS)
    x1, x2 = tl.split(tl.permute(tl.reshape(v, (BM, G, 2, PS)), (0, 1, 3, 2)))
    _, f, rot = _pair_cols(n0, BN, PS, HALF, HEAD_DIM, rot_cols)  # pair g·PS + j is [g, j] of the x1 tile
    f = tl.reshape(f, (G, PS))
    rot = tl.reshape(rot, (G, PS))
    m3 = rot[None, :, :] & (pos >= 0)[:, None, None]
    c, s = _cos_sin(pos[:, None, None], f[None, :, :], m3, COS, SIN, FREQ, n_table, s_ct, s_cf, s_st, s_sf, mscale,
                    v.dtype, USE_TABLE, CONJ)
    out = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)  # [BM, G, PS, 2]
    return tl.reshape(tl.permute(out, (0, 1, 3, 2)), (BM, BN))


# ---------------------------------------------------------------------------------------------- prologue
@triton.jit
def _load(ptr, mask, MASKED: tl.constexpr):
    """``tl.load`` with ``other=0`` where MASKED, unmasked otherwise (Triton 3.6 refuses ``other`` without a mask)."""
    if MASKED:
        v = tl.load(ptr, mask=mask, other=0.0)
    else:
        v = tl.load(ptr)
    return v


@triton.jit
def _mask_bits(MSK, p, r, s_mt, P, R, N_ALONG_P: tl.constexpr):
    """The kept ReLU bits of the tile at rows p, columns r as 0/1 int32; MSK is [rows, cdiv(n, 8)] uint8 (bit j of
    word w is column 8w + j) with row stride s_mt; the column (n) axis is r, or p when N_ALONG_P. Each element loads
    its byte (eight neighbours share one: L1 hits) and shifts: no reshape of the tile."""
    if N_ALONG_P:  # p = n, r = token
        words = tl.load(MSK + r[None, :] * s_mt + (p // 8)[:, None], mask=(p < P)[:, None] & (r < R)[None, :],
                        other=0)
        bits = (words.to(tl.int32) >> (p % 8)[:, None]) & 1
    else:
        words = tl.load(MSK + p[:, None] * s_mt + (r // 8)[None, :], mask=(r < R)[None, :], other=0)
        bits = (words.to(tl.int32) >> (r % 8)[None, :]) & 1
    return bits


@triton.jit
def _mask_words(MSK, p, r0, s_mt, R, BP: tl.constexpr, BR: tl.constexpr):
    """The kept ReLU bits of rows p, columns r0 .. r0 + BR (r0 a multiple of 8) as 0/1 int32 [BP, BR], for tiles
    whose column axis is n: the [BP, BR / 8] words loaded as one tile and unpacked by shifts and a reshape (column
    8w + j is bit j of word w). The elementwise pass runs at the memory bound with it; one byte load per element
    (:func:`_mask_bits`) beside the pass's column sums runs at a fifth of it."""
    w = r0 // 8 + tl.arange(0, BR // 8)
    words = tl.load(MSK + p[:, None] * s_mt + w[None, :], mask=(w < (R + 7) // 8)[None, :], other=0).to(tl.int32)
    return tl.reshape((words[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1, (BP, BR))


@triton.jit
def _prologue(a, p, r, rmask, S, G0, s_sp, s_sr, s_gp, s_gr, P, R, PRO_ACT: tl.constexpr,
              PRO_MASK: tl.constexpr, PRO_X0: tl.constexpr, N_ALONG_P: tl.constexpr, BP: tl.constexpr,
              BR: tl.constexpr, MASKED: tl.constexpr):
    """``a`` (a tile of dY in the compute dtype) times act'(kept S) or the kept ReLU bits, times the DCN
    multiplier G0."""
    if PRO_MASK:
        a = tl.where(_mask_bits(S, p, r, s_sp, P, R, N_ALONG_P) != 0, a, 0.0)
    elif PRO_ACT != 0:
        s = _load(S + p[:, None] * s_sp + r[None, :] * s_sr, rmask, MASKED).to(a.dtype)
        a = a * _act_grad(s, PRO_ACT)
    if PRO_X0:
        a = a * _load(G0 + p[:, None] * s_gp + r[None, :] * s_gr, rmask, MASKED).to(a.dtype)
    return a
