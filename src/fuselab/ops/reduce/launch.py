"""The out-param launcher of ``fuselab.sum``/``fuselab.mean``: one launch of a :class:`~.plan.ReducePlan`
(:mod:`fuselab.ops.reduce.plan`) on the kernels of :mod:`fuselab.ops.reduce.kernels`."""

from __future__ import annotations

import torch
import triton.language as tl

from fuselab.core.device import INT32_MAX, cdiv, needs_int64, sm_count
from fuselab.ops._launch import TensorDescriptor
from fuselab.ops._launch import launch as launch_kernel
from fuselab.ops._tickets import final_sum_rows, ticket_counters
from fuselab.ops.tuning import current

from .kernels import _cols_kernel, _cols_tma_kernel, _rows_kernel
from .plan import ReducePlan, ReduceTuning, workspace_numel

#: registers of one SM (every GPU fuselab targets, sm_80 to sm_90), for the register cap of stealing grids
REGISTERS_PER_SM = 65536


def steal_maxnreg(plan: ReducePlan, sms: int) -> int:
    """Register cap under which all ``plan.steal`` programs of a stealing plan are resident at once on ``sms`` SMs (a
    grid larger than what fits would run a second, partial wave: the imbalance stealing is there to remove):
    registers per SM over the threads the grid puts on each SM, in the allocation's steps of 8."""
    warps_per_sm = plan.num_warps * cdiv(plan.steal, sms)
    return min(255, REGISTERS_PER_SM // (warps_per_sm * 32) // 8 * 8)


def launch(x: torch.Tensor, plan: ReducePlan, out: torch.Tensor, partials: torch.Tensor | None, *, is_mean: bool,
           acc_dtype: torch.dtype) -> None:
    """The one kernel launch of ``plan`` on ``x``, writing ``out`` (and ``partials`` ``[split, K]`` on the way,
    when ``plan.split > 1``)."""
    t = current(ReduceTuning)
    split = plan.split > 1
    int64 = needs_int64(x, out) or plan.K * plan.split > INT32_MAX or (plan.steal > 0 and t.steal_int64)
    evict = t.stream_eviction.get(x.element_size(), "")
    # plan.block_i outputs per tile: rows of the rows kernel, columns of the cols kernel
    block_s = final_sum_rows(plan.split, plan.block_i) if split else 1
    maxnreg = t.rows_maxnreg if plan.kind == "rows" else None
    if plan.steal:
        maxnreg = min(maxnreg or 255, steal_maxnreg(plan, sm_count(x.device)))
    key = (plan, is_mean, acc_dtype, out.dtype, int64, evict, maxnreg)  # int64 and maxnreg: knobs read here
    counters = ticket_counters(x.device, 2) if plan.steal else ticket_counters(x.device, plan.tiles) if split else out
    tensors = (x, out, partials if split else out, counters)

    tma = plan.stages > 0 and x.data_ptr() % 16 == 0  # else the cols kernel runs the same plan from pointers

    def constexprs() -> dict:  # built only the first time this signature launches
        common = dict(SPLIT_R=split, ACC=tl.float64 if acc_dtype == torch.float64 else tl.float32, BLOCK_S=block_s,
                      IS_MEAN=is_mean, num_warps=plan.num_warps)
        if tma:
            return dict(BLOCK_R=plan.block_r, BLOCK_I=plan.block_i, STAGES=plan.stages, **common)
        common.update(EVICT=evict, INTERLEAVE=plan.interleave, HAS_TAIL=plan.R % plan.block_r != 0, INT64=int64)
        if maxnreg is not None and x.is_cuda:  # a CUDA compile option (not the interpreter's)
            common["maxnreg"] = maxnreg
        if plan.kind == "rows":
            return dict(ROWS=plan.block_i, BLOCK_R=plan.block_r, HAS_I=plan.I > 1, R_CONTIG=plan.s_r == 1,
                        STEAL=plan.steal > 0, **common)
        return dict(BLOCK_R=plan.block_r, BLOCK_I=plan.block_i, I_CONTIG=plan.s_i == 1, **common)

    if plan.kind == "rows":
        scalars = (plan.K, plan.I, plan.R, plan.s_o, plan.s_i, plan.s_r, plan.r_per_split, plan.R, plan.tiles,
                   plan.split)
        launch_kernel(_rows_kernel, key, plan.grid, tensors, scalars, constexprs)
    elif tma:
        desc = TensorDescriptor(x, [plan.R, plan.I], [plan.s_r, 1], [plan.block_r, plan.block_i])
        scalars = (plan.I, plan.R, plan.r_per_split, plan.R)
        launch_kernel(_cols_tma_kernel, key, plan.grid, (out, desc, *tensors[2:]), scalars, constexprs)
    else:
        scalars = (plan.O, plan.I, plan.R, plan.s_o, plan.s_r, plan.s_i, plan.r_per_split, plan.R)
        launch_kernel(_cols_kernel, key, plan.grid, tensors, scalars, constexprs)


def reduce_into(x: torch.Tensor, dims: tuple[int, ...], out: torch.Tensor, workspace: torch.Tensor | None, *,
                plan: ReducePlan, is_mean: bool) -> None:
    """Launcher: reduce ``x`` (already laid out by :func:`prepare`) over ``dims`` into ``out``, in one launch.

    ``out`` is contiguous with ``plan.K`` elements; ``workspace`` holds :func:`workspace_numel`
    accumulator-dtype elements (``None`` when that is 0) for the partials ``[split, K]`` of a split
    reduction, which the last program of each output tile sums in split order.
    """
    if out.numel() != plan.K or not out.is_contiguous():
        raise ValueError(f"out must be contiguous with {plan.K} elements, got shape {tuple(out.shape)}")
    if plan.split == 1:
        launch(x, plan, out, None, is_mean=is_mean, acc_dtype=_acc(x, out))
        return
    if workspace is None or workspace.numel() < workspace_numel(plan):
        raise ValueError(f"workspace must hold {workspace_numel(plan)} elements")
    partials = workspace[: workspace_numel(plan)].view(plan.split, plan.K)
    launch(x, plan, out, partials, is_mean=is_mean, acc_dtype=workspace.dtype)


def _acc(x: torch.Tensor, out: torch.Tensor) -> torch.dtype:
    return torch.float64 if torch.float64 in (x.dtype, out.dtype) else torch.float32
