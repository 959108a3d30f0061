"""Tuning, plans and the out-param launcher of the GEMM family (kernel: :func:`fuselab.ops.gemm.kernels._gemm_kernel`).

One launch computes ``C = epilogue(prologue(A) · B)`` for ``A`` ``[P, R]`` and ``B`` ``[R, Q]`` given as views with
those logical shapes (a transposed operand is a ``.t()`` view: the kernel reads through the strides).
:class:`~fuselab.ops.gemm.spec.GemmSpec` is what the plan depends on (sizes, dtype, device, the prologue's and
epilogue's flags, the TMA eligibility of the operands): hashable, no tensors. :func:`plan` turns it into a
:class:`~fuselab.ops.gemm.spec.GemmPlan` (tile config by shape rules read from
:class:`~fuselab.ops.gemm.spec.GemmTuning`, split of the reduction, grid, constexprs); :func:`gemm_` launches a plan
on :class:`~fuselab.ops.gemm.spec.GemmOperands`. Nothing here validates or allocates outputs (the ops do), except the
split's scratch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import triton.language as tl

from fuselab.core.device import cdiv, next_power_of_2, sm_count, tma_capable
from fuselab.ops._launch import TensorDescriptor
from fuselab.ops._launch import launch as launch_kernel
from fuselab.ops._tickets import final_sum_rows, scratch, ticket_counters
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current

from .kernels import _cast_update_kernel, _gemm_kernel
from .pass_kernel import _pass_kernel
from .spec import (
    SMEM_BUDGET,
    CastStep,
    GemmOperands,
    GemmPlan,
    GemmSpec,
    GemmTuning,
    PassPlan,
    PassSpec,
    RopeArgs,
    RopeSpec,
    TileConfig,
)

__all__ = ["SMEM_BUDGET", "GemmOperands", "GemmPlan", "GemmSpec", "GemmTuning", "PassPlan", "PassSpec", "RopeArgs",
           "RopeSpec", "TileConfig", "cast_update", "choose_tile", "gemm_", "pass_", "pass_plan", "plan", "spec_of",
           "tma_mode", "with_flags"]

#: elements per program of :func:`cast_update`
CAST_BLOCK = 2048
#: programs per SM of the elementwise pass (its column sums: one partial row per program along M, which the last
#: program of a column block adds in steps of 64 rows)
PASS_PROGRAMS_PER_SM = 4
#: elements of one tile of the elementwise pass (``block_m x block_n``: 32 per thread of its 8 warps)
PASS_TILE = 8192
#: elements of one tile of the pass's rotation: its two column tiles and their cos and sin, pipelined in shared
#: memory, fit four programs per SM at 16 x 128 (one H100: 64 x 128 ran at 0.7 TB/s, 16 x 128 at 1.3-2.2;
#: ``benchmarks/notes/gemm.md``, section "The rotation in the pass")
PASS_ROPE_TILE = 2048


# ---------------------------------------------------------------------------------------------- specs
def tma_mode(t: torch.Tensor, device_ok: bool) -> int:
    """How a 2-D operand view can be read through a TMA descriptor: 1 as it is (unit column stride), 2 through its
    transpose (unit row stride), 0 not at all (16-byte aligned base and row stride required, no zero strides)."""
    if not device_ok or t.dim() != 2 or t.data_ptr() % 16 or 0 in t.stride():
        return 0
    size = t.element_size()
    s0, s1 = t.stride()
    if s1 == 1 and (s0 * size) % 16 == 0:
        return 1
    if s0 == 1 and (s1 * size) % 16 == 0:
        return 2
    return 0


def spec_of(ops: GemmOperands, **flags: Any) -> GemmSpec:
    """The :class:`GemmSpec` of a launch on ``ops`` with ``flags`` (GemmSpec's flag fields)."""
    a, b = ops.a, ops.b
    tma_ok = current(GemmTuning).tma and a.dtype != torch.float64 and tma_capable(a.device)
    big = [t for t in (a, b, ops.c, ops.s, ops.g0, ops.x0, ops.res, ops.kept, ops.aout) if t is not None]
    int64 = any(_reach(t) > 2**31 - 1 for t in big)
    return GemmSpec(p=a.shape[0], q=b.shape[1], r=a.shape[1], dtype=a.dtype, device=a.device, int64=int64,
                    a_tma=tma_mode(a, tma_ok), b_tma=tma_mode(b, tma_ok), **flags)


def _reach(t: torch.Tensor) -> int:
    """Largest element offset reachable through ``t``'s strides, from its data pointer."""
    return sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


# ---------------------------------------------------------------------------------------------- plans
def choose_tile(spec: GemmSpec, tuning: GemmTuning) -> TileConfig:
    """The tile config of ``spec`` by the shape rules (see :class:`~fuselab.ops.gemm.spec.GemmTuning`; the wide tile
    only for operands read through TMA, pointer loads of 128x256 tiles spill; weight gradients with large outputs
    take the forward's tiles), fitted to the problem: blocks no
    larger than the next power of 2 of each size (16 at least), wide enough for a RoPE pair group, few warps for
    tiles of fewer than 128 rows, stages within :data:`SMEM_BUDGET`."""
    if tuning.force is not None:
        cfg = tuning.force
    elif (spec.dtype == torch.float32 and not spec.tf32) or spec.dtype == torch.float64:
        cfg = tuning.fp32
    elif spec.n_along_p and spec.p * spec.q < tuning.wide_min_p * tuning.wide_min_q:
        cfg = tuning.weight_grad
    elif spec.q <= tuning.narrow_max_q:
        cfg = tuning.narrow
    elif (spec.q >= tuning.wide_min_q and spec.p >= tuning.wide_min_p and spec.a_tma and spec.b_tma
          and not spec.lora_rank and spec.rope is None and not spec.x0 and not spec.residual
          and not register_operand(spec)):
        cfg = tuning.wide
    else:
        cfg = tuning.large
    bp = min(cfg.block_p, max(16, next_power_of_2(spec.p)))
    bq = min(cfg.block_q, max(16, next_power_of_2(spec.q)))
    br = min(cfg.block_r, max(16, next_power_of_2(spec.r)))
    if spec.rope is not None:
        bq = max(bq, 2 * spec.rope.pair_stride)
    if spec.pro_rope is not None:
        if spec.n_along_p:
            bp = max(bp, 2 * spec.pro_rope.pair_stride)
        else:  # wide reduction steps: fewer rows, so that the rotation's layout conversions fit beside the stages
            br = max(br, 2 * spec.pro_rope.pair_stride)
            bp = min(bp, 64) if br >= 128 else bp
    warps = cfg.warps if bp >= 128 else min(cfg.warps, 4)  # one warpgroup per 64 rows of the MMA
    item = 4 if spec.dtype in (torch.float32, torch.float64) else 2
    per_stage = (bp * br + br * bq) * item
    rotates = spec.rope is not None or spec.pro_rope is not None
    scratch = 6 * bp * max(bq, br) if rotates else 0  # the rotation's fp32 tiles through shared memory, 1.5 of one
    stages = max(1, min(cfg.stages, (SMEM_BUDGET - scratch) // per_stage))
    return TileConfig(bp, bq, br, warps, stages, cfg.group)


def _dot_types(spec: GemmSpec) -> tuple:
    """(DOT, ACC, PRECISION) constexprs: the operand dtype of tl.dot (fp32 under the interpreter, whose dot cannot
    take bf16), the accumulator dtype and the fp32 input precision (tf32 or ieee; None for 16-bit operands)."""
    if spec.dtype == torch.float64:
        return tl.float64, tl.float64, "ieee"
    if spec.device.type != "cuda" or spec.dtype == torch.float32:
        return tl.float32, tl.float32, "tf32" if spec.tf32 and spec.device.type == "cuda" else "ieee"
    return (tl.bfloat16 if spec.dtype == torch.bfloat16 else tl.float16), tl.float32, None


def register_operand(spec: GemmSpec) -> bool:
    """Whether the launch's A operand is computed in registers (a prologue) before the MMA: its MMA then runs
    synchronously (``SYNC_DOT``; see :func:`fuselab.ops.gemm.kernels._k_step`)."""
    return bool(spec.pro_act or spec.pro_mask or spec.pro_x0 or spec.pro_rope is not None or spec.write_a)


def _split(spec: GemmSpec, tile: TileConfig, tuning: GemmTuning, programs: int) -> tuple[int, int]:
    """(split, reduction steps per split): a split of the reduction when the output has fewer tiles than the grid
    has programs (a power of 2, at most ``max_split``, at least ``min_split_steps`` steps each)."""
    k_full = spec.r // tile.block_r
    n_tiles = cdiv(spec.p, tile.block_p) * cdiv(spec.q, tile.block_q)
    split = 1
    if not spec.lora_rank and not spec.write_a:
        limit = min(tuning.max_split, programs // max(n_tiles, 1), k_full // max(tuning.min_split_steps, 1))
        while split * 2 <= limit:
            split *= 2
    return split, cdiv(k_full, split) if k_full else 0


@memo(maxsize=1024)
def _plan(spec: GemmSpec, tuning: GemmTuning) -> GemmPlan:
    tile = choose_tile(spec, tuning)
    programs = sm_count(spec.device) * tuning.programs_per_sm
    split, k_per_split = _split(spec, tile, tuning, programs)
    n_units = cdiv(spec.p, tile.block_p) * cdiv(spec.q, tile.block_q) * split
    dot, acc, precision = _dot_types(spec)
    rope = spec.rope or spec.pro_rope or RopeSpec(1, 1, 2, 0, False)
    cx = dict(
        BP=tile.block_p, BQ=tile.block_q, BR=tile.block_r, GROUP=tile.group, SPLIT=split,
        EVEN_R=spec.r % tile.block_r == 0, EVEN_P=spec.p % tile.block_p == 0, EVEN_Q=spec.q % tile.block_q == 0,
        DOT=dot, ACC=acc, PRECISION=precision, INT64=spec.int64,
        A_DESC=spec.a_tma > 0, A_DESC_T=spec.a_tma == 2, B_DESC=spec.b_tma > 0, B_DESC_T=spec.b_tma == 2,
        PRO_ACT=spec.pro_act, PRO_MASK=spec.pro_mask, PRO_X0=spec.pro_x0, PRO_ROPE=spec.pro_rope is not None,
        N_ALONG_P=spec.n_along_p, ROW_SUM=spec.row_sum, WRITE_A=spec.write_a, LORA=spec.lora_rank > 0,
        RANK_B=max(16, next_power_of_2(spec.lora_rank)), HAS_BIAS=spec.bias, EPI_X0=spec.x0, HAS_RES=spec.residual,
        EPI_ROPE=spec.rope is not None, KEEP=spec.keep, ACT=spec.act, ROPE_PS=rope.pair_stride, ROPE_HALF=rope.half,
        HEAD_DIM=rope.head_dim, USE_TABLE=rope.use_table, POS_MODE=rope.pos_mode, SEARCH_STEPS=rope.search_steps,
        NUM_STAGES=tile.stages, FLATTEN=tuning.flatten, WARP_SPEC=tuning.warp_specialize and spec.a_tma > 0,
        SYNC_DOT=register_operand(spec), num_warps=tile.warps, num_stages=tile.stages)
    return GemmPlan(spec, tile, split, k_per_split, (max(1, min(n_units, programs)),), tuple(cx.items()))


def plan(spec: GemmSpec) -> GemmPlan:
    """The launch plan of ``spec`` under the tuning in force (memoized)."""
    return _plan(spec, current(GemmTuning))


def with_flags(spec: GemmSpec, **flags: Any) -> GemmSpec:
    """``spec`` with some flags changed (a backward launch derived from a forward spec)."""
    return replace(spec, **flags)


# ---------------------------------------------------------------------------------------------- launch
def _descriptor(t: torch.Tensor, mode: int, rows: int, cols: int):
    """The TMA descriptor of operand view ``t`` (mode 1: of t with box [rows, cols]; 2: of t.T, box [cols, rows])."""
    if mode == 1:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, cols])
    tt = t.t()
    return TensorDescriptor(tt, list(tt.shape), list(tt.stride()), [cols, rows])


def _strides(t: torch.Tensor | None, n: int = 2) -> tuple[int, ...]:
    if t is None:
        return (0,) * n
    return tuple(t.stride()) if n == 2 else (t.stride(0),)


def _rope_scalars(rope: RopeArgs | None, r: RopeSpec | None) -> tuple:
    """(n_table, s_ct, s_cf, s_st, s_sf, rot_cols, div_b, mod_b, div_s, mod_s, s_pb, s_ps, n_seq) of a rotation."""
    if rope is None or r is None:
        return (1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1)
    cos, sin, pos = rope.cos, rope.sin, rope.positions
    n_seq = rope.cu_seqlens.shape[0] - 1 if rope.cu_seqlens is not None else 1
    return (cos.shape[0] if cos is not None else 1, *_strides(cos), *_strides(sin), r.rot_cols, rope.div_b,
            rope.mod_b, rope.div_s, rope.mod_s, *_strides(pos), n_seq)


def gemm_(p: GemmPlan, ops: GemmOperands) -> None:
    """Launch plan ``p`` on ``ops`` (outputs written in place; the split's partials and tickets are scratch)."""
    spec, tile = p.spec, p.tile
    dev = ops.a.device
    c = ops.c
    a = _descriptor(ops.a, spec.a_tma, tile.block_p, tile.block_r) if spec.a_tma else ops.a
    b = _descriptor(ops.b, spec.b_tma, tile.block_r, tile.block_q) if spec.b_tma else ops.b
    acc_dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
    if p.split > 1:
        ws = scratch(dev, (p.split, spec.p, spec.q), acc_dtype)
        dbs = scratch(dev, (p.split, spec.p), acc_dtype) if spec.row_sum else c
        count = ticket_counters(dev, p.n_tiles)
    else:
        ws = dbs = count = c
    rope = ops.rope or RopeArgs()

    def arg(t: torch.Tensor | None) -> torch.Tensor:
        return c if t is None else t

    tensors = (c, a, b, arg(ops.bias), arg(ops.x0), arg(ops.res), arg(ops.kept), arg(ops.l1), arg(ops.l2),
               arg(ops.t), arg(ops.s), arg(ops.g0), arg(ops.aout), arg(ops.db), ws, dbs, count, arg(rope.cos),
               arg(rope.sin), arg(rope.freq), arg(rope.positions), arg(rope.offsets), arg(rope.cu_seqlens))
    s_sp, s_sr = _strides(ops.s) if not spec.pro_mask else (ops.s.stride(0), 0)
    scalars = (float(ops.alpha), float(ops.lora_scale), int(rope.offset), float(rope.mscale),
               spec.p, spec.q, spec.r, p.k_per_split, *c.stride(), *ops.a.stride(), *ops.b.stride(),
               *_strides(ops.bias, 1), *_strides(ops.x0), *_strides(ops.res), *_strides(ops.kept, 1),
               *_strides(ops.l1), *_strides(ops.l2), s_sp, s_sr, *_strides(ops.g0), spec.lora_rank,
               *_rope_scalars(ops.rope, spec.rope or spec.pro_rope))
    launch_kernel(_gemm_kernel, p.constexprs, p.grid, tensors, scalars, dict(p.constexprs), dynamic=4)


def cast_update(master: torch.Tensor, grad: torch.Tensor, low: torch.Tensor, state: torch.Tensor | None,
                lr_tensor: torch.Tensor | None, step: CastStep) -> None:
    """Launch the master-weight update (:func:`~fuselab.ops.gemm.kernels._cast_update_kernel`) on contiguous
    tensors of one size: ``lr_tensor`` (read on the device) or ``step.lr``."""
    n = master.numel()
    cx = dict(ADAGRAD=step.optimizer == "adagrad", LR_TENSOR=lr_tensor is not None, DECAY=step.weight_decay != 0.0,
              BLOCK=CAST_BLOCK, num_warps=4)
    tensors = (master, grad, low, master if state is None else state, master if lr_tensor is None else lr_tensor)
    launch_kernel(_cast_update_kernel, tuple(cx.items()), (cdiv(n, CAST_BLOCK),), tensors,
                  (float(step.lr), float(step.eps), float(step.weight_decay), n), cx, dynamic=3)


# ---------------------------------------------------------------------------------------------- elementwise pass
@memo(maxsize=256)
def pass_plan(spec: PassSpec) -> PassPlan:
    """The launch plan of the elementwise pass: column blocks of up to 128 (a RoPE pair group at least), ``block_m``
    rows per step, :data:`PASS_PROGRAMS_PER_SM` programs per SM in all."""
    if spec.rope is not None and (spec.pro_act or spec.pro_mask or spec.pro_x0):
        raise ValueError("the elementwise pass rotates without a prologue: no pro_act, pro_mask or pro_x0 with rope")
    if (spec.dx0 or spec.copy) and (spec.rope is not None or spec.pro_act or spec.pro_mask):
        raise ValueError("the elementwise pass writes dx0 and the copy beside the DCN multiplier only: no rope, "
                         "pro_act or pro_mask")
    bn = min(128, max(16, next_power_of_2(spec.n)))
    if spec.rope is not None:
        bn = max(bn, 2 * spec.rope.pair_stride)
    # three or more [M, N] inputs pipelined (the DCN backward's g, x0, u and dx0): half-height tiles keep three
    # programs per SM in shared memory (64 x 128 with four inputs: 128 KiB, one program)
    inputs = 1 + (spec.pro_act != 0) + spec.pro_x0 + spec.dx0 + spec.dx0_acc
    tile = PASS_ROPE_TILE if spec.rope is not None else PASS_TILE // 2 if inputs >= 3 else PASS_TILE
    bm = max(16, min(64, tile // bn))
    col_blocks = cdiv(spec.n, bn)
    along_m = max(1, min(cdiv(spec.m, bm), cdiv(PASS_PROGRAMS_PER_SM * sm_count(spec.device), col_blocks)))
    rows = cdiv(cdiv(spec.m, along_m), bm) * bm
    along_m = cdiv(spec.m, rows)
    rope = spec.rope or RopeSpec(1, 1, 2, 0, False)
    acc = tl.float64 if spec.dtype == torch.float64 else tl.float32
    cx = dict(BM=bm, BN=bn, ACC=acc, INT64=spec.int64, PRO_ACT=spec.pro_act, PRO_MASK=spec.pro_mask,
              PRO_X0=spec.pro_x0, ROPE=spec.rope is not None, CONJ=spec.conj, ROPE_PS=rope.pair_stride,
              ROPE_HALF=rope.half, HEAD_DIM=rope.head_dim, USE_TABLE=rope.use_table, POS_MODE=rope.pos_mode,
              SEARCH_STEPS=rope.search_steps, WRITE=spec.write, COL_SUM=spec.col_sum,
              SUM_ROWS=final_sum_rows(along_m, bn), DX0_OUT=spec.dx0,
              DX0_ACC=spec.dx0_acc, DX0_PLUS_A=spec.dx0_plus_a, COPY_OUT=spec.copy, num_warps=8)
    return PassPlan(spec, rows, (along_m, col_blocks), tuple(cx.items()))


def pass_(p: PassPlan, a: torch.Tensor, out: torch.Tensor | None = None, *, s: torch.Tensor | None = None,
          g0: torch.Tensor | None = None, db: torch.Tensor | None = None, rope: RopeArgs | None = None,
          dx0: torch.Tensor | None = None, copy: torch.Tensor | None = None) -> None:
    """Launch plan ``p`` of the elementwise pass on ``a`` ``[M, N]``: ``out`` (unit column stride; None: in place, in
    ``a`` of unit column stride) gets the operand after the prologue (kept ``s``: y / z ``[M, N]`` or ReLU bits;
    DCN multiplier ``g0``; the rotation of ``rope``), ``db`` ``[N]`` its column sums; ``dx0`` the operand times the
    kept pre-product ``s``, ``copy`` the operand as read (both with ``out``'s strides)."""
    spec = p.spec
    dev = a.device
    arg = a if out is None else out
    for side in (dx0, copy):
        if side is not None and side.stride() != arg.stride():
            raise ValueError(f"the pass's side outputs take the output's strides {arg.stride()}, got {side.stride()}")
    if spec.col_sum:
        ws = scratch(dev, (p.grid[0], spec.n), db.dtype)
        count = ticket_counters(dev, p.grid[1])
    else:
        ws = count = arg
    rope = rope or RopeArgs()
    s_sm, s_sn = (s.stride(0), 0) if spec.pro_mask else _strides(s)
    tensors = (arg, a, a if s is None else s, a if g0 is None else g0, arg if dx0 is None else dx0,
               arg if copy is None else copy, ws, arg if db is None else db, count,
               *(a if t is None else t for t in (rope.cos, rope.sin, rope.freq, rope.positions, rope.offsets,
                                                  rope.cu_seqlens)))
    scalars = (int(rope.offset), float(rope.mscale), spec.m, spec.n, p.rows_per_program,
               arg.stride(0), *a.stride(), s_sm, s_sn, *_strides(g0),
               *_rope_scalars(rope, spec.rope))
    launch_kernel(_pass_kernel, p.constexprs, p.grid, tensors, scalars, dict(p.constexprs), dynamic=2)

