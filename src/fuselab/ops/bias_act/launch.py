"""Plans and launches of the fused bias + scaled residual + activation (kernels: :mod:`fuselab.ops.bias_act.kernels`)
for validated calls (:mod:`fuselab.ops.bias_act.checks`): :func:`plan` and :func:`forward` (out of place),
:func:`forward_inplace`, :func:`plan_grad` and :func:`forward_grad` (the backward); :func:`write` and
:func:`write_grad` launch a plan into outputs the caller allocated (``FusedLinear`` runs the epilogue in place on
its matmul output).

Forward, one pass:  read x, residual (M·N each), bias (N) -> write y (M·N) [+ pre-activation z (M·N)].
Backward, one pass: read grad_y + saved (M·N each) -> write grad_x, grad_residual (M·N each, those asked for) + fp32
partial column sums of dz ([grid_m, N]) summed by the last program of each column block into the bias gradient.
Tensors are read as 2-D ``[M, N]`` rows with their own strides; a tensor whose leading dims cannot be merged into
rows without a copy is copied by ``reshape`` on every call (planned so). The kernels take addresses, so a tensor of
any number of dims is passed as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from fuselab.core.activations import ACTIVATION_CODES
from fuselab.core.checks import rows
from fuselab.core.device import INT32_MAX, cdiv, needs_int64, next_power_of_2, sm_count
from fuselab.ops._launch import Launch
from fuselab.ops._tickets import final_sum_rows, scratch, ticket_counters
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current

from .checks import BiasActCall, BiasActGradCall
from .kernels import _bias_act_bwd_kernel, _bias_act_fwd_kernel


@dataclass(frozen=True, eq=False)
class BiasActTuning:
    """The planners' knobs (:func:`fuselab.ops.tuning.override` changes them for a sweep); the measurements behind
    them: ``benchmarks/notes/bias_act.md#launcher-knobs``.

    The forward runs one tile per program (``fwd_programs_per_sm`` caps the grid); the backward runs few programs
    that accumulate their bias partials over many tiles. ``bwd_col_bytes``: the backward's column block per row.
    ``fwd_vectors_per_thread``: 16-byte vectors per thread per tensor in a forward tile (it sets num_warps from the
    tile bytes). ``fwd_flat``: forward of contiguous operands as flat runs of ``fwd_flat_tile_bytes`` per tensor,
    ``fwd_flat_vectors_per_thread`` vectors per thread, one run per program, as Inductor's pointwise kernels.
    ``stream_eviction``: eviction hint of the streamed (read-once) loads; Triton's default (""), since the kernels
    write as much as they read; the bias row is loaded "evict_last".
    """

    fwd_tile_bytes: int = 16384
    bwd_tile_bytes: int = 8192
    fwd_programs_per_sm: int = 256
    bwd_programs_per_sm: int = 4
    bwd_col_bytes: int = 256
    max_warps: int = 8
    fwd_vectors_per_thread: int = 4
    fwd_flat: bool = True
    fwd_flat_tile_bytes: int = 4096
    fwd_flat_vectors_per_thread: int = 2
    stream_eviction: str = ""


@dataclass(frozen=True)
class Tiles:
    """The work split of one launch: grid, rows and columns per tile, warps; the backward's ``block_p``: partial rows
    per step of its final column sum."""

    grid: tuple[int, int]
    block_m: int
    block_n: int
    warps: int
    block_p: int = 1


@dataclass(frozen=True, eq=False)
class BiasActPlan:
    """A planned forward (out of place or in place): its call, its launch (None: nothing to compute), and whether x
    and the residual are copied into rows on every call (``copy_x``, ``copy_residual``: leading dims that do not
    merge). Outputs: ``y`` contiguous of x's shape (and ``z`` when the call saves it), or x itself in place."""

    call: BiasActCall
    launch: Launch | None
    copy_x: bool = False
    copy_residual: bool = False


@dataclass(frozen=True, eq=False)
class BiasActGradPlan:
    """A planned backward: its call, its launch (None: nothing to compute, the bias gradient is zeros), whether the
    gradient and the saved tensor are copied into rows on every call, and the bias gradient's partial sums
    (``partial_rows`` x N in ``partial_dtype``, scratch) and ticket counters (``column_blocks``)."""

    call: BiasActGradCall
    launch: Launch | None
    copy_grad: bool = False
    copy_saved: bool = False
    partial_rows: int = 0
    partial_dtype: torch.dtype = torch.float32
    column_blocks: int = 0


def _acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _tile(M: int, N: int, elem_size: int, tile_bytes: int, col_bytes: int, vectors: int,
          max_warps: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): a ``tile_bytes`` tile per tensor, rows of at most ``col_bytes``."""
    tile_elems = max(16, tile_bytes // elem_size)
    block_n = min(next_power_of_2(N), tile_elems, max(16, col_bytes // elem_size))
    block_m = max(1, min(tile_elems // block_n, next_power_of_2(M)))
    return block_m, block_n, _warps(block_m * block_n * elem_size, vectors, max_warps)


def _warps(tile_bytes: int, vectors: int, max_warps: int) -> int:
    """num_warps for a tile of ``tile_bytes`` per tensor with ~``vectors`` 16-byte vectors per thread (a warp covers
    32 * 16 bytes per vector), a power of 2 up to ``max_warps``."""
    return max(1, min(max_warps, next_power_of_2(max(1, tile_bytes // (32 * 16 * vectors)))))


def _grid(M: int, N: int, block_m: int, block_n: int, sms: int, per_sm: int) -> tuple[int, int]:
    grid_n = cdiv(N, block_n)
    grid_m = min(cdiv(M, block_m), max(1, (sms * per_sm) // grid_n))
    return grid_m, grid_n


@memo(maxsize=1024)
def forward_tiles(M: int, N: int, elem_size: int, sms: int, flat: bool, tuning: BiasActTuning) -> Tiles:
    """The forward kernel's work split. ``flat``: contiguous operands, one ``fwd_flat_tile_bytes`` run of the flat
    ``[M*N]`` per program (BLOCK_M 1)."""
    if flat:
        block = max(16, tuning.fwd_flat_tile_bytes // elem_size)
        return Tiles((cdiv(M * N, block), 1), 1, block,
                     _warps(block * elem_size, tuning.fwd_flat_vectors_per_thread, tuning.max_warps))
    block_m, block_n, num_warps = _tile(M, N, elem_size, tuning.fwd_tile_bytes, tuning.fwd_tile_bytes,
                                        tuning.fwd_vectors_per_thread, tuning.max_warps)
    return Tiles(_grid(M, N, block_m, block_n, sms, tuning.fwd_programs_per_sm), block_m, block_n, num_warps)


@memo(maxsize=1024)
def backward_tiles(M: int, N: int, elem_size: int, sms: int, tuning: BiasActTuning) -> Tiles:
    """The backward kernel's work split."""
    # narrow column blocks: the [grid_m, N] fp32 bias partials shrink with grid_m = programs / grid_n
    block_m, block_n, num_warps = _tile(M, N, elem_size, tuning.bwd_tile_bytes, tuning.bwd_col_bytes, 4,
                                        tuning.max_warps)
    grid = _grid(M, N, block_m, block_n, sms, tuning.bwd_programs_per_sm)
    # the last program of a column block sums its grid_m partial rows in [BLOCK_P, BLOCK_N] steps
    return Tiles(grid, block_m, block_n, num_warps, final_sum_rows(grid[0], block_n))


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the bias-grad partial sums: float32 (float64 for float64 gradients)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def bwd_partial_rows(M: int, N: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows of the partial-sum buffer ``[rows, N]`` of a backward of ``[M, N]`` gradients."""
    return backward_tiles(M, N, dtype.itemsize, sm_count(device), current(BiasActTuning)).grid[0]


def _as_rows(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``t`` as rows and whether that took a copy (see :func:`~fuselab.core.checks.rows`)."""
    t2 = rows(t)
    return t2, t2.data_ptr() != t.data_ptr()


# ---------------------------------------------------------------------------------------------- forward
def plan(call: BiasActCall, operands: tuple) -> BiasActPlan:
    """The forward launch of ``call`` on ``operands`` = (x, bias, residual, alpha): into a contiguous y (and z) of
    x's shape, or into x in place (through a contiguous buffer when x's rows are a copy)."""
    x, bias, residual = operands[0], operands[1], operands[2]
    if x.numel() == 0:
        return BiasActPlan(call, None)
    x2, copy_x = _as_rows(x)
    r2, copy_residual = _as_rows(residual) if residual is not None else (x2, False)
    M, N = x2.shape
    out_strides = x2.stride() if call.inplace and not copy_x else (N, 1)
    tuning = current(BiasActTuning)
    flat = (tuning.fwd_flat and x2.is_contiguous() and out_strides == (N, 1)
            and (residual is None or r2.is_contiguous()))
    tiles = forward_tiles(M, N, x.element_size(), sm_count(x.device), flat, tuning)
    # flat: the last block's offsets run up to grid * BLOCK_N - 1, past M*N
    int64 = (needs_int64(x2, None if residual is None else r2) or M * N > INT32_MAX
             or (flat and tiles.grid[0] * tiles.block_n > INT32_MAX))
    scalars = (M, N, *x2.stride(), *r2.stride(), bias.stride(0) if bias is not None else 0, *out_strides)
    constexprs = dict(ACTIVATION=ACTIVATION_CODES[call.activation], HAS_RESIDUAL=residual is not None,
                      HAS_BIAS=bias is not None, SAVE_PRE=call.save_pre, ACC=_acc_dtype(x.dtype), INT64=int64,
                      BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, EVICT=tuning.stream_eviction, FLAT=flat,
                      EVEN=flat and (M * N) % tiles.block_n == 0, num_warps=tiles.warps)
    return BiasActPlan(call, Launch(_bias_act_fwd_kernel, tiles.grid, scalars, constexprs), copy_x, copy_residual)


def forward(plan: BiasActPlan, operands: tuple) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(y, z or None)`` of ``operands`` as planned: fresh tensors of x's shape, contiguous."""
    x = operands[0]
    y = x.new_empty(x.shape)
    pre = x.new_empty(x.shape) if plan.call.save_pre else None
    write(plan, operands, y, pre)
    return y, pre


def forward_inplace(plan: BiasActPlan, operands: tuple) -> torch.Tensor:
    """x of ``operands`` overwritten with the result as planned (x's rows that are a copy: computed into a buffer,
    copied back); returns x."""
    x = operands[0]
    if plan.copy_x:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        write(plan, operands, out, None)
        x.copy_(out)
    else:
        write(plan, operands, x, None)
    return x


def write(plan: BiasActPlan, operands: tuple, y: torch.Tensor, pre: torch.Tensor | None) -> None:
    """``y = act(x + alpha * residual + bias)`` (and ``pre = x + alpha * residual + bias``) of ``operands`` = (x,
    bias, residual, alpha), launched as planned: ``y`` and ``pre`` laid out as the plan's outputs (contiguous of x's
    shape; ``y`` may be x itself where the plan is in place, or a contiguous x)."""
    launch = plan.launch
    if launch is None:
        return
    x, bias, residual, alpha = operands
    if plan.copy_x:
        x = rows(x)
    if plan.copy_residual:
        residual = rows(residual)
    launch((x, x if residual is None else residual, x if bias is None else bias, y, y if pre is None else pre),
           (alpha,))


# ---------------------------------------------------------------------------------------------- backward
def plan_grad(call: BiasActGradCall, operands: tuple) -> BiasActGradPlan:
    """The backward launch of ``call`` on ``operands`` = (grad, saved, shift, alpha): gradients of x and the
    residual contiguous of grad's shape, the bias gradient ``(N,)``."""
    grad, saved, shift = operands[0], operands[1], operands[2]
    if grad.numel() == 0:  # no rows (the bias gradient sums none: zeros) or an empty last dim
        return BiasActGradPlan(call, None)
    g2, copy_grad = _as_rows(grad)
    s2, copy_saved = _as_rows(saved) if saved is not None else (g2, False)
    M, N = g2.shape
    tuning = current(BiasActTuning)
    tiles = backward_tiles(M, N, grad.element_size(), sm_count(grad.device), tuning)
    int64 = needs_int64(g2, s2) or M * N > INT32_MAX
    scalars = (M, N, *g2.stride(), *s2.stride(), shift.stride(0) if shift is not None else 0, 1)
    constexprs = dict(ACTIVATION=ACTIVATION_CODES[call.activation], HAS_SHIFT=shift is not None,
                      WRITE_DX=call.want_x, WRITE_DR=call.want_residual, HAS_BIAS=call.want_bias,
                      ACC=_acc_dtype(grad.dtype), INT64=int64, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                      BLOCK_P=tiles.block_p, EVICT=tuning.stream_eviction, num_warps=tiles.warps)
    return BiasActGradPlan(call, Launch(_bias_act_bwd_kernel, tiles.grid, scalars, constexprs), copy_grad,
                           copy_saved, tiles.grid[0], partial_dtype(grad.dtype), tiles.grid[1])


def forward_grad(plan: BiasActGradPlan, operands: tuple) -> tuple:
    """``(grad_x, grad_residual, grad_bias)`` of ``operands`` as planned, None for those not wanted."""
    grad = operands[0]
    call, device = plan.call, grad.device
    gx = torch.empty(grad.shape, dtype=call.x_dtype, device=device) if call.want_x else None
    gr = torch.empty(grad.shape, dtype=call.residual_dtype, device=device) if call.want_residual else None
    gb = torch.empty(grad.shape[-1], dtype=call.bias_dtype, device=device) if call.want_bias else None
    write_grad(plan, operands, gx, gr, gb)
    return gx, gr, gb


def write_grad(plan: BiasActGradPlan, operands: tuple, gx: torch.Tensor | None, gr: torch.Tensor | None,
               gb: torch.Tensor | None, partial: torch.Tensor | None = None) -> None:
    """The backward of ``operands`` = (grad, saved, shift, alpha) into ``gx``, ``gr`` (contiguous of grad's shape)
    and ``gb`` (``(N,)``, contiguous), those the plan's call wants; ``partial``: the bias gradient's partial sums
    (contiguous ``[bwd_partial_rows, N]`` in :func:`partial_dtype`; default: per-stream scratch). ``saved`` is
    unused (may be None) for activation "none"; ``shift`` ``(N,)`` (or None) is added to it to rebuild ``z = x +
    bias`` when x was saved instead of z."""
    launch = plan.launch
    if launch is None:
        if gb is not None:
            gb.zero_()
        return
    grad, saved, shift, alpha = operands
    if plan.copy_grad:
        grad = rows(grad)
    if plan.copy_saved:
        saved = rows(saved)
    if gb is not None:
        device = grad.device
        if partial is None:
            partial = scratch(device, (plan.partial_rows, grad.shape[-1]), plan.partial_dtype)
        counters = ticket_counters(device, plan.column_blocks)
    else:
        partial = counters = grad
    launch((grad, grad if saved is None else saved, grad if shift is None else shift, grad if gx is None else gx,
            grad if gr is None else gr, partial, grad if gb is None else gb, counters), (alpha,))
