"""Triton kernels of the fused dot interaction (forward and backward); launched by :mod:`.launch`.

Notation: ``B`` rows, ``F`` sparse features, ``N = F + 1`` vectors per row (``v_0 = dense[b]``,
``v_k = emb[b, k-1]``), ``D`` the vector length, ``P`` pairs, ``W`` the output width. Pair ``(i, j)``, ``j < i``,
is output column ``D + i(i-1)/2 + j`` (``SELF``: ``j <= i`` at ``D + i(i+1)/2 + j``).

Both kernels work on ``ROWS`` batch rows at once: every tile has a leading row dimension and the products are
batched ``tl.dot`` s (one per row), so a program keeps ``ROWS`` rows' loads in flight.

Forward: one program per (block of ``ROWS`` rows, tile ``(ti, tj)``, ``tj <= ti``, of ``BLOCK_V`` x ``BLOCK_V``
Gram entries). It loads the rows' ``BLOCK_V x BLOCK_D`` slices of vectors ``I`` and ``J``, accumulates
``V_I V_Jᵀ`` in fp32 over the D chunks, and stores the kept entries straight to their output columns: no Gram
matrix in memory and no gather. The ``(0, 0)`` tile's programs also copy the dense columns and write the zero
padding. Bytes per row: read ``N·D``, write ``W`` elements; flops ``2·P·D`` useful (a whole tile is computed).

Backward: one program per (block of rows, ``BLOCK_V`` vectors ``I``, ``BLOCK_D`` columns). ``dV_I = S_I: V`` with
``S`` the symmetric matrix of the pair gradients (read from the rows of the output gradient, ``2 g_ii`` on the
diagonal with ``SELF``), accumulated in fp32 over the ``J`` blocks, plus ``grad[:, :D]`` for ``v_0``. Bytes per
row: read ``P + D`` gradient and ``N·D`` input elements, write ``N·D`` (``S`` is re-read from L1/L2 per ``D``
chunk); flops ``4·P·D`` useful.

``OUTER`` replaces the ``tl.dot`` s by CUDA-core FMAs, one outer product per element of D (forward
``v_I[:, d] v_J[:, d]ᵀ``; backward ``S[:, I, j] v_j`` per vector ``j``), the operands read from L1; ``OUTER4``
makes the forward take four elements of D per step (one 16-byte load per vector, split in registers).

Under the interpreter (``LOWP_DOT`` off) the dots run on fp32 copies; on GPUs 16-bit inputs go to the tensor
cores as they are (their products are exact in fp32, the accumulation is fp32 either way) and fp32 inputs use
``input_precision="ieee"`` (no TF32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded


@triton.jit
def _cast_out(v, out_ptr, OUT_BF16: tl.constexpr):
    """fp32 ``v`` in ``out_ptr``'s element type, rounded to nearest even (the shared store helper; ``OUT_BF16``
    only keys the compiled variant)."""
    return rounded(v, out_ptr.dtype.element_ty)


@triton.jit
def _load_vectors(dense_ptr, emb_ptr, rows, live, vec, col, n_vec, dim,
                  stride_db, stride_dd, stride_eb, stride_ef, stride_ed):
    """``[ROWS, BLOCK_V, BLOCK_D]`` slice of the rows' vectors in the input dtype: ``v_0`` from ``dense``, ``v_k``
    from ``emb[:, k-1]``; zeros past ``n_vec``, ``dim`` and the last row. ``rows``/``live`` are ``[ROWS, 1, 1]``,
    ``vec`` ``[1, BLOCK_V, 1]``, ``col`` ``[1, 1, BLOCK_D]``."""
    x = dense_ptr + rows * stride_db + col * stride_dd + vec * 0
    e = emb_ptr + rows * stride_eb + tl.maximum(vec - 1, 0) * stride_ef + col * stride_ed
    # one load through a selected pointer (not a load per source and a select): half the load instructions
    return tl.load(tl.where(vec == 0, x, e), mask=live & (col < dim) & (vec < n_vec), other=0.0)


@triton.jit
def _index(offsets, WIDE: tl.constexpr):
    """Index vector ``offsets`` in 64-bit when an operand reaches past 2^31 - 1 elements (``WIDE``): the products
    with the strides then cannot overflow."""
    if WIDE:
        return offsets.to(tl.int64)
    else:
        return offsets


@triton.jit
def _dot(a, b, LOWP_DOT: tl.constexpr):
    """Batched ``a @ b`` accumulated in fp32: 16-bit operands as they are (tensor cores), or fp32 copies in IEEE
    fp32."""
    if LOWP_DOT:
        return tl.dot(a, b)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def dot_interaction_fwd_kernel(
    dense_ptr,  # (B, D) input dtype, strides (stride_db, stride_dd)
    emb_ptr,  # (B, F, D) input dtype, strides (stride_eb, stride_ef, stride_ed)
    out_ptr,  # (B, W) input dtype, strides (stride_ob, stride_oc): [dense, pairs, zero padding]
    n_rows, n_vec, dim, n_pairs, out_width,
    stride_db, stride_dd, stride_eb, stride_ef, stride_ed, stride_ob, stride_oc,
    ROWS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_PAD: tl.constexpr,
    SELF: tl.constexpr, LOWP_DOT: tl.constexpr, OUT_BF16: tl.constexpr, ONE_TILE: tl.constexpr,
    WIDE: tl.constexpr, OUTER: tl.constexpr, OUTER4: tl.constexpr,
):
    ti = tl.program_id(1)
    tj = tl.program_id(2)
    if tj > ti:  # upper-triangle tiles hold no kept pair
        return
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    r3 = rows[:, None, None]
    live = r3 < n_rows
    i = _index(ti * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)[None, :, None]
    vj = _index(tj * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)
    j = vj[None, None, :]
    cd = _index(tl.arange(0, BLOCK_D), WIDE)
    acc = tl.zeros((ROWS, BLOCK_V, BLOCK_V), dtype=tl.float32)
    if OUTER and OUTER4:  # the same, four elements of D per step: one 16-byte load per vector, split in registers
        k4 = tl.arange(0, 4)[None, None, None, :]
        for d in range(0, dim, 4):
            c4 = _index(d + k4, WIDE)
            a = _load_vectors(dense_ptr, emb_ptr, r3[:, :, :, None], live[:, :, :, None], i[:, :, :, None], c4,
                              n_vec, dim, stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            b = _load_vectors(dense_ptr, emb_ptr, r3[:, :, :, None], live[:, :, :, None], j[:, :, :, None], c4,
                              n_vec, dim, stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            a_even, a_odd = tl.split(tl.reshape(a.to(tl.float32), (ROWS, BLOCK_V, 1, 2, 2)))  # d + {0, 2}, d + {1, 3}
            b_even, b_odd = tl.split(tl.reshape(b.to(tl.float32), (ROWS, 1, BLOCK_V, 2, 2)))
            a0, a2 = tl.split(a_even)
            a1, a3 = tl.split(a_odd)
            b0, b2 = tl.split(b_even)
            b1, b3 = tl.split(b_odd)
            acc += a0 * b0
            acc += a1 * b1
            acc += a2 * b2
            acc += a3 * b3
    elif OUTER:  # CUDA-core FMAs: one outer product v_I[:, d] v_J[:, d]ᵀ per element of D (L1-resident rows)
        for d in range(0, dim):
            dd = _index(d + tl.zeros((1, 1, 1), tl.int32), WIDE)  # a tensor (the interpreter's d is an int)
            a = _load_vectors(dense_ptr, emb_ptr, r3, live, i, dd, n_vec, dim,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            b = _load_vectors(dense_ptr, emb_ptr, r3, live, j, dd, n_vec, dim,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += a.to(tl.float32) * b.to(tl.float32)
    else:
        for d0 in range(0, dim, BLOCK_D):
            c = (d0 + cd)[None, None, :]
            a = _load_vectors(dense_ptr, emb_ptr, r3, live, i, c, n_vec, dim,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            if ONE_TILE:  # all N vectors in one tile (N <= BLOCK_V): V Vᵀ from one load
                b = a
            else:
                b = _load_vectors(dense_ptr, emb_ptr, r3, live, vj[None, :, None], c, n_vec, dim,
                                  stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += _dot(a, tl.trans(b, (0, 2, 1)), LOWP_DOT)
    if SELF:
        kept = (j <= i) & (i < n_vec)
        col = dim + i * (i + 1) // 2 + j
    else:
        kept = (j < i) & (i < n_vec)
        col = dim + i * (i - 1) // 2 + j
    tl.store(out_ptr + r3 * stride_ob + col * stride_oc, _cast_out(acc, out_ptr, OUT_BF16), mask=kept & live)
    if ti + tj == 0:  # the first tile's programs also write the dense columns and the padding
        r2 = rows[:, None]
        for d0 in range(0, dim, BLOCK_D):
            c = (d0 + cd)[None, :]
            ok = (r2 < n_rows) & (c < dim)
            x = tl.load(dense_ptr + r2 * stride_db + c * stride_dd, mask=ok, other=0.0)
            tl.store(out_ptr + r2 * stride_ob + c * stride_oc, x.to(out_ptr.dtype.element_ty), mask=ok)
        zero = tl.zeros((ROWS, BLOCK_PAD), dtype=out_ptr.dtype.element_ty)
        for c0 in range(dim + n_pairs, out_width, BLOCK_PAD):
            c = (c0 + _index(tl.arange(0, BLOCK_PAD), WIDE))[None, :]
            tl.store(out_ptr + r2 * stride_ob + c * stride_oc, zero, mask=(r2 < n_rows) & (c < out_width))


@triton.jit
def dot_interaction_bwd_kernel(
    grad_ptr,  # (B, W) output gradient, strides (stride_gb, stride_gc); padding columns never read
    dense_ptr,  # (B, D) input dtype, strides (stride_db, stride_dd)
    emb_ptr,  # (B, F, D) input dtype, strides (stride_eb, stride_ef, stride_ed)
    grad_dense_ptr,  # (B, D) dense's dtype, strides (stride_xb, stride_xd)
    grad_emb_ptr,  # (B, F, D) emb's dtype, strides (stride_yb, stride_yf, stride_yd)
    n_rows, n_vec, dim,
    stride_gb, stride_gc, stride_db, stride_dd, stride_eb, stride_ef, stride_ed,
    stride_xb, stride_xd, stride_yb, stride_yf, stride_yd,
    ROWS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
    SELF: tl.constexpr, LOWP_DOT: tl.constexpr, OUT_BF16: tl.constexpr, WIDE: tl.constexpr, OUTER: tl.constexpr,
):
    r3 = (tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS))[:, None, None]
    live = r3 < n_rows
    i = _index(tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)[None, :, None]
    c = _index(tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D), WIDE)[None, None, :]
    acc = tl.zeros((ROWS, BLOCK_V, BLOCK_D), dtype=tl.float32)
    if OUTER:  # CUDA-core FMAs: dV_I += S[:, I, j] v_j per vector j (a column of S, one row of V)
        for jj in range(0, n_vec):
            j = _index(jj + tl.zeros((1, 1, 1), tl.int32), WIDE)  # a tensor (the interpreter's jj is an int)
            hi = tl.maximum(i, j)
            lo = tl.minimum(i, j)
            if SELF:
                kept = live & (hi < n_vec)
                pair = hi * (hi + 1) // 2 + lo
            else:
                kept = live & (hi < n_vec) & (i != j)
                pair = hi * (hi - 1) // 2 + lo
            s = tl.load(grad_ptr + r3 * stride_gb + (dim + pair) * stride_gc, mask=kept, other=0.0).to(tl.float32)
            if SELF:
                s = tl.where(i == j, s * 2.0, s)
            v = _load_vectors(dense_ptr, emb_ptr, r3, live, j, c, n_vec, dim,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += s * v.to(tl.float32)
    else:
        for j0 in range(0, n_vec, BLOCK_V):
            vj = _index(j0 + tl.arange(0, BLOCK_V), WIDE)
            j = vj[None, None, :]
            hi = tl.maximum(i, j)
            lo = tl.minimum(i, j)
            if SELF:
                kept = live & (hi < n_vec)
                pair = hi * (hi + 1) // 2 + lo
            else:
                kept = live & (hi < n_vec) & (i != j)
                pair = hi * (hi - 1) // 2 + lo
            # S[r, i, j] = dL/dZ_ij of row r for the kept pair {i, j}: symmetric, read from the gradient's rows
            s = tl.load(grad_ptr + r3 * stride_gb + (dim + pair) * stride_gc, mask=kept, other=0.0)
            if SELF:  # d(v_i . v_i)/dv_i = 2 v_i: exact doubling, back in the gradient's dtype
                s = tl.where(i == j, s.to(tl.float32) * 2.0, s.to(tl.float32)).to(s.dtype)
            v = _load_vectors(dense_ptr, emb_ptr, r3, live, vj[None, :, None], c, n_vec, dim,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += _dot(s.to(v.dtype), v, LOWP_DOT)
    # v_0 = dense passes straight through to output columns [0, D)
    is_dense = live & (i == 0) & (c < dim)
    g0 = tl.load(grad_ptr + r3 * stride_gb + c * stride_gc, mask=live & (c < dim) & (c * 0 + tl.program_id(1) == 0),
                 other=0.0)  # [ROWS, 1, BLOCK_D]: one load per column, added to vector 0 alone
    acc += tl.where(i == 0, g0.to(tl.float32), 0.0)
    tl.store(grad_dense_ptr + r3 * stride_xb + c * stride_xd + i * 0, _cast_out(acc, grad_dense_ptr, OUT_BF16),
             mask=is_dense)
    is_emb = live & (i >= 1) & (i < n_vec) & (c < dim)
    tl.store(grad_emb_ptr + r3 * stride_yb + tl.maximum(i - 1, 0) * stride_yf + c * stride_yd,
             _cast_out(acc, grad_emb_ptr, OUT_BF16), mask=is_emb)
