"""Validation, planning and out-param launchers of the dot-interaction kernels (:mod:`.kernels`).

Tuning knobs are a frozen :class:`InteractionTuning`, read through :func:`fuselab.ops.tuning.current` (or handed to a
launcher); :func:`plan` is memoized on everything it depends on, the tuning included. The launchers allocate
nothing: :func:`dot_interaction_fwd_` / :func:`dot_interaction_bwd_` check their operands, plan and launch;
:func:`launch_fwd` / :func:`launch_bwd` skip the checks and return a record of their launch that
:func:`launch_fwd_again` / :func:`launch_bwd_again` repeat on new tensors of the same layout (no plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.core.checks import FLOAT_DTYPES, require_ndim, require_tensor
from fuselab.core.device import cdiv, needs_int64, next_power_of_2
from fuselab.ops._launch import launch, relaunch
from fuselab.ops.interaction.kernels import dot_interaction_bwd_kernel, dot_interaction_fwd_kernel
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current
from fuselab.reference.interaction import MAX_DIM, MAX_FEATURES, num_pairs, output_width


@dataclass(frozen=True, eq=False)
class InteractionTuning:
    """Knobs of :func:`plan` (data, never module state; the launchers read them through
    :func:`fuselab.ops.tuning.current` unless given). Defaults: the fastest of an H100 sweep
    (``benchmarks/results/h100/interaction_sweep.txt``, ``docs/interaction.md``): one warp per program,
    two rows per forward program, one per backward program, float32 forward by outer products (four elements
    of D per step) up to D = 32."""

    #: batch rows one forward program handles at once (a leading dimension of every tile, one batched
    #: ``tl.dot``): more rows keep more loads in flight per program; a power of two
    rows_per_program: int = 2
    #: register budget of a forward program: rows x the larger tile (``BLOCK_V x max(BLOCK_V, BLOCK_D)``) stays
    #: within this many elements (fewer rows for large tiles, at least one)
    max_tile_elements: int = 2048
    #: the same two for the backward, whose ``S`` tile is a gather (a 64-bit address per element)
    bwd_rows_per_program: int = 1
    bwd_max_tile_elements: int = 2048
    #: largest tile of vectors (Gram tile ``BLOCK_V x BLOCK_V``); a power of two >= 16 (``tl.dot``'s minimum)
    max_block_v: int = 64
    #: largest chunk of the vector length D per ``tl.dot``; a power of two >= 16
    max_block_d: int = 64
    #: zero-padding columns written per store
    block_pad: int = 16
    #: warps of a program whose Gram tile is at most 32 x 32 (Kaggle: N = 27), and of one with a larger tile
    num_warps: int = 1
    num_warps_large: int = 4
    #: software-pipelining stages of the loops (more measured no faster)
    num_stages: int = 1
    #: compute with CUDA-core FMAs, one outer product per element of D (forward: ``v_I[:, d] v_J[:, d]ᵀ``, whose
    #: registers hold the Gram tile alone: rows x ``BLOCK_V²`` within ``max_tile_elements``; backward:
    #: ``S[:, I, j] v_j`` per vector ``j``) instead of ``tl.dot``; per dtype class (fp32, 16-bit), for D up to
    #: ``outer_max_dim`` (one D element per step: slower than ``tl.dot`` on long vectors)
    outer_max_dim: int = 32
    #: forward outer products four elements of D per step (one 16-byte load per vector and step, split in
    #: registers) instead of one
    outer4: bool = True
    fwd_outer_fp32: bool = True
    fwd_outer_lowp: bool = False
    bwd_outer_fp32: bool = False
    bwd_outer_lowp: bool = False

    def __post_init__(self) -> None:
        for name in ("max_block_v", "max_block_d", "block_pad"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"InteractionTuning.{name} must be a power of two >= 16, got {value}")
        for name in ("rows_per_program", "max_tile_elements", "bwd_rows_per_program", "bwd_max_tile_elements"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"InteractionTuning.{name} must be a power of two >= 1, got {value}")
        if self.outer_max_dim < 0:
            raise ValueError(f"InteractionTuning.outer_max_dim must be >= 0, got {self.outer_max_dim}")
        if min(self.num_warps, self.num_warps_large, self.num_stages) < 1:
            raise ValueError("InteractionTuning.num_warps, num_warps_large and num_stages must be >= 1")


DEFAULT_TUNING = InteractionTuning()


@dataclass(frozen=True)
class InteractionPlan:
    """Block sizes and compile-time flags of one launch."""

    rows: int
    block_v: int
    block_d: int
    block_pad: int
    num_warps: int
    num_stages: int
    lowp_dot: bool  # 16-bit operands straight to tl.dot (GPU); fp32 copies under the interpreter
    outer: bool  # CUDA-core outer products over D instead of tl.dot (kernels' OUTER)
    outer4: bool  # forward outer products four elements of D per step (kernels' OUTER4)
    out_bf16: bool  # bf16 output (stores round through fuselab.ops._rounding.rounded)


@memo(maxsize=256)
def plan(n_vec: int, dim: int, dtype: torch.dtype, on_gpu: bool, backward: bool,
         tuning: InteractionTuning = DEFAULT_TUNING) -> InteractionPlan:
    """The forward or backward launch of ``n_vec = F + 1`` vectors of length ``dim`` in ``dtype``."""
    block_v = min(max(16, next_power_of_2(n_vec)), tuning.max_block_v)
    block_d = min(max(16, next_power_of_2(dim)), tuning.max_block_d)
    lowp = dtype in (torch.bfloat16, torch.float16)
    tile = block_v * max(block_v, block_d)
    if backward:
        outer = tuning.bwd_outer_lowp if lowp else tuning.bwd_outer_fp32
        rows, budget = tuning.bwd_rows_per_program, tuning.bwd_max_tile_elements
    else:
        outer = tuning.fwd_outer_lowp if lowp else tuning.fwd_outer_fp32
        rows, budget = tuning.rows_per_program, tuning.max_tile_elements
    outer = outer and dim <= tuning.outer_max_dim
    if outer and not backward:
        tile = block_v * block_v
    return InteractionPlan(
        rows=max(1, min(rows, budget // tile)),
        block_v=block_v,
        block_d=block_d,
        block_pad=tuning.block_pad,
        num_warps=tuning.num_warps if block_v <= 32 else tuning.num_warps_large,
        num_stages=tuning.num_stages,
        lowp_dot=on_gpu and lowp,
        outer=outer,
        outer4=outer and tuning.outer4,
        out_bf16=dtype == torch.bfloat16,
    )


def check_inputs(dense: object, emb: object, pad_to: object = 1) -> None:
    """TypeError/ValueError naming the argument unless dense (B, D) and emb (B, F, D) are valid operands.

    Rules: tensors of one floating dtype (float32, bfloat16, float16; float64 too, which only the PyTorch path
    runs), on one device; ``1 <= F <=`` :data:`MAX_FEATURES`, ``1 <= D <=`` :data:`MAX_DIM`; ``pad_to`` an int >= 1.
    """
    require_tensor("dense", dense)
    require_tensor("emb", emb)
    for name, t in (("dense", dense), ("emb", emb)):
        if t.dtype not in (*FLOAT_DTYPES, torch.float64):
            raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if dense.dtype != emb.dtype:
        raise TypeError(f"dense and emb must have the same dtype, got {dense.dtype} and {emb.dtype} "
                        "(cast one of them first)")
    if dense.device != emb.device:
        raise ValueError(f"dense is on {dense.device} but emb is on {emb.device}; both must share a device")
    require_ndim("dense", dense, 2, "(B, D)")
    require_ndim("emb", emb, 3, "(B, F, D)")
    b, f, d = emb.shape
    if dense.shape[0] != b:
        raise ValueError(f"dense has {dense.shape[0]} rows but emb has {b}; both need the batch size B first")
    if dense.shape[1] != d:
        raise ValueError(f"dense's width D={dense.shape[1]} must equal emb's vector length D={d} (emb (B, F, D))")
    if not 1 <= f <= MAX_FEATURES:
        raise ValueError(f"emb must have 1 <= F <= {MAX_FEATURES} features (emb (B, F, D)), got F={f}")
    if not 1 <= d <= MAX_DIM:
        raise ValueError(f"the vector length D must be in [1, {MAX_DIM}], got D={d}")
    if isinstance(pad_to, bool) or not isinstance(pad_to, int):
        raise TypeError(f"pad_to must be an int, got {type(pad_to).__name__}")
    if pad_to < 1:
        raise ValueError(f"pad_to must be >= 1, got {pad_to}")


def _require_out(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> None:
    require_tensor(name, t)
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {shape} on {device}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def _triton_dtype_ok(t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"the Triton kernels take float32, bfloat16 or float16, got {t.dtype} "
                        "(float64 runs on the PyTorch path: FUSELAB_BACKEND=torch)")


def dot_interaction_fwd_(dense: torch.Tensor, emb: torch.Tensor, out: torch.Tensor, self_interaction: bool,
                         tuning: InteractionTuning | None = None) -> tuple | None:
    """Write ``[dense, pairs, zeros]`` into ``out`` (B, W), any strides; W fixes the padding (W >= D + P).
    ``tuning``: None for :func:`fuselab.ops.tuning.current`'s. Returns :func:`launch_fwd`'s record."""
    check_inputs(dense, emb)
    b, f, d = emb.shape
    pairs = num_pairs(f, self_interaction)
    require_tensor("out", out)
    if out.dim() != 2 or out.shape[0] != b or out.shape[1] < d + pairs:
        raise ValueError(f"out must be (B={b}, W >= {d + pairs}), got {tuple(out.shape)}")
    _require_out("out", out, (b, out.shape[1]), dense.dtype, dense.device)
    return launch_fwd(dense, emb, out, bool(self_interaction), tuning)


def launch_fwd(dense: torch.Tensor, emb: torch.Tensor, out: torch.Tensor, self_interaction: bool,
               tuning: InteractionTuning | None = None) -> tuple | None:
    """:func:`dot_interaction_fwd_` without its checks (but the dtype's), for callers that made them (the op):
    one launch through :func:`fuselab.ops._launch.launch` (the compiled kernel's own launcher after the first call
    of a signature). Returns the record of the launch for :func:`launch_fwd_again` (None for an empty batch:
    nothing launched)."""
    _triton_dtype_ok(dense)
    b, f, d = emb.shape
    if b == 0:
        return None
    p = plan(f + 1, d, dense.dtype, dense.is_cuda, False, current(InteractionTuning) if tuning is None else tuning)
    tiles = cdiv(f + 1, p.block_v)
    wide = needs_int64(dense, emb, out)
    grid = (cdiv(b, p.rows), tiles, tiles)
    scalars = (b, f + 1, d, num_pairs(f, self_interaction), out.shape[1], *dense.stride(), *emb.stride(),
               *out.stride())
    entry = launch(
        dot_interaction_fwd_kernel, (p, self_interaction, wide), grid, (dense, emb, out), scalars,
        lambda: dict(ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d, BLOCK_PAD=p.block_pad, SELF=self_interaction,
                     LOWP_DOT=p.lowp_dot, OUT_BF16=p.out_bf16, ONE_TILE=tiles == 1, WIDE=wide, OUTER=p.outer,
                     OUTER4=p.outer4, num_warps=p.num_warps, num_stages=p.num_stages),
    )
    return entry, grid, scalars


def launch_fwd_again(record: tuple, dense: torch.Tensor, emb: torch.Tensor, out: torch.Tensor) -> None:
    """The launch that :func:`launch_fwd` returned ``record`` for, on new tensors: no checks, no plan. The caller
    guarantees the same shapes, dtypes, strides and 16-byte alignment as that launch's tensors."""
    entry, grid, scalars = record
    relaunch(entry, grid, (dense, emb, out), scalars)


def dot_interaction_bwd_(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor, grad_dense: torch.Tensor,
                         grad_emb: torch.Tensor, self_interaction: bool,
                         tuning: InteractionTuning | None = None) -> tuple | None:
    """Write the gradients of dense (B, D) and emb (B, F, D) from ``grad`` (B, W >= D + P, inputs' dtype, any
    strides; columns past D + P are not read) into ``grad_dense`` and ``grad_emb`` (any strides). Returns
    :func:`launch_bwd`'s record."""
    check_inputs(dense, emb)
    b, f, d = emb.shape
    pairs = num_pairs(f, self_interaction)
    require_tensor("grad", grad)
    if grad.dim() != 2 or grad.shape[0] != b or grad.shape[1] < d + pairs:
        raise ValueError(f"grad must be (B={b}, W >= {d + pairs}), got {tuple(grad.shape)}")
    _require_out("grad", grad, (b, grad.shape[1]), dense.dtype, dense.device)
    _require_out("grad_dense", grad_dense, (b, d), dense.dtype, dense.device)
    _require_out("grad_emb", grad_emb, (b, f, d), emb.dtype, emb.device)
    return launch_bwd(grad, dense, emb, grad_dense, grad_emb, bool(self_interaction), tuning)


def launch_bwd(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor, grad_dense: torch.Tensor,
               grad_emb: torch.Tensor, self_interaction: bool, tuning: InteractionTuning | None = None) -> tuple | None:
    """:func:`dot_interaction_bwd_` without its checks (but the dtype's), for callers that made them (the op's
    backward). Returns the record of the launch for :func:`launch_bwd_again` (None for an empty batch)."""
    _triton_dtype_ok(dense)
    b, f, d = emb.shape
    if b == 0:
        return None
    p = plan(f + 1, d, dense.dtype, dense.is_cuda, True, current(InteractionTuning) if tuning is None else tuning)
    wide = needs_int64(grad, dense, emb, grad_dense, grad_emb)
    grid = (cdiv(b, p.rows), cdiv(f + 1, p.block_v), cdiv(d, p.block_d))
    scalars = (b, f + 1, d, *grad.stride(), *dense.stride(), *emb.stride(), *grad_dense.stride(),
               *grad_emb.stride())
    entry = launch(
        dot_interaction_bwd_kernel, (p, self_interaction, wide), grid, (grad, dense, emb, grad_dense, grad_emb),
        scalars,
        lambda: dict(ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d, SELF=self_interaction, LOWP_DOT=p.lowp_dot,
                     OUT_BF16=p.out_bf16, WIDE=wide, OUTER=p.outer, num_warps=p.num_warps, num_stages=p.num_stages),
    )
    return entry, grid, scalars


def launch_bwd_again(record: tuple, grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor,
                     grad_dense: torch.Tensor, grad_emb: torch.Tensor) -> None:
    """The launch that :func:`launch_bwd` returned ``record`` for, on new tensors of the same layout (on the
    autograd engine's thread, where every Python step costs several times its main-thread time)."""
    entry, grid, scalars = record
    relaunch(entry, grid, (grad, dense, emb, grad_dense, grad_emb), scalars)


__all__ = ["DEFAULT_TUNING", "InteractionPlan", "InteractionTuning", "check_inputs", "dot_interaction_bwd_",
           "dot_interaction_fwd_", "launch_bwd", "launch_bwd_again", "launch_fwd", "launch_fwd_again", "output_width",
           "plan"]
