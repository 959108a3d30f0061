"""Validation, planning and out-param launchers of the dot-interaction kernels (:mod:`.kernels`).

Tuning knobs are a frozen :class:`InteractionTuning` handed to :func:`plan`; the plan is cached on everything it
depends on, the tuning included. The launchers allocate nothing: they check their operands, plan and launch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fuselab.core.checks import FLOAT_DTYPES, require_ndim, require_tensor
from fuselab.core.device import cdiv, needs_int64, next_power_of_2
from fuselab.reference.interaction import MAX_DIM, MAX_FEATURES, num_pairs, output_width


@dataclass(frozen=True)
class InteractionTuning:
    """Knobs of :func:`plan` (defaults: not yet tuned on a GPU; they are data, never module state)."""

    #: batch rows one forward program handles at once (a leading dimension of every tile, one batched
    #: ``tl.dot``): more rows keep more loads in flight per program; a power of two
    rows_per_program: int = 4
    #: register budget of a forward program: rows x the larger tile (``BLOCK_V x max(BLOCK_V, BLOCK_D)``) stays
    #: within this many elements (fewer rows for large tiles, at least one)
    max_tile_elements: int = 4096
    #: the same two for the backward, whose ``S`` tile is a gather (a 64-bit address per element): ptxas
    #: (Triton 3.6, sm_90, 4 warps) gives the Kaggle tile 128 registers at 2 rows, 200 at 4
    bwd_rows_per_program: int = 2
    bwd_max_tile_elements: int = 2048
    #: largest tile of vectors (Gram tile ``BLOCK_V x BLOCK_V``); a power of two >= 16 (``tl.dot``'s minimum)
    max_block_v: int = 64
    #: largest chunk of the vector length D per ``tl.dot``; a power of two >= 16
    max_block_d: int = 64
    #: zero-padding columns written per store
    block_pad: int = 16
    #: warps of a program whose Gram tile is at most 32 x 32 (Kaggle: N = 27), and of one with a larger tile
    num_warps: int = 4
    num_warps_large: int = 8
    #: software-pipelining stages of the loops. 1: ptxas (Triton 3.6, sm_90) then fits every tile in registers
    #: without spilling (3: the fp32 backward spills from 32 x 32 tiles on, and the Kaggle tiles take 2-3x the
    #: registers); occupancy hides the load latency instead
    num_stages: int = 1

    def __post_init__(self) -> None:
        for name in ("max_block_v", "max_block_d", "block_pad"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"InteractionTuning.{name} must be a power of two >= 16, got {value}")
        for name in ("rows_per_program", "max_tile_elements", "bwd_rows_per_program", "bwd_max_tile_elements"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"InteractionTuning.{name} must be a power of two >= 1, got {value}")
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
    out_bf16: bool  # round bf16 stores to nearest even with integer ops (see kernels.round_to_bf16_rtne)


@functools.cache
def plan(n_vec: int, dim: int, dtype: torch.dtype, on_gpu: bool, backward: bool,
         tuning: InteractionTuning = DEFAULT_TUNING) -> InteractionPlan:
    """The forward or backward launch of ``n_vec = F + 1`` vectors of length ``dim`` in ``dtype``."""
    block_v = min(max(16, next_power_of_2(n_vec)), tuning.max_block_v)
    block_d = min(max(16, next_power_of_2(dim)), tuning.max_block_d)
    rows, budget = ((tuning.bwd_rows_per_program, tuning.bwd_max_tile_elements) if backward
                    else (tuning.rows_per_program, tuning.max_tile_elements))
    return InteractionPlan(
        rows=max(1, min(rows, budget // (block_v * max(block_v, block_d)))),
        block_v=block_v,
        block_d=block_d,
        block_pad=tuning.block_pad,
        num_warps=tuning.num_warps if block_v <= 32 else tuning.num_warps_large,
        num_stages=tuning.num_stages,
        lowp_dot=on_gpu and dtype in (torch.bfloat16, torch.float16),
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
                         tuning: InteractionTuning = DEFAULT_TUNING) -> None:
    """Write ``[dense, pairs, zeros]`` into ``out`` (B, W), any strides; W fixes the padding (W >= D + P)."""
    from fuselab.ops.interaction.kernels import dot_interaction_fwd_kernel

    check_inputs(dense, emb)
    _triton_dtype_ok(dense)
    b, f, d = emb.shape
    pairs = num_pairs(f, self_interaction)
    require_tensor("out", out)
    if out.dim() != 2 or out.shape[0] != b or out.shape[1] < d + pairs:
        raise ValueError(f"out must be (B={b}, W >= {d + pairs}), got {tuple(out.shape)}")
    _require_out("out", out, (b, out.shape[1]), dense.dtype, dense.device)
    if b == 0:
        return
    p = plan(f + 1, d, dense.dtype, dense.device.type == "cuda", False, tuning)
    tiles = cdiv(f + 1, p.block_v)
    grid = (cdiv(b, p.rows), tiles, tiles)
    dot_interaction_fwd_kernel[grid](
        dense, emb, out, b, f + 1, d, pairs, out.shape[1],
        *dense.stride(), *emb.stride(), *out.stride(),
        ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d, BLOCK_PAD=p.block_pad,
        SELF=bool(self_interaction), LOWP_DOT=p.lowp_dot, OUT_BF16=p.out_bf16, ONE_TILE=tiles == 1,
        WIDE=needs_int64(dense, emb, out), num_warps=p.num_warps, num_stages=p.num_stages,
    )


def dot_interaction_bwd_(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor, grad_dense: torch.Tensor,
                         grad_emb: torch.Tensor, self_interaction: bool,
                         tuning: InteractionTuning = DEFAULT_TUNING) -> None:
    """Write the gradients of dense (B, D) and emb (B, F, D) from ``grad`` (B, W >= D + P, inputs' dtype, any
    strides; columns past D + P are not read) into ``grad_dense`` and ``grad_emb`` (any strides)."""
    from fuselab.ops.interaction.kernels import dot_interaction_bwd_kernel

    check_inputs(dense, emb)
    _triton_dtype_ok(dense)
    b, f, d = emb.shape
    pairs = num_pairs(f, self_interaction)
    require_tensor("grad", grad)
    if grad.dim() != 2 or grad.shape[0] != b or grad.shape[1] < d + pairs:
        raise ValueError(f"grad must be (B={b}, W >= {d + pairs}), got {tuple(grad.shape)}")
    _require_out("grad", grad, (b, grad.shape[1]), dense.dtype, dense.device)
    _require_out("grad_dense", grad_dense, (b, d), dense.dtype, dense.device)
    _require_out("grad_emb", grad_emb, (b, f, d), emb.dtype, emb.device)
    if b == 0:
        return
    p = plan(f + 1, d, dense.dtype, dense.device.type == "cuda", True, tuning)
    grid = (cdiv(b, p.rows), cdiv(f + 1, p.block_v), cdiv(d, p.block_d))
    dot_interaction_bwd_kernel[grid](
        grad, dense, emb, grad_dense, grad_emb, b, f + 1, d,
        *grad.stride(), *dense.stride(), *emb.stride(), *grad_dense.stride(), *grad_emb.stride(),
        ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d,
        SELF=bool(self_interaction), LOWP_DOT=p.lowp_dot, OUT_BF16=p.out_bf16,
        WIDE=needs_int64(grad, dense, emb, grad_dense, grad_emb), num_warps=p.num_warps, num_stages=p.num_stages,
    )


__all__ = ["DEFAULT_TUNING", "InteractionPlan", "InteractionTuning", "check_inputs", "dot_interaction_bwd_",
           "dot_interaction_fwd_", "output_width", "plan"]
