"""Triton kernels of the fused dot interaction (forward and backward); launched by :mod:`.launch`.

Notation: ``B`` rows, ``F`` sparse features, ``N = F + 1`` vectors per row (``v_0 = dense[b]``,
``v_k = emb[b, k-1]``), ``D`` the vector length, ``P`` pairs, ``W`` the output width. Pair ``(i, j)``, ``j < i``,
is output column ``D + i(i-1)/2 + j`` (``SELF``: ``j <= i`` at ``D + i(i+1)/2 + j``).

Forward: one program per (block of ``ROWS`` batch rows, tile ``(ti, tj)``, ``tj <= ti``, of ``BLOCK_V`` x
``BLOCK_V`` Gram entries). For each row it loads the two ``BLOCK_V x BLOCK_D`` slices of the row's vectors, takes
``tl.dot(V_I, V_Jᵀ)`` in fp32 over the D chunks, and stores the kept entries straight to their output columns: no
Gram matrix in memory and no gather. The diagonal tile ``(0, 0)`` also copies the dense columns and writes the
zero padding. Bytes: read ``N·D`` and write ``W`` elements per row; flops ``2·P·D`` per row.

Backward: one program per (block of rows, ``BLOCK_V`` vectors ``I``, ``BLOCK_D`` columns). ``dV_I = S_I: V`` with
``S`` the symmetric matrix of the pair gradients (read from the output gradient row, ``2 g_ii`` on the diagonal
with ``SELF``), accumulated in fp32 over the ``J`` blocks, plus ``grad[:, :D]`` for ``v_0``. Bytes: read ``P + D``
gradient and ``N·D`` input elements, write ``N·D`` per row (``S`` is re-read from L1/L2 per ``D`` chunk);
flops ``2·N·N·D`` per row as computed (``4·P·D`` useful).

Under the interpreter (``LOWP_DOT`` off) the dot runs on fp32 copies; on GPUs 16-bit inputs go to the tensor
cores as they are (their products are exact in fp32, the accumulation is fp32 either way) and fp32 inputs use
``input_precision="ieee"`` (no TF32).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_bf16_rtne(v):
    """fp32 ``v`` rounded to nearest-even bfloat16 with integer ops: the interpreter truncates fp32 -> bf16
    casts where the GPU rounds, so this gives the same bits on both (the reduce kernel's store does the same)."""
    bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _cast_out(v, out_ptr, OUT_BF16: tl.constexpr):
    """fp32 ``v`` in ``out_ptr``'s element type (bf16 through :func:`round_to_bf16_rtne`)."""
    if OUT_BF16:
        return round_to_bf16_rtne(v)
    else:
        return v.to(out_ptr.dtype.element_ty)


@triton.jit
def _load_vectors(dense_ptr, emb_ptr, row, vec, col, n_vec, dim_r,
                  stride_db, stride_dd, stride_eb, stride_ef, stride_ed):
    """``[len(vec), len(col)]`` slice of row ``row``'s vectors, in the input dtype: ``v_0`` from ``dense``,
    ``v_k`` from ``emb[:, k-1]``; zeros outside ``vec < n_vec`` and ``col < dim_r`` (``dim_r`` is 0 for a row past
    the end: masks are built from per-row limits, since the interpreter turns ``tensor & scalar bool`` into int)."""
    v = vec[:, None]
    c = col[None, :]
    ok = c < dim_r
    from_dense = ok & (v == 0)
    from_emb = ok & (v >= 1) & (v < n_vec)
    x = tl.load(dense_ptr + row * stride_db + c * stride_dd + v * 0, mask=from_dense, other=0.0)
    e = tl.load(emb_ptr + row * stride_eb + tl.maximum(v - 1, 0) * stride_ef + c * stride_ed, mask=from_emb,
                other=0.0)
    return tl.where(v == 0, x, e)


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
    """``a @ b`` accumulated in fp32: 16-bit operands as they are (tensor cores) or fp32 copies, IEEE fp32."""
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
    WIDE: tl.constexpr,
):
    ti = tl.program_id(1)
    tj = tl.program_id(2)
    if tj > ti:  # upper-triangle tiles hold no kept pair
        return
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    vi = _index(ti * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)
    vj = _index(tj * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)
    i = vi[:, None]
    j = vj[None, :]
    if SELF:
        kept = (j <= i) & (i < n_vec)
        col = dim + i * (i + 1) // 2 + j
    else:
        kept = (j < i) & (i < n_vec)
        col = dim + i * (i - 1) // 2 + j
    cd = _index(tl.arange(0, BLOCK_D), WIDE)
    for r in range(ROWS):
        row = row0 + r
        live = row < n_rows
        dim_r = tl.where(live, dim, 0)  # per-row limits: 0 for a row past the end masks all of it
        acc = tl.zeros((BLOCK_V, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, dim, BLOCK_D):
            a = _load_vectors(dense_ptr, emb_ptr, row, vi, d0 + cd, n_vec, dim_r,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            if ONE_TILE:  # all N vectors in one tile (N <= BLOCK_V): V Vᵀ from one load
                b = a
            else:
                b = _load_vectors(dense_ptr, emb_ptr, row, vj, d0 + cd, n_vec, dim_r,
                                  stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += _dot(a, tl.trans(b), LOWP_DOT)
        tl.store(out_ptr + row * stride_ob + col * stride_oc, _cast_out(acc, out_ptr, OUT_BF16),
                 mask=kept & (i < tl.where(live, n_vec, 0)))
        if ti + tj == 0:  # the first tile's programs also write the dense columns and the padding
            for d0 in range(0, dim, BLOCK_D):
                c = d0 + cd
                x = tl.load(dense_ptr + row * stride_db + c * stride_dd, mask=c < dim_r, other=0.0)
                tl.store(out_ptr + row * stride_ob + c * stride_oc, x.to(out_ptr.dtype.element_ty), mask=c < dim_r)
            width_r = tl.where(live, out_width, 0)
            for c0 in range(dim + n_pairs, out_width, BLOCK_PAD):
                c = c0 + _index(tl.arange(0, BLOCK_PAD), WIDE)
                zero = tl.zeros((BLOCK_PAD,), dtype=out_ptr.dtype.element_ty)
                tl.store(out_ptr + row * stride_ob + c * stride_oc, zero, mask=c < width_r)


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
    SELF: tl.constexpr, LOWP_DOT: tl.constexpr, OUT_BF16: tl.constexpr, WIDE: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    vi = _index(tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V), WIDE)
    cols = _index(tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D), WIDE)
    i = vi[:, None]
    c = cols[None, :]
    for r in range(ROWS):
        row = row0 + r
        live = row < n_rows
        dim_r = tl.where(live, dim, 0)  # per-row limits: 0 for a row past the end masks all of it
        n_vec_r = tl.where(live, n_vec, 0)
        acc = tl.zeros((BLOCK_V, BLOCK_D), dtype=tl.float32)
        for j0 in range(0, n_vec, BLOCK_V):
            vj = _index(j0 + tl.arange(0, BLOCK_V), WIDE)
            j = vj[None, :]
            hi = tl.maximum(i, j)
            lo = tl.minimum(i, j)
            if SELF:
                kept = hi < n_vec_r
                pair = hi * (hi + 1) // 2 + lo
            else:
                kept = (hi < n_vec_r) & (i != j)
                pair = hi * (hi - 1) // 2 + lo
            # S[i, j] = dL/dZ_ij for the kept pair {i, j}; symmetric, read from the gradient row (L1-resident)
            s = tl.load(grad_ptr + row * stride_gb + (dim + pair) * stride_gc, mask=kept, other=0.0)
            if SELF:  # d(v_i . v_i)/dv_i = 2 v_i: exact doubling, back in the gradient's dtype
                s = tl.where(i == j, s.to(tl.float32) * 2.0, s.to(tl.float32)).to(s.dtype)
            v = _load_vectors(dense_ptr, emb_ptr, row, vj, cols, n_vec, dim_r,
                              stride_db, stride_dd, stride_eb, stride_ef, stride_ed)
            acc += _dot(s.to(v.dtype), v, LOWP_DOT)
        # v_0 = dense passes straight through to output columns [0, D)
        is_dense = (i == 0) & (c < dim_r)
        g0 = tl.load(grad_ptr + row * stride_gb + c * stride_gc + i * 0, mask=is_dense, other=0.0)
        acc += g0.to(tl.float32)
        tl.store(grad_dense_ptr + row * stride_xb + c * stride_xd + i * 0,
                 _cast_out(acc, grad_dense_ptr, OUT_BF16), mask=is_dense)
        is_emb = (i >= 1) & (i < n_vec) & (c < dim_r)
        tl.store(grad_emb_ptr + row * stride_yb + tl.maximum(i - 1, 0) * stride_yf + c * stride_yd,
                 _cast_out(acc, grad_emb_ptr, OUT_BF16), mask=is_emb)
