"""Triton kernels and out-param launchers of the fused bias + scaled residual + activation.

Forward, one pass:  read x, residual (M·N each), bias (N) -> write y (M·N) [+ pre-activation z (M·N) when the
backward of silu/gelu/gelu_tanh needs it].
Backward, one pass: read grad_y + saved (M·N each) -> write grad_x, grad_residual (M·N each, only those asked
for) + an fp32 partial column sum of dz per program ([grid_m, N], a few MB at most); the last program of each
column block (int32 tickets, :mod:`fuselab.ops._tickets`) sums that block's partials in row order: the bias
gradient is deterministic, no float atomics, no second pass over grad_y and no second launch.

Tensors are 2-D ``[M, N]`` views with arbitrary strides (Triton specializes a unit inner stride, so contiguous
rows get 16-byte vector access); outputs the launchers do not own are allocated by the caller.
Programs walk row tiles with a grid stride (``for tile in range(pid_m, n_tiles, grid_m)``), so each program loads
its bias slice once and the backward accumulates its column sums in registers over all of its tiles.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fuselab.ops._launch import INT32_MAX, cdiv, launch, needs_int64, next_power_of_2, relaunch, sm_count
from fuselab.ops._tickets import final_sum_rows, last_to_arrive, scratch, sum_partials, ticket_counters

#: activation name -> constexpr id used by the kernels (order of fuselab.ACTIVATIONS)
ACT_IDS: dict[str, int] = {"none": 0, "relu": 1, "relu2": 2, "sigmoid": 3, "silu": 4, "gelu": 5, "gelu_tanh": 6}

#: tuning knobs (module constants so a GPU sweep, benchmarks/sweeps/l2_probe.py, can change them): bytes of one
#: tensor tile, programs per SM, widest backward column block (bytes of one row segment). H100 sweep: the forward
#: is best with one tile per program (up to 256 per SM; 0.92-1.01 of copy bandwidth vs 0.91-0.97 at 16); the
#: backward with few programs that accumulate their bias partials over many tiles, and 8 KiB tiles.
#: (A sweep that changes them must also empty the launches prepared by eager backwards, which keep the plan they
#: were made with: fuselab.ops.bias_act._FORWARDS and _PREPARED, fuselab.nn._PREPARED.)
FWD_TILE_BYTES = 16384
BWD_TILE_BYTES = 8192
FWD_PROGRAMS_PER_SM = 256
BWD_PROGRAMS_PER_SM = 4
#: backward column block: 256 B of each row (64 fp32 / 128 bf16 columns; was 512 B). Alternating rounds of the
#: launcher alone (probes/bias_act_bwd_ab.txt, H100 and H200): better or level at 11 of the 12 cases, e.g. 65536x512
#: bf16 0.826 -> 0.869 (H100) and 0.727 -> 0.807 (H200); 262144x1024 fp32 on the H200 -1.4%
BWD_COL_BYTES = 256
MAX_WARPS = 8
#: 16-byte vectors per thread per tensor in a forward tile (it sets num_warps from the tile bytes)
FWD_VECTORS_PER_THREAD = 4
#: forward of contiguous operands: flat runs of 4 KiB per tensor, 2 vectors per thread (4 warps), one per program, as
#: Inductor's pointwise kernels. On the H200 0.5-1.5% ahead of the 2-D tiles at the lab's shapes, level with
#: torch.compile (benchmarks/results/h200/probes/bias_act_fwd_flat.txt; the H100: h100/probes/)
FWD_FLAT = True
FWD_FLAT_TILE_BYTES = 4096
FWD_FLAT_VECTORS_PER_THREAD = 2
#: eviction hint of the streamed (read-once) loads; "" is Triton's default, which measured as fast or faster
#: than "evict_first" here (the kernels write as much as they read). The bias row is reused by every tile of a
#: program and is loaded with "evict_last".
STREAM_EVICTION = ""


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
    # program and no loop: Inductor's pointwise kernel, 0.5-1.5% ahead of the 2-D tiles on the H200
    # (benchmarks/results/h200/probes/bias_act_fwd_flat.txt)
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
        tl.store(Z + offs, z.to(Z.dtype.element_ty), mask=mask)
    tl.store(Y + offs, _act(z, ACTIVATION).to(Y.dtype.element_ty), mask=mask)


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
            tl.store(Z + rows[:, None] * N + cols[None, :], z.to(Z.dtype.element_ty), mask=mask)
        y = _act(z, ACTIVATION)
        tl.store(Y + rows[:, None] * stride_ym + cols[None, :] * stride_yn, y.to(Y.dtype.element_ty), mask=mask)


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
            tl.store(DX + offs, dz.to(DX.dtype.element_ty), mask=mask)
        if WRITE_DR:
            tl.store(DR + offs, (alpha * dz).to(DR.dtype.element_ty), mask=mask)
        if HAS_BIAS:
            acc += tl.where(mask, dz, 0.0)
    if HAS_BIAS:
        tl.store(P + pid_m.to(tl.int64) * N + cols, tl.sum(acc, axis=0).to(P.dtype.element_ty), mask=col_mask)
        if last_to_arrive(COUNT + pid_n, grid_m):  # this column block's partials, summed in row order
            db = sum_partials(P, N, cols, col_mask, grid_m, BLOCK_P, BLOCK_N, ACC)
            tl.store(DB + cols * stride_db, db.to(DB.dtype.element_ty), mask=col_mask)


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _tile(M: int, N: int, elem_size: int, tile_bytes: int, col_bytes: int, vectors: int = 4) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): a ``tile_bytes`` tile per tensor, rows of at most ``col_bytes``."""
    tile_elems = max(16, tile_bytes // elem_size)
    block_n = min(next_power_of_2(N), tile_elems, max(16, col_bytes // elem_size))
    block_m = max(1, min(tile_elems // block_n, next_power_of_2(M)))
    return block_m, block_n, _warps(block_m * block_n * elem_size, vectors)


def _warps(tile_bytes: int, vectors: int) -> int:
    """num_warps for a tile of ``tile_bytes`` per tensor with ~``vectors`` 16-byte vectors per thread (a warp covers
    32 * 16 bytes per vector), a power of 2 up to :data:`MAX_WARPS`."""
    return max(1, min(MAX_WARPS, next_power_of_2(max(1, tile_bytes // (32 * 16 * vectors)))))


def _grid(M: int, N: int, block_m: int, block_n: int, sms: int, per_sm: int) -> tuple[int, int]:
    grid_n = cdiv(N, block_n)
    grid_m = min(cdiv(M, block_m), max(1, (sms * per_sm) // grid_n))
    return grid_m, grid_n


@functools.lru_cache(maxsize=1024)
def _fwd_plan(M: int, N: int, elem_size: int, sms: int, flat: bool) -> tuple[tuple[int, int], int, int, int]:
    """(grid, BLOCK_M, BLOCK_N, num_warps) of the forward kernel (cached: launch plans cost host time). ``flat``:
    contiguous operands, one ``FWD_FLAT_TILE_BYTES`` run of the flat ``[M*N]`` per program (BLOCK_M 1)."""
    if flat:
        block = max(16, FWD_FLAT_TILE_BYTES // elem_size)
        return (cdiv(M * N, block), 1), 1, block, _warps(block * elem_size, FWD_FLAT_VECTORS_PER_THREAD)
    block_m, block_n, num_warps = _tile(M, N, elem_size, FWD_TILE_BYTES, FWD_TILE_BYTES, FWD_VECTORS_PER_THREAD)
    return _grid(M, N, block_m, block_n, sms, FWD_PROGRAMS_PER_SM), block_m, block_n, num_warps


@functools.lru_cache(maxsize=1024)
def _bwd_plan(M: int, N: int, elem_size: int, sms: int) -> tuple:
    """(grid, BLOCK_M, BLOCK_N, num_warps, BLOCK_P) of the backward kernel."""
    # narrow column blocks: the [grid_m, N] fp32 bias partials shrink with grid_m = programs / grid_n
    block_m, block_n, num_warps = _tile(M, N, elem_size, BWD_TILE_BYTES, BWD_COL_BYTES)
    grid = _grid(M, N, block_m, block_n, sms, BWD_PROGRAMS_PER_SM)
    # the last program of a column block sums its grid_m partial rows in [BLOCK_P, BLOCK_N] steps
    return grid, block_m, block_n, num_warps, final_sum_rows(grid[0], block_n)


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the bias-grad partial sums: float32 (float64 for float64 gradients)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def bwd_partial_rows(M: int, N: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows of the fp32 partial-sum buffer ``[rows, N]`` that :func:`bias_act_bwd_` needs for the bias grad."""
    return _bwd_plan(M, N, dtype.itemsize, sm_count(device))[0][0]


def bias_grad_partials(M: int, N: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A ``partial`` buffer for one :func:`bias_act_bwd_` launch on the current stream: ``[bwd_partial_rows(...), N]``
    in :func:`partial_dtype`, scratch that later launches on the stream reuse (:func:`fuselab.ops._tickets.scratch`)."""
    return scratch(device, (bwd_partial_rows(M, N, dtype, device), N), partial_dtype(dtype))


def bias_act_fwd_(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    out: torch.Tensor,
    pre: torch.Tensor | None,
    alpha: float,
    activation: str,
) -> tuple | None:
    """``out = act(x + alpha*residual + bias)``; also ``pre = x + alpha*residual + bias`` when given.

    x, residual, out: ``[M, N]`` (any strides; ``out`` may be ``x`` for in place); pre: contiguous ``[M, N]``.
    Returns a record of the launch for :func:`bias_act_fwd_again` (None when there was nothing to launch).
    """
    M, N = x.shape
    if M == 0 or N == 0:
        return None
    assert pre is None or pre.is_contiguous()
    flat = FWD_FLAT and x.is_contiguous() and out.is_contiguous() and (residual is None or residual.is_contiguous())
    grid, block_m, block_n, num_warps = _fwd_plan(M, N, x.element_size(), sm_count(x.device), flat)
    r = residual if residual is not None else x
    # flat: the last block's offsets run up to grid * BLOCK_N - 1, past M*N
    int64 = needs_int64(x, residual, out, pre) or M * N > INT32_MAX or (flat and grid[0] * block_n > INT32_MAX)
    even = flat and (M * N) % block_n == 0
    tensors = (x, r, bias if bias is not None else x, out, pre if pre is not None else out)
    scalars = (float(alpha), M, N, *x.stride(), *r.stride(), bias.stride(0) if bias is not None else 0, *out.stride())
    flags = (ACT_IDS[activation], residual is not None, bias is not None, pre is not None, x.dtype, int64, flat, even)
    entry = launch(_bias_act_fwd_kernel, (flags, block_m, block_n, num_warps, STREAM_EVICTION), grid, tensors,
                   scalars, lambda: dict(ACTIVATION=flags[0], HAS_RESIDUAL=flags[1], HAS_BIAS=flags[2],
                                         SAVE_PRE=flags[3], ACC=_acc_dtype(x.dtype), INT64=int64, BLOCK_M=block_m,
                                         BLOCK_N=block_n, EVICT=STREAM_EVICTION, FLAT=flat, EVEN=even,
                                         num_warps=num_warps), dynamic=1)
    return entry, grid, scalars[1:]


def bias_act_fwd_again(record: tuple, x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                       out: torch.Tensor, pre: torch.Tensor | None, alpha: float) -> None:
    """The launch that :func:`bias_act_fwd_` returned ``record`` for, with new tensors and ``alpha``: no plan, no
    checks. The caller guarantees the same dtypes, 16-byte alignment, memory layout (sizes, strides, storage
    offsets) and operands (bias, residual, pre given or not) as that launch's; tensors may have any number of
    dims with that layout (only their addresses are passed)."""
    entry, grid, rest = record
    relaunch(entry, grid, (x, residual if residual is not None else x, bias if bias is not None else x, out,
                           pre if pre is not None else out), (alpha, *rest))


def bias_act_bwd_(
    grad: torch.Tensor,
    saved: torch.Tensor | None,
    shift: torch.Tensor | None,
    alpha: float,
    activation: str,
    grad_x: torch.Tensor | None,
    grad_residual: torch.Tensor | None,
    partial: torch.Tensor | None,
    grad_bias: torch.Tensor | None,
) -> tuple | None:
    """dz = grad * act'(saved [+ shift]); grad_x = dz, grad_residual = alpha*dz, grad_bias = dz summed over rows.

    grad, saved: ``[M, N]`` any strides; grad_x, grad_residual: contiguous ``[M, N]`` or None (not wanted);
    partial: contiguous fp32 ``[bwd_partial_rows(M, N, grad.dtype, device), N]`` and grad_bias ``[N]``, both
    or neither. ``saved`` is unused (may be None) for activation "none". ``shift`` ``[N]`` (or None) is added
    to ``saved`` to rebuild the pre-activation ``x + bias`` when ``x`` was saved instead of ``z``.

    Returns a record of the launch for :func:`bias_act_bwd_again` (None when there was nothing to launch).
    """
    M, N = grad.shape
    if (partial is None) != (grad_bias is None):
        raise ValueError("partial and grad_bias must be given together")
    if M == 0 or N == 0:
        if grad_bias is not None:
            grad_bias.zero_()
        return None
    for t in (grad_x, grad_residual):
        assert t is None or t.is_contiguous()
    grid, block_m, block_n, num_warps, block_p = _bwd_plan(M, N, grad.element_size(), sm_count(grad.device))
    want = partial_dtype(grad.dtype)
    if partial is not None and (tuple(partial.shape) != (grid[0], N) or partial.dtype != want
                                or not partial.is_contiguous()):
        raise ValueError(f"partial must be a contiguous {want} tensor of shape {(grid[0], N)}")
    s = saved if saved is not None else grad
    int64 = needs_int64(grad, s) or M * N > INT32_MAX
    has_bias = grad_bias is not None
    tensors = (grad, s, shift if shift is not None else grad, grad_x if grad_x is not None else grad,
               grad_residual if grad_residual is not None else grad, partial if has_bias else grad,
               grad_bias if has_bias else grad, ticket_counters(grad.device, grid[1]) if has_bias else grad)
    scalars = (float(alpha), M, N, *grad.stride(), *s.stride(), shift.stride(0) if shift is not None else 0,
               grad_bias.stride(0) if has_bias else 0)
    flags = (ACT_IDS[activation], shift is not None, grad_x is not None, grad_residual is not None,
             has_bias, grad.dtype, int64)
    entry = launch(_bias_act_bwd_kernel, (flags, block_m, block_n, num_warps, block_p, STREAM_EVICTION), grid,
                   tensors, scalars, lambda: dict(ACTIVATION=flags[0], HAS_SHIFT=flags[1], WRITE_DX=flags[2],
                                                  WRITE_DR=flags[3], HAS_BIAS=has_bias, ACC=_acc_dtype(grad.dtype),
                                                  INT64=int64, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_P=block_p,
                                                  EVICT=STREAM_EVICTION, num_warps=num_warps), dynamic=1)
    return entry, grid, scalars[1:], (grid[0], N), partial_dtype(grad.dtype) if has_bias else None


def bias_act_bwd_again(record: tuple, grad: torch.Tensor, saved: torch.Tensor | None, shift: torch.Tensor | None,
                       alpha: float, grad_x: torch.Tensor | None, grad_residual: torch.Tensor | None,
                       grad_bias: torch.Tensor | None) -> None:
    """The launch that :func:`bias_act_bwd_` returned ``record`` for, with new tensors and ``alpha``: no plan, no
    checks. The caller guarantees the same dtypes, 16-byte alignment and memory layout (sizes and strides) as
    that launch's tensors, and the same outputs wanted; tensors may have any number of dims with that layout.
    ``partial`` is scratch (:func:`bias_grad_partials`)."""
    entry, grid, rest, partial_shape, partial_type = record
    if partial_type is not None:
        device = grad.device
        partial, counters = scratch(device, partial_shape, partial_type), ticket_counters(device, grid[1])
    else:
        partial = counters = grad
    relaunch(entry, grid, (grad, saved if saved is not None else grad, shift if shift is not None else grad,
                           grad_x if grad_x is not None else grad, grad_residual if grad_residual is not None else grad,
                           partial, grad_bias if grad_bias is not None else grad, counters), (alpha, *rest))
