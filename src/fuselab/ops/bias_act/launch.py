"""Plans and out-param launchers of the fused bias + scaled residual + activation (kernels:
:mod:`fuselab.ops.bias_act.kernels`).

Forward, one pass:  read x, residual (M·N each), bias (N) -> write y (M·N) [+ pre-activation z (M·N)].
Backward, one pass: read grad_y + saved (M·N each) -> write grad_x, grad_residual (M·N each, those asked for) + fp32
partial column sums of dz ([grid_m, N]) summed by the last program of each column block into the bias gradient.
Tensors are 2-D ``[M, N]`` views with arbitrary strides; the caller allocates every output (out-params).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from fuselab.core.activations import ACTIVATION_CODES
from fuselab.core.device import INT32_MAX, cdiv, needs_int64, next_power_of_2, sm_count
from fuselab.ops._launch import launch, relaunch
from fuselab.ops._tickets import final_sum_rows, scratch, ticket_counters
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current

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
def _fwd_plan(M: int, N: int, elem_size: int, sms: int, flat: bool,
              tuning: BiasActTuning) -> tuple[tuple[int, int], int, int, int]:
    """(grid, BLOCK_M, BLOCK_N, num_warps) of the forward kernel (cached: launch plans cost host time). ``flat``:
    contiguous operands, one ``fwd_flat_tile_bytes`` run of the flat ``[M*N]`` per program (BLOCK_M 1)."""
    if flat:
        block = max(16, tuning.fwd_flat_tile_bytes // elem_size)
        return ((cdiv(M * N, block), 1), 1, block,
                _warps(block * elem_size, tuning.fwd_flat_vectors_per_thread, tuning.max_warps))
    block_m, block_n, num_warps = _tile(M, N, elem_size, tuning.fwd_tile_bytes, tuning.fwd_tile_bytes,
                                        tuning.fwd_vectors_per_thread, tuning.max_warps)
    return _grid(M, N, block_m, block_n, sms, tuning.fwd_programs_per_sm), block_m, block_n, num_warps


@memo(maxsize=1024)
def _bwd_plan(M: int, N: int, elem_size: int, sms: int, tuning: BiasActTuning) -> tuple:
    """(grid, BLOCK_M, BLOCK_N, num_warps, BLOCK_P) of the backward kernel."""
    # narrow column blocks: the [grid_m, N] fp32 bias partials shrink with grid_m = programs / grid_n
    block_m, block_n, num_warps = _tile(M, N, elem_size, tuning.bwd_tile_bytes, tuning.bwd_col_bytes, 4,
                                        tuning.max_warps)
    grid = _grid(M, N, block_m, block_n, sms, tuning.bwd_programs_per_sm)
    # the last program of a column block sums its grid_m partial rows in [BLOCK_P, BLOCK_N] steps
    return grid, block_m, block_n, num_warps, final_sum_rows(grid[0], block_n)


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the bias-grad partial sums: float32 (float64 for float64 gradients)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def bwd_partial_rows(M: int, N: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows of the fp32 partial-sum buffer ``[rows, N]`` that :func:`bias_act_bwd_` needs for the bias grad."""
    return _bwd_plan(M, N, dtype.itemsize, sm_count(device), current(BiasActTuning))[0][0]


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
    tuning = current(BiasActTuning)
    flat = (tuning.fwd_flat and x.is_contiguous() and out.is_contiguous()
            and (residual is None or residual.is_contiguous()))
    grid, block_m, block_n, num_warps = _fwd_plan(M, N, x.element_size(), sm_count(x.device), flat, tuning)
    r = residual if residual is not None else x
    # flat: the last block's offsets run up to grid * BLOCK_N - 1, past M*N
    int64 = needs_int64(x, residual, out, pre) or M * N > INT32_MAX or (flat and grid[0] * block_n > INT32_MAX)
    even = flat and (M * N) % block_n == 0
    tensors = (x, r, bias if bias is not None else x, out, pre if pre is not None else out)
    scalars = (float(alpha), M, N, *x.stride(), *r.stride(), bias.stride(0) if bias is not None else 0, *out.stride())
    flags = (ACTIVATION_CODES[activation], residual is not None, bias is not None, pre is not None, x.dtype, int64,
             flat, even)
    evict = tuning.stream_eviction
    entry = launch(_bias_act_fwd_kernel, (flags, block_m, block_n, num_warps, evict), grid, tensors,
                   scalars, lambda: dict(ACTIVATION=flags[0], HAS_RESIDUAL=flags[1], HAS_BIAS=flags[2],
                                         SAVE_PRE=flags[3], ACC=_acc_dtype(x.dtype), INT64=int64, BLOCK_M=block_m,
                                         BLOCK_N=block_n, EVICT=evict, FLAT=flat, EVEN=even,
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
    tuning = current(BiasActTuning)
    grid, block_m, block_n, num_warps, block_p = _bwd_plan(M, N, grad.element_size(), sm_count(grad.device), tuning)
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
    flags = (ACTIVATION_CODES[activation], shift is not None, grad_x is not None, grad_residual is not None,
             has_bias, grad.dtype, int64)
    evict = tuning.stream_eviction
    entry = launch(_bias_act_bwd_kernel, (flags, block_m, block_n, num_warps, block_p, evict), grid,
                   tensors, scalars, lambda: dict(ACTIVATION=flags[0], HAS_SHIFT=flags[1], WRITE_DX=flags[2],
                                                  WRITE_DR=flags[3], HAS_BIAS=has_bias, ACC=_acc_dtype(grad.dtype),
                                                  INT64=int64, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_P=block_p,
                                                  EVICT=evict, num_warps=num_warps), dynamic=1)
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
