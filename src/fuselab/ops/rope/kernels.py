"""Triton RoPE kernel (launcher and plan: :mod:`fuselab.ops.rope.launch`; op: :mod:`fuselab.ops.rope.op`).

Every layout is a set of strides over one logical (batch, seq, heads, head_dim) view; ``thd`` is
batch 1 with seq = total tokens, each token finding its sequence by a binary search over cu_seqlens.
One launch rotates q and k (any head counts). Grid: (token blocks, head splits). Each program takes
BLOCK_T tokens, computes their positions and loads (or computes) their cos/sin once, then walks all
q heads and all k heads of its split in [BLOCK_T, BLOCK_H, head_dim] tiles, loaded along head_dim
(16-byte vectors when the last stride is 1). Bytes: read q, k; write q_out, k_out; read
(tokens x rotary_dim/2) cos and sin values (or none, with in-kernel angles). Pass-through dims
(partial rotary) are copied only out of place. The backward is the same kernel with CONJ (sin negated).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_tok, o_tok, tmask, h_start, h_end, sxh, sxd, soh, sod, c, s,
                  BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
                  COPY_PASS: tl.constexpr, INT64: tl.constexpr, LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr):
    # x_ptr/o_ptr: one tensor's input/output; x_tok/o_tok: (BLOCK_T,) element offsets of each token's
    # head 0; c, s: (BLOCK_T, 1, BLOCK_HALF) compute-dtype cos/sin (sin already sign-flipped if CONJ)
    jj = tl.arange(0, BLOCK_HALF)
    jmask = jj < HALF
    for h0 in range(h_start, h_end, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        m2 = tmask[:, None] & (hh < h_end)[None, :]
        if INT64:
            hh = hh.to(tl.int64)
        xrow = (x_tok[:, None] + hh[None, :] * sxh)[:, :, None]
        orow = (o_tok[:, None] + hh[None, :] * soh)[:, :, None]
        if INTERLEAVED:
            dd = tl.arange(0, 2 * BLOCK_HALF)
            m3 = m2[:, :, None] & (dd < 2 * HALF)[None, None, :]
            x = tl.load(x_ptr + xrow + dd[None, None, :] * sxd, mask=m3, other=0.0,
                        eviction_policy=LOAD_EVICT).to(c.dtype)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_HALF, 2)))
            o = tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), (BLOCK_T, BLOCK_H, 2 * BLOCK_HALF))
            tl.store(o_ptr + orow + dd[None, None, :] * sod, rounded(o, o_ptr.dtype.element_ty), mask=m3,
                     eviction_policy=STORE_EVICT)
        else:
            m3 = m2[:, :, None] & jmask[None, None, :]
            px = x_ptr + xrow + jj[None, None, :] * sxd
            x1 = tl.load(px, mask=m3, other=0.0, eviction_policy=LOAD_EVICT).to(c.dtype)
            x2 = tl.load(px + HALF * sxd, mask=m3, other=0.0, eviction_policy=LOAD_EVICT).to(c.dtype)
            po = o_ptr + orow + jj[None, None, :] * sod
            tl.store(po, rounded(x1 * c - x2 * s, o_ptr.dtype.element_ty), mask=m3, eviction_policy=STORE_EVICT)
            tl.store(po + HALF * sod, rounded(x2 * c + x1 * s, o_ptr.dtype.element_ty), mask=m3,
                     eviction_policy=STORE_EVICT)
        if COPY_PASS:
            pp = tl.arange(0, BLOCK_PASS)
            mp = m2[:, :, None] & (pp < PASS)[None, None, :]
            v = tl.load(x_ptr + xrow + (2 * HALF + pp[None, None, :]) * sxd, mask=mp, other=0.0,
                        eviction_policy=LOAD_EVICT)
            tl.store(o_ptr + orow + (2 * HALF + pp[None, None, :]) * sod, v.to(o_ptr.dtype.element_ty), mask=mp,
                     eviction_policy=STORE_EVICT)


@triton.jit
def _rope_kernel(
    q_ptr,  # (B, S, HQ, D) logical view of q (in backward: grad of q_out), any strides
    k_ptr,  # (B, S, HK, D) logical view of k; unused unless HAS_K
    qo_ptr,  # (B, S, HQ, D) output for q (== q_ptr in place)
    ko_ptr,  # (B, S, HK, D) output for k; unused unless HAS_K
    cos_ptr,  # (BC, R, HALF) table (BC broadcast by a zero stride); unused unless USE_TABLE
    sin_ptr,  # (BC, R, HALF) table; unused unless USE_TABLE
    freq_ptr,  # (HALF,) fp32 inverse frequencies; unused when USE_TABLE
    pos_ptr,  # (B, S) int positions (thd: (1, T)); unused unless POS_TENSOR
    off_ptr,  # (B,) int offsets per batch row / per sequence; unused unless OFF_TENSOR
    cu_ptr,  # (NSEQ + 1,) int cu_seqlens; unused unless VARLEN
    offset, mscale,  # the per-call scalars first: everything after them is cached per launch plan
    n_tokens, seqlen, n_rows, HQ, HK, q_chunk, k_chunk, nseq,
    sqb, sqs, sqh, sqd, skb, sks, skh, skd,
    soqb, soqs, soqh, soqd, sokb, soks, sokh, sokd,
    scb, scr, scd, ssb, ssr, ssd, spb, sps, so,
    BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    INTERLEAVED: tl.constexpr, CONJ: tl.constexpr, HAS_K: tl.constexpr, USE_TABLE: tl.constexpr,
    POS_TENSOR: tl.constexpr, OFF_TENSOR: tl.constexpr, VARLEN: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    COPY_PASS: tl.constexpr, INT64: tl.constexpr, F64: tl.constexpr,
    LOAD_EVICT: tl.constexpr, STORE_EVICT: tl.constexpr,  # eviction hints of the q/k stream ("" = default)
):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    tok = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = tok < n_tokens
    tok = tl.where(tmask, tok, 0)
    if INT64:
        tok = tok.to(tl.int64)
    # (b, s): the token's batch row and sequence index in the logical view, which address memory
    b = tok // seqlen
    s = tok - b * seqlen
    if VARLEN:  # thd: seq = largest i with cu[i] <= tok (cu[nseq] == n_tokens > tok); pos within it
        lo = tl.zeros_like(tok)
        hi = tl.zeros_like(tok) + nseq
        for _ in tl.static_range(SEARCH_STEPS):
            mid = (lo + hi) // 2
            start = tl.load(cu_ptr + mid, mask=tmask, other=0)
            below = start <= tok
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        seq = lo
        pos = tok - tl.load(cu_ptr + seq, mask=tmask, other=0)
    else:
        seq = b
        pos = s
    if POS_TENSOR:
        pos = tl.load(pos_ptr + b * spb + s * sps, mask=tmask, other=0)
    elif OFF_TENSOR:
        pos = pos + tl.load(off_ptr + seq * so, mask=tmask, other=0)
    else:
        pos = pos + offset
    if F64:
        ct = tl.float64
    else:
        ct = tl.float32
    jj = tl.arange(0, BLOCK_HALF)
    jmask = tmask[:, None] & (jj < HALF)[None, :]
    if USE_TABLE:  # out-of-range positions are clamped to the table: never an out-of-bounds read
        pos = tl.minimum(tl.maximum(pos, 0), n_rows - 1)
        c = tl.load(cos_ptr + (b * scb + pos * scr)[:, None] + jj[None, :] * scd, mask=jmask, other=0.0).to(ct)
        sn = tl.load(sin_ptr + (b * ssb + pos * ssr)[:, None] + jj[None, :] * ssd, mask=jmask, other=0.0).to(ct)
    else:
        freq = tl.load(freq_ptr + jj, mask=jj < HALF, other=0.0).to(ct)
        angle = pos.to(ct)[:, None] * freq[None, :]
        c = tl.cos(angle) * mscale
        sn = tl.sin(angle) * mscale
    if CONJ:
        sn = -sn
    c = c[:, None, :]
    sn = sn[:, None, :]
    q_start = pid_h * q_chunk
    _rotate_heads(q_ptr, qo_ptr, b * sqb + s * sqs, b * soqb + s * soqs, tmask, q_start,
                  tl.minimum(q_start + q_chunk, HQ), sqh, sqd, soqh, soqd, c, sn,
                  BLOCK_T, BLOCK_HQ, HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, COPY_PASS, INT64,
                  LOAD_EVICT, STORE_EVICT)
    if HAS_K:
        k_start = pid_h * k_chunk
        _rotate_heads(k_ptr, ko_ptr, b * skb + s * sks, b * sokb + s * soks, tmask, k_start,
                      tl.minimum(k_start + k_chunk, HK), skh, skd, sokh, sokd, c, sn,
                      BLOCK_T, BLOCK_HK, HALF, BLOCK_HALF, PASS, BLOCK_PASS, INTERLEAVED, COPY_PASS, INT64,
                      LOAD_EVICT, STORE_EVICT)
