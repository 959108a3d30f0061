"""Plans and launches of the embedding bag collection kernels (:mod:`.kernels`) for validated calls (:mod:`.checks`).

* :func:`plan_lookup` / :func:`lookup`: the pooled lookup, one launch into a fresh ``(B, F, D)`` fp32 output;
  :func:`plan_train` / :func:`train`: the same lookup for the training op (its backward is the update);
* :func:`plan_update` / :func:`update`: the fused optimizer update in place. Deterministic: global rows (int32 keys
  when R < 2^31) -> stable ``torch.sort`` -> the chunks' runs summed, whole segments applied -> the carry kernel
  (adds the pieces of segments longer than a chunk, in order, and applies them). The runs are summed by items
  (numbered: runs of one row cut at chunk starts, two passes and a cumsum, then the item kernel) or, for one id
  per feature at D <= ``config.segment_dim``, by the segment kernel's scan over contiguous sorted positions;
  about ten launches with items, seven with segments, the sort's included.
  ``deterministic=False`` with ``sgd`` and an fp32 weight: one kernel of atomic adds, no sort (other optimizers and
  half-precision weights ignore the flag). The plan holds every launch and the workspace's sizes; the workspace
  (keys, sorted keys, permutation, flags, item numbers and starts, the sorted sources, 2 partial rows per chunk) is
  allocated per call on the current stream: no host synchronisation, CUDA-graph capturable.

The PyTorch path (``call.triton`` False) runs :mod:`fuselab.reference.embedding` and plans nothing. Index tensors
(offsets, table metadata) that are strided views are read through contiguous copies (B*F + 1 or F elements). The
kernels' tuning is the call's :class:`~fuselab.ops.embedding.checks.EmbeddingConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.core.device import INT32_MAX, cdiv, needs_int64, next_power_of_2, sm_count
from fuselab.ops._launch import Launch
from fuselab.reference import embedding as ref

from . import checks, kernels, update_kernels
from .checks import DEFAULT_CONFIG, EmbeddingConfig, LookupArgs, LookupCall, UpdateCall

SGD_CODE = checks.KERNEL_OPTIMIZERS[checks.SGD]


@dataclass(frozen=True)
class Blocks:
    """Block sizes of one embedding dim: ``block_d`` (D padded to a power of two); rows per lookup program of one
    id per feature, and of bags (``bag_rows``, ``config.lookup_unroll`` ids each per step); items per step of the
    update's item kernel (``config.update_unroll`` gradient rows each); chunk partials per carry step."""

    block_d: int
    lookup_rows: int
    bag_rows: int
    update_items: int
    carry_chunks: int


def blocks(dim: int, config: EmbeddingConfig = DEFAULT_CONFIG) -> Blocks:
    """The block sizes for embedding dim ``dim`` under ``config``'s element budgets (at least one row each)."""
    block_d = next_power_of_2(dim)
    return Blocks(block_d, max(1, config.lookup_elements // block_d),
                  max(1, config.lookup_elements // (block_d * config.lookup_unroll)),
                  max(1, config.update_elements // (block_d * config.update_unroll)),
                  max(1, config.carry_elements // block_d))


def _strided(*tensors: torch.Tensor | None) -> bool:
    """Whether an index tensor is a strided view (the launches then read a contiguous copy)."""
    return any(t is not None and not t.is_contiguous() for t in tensors)


def _id_strides(ids: torch.Tensor, bags: bool) -> tuple[int, int]:
    return (ids.stride(0), 0) if bags else (ids.stride(0), ids.stride(1))


# ---------------------------------------------------------------------------------------------- lookup
@dataclass(frozen=True, eq=False)
class LookupPlan:
    """A planned lookup: its call, whether the index tensors are read through contiguous copies, and its launch
    (None: no bag, or the PyTorch path)."""

    call: LookupCall
    copy_index: bool
    launch: Launch | None


@dataclass(frozen=True, eq=False)
class TrainPlan:
    """A planned training lookup: its call (the update its backward runs) and the lookup's plan."""

    call: UpdateCall
    lookup: LookupPlan


def plan_lookup(call: LookupCall, operands: tuple) -> LookupPlan:
    """The lookup of ``operands`` = (weight, ids, offsets, table_sizes, row_offsets): one launch over the ``B*F``
    outputs (bags: a program per block of batch rows of one feature)."""
    _weight, ids, offsets, table_sizes, row_offsets = operands
    copy = _strided(offsets, table_sizes, row_offsets)
    batch, f_count, dim = call.shape
    num_bags = batch * f_count
    if not call.triton or num_bags == 0:
        return LookupPlan(call, copy, None)
    config = call.config
    sizes = blocks(dim, config)
    bags = call.bags
    block_rows = sizes.bag_rows if bags else sizes.lookup_rows
    s_ib, s_if = _id_strides(ids, bags)
    grid = (cdiv(batch, block_rows), f_count) if bags else (cdiv(num_bags, block_rows), 1)
    out = torch.empty(call.shape, dtype=torch.float32, device="meta")
    wide = needs_int64(out, ids) or num_bags + block_rows > INT32_MAX
    return LookupPlan(call, copy, Launch(
        kernels.lookup_kernel, grid, (ids.shape[0] if bags else 0, num_bags, f_count, s_ib, s_if),
        dict(D=dim, BLOCK_ROWS=block_rows, BLOCK_D=sizes.block_d, BAGS=bags, MEAN=call.pooling == "mean", WIDE=wide,
             UNROLL=config.lookup_unroll if bags else 1, num_warps=config.bag_warps if bags else config.num_warps)))


def _lookup_into(plan: LookupPlan, operands: tuple, out: torch.Tensor) -> None:
    """Launch ``plan`` on ``operands`` (as :func:`plan_lookup`'s) into ``out`` (B, F, D) fp32, contiguous."""
    launch = plan.launch
    if launch is None:
        return
    weight, ids, offsets, table_sizes, row_offsets = operands
    if plan.copy_index:
        offsets = None if offsets is None else offsets.contiguous()
        table_sizes, row_offsets = table_sizes.contiguous(), row_offsets.contiguous()
    launch((weight, ids, table_sizes if offsets is None else offsets, table_sizes, row_offsets, out))


def lookup(plan: LookupPlan, operands: tuple) -> torch.Tensor:
    """The ``(B, F, D)`` pooled embeddings of ``operands`` (as :func:`plan_lookup`'s), in
    :func:`fuselab.reference.embedding.compute_dtype` of the weight's (fp32 on the Triton path)."""
    call = plan.call
    if not call.triton:
        weight, ids, offsets, table_sizes, row_offsets = operands
        return ref.lookup(weight, ids, table_sizes, row_offsets, offsets, call.pooling)
    out = torch.empty(call.shape, dtype=torch.float32, device=operands[0].device)
    _lookup_into(plan, operands, out)
    return out


def plan_train(call: UpdateCall, operands: tuple) -> TrainPlan:
    """The lookup of the training op's ``operands`` = (anchor, weight, state, seed, lr, ids, offsets,
    table_sizes, row_offsets)."""
    _anchor, weight, _state, _seed, _lr, ids, offsets, table_sizes, row_offsets = operands
    return TrainPlan(call, plan_lookup(call.lookup, (weight, ids, offsets, table_sizes, row_offsets)))


def train(plan: TrainPlan, operands: tuple) -> torch.Tensor:
    """:func:`lookup` of the training op's ``operands``."""
    _anchor, weight, _state, _seed, _lr, ids, offsets, table_sizes, row_offsets = operands
    return lookup(plan.lookup, (weight, ids, offsets, table_sizes, row_offsets))


def lookup_(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor,
            row_offsets: torch.Tensor, offsets: torch.Tensor | None, pooling: str,
            config: EmbeddingConfig = DEFAULT_CONFIG) -> None:
    """Write the ``(B, F, D)`` pooled embeddings into ``out`` (fp32, contiguous) through the Triton kernel. Raises
    as :func:`fuselab.ops.embedding.embedding_bag_lookup`, and for an ``out`` of another shape or layout."""
    call = checks.validate_lookup(LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, config), None,
                                  True)
    checks.require_lookup_out(out, call, weight.device)
    operands = (weight, ids, offsets, table_sizes, row_offsets)
    _lookup_into(plan_lookup(call, operands), operands, out)


# ---------------------------------------------------------------------------------------------- update
@dataclass(frozen=True)
class Workspace:
    """The sizes of an update's per-call scratch: ``n_pos`` id positions, the sort keys' dtype, ``n_chunks`` chunks
    of sorted positions, two partial rows of ``block_d`` per chunk."""

    n_pos: int
    key_dtype: torch.dtype
    n_chunks: int
    block_d: int


@dataclass(frozen=True, eq=False)
class SortedLaunches:
    """The deterministic update's launches after the sort: the item-numbering passes (``flags``, then ``starts``
    after the cumsum) and the item kernel, or the segment kernel (``segments``, the others None); then the carry
    kernel."""

    carry: Launch
    flags: Launch | None = None
    starts: Launch | None = None
    items: Launch | None = None
    segments: Launch | None = None


@dataclass(frozen=True, eq=False)
class UpdatePlan:
    """A planned update: its call, whether the index tensors are read through contiguous copies, the workspace
    (None: nothing to update, or the PyTorch path), the rows kernel's launch, then atomic SGD's launch or the
    sorted pipeline's."""

    call: UpdateCall
    copy_index: bool
    workspace: Workspace | None = None
    rows: Launch | None = None
    atomic: Launch | None = None
    sorted: SortedLaunches | None = None


def _sorted_launches(call: UpdateCall, grad: torch.Tensor, workspace: Workspace,
                     device: torch.device) -> SortedLaunches:
    """The launches of the deterministic pipeline after the rows kernel."""
    config, (_, f_count, dim) = call.lookup.config, call.lookup.shape
    n_pos, chunk, warps = workspace.n_pos, config.update_chunk, config.num_warps
    code, eps = checks.kernel_optimizer(call.optimizer)
    sizes = blocks(dim, config)
    flat_grad = grad.stride(0) == f_count * grad.stride(1)
    # most carry programs read 3 keys and exit; a segment crossing chunks adds (carry_chunks, D) tiles
    carry = Launch(update_kernels.carry_update_kernel, (workspace.n_chunks,), (n_pos, workspace.n_chunks, eps),
                   dict(CHUNK=chunk, BLOCK_C=sizes.carry_chunks, OPTIMIZER=code, D=dim, BLOCK_D=sizes.block_d,
                        num_warps=warps))
    if not call.lookup.bags and dim <= config.segment_dim:
        block_p = min(chunk, max(1, config.segment_elements // sizes.block_d))
        segments = Launch(update_kernels.segment_update_kernel, (workspace.n_chunks,),
                          (n_pos, f_count, *grad.stride(), eps),
                          dict(D=dim, BLOCK_P=block_p, CHUNK=chunk, BLOCK_D=sizes.block_d, OPTIMIZER=code,
                               FLAT_GRAD=flat_grad, num_warps=warps))
        return SortedLaunches(carry, segments=segments)
    rows_grid = (cdiv(n_pos, config.rows_block),)
    flags, starts = (Launch(update_kernels.items_kernel, rows_grid, (n_pos,),
                            dict(BLOCK=config.rows_block, CHUNK=chunk, STARTS=pass_two, num_warps=warps))
                     for pass_two in (False, True))
    # a persistent grid of 32 warps per multiprocessor: items are at most N, their count is known on the device only
    programs = min(cdiv(n_pos, sizes.update_items), max(1, 32 // config.update_warps) * sm_count(device))
    items = Launch(update_kernels.item_update_kernel, (max(programs, 1),), (n_pos, f_count, *grad.stride(), eps),
                   dict(D=dim, BLOCK_S=sizes.update_items, UNROLL=config.update_unroll, BLOCK_D=sizes.block_d,
                        CHUNK=chunk, OPTIMIZER=code, SCALED=call.lookup.bags,
                        FLAT_GRAD=flat_grad, num_warps=config.update_warps))
    return SortedLaunches(carry, flags, starts, items)


def plan_update(call: UpdateCall, operands: tuple) -> UpdatePlan:
    """The update of ``operands`` = (weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets)."""
    weight, _state, _seed, _lr, grad, ids, offsets, table_sizes, row_offsets = operands
    copy = _strided(offsets, table_sizes, row_offsets)
    lookup_call = call.lookup
    if not lookup_call.triton or ids.numel() == 0 or grad.numel() == 0:
        return UpdatePlan(call, copy)
    config, (_, f_count, dim) = lookup_call.config, lookup_call.shape
    n_pos, bags = ids.numel(), lookup_call.bags
    workspace = Workspace(n_pos, torch.int32 if weight.shape[0] <= INT32_MAX else torch.int64,
                          cdiv(n_pos, config.update_chunk), blocks(dim, config).block_d)
    s_ib, s_if = _id_strides(ids, bags)
    wide = needs_int64(ids, grad) or n_pos + config.rows_block > INT32_MAX
    mean = lookup_call.pooling == "mean"
    n_ids = ids.shape[0] if bags else 0
    stochastic = weight.dtype in checks.HALF_WEIGHT_DTYPES
    rows = Launch(kernels.rows_kernel, (cdiv(n_pos, config.rows_block),), (n_pos, n_ids, f_count, s_ib, s_if),
                  dict(BLOCK=config.rows_block, BAGS=bags, MEAN=mean, WIDE=wide, STOCHASTIC=stochastic,
                       num_warps=config.num_warps))
    code, _ = checks.kernel_optimizer(call.optimizer)
    if code == SGD_CODE and not call.deterministic and not stochastic:  # atomics cannot round stochastically
        block_p = max(1, config.update_elements // workspace.block_d)
        atomic = Launch(update_kernels.atomic_sgd_kernel, (cdiv(n_pos, block_p),),
                        (n_pos, n_ids, f_count, *grad.stride()),
                        dict(BLOCK_P=block_p, BAGS=bags, MEAN=mean, WIDE=wide, D=dim, BLOCK_D=workspace.block_d,
                             num_warps=config.num_warps))
        return UpdatePlan(call, copy, workspace, rows, atomic=atomic)
    return UpdatePlan(call, copy, workspace, rows, sorted=_sorted_launches(call, grad, workspace, weight.device))


def _bag_of_positions(offsets: torch.Tensor, n_pos: int) -> torch.Tensor:
    """(N,) int64 bag of each id position (searchsorted over the offsets, clamped to a valid bag)."""
    pos = torch.arange(n_pos, device=offsets.device)
    bag = torch.searchsorted(offsets, pos, right=True)
    return bag.sub_(1).clamp_(0, offsets.shape[0] - 2)


def update(plan: UpdatePlan, operands: tuple) -> None:
    """Apply the optimizer step of the output gradient ``grad`` (B, F, D) to the rows the ids touched, in place on
    ``weight``, its state and (half-precision weights) the rounding seed; ``operands`` as :func:`plan_update`'s."""
    weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets = operands
    call = plan.call
    if not call.lookup.triton:
        ref.sparse_update_(weight, state, lr, grad, ids, table_sizes, row_offsets, offsets, call.lookup.pooling,
                           call.optimizer)
        return
    workspace = plan.workspace
    if workspace is None:
        return
    if plan.copy_index:
        offsets = None if offsets is None else offsets.contiguous()
        table_sizes, row_offsets = table_sizes.contiguous(), row_offsets.contiguous()
    state = state if state.numel() else weight  # sgd: no state (never read)
    seed = seed if seed is not None else lr  # fp32 weights: never read
    n_pos, device = workspace.n_pos, weight.device
    keys = torch.empty(n_pos, dtype=workspace.key_dtype, device=device)
    bags = offsets is not None
    bag = _bag_of_positions(offsets, n_pos) if bags else keys
    scale = torch.empty(n_pos if bags else 0, dtype=torch.float32, device=device)
    plan.rows((ids, bag, table_sizes, row_offsets, keys, offsets if bags else keys, scale if bags else keys, seed))
    if plan.atomic is not None:
        plan.atomic((grad, keys, bag, offsets if bags else keys, weight, lr))
        return
    launches = plan.sorted
    sorted_keys, perm = torch.sort(keys, stable=True)
    head = torch.empty(workspace.n_chunks, workspace.block_d, dtype=torch.float32, device=device)
    tail = torch.empty_like(head)
    if launches.segments is not None:  # one id per feature: the sorted position's id position is its bag
        launches.segments((sorted_keys, perm, grad, weight, state, lr, seed, head, tail))
        launches.carry((sorted_keys, head, tail, weight, state, lr, seed))
        return
    flags = torch.empty(n_pos, dtype=torch.int32, device=device)
    starts = torch.empty(n_pos + 1, dtype=torch.int64, device=device)
    count = torch.empty(1, dtype=torch.int64, device=device)
    launches.flags((sorted_keys, flags, perm, starts, count))
    number = torch.cumsum(flags, 0)
    launches.starts((sorted_keys, flags, number, starts, count))
    # the gradient row and factor of each sorted position (one id per feature: the position is its bag)
    src = bag[perm] if bags else perm
    scale_sorted = scale[perm] if bags else lr
    launches.items((sorted_keys, src, scale_sorted, starts, count, grad, weight, state, lr, seed, head, tail))
    launches.carry((sorted_keys, head, tail, weight, state, lr, seed))
