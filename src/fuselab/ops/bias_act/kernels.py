"""Triton kernels of the fused bias + scaled residual + activation.

Forward, one pass:  read x, residual (M·N each), bias (N) -> write y (M·N) [+ pre-activation z (M·N) when the
backward of silu/gelu/gelu_tanh needs it].
Backward, one pass: read grad_y + saved (M·N each) -> write grad_x, grad_residual (M·N each, only those asked
for) + an fp32 partial column sum of dz per program ([grid_m, N], a few MB at most); the last program of each
column block (int32 tickets, :mod:`fuselab.ops._tickets`) sums that block's partials in row order: the bias
gradient is deterministic, no float atomics, no second pass over grad_y and no second launch.

Tensors are 2-D ``[M, N]`` views with arbitrary strides (Triton specializes a unit inner stride, so contiguous
rows get 16-byte vector access). Launchers and plans: :mod:`fuselab.ops.bias_act.launch`.
Programs walk row tiles with a grid stride (``for tile in range(pid_m, n_tiles, grid_m)``), so each program loads
its bias slice once and the backward accumulates its column sums in registers over all of its tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuselab.ops._rounding import rounded
from fuselab.ops._tickets import last_to_arrive, sum_partials


@triton.jit
def _act(z, ACTIVATION: tl.constexpr):
    """act(z) in the compute dtype. tanh(u) = 2*sigmoid(2u) - 1, so gelu_tanh(z) = z * sigmoid(2u).
    relu keeps NaN, as torch.relu does (max(z, 0) would turn it into 0)."""
    if ACTIVATION == 0:  # none
        y = z
    elif ACTIVATION == 1:  # relu
        y = tl.where(z < 0.0, 0.0, z)
    elif ACTIVATION == 2:  # relu2
        r = tl.where(z < 0.0, 0.0, z)
        y = r * r
    elif ACTIVATION == 3:  # sigmoid
        y = 1.0 / (1.0 + tl.exp(-z))
    elif ACTIVATION == 4:  # silu
        y = z / (1.0 + tl.exp(-z))
    elif ACTIVATION == 5:  # gelu (erf)
        y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    else:  # gelu_tanh; 2*sqrt(2/pi) = 1.5957691216057308
        u2 = 1.5957691216057308 * (z + 0.044715 * z * z * z)
        y = z / (1.0 + tl.exp(-u2))
    return y


@triton.jit
def _act_grad(s, ACTIVATION: tl.constexpr):
    """act'(z) from the saved tensor s: the output y for relu/relu2/sigmoid, the pre-activation z otherwise.
    relu passes the gradient where y is NaN, as torch's threshold_backward does."""
    if ACTIVATION == 1:  # relu, s = y
        d = tl.where(s <= 0.0, 0.0, 1.0)
    elif ACTIVATION == 2:  # relu2, s = y = relu(z)^2 -> 2 relu(z) = 2 sqrt(y)
        d = 2.0 * tl.sqrt(s)
    elif ACTIVATION == 3:  # sigmoid, s = y
        d = s * (1.0 - s)
    elif ACTIVATION == 4:  # silu, s = z
        sig = 1.0 / (1.0 + tl.exp(-s))
        d = sig * (1.0 + s * (1.0 - sig))
    elif ACTIVATION == 5:  # gelu (erf), s = z; 1/sqrt(2 pi) = 0.3989422804014327
        d = 0.5 * (1.0 + tl.erf(s * 0.7071067811865476)) + s * tl.exp(-0.5 * s * s) * 0.3989422804014327
    else:  # gelu_tanh, s = z
        u2 = 1.5957691216057308 * (s + 0.044715 * s * s * s)
        sig = 1.0 / (1.0 + tl.exp(-u2))
        d = sig + s * sig * (1.0 - sig) * (1.5957691216057308 * (1.0 + 0.134145 * s * s))
    return d


@triton.jit
def _bias_act_fwd_kernel(
    X,  # [M, N] input x, strides (stride_xm, stride_xn)
    R,  # [M, N] residual, strides (stride_rm, stride_rn); read only if HAS_RESIDUAL
    B,  # [N] bias, stride stride_b; read only if HAS_BIAS
    Y,  # [M, N] output y, strides (stride_ym, stride_yn) (Y is X when in place)
    Z,  # [M, N] contiguous pre-activation for the backward; written only if SAVE_PRE
    alpha,  # python float, scale of the residual
    M,
    N,
    stride_xm,
    stride_xn,
    stride_rm,
    stride_rn,
    stride_b,
    stride_ym,
    stride_yn,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SAVE_PRE: tl.constexpr,
    ACC: tl.constexpr,  # compute dtype: fp32 (fp64 for fp64 inputs)
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVICT: tl.constexpr,  # eviction policy of the x / residual loads
    FLAT: tl.constexpr,  # x, residual, y contiguous: one run of BLOCK_N elements of the flat [M*N] per program
    EVEN: tl.constexpr,  # FLAT and BLOCK_N divides M*N: no masks
):
    # bytes: read x, residual (M·N each) + bias (N), write y (M·N) [+ z (M·N)]
    if FLAT:
        _bias_act_fwd_flat(X, R, B, Y, Z, alpha, M, N, stride_b, ACTIVATION, HAS_RESIDUAL, HAS_BIAS, SAVE_PRE, ACC,
                           INT64, BLOCK_N, EVICT, EVEN)
    else:
        _bias_act_fwd_tiles(X, R, B, Y, Z, alpha, M, N, stride_xm, stride_xn, stride_rm, stride_rn, stride_b,
                            stride_ym, stride_yn, ACTIVATION, HAS_RESIDUAL, HAS_BIAS, SAVE_PRE, ACC, INT64, BLOCK_M,
                            BLOCK_N, EVICT)


@triton.jit
def _bias_act_fwd_flat(X, R, B, Y, Z, alpha, M, N, stride_b, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SAVE_PRE: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr,
                       BLOCK: tl.constexpr, EVICT: tl.constexpr, EVEN: tl.constexpr):
    # contiguous x, residual, y, z as flat [M*N]; each element's bias column is its offset mod N. One block per
    # program and no loop, as Inductor's pointwise kernel (why: benchmarks/notes/bias_act.md#launcher-knobs)
    pid = tl.program_id(0)
    if INT64:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        total = tl.cast(M, tl.int64) * N
    else:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        total = M * N
    if EVEN:
        mask, other = None, None
    else:
        mask, other = offs < total, 0.0
    z = tl.load(X + offs, mask=mask, other=other, eviction_policy=EVICT).to(ACC)
    if HAS_RESIDUAL:
        z = z + alpha * tl.load(R + offs, mask=mask, other=other, eviction_policy=EVICT).to(ACC)
    if HAS_BIAS:
        z = z + tl.load(B + (offs % N) * stride_b, mask=mask, other=other, eviction_policy="evict_last").to(ACC)
    if SAVE_PRE:
        tl.store(Z + offs, rounded(z, Z.dtype.element_ty), mask=mask)
    tl.store(Y + offs, rounded(_act(z, ACTIVATION), Y.dtype.element_ty), mask=mask)


@triton.jit
def _bias_act_fwd_tiles(X, R, B, Y, Z, alpha, M, N, stride_xm, stride_xn, stride_rm, stride_rn, stride_b, stride_ym,
                        stride_yn, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SAVE_PRE: tl.constexpr, ACC: tl.constexpr, INT64: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, EVICT: tl.constexpr):
    # any strides: [BLOCK_M, BLOCK_N] tiles, a grid stride over the row tiles
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    grid_m = tl.num_programs(0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if INT64:
        cols = cols.to(tl.int64)
    if HAS_BIAS:  # once per program, reused by every row tile
        b = tl.load(B + cols * stride_b, mask=col_mask, other=0.0, eviction_policy="evict_last").to(ACC)
    n_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid_m, n_tiles, grid_m):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if INT64:
            rows = rows.to(tl.int64)
        mask = (rows < M)[:, None] & col_mask[None, :]
        z = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0,
                    eviction_policy=EVICT).to(ACC)
        if HAS_RESIDUAL:
            r = tl.load(R + rows[:, None] * stride_rm + cols[None, :] * stride_rn, mask=mask, other=0.0,
                        eviction_policy=EVICT)
            z = z + alpha * r.to(ACC)
        if HAS_BIAS:
            z = z + b[None, :]
        if SAVE_PRE:
            tl.store(Z + rows[:, None] * N + cols[None, :], rounded(z, Z.dtype.element_ty), mask=mask)
        y = _act(z, ACTIVATION)
        tl.store(Y + rows[:, None] * stride_ym + cols[None, :] * stride_yn, rounded(y, Y.dtype.element_ty), mask=mask)


@triton.jit
def _bias_act_bwd_kernel(
    G,  # [M, N] grad of y, strides (stride_gm, stride_gn)
    S,  # [M, N] saved tensor (y or z, see _act_grad), strides (stride_sm, stride_sn); unused for "none"
    SHIFT,  # [N] bias added to S to rebuild z = x + bias (saved x, no residual), stride stride_shift; if HAS_SHIFT
    DX,  # [M, N] contiguous grad of x = dz; written only if WRITE_DX
    DR,  # [M, N] contiguous grad of residual = alpha * dz; written only if WRITE_DR
    P,  # [grid_m, N] contiguous fp32 (fp64) partial column sums of dz (bias grad, stage 1); only if HAS_BIAS
    DB,  # [N] grad of bias, stride stride_db, summed from P by the last program of each column block; if HAS_BIAS
    COUNT,  # [grid_n] int32 ticket counters, zero before the launch and after it; only if HAS_BIAS
    alpha,  # python float, scale of the residual's gradient
    M,
    N,
    stride_gm,
    stride_gn,
    stride_sm,
    stride_sn,
    stride_shift,
    stride_db,
    ACTIVATION: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    WRITE_DX: tl.constexpr,
    WRITE_DR: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,  # partial rows per step of the final column sum
    EVICT: tl.constexpr,  # eviction policy of the grad / saved loads
):
    # bytes: read grad_y, saved (M·N each), write grad_x, grad_residual (M·N each) + partials (grid_m·N fp32,
    # written once and read once from L2 by the last program of each column block) + grad_bias (N)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    grid_m = tl.num_programs(0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if INT64:
        cols = cols.to(tl.int64)
    if HAS_SHIFT:
        shift = tl.load(SHIFT + cols * stride_shift, mask=col_mask, other=0.0, eviction_policy="evict_last").to(ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    n_tiles = tl.cdiv(M, BLOCK_M)
    for tile in range(pid_m, n_tiles, grid_m):
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if INT64:
            rows = rows.to(tl.int64)
        mask = (rows < M)[:, None] & col_mask[None, :]
        dz = tl.load(G + rows[:, None] * stride_gm + cols[None, :] * stride_gn, mask=mask, other=0.0,
                     eviction_policy=EVICT).to(ACC)
        if ACTIVATION != 0:
            s = tl.load(S + rows[:, None] * stride_sm + cols[None, :] * stride_sn, mask=mask, other=0.0,
                        eviction_policy=EVICT).to(ACC)
            if HAS_SHIFT:
                s = s + shift[None, :]
            dz = dz * _act_grad(s, ACTIVATION)
        offs = rows[:, None] * N + cols[None, :]
        if WRITE_DX:
            tl.store(DX + offs, rounded(dz, DX.dtype.element_ty), mask=mask)
        if WRITE_DR:
            tl.store(DR + offs, rounded(alpha * dz, DR.dtype.element_ty), mask=mask)
        if HAS_BIAS:
            acc += tl.where(mask, dz, 0.0)
    if HAS_BIAS:
        tl.store(P + pid_m.to(tl.int64) * N + cols, tl.sum(acc, axis=0).to(P.dtype.element_ty), mask=col_mask)
        if last_to_arrive(COUNT + pid_n, grid_m):  # this column block's partials, summed in row order
            db = sum_partials(P, N, cols, col_mask, grid_m, BLOCK_P, BLOCK_N, ACC)
            tl.store(DB + cols * stride_db, rounded(db, DB.dtype.element_ty), mask=col_mask)
