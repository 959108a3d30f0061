"""Plans and launches of the dot-interaction kernels (:mod:`.kernels`) for validated calls (:mod:`.checks`).

:func:`plan` / :func:`forward` (the forward op: allocate ``(B, W)``, one launch) and :func:`plan_backward` /
:func:`backward` (the backward op: allocate both gradients, one launch); each plan holds its
:class:`~fuselab.ops._launch.Launch` (None for an empty batch or the PyTorch path, which the forwards run from
:mod:`fuselab.reference.interaction`). Tuning knobs are a frozen :class:`InteractionTuning`, read through
:func:`fuselab.ops.tuning.current` when a plan is made; :func:`blocks` is memoized on everything it depends on, the
tuning included. :func:`dot_interaction_fwd_` / :func:`dot_interaction_bwd_` check their operands and launch once
into given outputs of any strides (a tuning of their own: the sweeps and the tests of tiled launches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.core.device import cdiv, needs_int64, next_power_of_2
from fuselab.ops._launch import Launch
from fuselab.ops.interaction.kernels import dot_interaction_bwd_kernel, dot_interaction_fwd_kernel
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current
from fuselab.reference import interaction as ref
from fuselab.reference.interaction import num_pairs

from . import checks
from .checks import InteractionCall, InteractionGradCall


@dataclass(frozen=True, eq=False)
class InteractionTuning:
    """Knobs of :func:`blocks` (data, never module state; the plans read them through
    :func:`fuselab.ops.tuning.current`, the out-param launchers may be given their own). Defaults: the fastest of an
    H100 sweep (``benchmarks/results/h100/interaction_sweep.txt``, ``docs/interaction.md``): one warp per program,
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
class InteractionBlocks:
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
def blocks(n_vec: int, dim: int, dtype: torch.dtype, on_gpu: bool, backward: bool,
           tuning: InteractionTuning = DEFAULT_TUNING) -> InteractionBlocks:
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
    return InteractionBlocks(
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


@dataclass(frozen=True, eq=False)
class InteractionPlan:
    """A planned forward: its call and its launch into a fresh ``(B, call.width)`` output (None: an empty batch, or
    the PyTorch path)."""

    call: InteractionCall
    launch: Launch | None


@dataclass(frozen=True, eq=False)
class InteractionGradPlan:
    """A planned backward: its call and its launch into fresh contiguous gradients (None: an empty batch, or the
    PyTorch path). A gradient of another dtype than the inputs' is cast to theirs first."""

    call: InteractionGradCall
    launch: Launch | None


# ---------------------------------------------------------------------------------------------- launches
def _forward_launch(self_interaction: bool, dense: torch.Tensor, emb: torch.Tensor, out: torch.Tensor,
                    tuning: InteractionTuning) -> Launch:
    """The forward launch writing ``out`` (its strides: a given tensor, or a meta tensor laid out as planned)."""
    b, f, d = emb.shape
    p = blocks(f + 1, d, dense.dtype, dense.is_cuda, False, tuning)
    tiles = cdiv(f + 1, p.block_v)
    wide = needs_int64(dense, emb, out)
    scalars = (b, f + 1, d, num_pairs(f, self_interaction), out.shape[1], *dense.stride(), *emb.stride(),
               *out.stride())
    return Launch(dot_interaction_fwd_kernel, (cdiv(b, p.rows), tiles, tiles), scalars,
                  dict(ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d, BLOCK_PAD=p.block_pad, SELF=self_interaction,
                       LOWP_DOT=p.lowp_dot, OUT_BF16=p.out_bf16, ONE_TILE=tiles == 1, WIDE=wide, OUTER=p.outer,
                       OUTER4=p.outer4, num_warps=p.num_warps, num_stages=p.num_stages))


def _backward_launch(self_interaction: bool, grad: torch.Tensor, inputs: tuple[torch.Tensor, torch.Tensor],
                     grads: tuple[torch.Tensor, torch.Tensor], tuning: InteractionTuning) -> Launch:
    """The backward launch reading ``grad`` and ``inputs`` = (dense, emb), writing ``grads`` = (grad_dense,
    grad_emb) (given tensors, or meta tensors laid out as planned)."""
    dense, emb = inputs
    b, f, d = emb.shape
    p = blocks(f + 1, d, dense.dtype, dense.is_cuda, True, tuning)
    wide = needs_int64(grad, dense, emb, *grads)
    scalars = (b, f + 1, d, *grad.stride(), *dense.stride(), *emb.stride(), *grads[0].stride(), *grads[1].stride())
    return Launch(dot_interaction_bwd_kernel, (cdiv(b, p.rows), cdiv(f + 1, p.block_v), cdiv(d, p.block_d)), scalars,
                  dict(ROWS=p.rows, BLOCK_V=p.block_v, BLOCK_D=p.block_d, SELF=self_interaction, LOWP_DOT=p.lowp_dot,
                       OUT_BF16=p.out_bf16, WIDE=wide, OUTER=p.outer, num_warps=p.num_warps, num_stages=p.num_stages))


# ---------------------------------------------------------------------------------------------- the ops
def plan(call: InteractionCall, operands: tuple) -> InteractionPlan:
    """The forward of ``operands`` = (dense, emb) into a contiguous ``(B, call.width)`` output."""
    dense, emb = operands
    if not call.triton or emb.shape[0] == 0:
        return InteractionPlan(call, None)
    out = torch.empty((emb.shape[0], call.width), dtype=dense.dtype, device="meta")
    return InteractionPlan(call, _forward_launch(call.self_interaction, dense, emb, out, current(InteractionTuning)))


def forward(plan: InteractionPlan, operands: tuple) -> torch.Tensor:
    """``[dense, pairs, zeros]`` of ``operands`` = (dense, emb): ``(B, W)`` contiguous in their dtype."""
    dense, emb = operands
    call = plan.call
    if not call.triton:
        with torch.no_grad():
            return ref.dot_interaction(dense, emb, call.self_interaction, call.pad_to)
    out = torch.empty((dense.shape[0], call.width), dtype=dense.dtype, device=dense.device)
    if plan.launch is not None:
        plan.launch((dense, emb, out))
    return out


def plan_backward(call: InteractionGradCall, operands: tuple) -> InteractionGradPlan:
    """The backward of ``operands`` = (grad, dense, emb); a gradient of another dtype is read as its cast."""
    grad, dense, emb = operands
    if not call.triton or emb.shape[0] == 0:
        return InteractionGradPlan(call, None)
    if grad.dtype != dense.dtype:  # the cast's layout (what backward() reads): torch.Tensor.to keeps dense strides
        grad = torch.empty_like(grad, dtype=dense.dtype, device="meta")
    grads = (torch.empty(dense.shape, dtype=dense.dtype, device="meta"),
             torch.empty(emb.shape, dtype=emb.dtype, device="meta"))
    return InteractionGradPlan(call, _backward_launch(call.self_interaction, grad, (dense, emb), grads,
                                                      current(InteractionTuning)))


def backward(plan: InteractionGradPlan, operands: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_dense (B, D), grad_emb (B, F, D)) contiguous in the inputs' dtype, from ``operands`` = (grad (B, W),
    dense, emb); the padding columns of grad are not read."""
    grad, dense, emb = operands
    if grad.dtype != dense.dtype:  # e.g. an upstream op that returned float32 for a bf16 output
        grad = grad.to(dense.dtype)
    if not plan.call.triton:
        with torch.no_grad():
            return ref.dot_interaction_backward(grad, dense, emb, plan.call.self_interaction)
    grad_dense = torch.empty(dense.shape, dtype=dense.dtype, device=dense.device)
    grad_emb = torch.empty(emb.shape, dtype=emb.dtype, device=emb.device)
    if plan.launch is not None:
        plan.launch((grad, dense, emb, grad_dense, grad_emb))
    return grad_dense, grad_emb


# ---------------------------------------------------------------------------------------------- out-param launchers
def dot_interaction_fwd_(dense: torch.Tensor, emb: torch.Tensor, out: torch.Tensor, self_interaction: bool,
                         tuning: InteractionTuning | None = None) -> None:
    """Write ``[dense, pairs, zeros]`` into ``out`` (B, W), any strides; W fixes the padding (W >= D + P).
    ``tuning``: None for :func:`fuselab.ops.tuning.current`'s. Raises as :func:`fuselab.dot_interaction`, and for
    an ``out`` of another shape, dtype or device."""
    checks.check_forward_out(dense, emb, out, self_interaction)
    if emb.shape[0]:
        _forward_launch(bool(self_interaction), dense, emb, out,
                        current(InteractionTuning) if tuning is None else tuning)((dense, emb, out))


def dot_interaction_bwd_(grad: torch.Tensor, dense: torch.Tensor, emb: torch.Tensor, grad_dense: torch.Tensor,
                         grad_emb: torch.Tensor, self_interaction: bool,
                         tuning: InteractionTuning | None = None) -> None:
    """Write the gradients of dense (B, D) and emb (B, F, D) from ``grad`` (B, W >= D + P, inputs' dtype, any
    strides; columns past D + P are not read) into ``grad_dense`` and ``grad_emb`` (any strides)."""
    checks.check_backward_outs(grad, dense, emb, (grad_dense, grad_emb), self_interaction)
    if emb.shape[0]:
        _backward_launch(bool(self_interaction), grad, (dense, emb), (grad_dense, grad_emb),
                         current(InteractionTuning) if tuning is None else tuning)(
            (grad, dense, emb, grad_dense, grad_emb))


__all__ = ["DEFAULT_TUNING", "InteractionBlocks", "InteractionGradPlan", "InteractionPlan", "InteractionTuning",
           "backward", "blocks", "dot_interaction_bwd_", "dot_interaction_fwd_", "forward", "plan", "plan_backward"]
