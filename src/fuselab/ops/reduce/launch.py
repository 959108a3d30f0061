"""Plan and launch of ``fuselab.sum``/``fuselab.mean`` for a validated call (:mod:`fuselab.ops.reduce.checks`):
:func:`plan` (the layout, copy or not, and the :class:`~fuselab.ops.reduce.plan.ReduceSchedule` of
:mod:`fuselab.ops.reduce.plan` as one kernel launch of :mod:`fuselab.ops.reduce.kernels`), and :func:`forward`,
which allocates the output and launches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from fuselab.core.device import INT32_MAX, cdiv, needs_int64, sm_count
from fuselab.ops._launch import Launch, TensorDescriptor
from fuselab.ops._tickets import final_sum_rows, scratch, ticket_counters
from fuselab.ops.tuning import current

from . import plan as planner
from .checks import ReduceCall
from .kernels import _cols_kernel, _cols_tma_kernel, _rows_kernel
from .plan import ReduceSchedule, ReduceTuning, workspace_numel

#: registers of one SM (every GPU fuselab targets, sm_80 to sm_90), for the register cap of stealing grids
REGISTERS_PER_SM = 65536


@dataclass(frozen=True, eq=False)
class ReducePlan:
    """A planned reduction: its call; ``copy``: x is read through one copy in ``(kept..., reduced...)`` order
    (:func:`~fuselab.ops.reduce.plan.prepare`), made on every call; the ``schedule`` and its one ``launch``;
    ``tma``: the launch reads through a TMA descriptor of the input, built on every call; ``workspace``: accumulator
    elements of the split partials (0: no second stage), ``counters``: the ticket counters it takes (0: none)."""

    call: ReduceCall
    copy: bool
    schedule: ReduceSchedule
    launch: Launch
    tma: bool
    workspace: int
    counters: int


def steal_maxnreg(schedule: ReduceSchedule, sms: int) -> int:
    """Register cap under which all ``schedule.steal`` programs of a stealing schedule are resident at once on ``sms``
    SMs (a grid larger than what fits would run a second, partial wave: the imbalance stealing is there to remove):
    registers per SM over the threads the grid puts on each SM, in the allocation's steps of 8."""
    warps_per_sm = schedule.num_warps * cdiv(schedule.steal, sms)
    return min(255, REGISTERS_PER_SM // (warps_per_sm * 32) // 8 * 8)


def plan(call: ReduceCall, operands: tuple) -> ReducePlan:
    """The launch of ``call`` on ``operands`` = ``(x,)`` (non-empty), into a contiguous output of ``call.out_shape``."""
    x = operands[0]
    src, kept, red = planner.prepare(x, call.dims)
    s = planner.plan_reduction(src, kept, red)
    t = current(ReduceTuning)
    split = s.split > 1
    int64 = needs_int64(src) or s.K * s.split > INT32_MAX or (s.steal > 0 and t.steal_int64)
    tma = s.stages > 0 and src.data_ptr() % 16 == 0  # else the cols kernel runs the same schedule from pointers
    # s.block_i outputs per tile: rows of the rows kernel, columns of the cols kernel
    common = dict(SPLIT_R=split, ACC=tl.float64 if call.acc_dtype == torch.float64 else tl.float32,
                  BLOCK_S=final_sum_rows(s.split, s.block_i) if split else 1, IS_MEAN=call.is_mean,
                  num_warps=s.num_warps)
    if tma:
        launch = Launch(_cols_tma_kernel, s.grid, (s.I, s.R, s.r_per_split, s.R),
                        dict(BLOCK_R=s.block_r, BLOCK_I=s.block_i, STAGES=s.stages, **common))
    else:
        maxnreg = t.rows_maxnreg if s.kind == "rows" else None
        if s.steal:
            maxnreg = min(maxnreg or 255, steal_maxnreg(s, sm_count(x.device)))
        common.update(EVICT=t.stream_eviction.get(x.element_size(), ""), INTERLEAVE=s.interleave,
                      HAS_TAIL=s.R % s.block_r != 0, INT64=int64)
        if maxnreg is not None and x.is_cuda:  # a CUDA compile option (not the interpreter's)
            common["maxnreg"] = maxnreg
        if s.kind == "rows":
            launch = Launch(_rows_kernel, s.grid, (s.K, s.I, s.R, s.s_o, s.s_i, s.s_r, s.r_per_split, s.R, s.tiles,
                                                   s.split),
                            dict(ROWS=s.block_i, BLOCK_R=s.block_r, HAS_I=s.I > 1, R_CONTIG=s.s_r == 1,
                                 STEAL=s.steal > 0, **common))
        else:
            launch = Launch(_cols_kernel, s.grid, (s.O, s.I, s.R, s.s_o, s.s_r, s.s_i, s.r_per_split, s.R),
                            dict(BLOCK_R=s.block_r, BLOCK_I=s.block_i, I_CONTIG=s.s_i == 1, **common))
    counters = 2 if s.steal else s.tiles if split else 0
    return ReducePlan(call, src is not x, s, launch, tma, workspace_numel(s), counters)


def forward(plan: ReducePlan, operands: tuple) -> torch.Tensor:
    """The reduction of ``operands`` = ``(x,)`` as planned, into a new contiguous tensor: one launch (split
    reductions write their partials ``[split, K]`` into per-stream scratch, which the last program of each output
    tile sums in split order)."""
    x = operands[0]
    call = plan.call
    if plan.copy:
        x = planner.prepare(x, call.dims)[0]
    device = x.device
    out = torch.empty(call.out_shape, dtype=call.out_dtype, device=device)
    partials = scratch(device, (plan.workspace,), call.acc_dtype) if plan.workspace else out
    counters = ticket_counters(device, plan.counters) if plan.counters else out
    if plan.tma:
        s = plan.schedule
        desc = TensorDescriptor(x, [s.R, s.I], [s.s_r, 1], [s.block_r, s.block_i])
        plan.launch((out, desc, partials, counters))
    else:
        plan.launch((x, out, partials, counters))
    return out
