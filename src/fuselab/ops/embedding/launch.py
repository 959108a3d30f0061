"""Validation and out-param launchers of the embedding bag collection kernels.

:func:`check` validates every argument (shapes, dtypes, devices; it reads no tensor values: that would synchronise
with the device). :func:`lookup_` writes the pooled embeddings into a given output; :func:`update_` applies the
fused optimizer update in place. Each returns a record of its launches that :func:`lookup_again` /
:func:`update_again` repeat on new tensors of the same layout (no plan, no checks). Launches go through
:func:`fuselab.ops._launch.launch` (the compiled kernel's own launcher after the first call of a signature; the
id counts, which change with every batch of bags, are keyed by class). Tuning knobs are the frozen
:class:`EmbeddingConfig`, passed by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuselab.core.device import INT32_MAX, cdiv, needs_int64, next_power_of_2
from fuselab.core.embedding_optimizer import SGD, Adagrad, EmbeddingOptimizer, RowwiseAdagrad
from fuselab.ops._launch import launch, relaunch
from fuselab.reference.embedding import POOLINGS

from . import kernels

#: the optimizers the kernels implement: their ``OPTIMIZER`` constexpr
KERNEL_OPTIMIZERS: dict[type[EmbeddingOptimizer], int] = {SGD: 0, Adagrad: 1, RowwiseAdagrad: 2}
_ID_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class EmbeddingConfig:
    """Tuning knobs of the kernels (all powers of two; tiles are rows x D padded to a power of two).

    ``lookup_elements``: tile of a lookup program (4096: 256 rows of D=16, 8 elements per thread on 4 warps).
    ``update_elements``: tile of the segment kernel (2048: chunks of 128 sorted positions at D=16, 16 at D=128;
    its segmented scan runs over the rows of the tile, through shared memory: 8 bytes per element).
    ``rows_block``: id positions per program of the row-computing kernel.
    ``carry_elements``: tile of chunk partials the one-warp carry kernel adds per step along a run that crosses
    chunks (1024: 64 chunks at D=16).
    ``num_warps``: warps per program of the lookup, rows and segment kernels.
    """

    lookup_elements: int = 4096
    update_elements: int = 2048
    rows_block: int = 1024
    carry_elements: int = 1024
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("lookup_elements", "update_elements", "rows_block", "carry_elements", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"EmbeddingConfig.{name} must be a positive power of two, got {value!r}")


DEFAULT_CONFIG = EmbeddingConfig()


@dataclass(frozen=True)
class Plan:
    """Block sizes of one embedding dim: ``block_d`` (D padded to a power of two), rows per lookup program,
    sorted positions per update chunk, chunk partials per carry step."""

    block_d: int
    lookup_rows: int
    update_rows: int
    carry_chunks: int


def plan(dim: int, config: EmbeddingConfig = DEFAULT_CONFIG) -> Plan:
    """The block sizes for embedding dim ``dim`` under ``config``'s element budgets (at least one row each)."""
    block_d = next_power_of_2(dim)
    return Plan(block_d, max(1, config.lookup_elements // block_d), max(1, config.update_elements // block_d),
                max(1, config.carry_elements // block_d))


def _require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check(weight: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
          offsets: torch.Tensor | None, pooling: str) -> tuple[int, int, int]:
    """Validate a lookup's arguments; returns ``(B, F, N)`` (N id positions).

    Raises TypeError (not a tensor, wrong dtype) or ValueError (rank, shapes, F mismatch, offsets not
    ``(B*F + 1,)``, mixed devices, unknown pooling), naming the argument."""
    for name, t in (("weight", weight), ("ids", ids), ("table_sizes", table_sizes), ("row_offsets", row_offsets)):
        _require_tensor(name, t)
    if not weight.is_floating_point():
        raise TypeError(f"weight must have a floating dtype, got {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be (R, D), got shape {tuple(weight.shape)}")
    for name, t in (("table_sizes", table_sizes), ("row_offsets", row_offsets)):
        if t.dtype != torch.int64:
            raise TypeError(f"{name} must be int64, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] == 0:
            raise ValueError(f"{name} must be (F,) with F >= 1, got shape {tuple(t.shape)}")
    f_count = table_sizes.shape[0]
    if row_offsets.shape[0] != f_count:
        raise ValueError(f"row_offsets must have F={f_count} entries (one per table), got {row_offsets.shape[0]}")
    if ids.dtype not in _ID_DTYPES:
        raise TypeError(f"ids must be int64 or int32, got {ids.dtype}")
    if not isinstance(pooling, str) or pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    devices = {"weight": weight.device, "ids": ids.device, "table_sizes": table_sizes.device,
               "row_offsets": row_offsets.device}
    if offsets is None:
        if ids.dim() != 2 or ids.shape[1] != f_count:
            raise ValueError(f"ids must be (B, F={f_count}) with one id per feature (or (N,) with offsets), "
                             f"got shape {tuple(ids.shape)}")
        batch, n_pos = ids.shape[0], ids.numel()
    else:
        _require_tensor("offsets", offsets)
        if offsets.dtype != torch.int64:
            raise TypeError(f"offsets must be int64, got {offsets.dtype}")
        if ids.dim() != 1:
            raise ValueError(f"ids must be (N,) flat bag values when offsets are given, got shape {tuple(ids.shape)}")
        if offsets.dim() != 1 or offsets.shape[0] < 1 or (offsets.shape[0] - 1) % f_count:
            raise ValueError(f"offsets must be (B*F + 1,) with F={f_count}, got shape {tuple(offsets.shape)}")
        batch, n_pos = (offsets.shape[0] - 1) // f_count, ids.shape[0]
        devices["offsets"] = offsets.device
    _same_device(devices)
    return batch, f_count, n_pos


def check_update(weight: torch.Tensor, state: torch.Tensor, lr: torch.Tensor, grad: torch.Tensor | None,
                 optimizer: EmbeddingOptimizer, batch: int, f_count: int) -> None:
    """Validate an update's own arguments (after :func:`check`; ``grad`` None: not yet known); same errors as
    :func:`check`."""
    for name, t in (("state", state), ("lr", lr)) + ((("grad", grad),) if grad is not None else ()):
        _require_tensor(name, t)
    if not isinstance(optimizer, EmbeddingOptimizer):
        raise TypeError(f"optimizer must be an EmbeddingOptimizer (fuselab.core.embedding_optimizer), got "
                        f"{type(optimizer).__name__}")
    rows, dim = weight.shape
    expect = optimizer.state_shape(rows, dim)
    if optimizer.has_state and tuple(state.shape) != expect:
        raise ValueError(f"state must have shape {expect} for {optimizer.name}, got {tuple(state.shape)}")
    if optimizer.has_state and state.dtype != weight.dtype:
        raise TypeError(f"state must have weight's dtype {weight.dtype}, got {state.dtype}")
    if lr.dim() != 0 or not lr.is_floating_point():
        raise ValueError(f"lr must be a 0-dim floating tensor, got shape {tuple(lr.shape)} {lr.dtype}")
    devices = {"weight": weight.device, "state": state.device, "lr": lr.device}
    if grad is not None:
        if not grad.is_floating_point():
            raise TypeError(f"grad must have a floating dtype, got {grad.dtype}")
        if tuple(grad.shape) != (batch, f_count, dim):
            raise ValueError(f"grad must have the output's shape {(batch, f_count, dim)}, got {tuple(grad.shape)}")
        devices["grad"] = grad.device
    _same_device(devices)


def kernel_optimizer(optimizer: EmbeddingOptimizer) -> tuple[int, float]:
    """The kernels' ``OPTIMIZER`` constexpr and ``eps`` of ``optimizer``. Raises ValueError for a kind the kernels do
    not implement (it runs on the reference path)."""
    code = KERNEL_OPTIMIZERS.get(type(optimizer))
    if code is None:
        names = ", ".join(kind.name for kind in KERNEL_OPTIMIZERS)
        raise ValueError(f"optimizer {optimizer.name!r} has no fused kernel (the kernels implement {names}); use "
                         "the reference path (kernels='torch')")
    return code, float(getattr(optimizer, "eps", 0.0))


def _same_device(devices: dict[str, torch.device]) -> None:
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {first}; all tensors must share a device")


def _require_kernel_layout(weight: torch.Tensor, state: torch.Tensor | None = None) -> None:
    if weight.dtype != torch.float32:
        raise TypeError(f"weight must be float32 for the Triton kernels, got {weight.dtype}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous (R, D) for the Triton kernels")
    if state is not None and not state.is_contiguous():
        raise ValueError("state must be contiguous for the Triton kernels")


def _dense_index(*tensors: torch.Tensor | None) -> tuple[tuple, bool]:
    """The small index tensors (offsets, table metadata) as the kernels read them: contiguous (a no-op for the
    contiguous tensors callers pass; a strided view is copied, B*F + 1 or F elements); and whether one was copied
    (the launch then read the copy: no record of it is kept)."""
    dense = tuple(None if t is None else t.contiguous() for t in tensors)
    return dense, any(d is not t for d, t in zip(dense, tensors))


def _id_strides(ids: torch.Tensor, bags: bool) -> tuple[int, int]:
    return (ids.stride(0), 0) if bags else (ids.stride(0), ids.stride(1))


def _step(kernel, grid: tuple[int, ...], tensors: tuple, scalars: tuple, constexprs: dict, dynamic: int) -> tuple:
    """One launch through :func:`fuselab.ops._launch.launch`: its record ``(entry, grid, scalars)`` for
    :func:`relaunch`. The first ``dynamic`` scalars (id counts) are keyed by class, the rest by value."""
    entry = launch(kernel, tuple(constexprs.items()), grid, tensors, scalars, constexprs, dynamic=dynamic)
    return entry, grid, scalars


def lookup_(out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor,
            row_offsets: torch.Tensor, offsets: torch.Tensor | None, pooling: str,
            config: EmbeddingConfig = DEFAULT_CONFIG) -> tuple | None:
    """Write the ``(B, F, D)`` pooled embeddings into ``out`` (fp32, contiguous); arguments as :func:`check`
    validated them. One launch over the ``B*F`` outputs. Returns its record for :func:`lookup_again` (None when
    nothing was launched or an index tensor was copied)."""
    _require_kernel_layout(weight)
    (offsets, table_sizes, row_offsets), copied = _dense_index(offsets, table_sizes, row_offsets)
    num_bags, dim = out.shape[0] * out.shape[1], weight.shape[1]
    if num_bags == 0:
        return None
    blocks = plan(dim, config)
    block_rows = blocks.lookup_rows
    bags = offsets is not None
    s_ib, s_if = _id_strides(ids, bags)
    f_count = table_sizes.shape[0]
    grid = (cdiv(out.shape[0], block_rows), f_count) if bags else (cdiv(num_bags, block_rows), 1)
    wide = needs_int64(out, ids) or num_bags + block_rows > INT32_MAX
    record = _step(kernels.lookup_kernel, grid,
                   (weight, ids, offsets if bags else table_sizes, table_sizes, row_offsets, out),
                   (ids.shape[0] if bags else 0, num_bags, f_count, s_ib, s_if),
                   dict(D=dim, BLOCK_ROWS=block_rows, BLOCK_D=blocks.block_d, BAGS=bags, MEAN=pooling == "mean",
                        WIDE=wide, num_warps=config.num_warps), 1)
    return None if copied else record


def lookup_again(record: tuple, out: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor,
                 table_sizes: torch.Tensor, row_offsets: torch.Tensor, offsets: torch.Tensor | None) -> None:
    """The launch that :func:`lookup_` returned ``record`` for, on new tensors: the caller guarantees the same
    shapes, dtypes, strides, storage offsets and 16-byte alignment (and ``offsets`` given or not)."""
    entry, grid, scalars = record
    relaunch(entry, grid, (weight, ids, table_sizes if offsets is None else offsets, table_sizes, row_offsets, out),
             scalars)


def _bag_of_positions(offsets: torch.Tensor, n_pos: int) -> torch.Tensor:
    """(N,) int64 bag of each id position (searchsorted over the offsets, clamped to a valid bag)."""
    pos = torch.arange(n_pos, device=offsets.device)
    bag = torch.searchsorted(offsets, pos, right=True)
    return bag.sub_(1).clamp_(0, offsets.shape[0] - 2)


def _update_plan(weight: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor,
                 bags: bool, pooling: str, optimizer: EmbeddingOptimizer, deterministic: bool,
                 config: EmbeddingConfig) -> tuple:
    """``(n_pos, key dtype, chunks, BLOCK_D, atomic, steps)``: the update's sizes and, per kernel (rows; then
    atomic SGD, or segment and carry), its grid, scalars, constexprs and dynamic-scalar count."""
    n_pos, f_count, dim = ids.numel(), table_sizes.shape[0], weight.shape[1]
    key_dtype = torch.int32 if weight.shape[0] <= INT32_MAX else torch.int64
    s_ib, s_if = _id_strides(ids, bags)
    wide = needs_int64(ids, grad) or n_pos + config.rows_block > INT32_MAX
    blocks = plan(dim, config)
    block_d, block_p = blocks.block_d, blocks.update_rows
    mean = pooling == "mean"
    n_ids = ids.shape[0] if bags else 0
    steps = [((cdiv(n_pos, config.rows_block),), (n_pos, f_count, s_ib, s_if),
              dict(BLOCK=config.rows_block, BAGS=bags, WIDE=wide, num_warps=config.num_warps), 1)]
    flags = dict(D=dim, BLOCK_D=block_d, num_warps=config.num_warps)
    code, eps = kernel_optimizer(optimizer)
    atomic = code == KERNEL_OPTIMIZERS[SGD] and not deterministic
    n_chunks = cdiv(n_pos, block_p)
    if atomic:
        steps.append(((n_chunks,), (n_pos, n_ids, f_count, *grad.stride()),
                      dict(BLOCK_P=block_p, BAGS=bags, MEAN=mean, WIDE=wide, **flags), 2))
    else:
        steps.append(((n_chunks,), (n_pos, n_ids, f_count, *grad.stride(), eps),
                      dict(BLOCK_P=block_p, OPTIMIZER=code, BAGS=bags, MEAN=mean, WIDE=wide, **flags), 2))
        # most carry programs read 3 keys and exit; a crossing run adds (carry_chunks, D) tiles: one warp
        steps.append(((n_chunks,), (n_pos, n_chunks, eps),
                      dict(BLOCK_P=block_p, BLOCK_C=blocks.carry_chunks, OPTIMIZER=code, D=dim, BLOCK_D=block_d,
                           num_warps=1), 2))
    return n_pos, key_dtype, n_chunks, block_d, atomic, steps


def _run_update(update_plan: tuple, entries: tuple | None, weight: torch.Tensor, state: torch.Tensor,
                lr: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor,
                row_offsets: torch.Tensor, offsets: torch.Tensor | None) -> tuple:
    """The update's workspace and launches, in stream order: each kernel launched (``entries`` None: returns their
    entries) or relaunched from its entry (returns ``entries``)."""
    n_pos, key_dtype, n_chunks, block_d, atomic, steps = update_plan
    launched = []

    def run(i: int, kernel, tensors: tuple) -> None:
        grid, scalars, constexprs, dynamic = steps[i]
        if entries is None:
            launched.append(_step(kernel, grid, tensors, scalars, constexprs, dynamic)[0])
        else:
            relaunch(entries[i], grid, tensors, scalars)

    keys = torch.empty(n_pos, dtype=key_dtype, device=weight.device)
    bag = keys if offsets is None else _bag_of_positions(offsets, n_pos)
    offsets_arg = keys if offsets is None else offsets
    run(0, kernels.rows_kernel, (ids, bag, table_sizes, row_offsets, keys))
    if atomic:
        run(1, kernels.atomic_sgd_kernel, (grad, keys, bag, offsets_arg, weight, lr))
    else:
        sorted_keys, perm = torch.sort(keys, stable=True)
        head = torch.empty(n_chunks, block_d, dtype=torch.float32, device=weight.device)
        tail = torch.empty_like(head)
        run(1, kernels.segment_update_kernel, (sorted_keys, perm, grad, bag, offsets_arg, weight, state, lr, head,
                                               tail))
        run(2, kernels.carry_update_kernel, (sorted_keys, head, tail, weight, state, lr))
    return entries if entries is not None else tuple(launched)


def update_(weight: torch.Tensor, state: torch.Tensor, lr: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor,
            table_sizes: torch.Tensor, row_offsets: torch.Tensor, offsets: torch.Tensor | None, pooling: str,
            optimizer: EmbeddingOptimizer, deterministic: bool = True,
            config: EmbeddingConfig = DEFAULT_CONFIG) -> tuple | None:
    """Apply the ``optimizer`` update of the output gradient ``grad`` (B, F, D) to the rows the ids touched, in place.

    Deterministic: global rows (int32 keys when R < 2^31) -> stable ``torch.sort`` -> segment kernel -> carry
    kernel (5-8 launches, the sort's included; workspace: keys, sorted keys, permutation, 2 partial rows per chunk).
    ``deterministic=False`` with ``sgd``: one kernel of atomic adds, no sort (other optimizers ignore the flag).
    No host synchronisation: every size comes from shapes. Returns a record for :func:`update_again` (None when
    nothing was launched or an index tensor was copied). Raises ValueError for an optimizer the kernels do not
    implement (:data:`KERNEL_OPTIMIZERS`).
    """
    _require_kernel_layout(weight, state)
    (offsets, table_sizes, row_offsets), copied = _dense_index(offsets, table_sizes, row_offsets)
    if ids.numel() == 0 or grad.numel() == 0:
        return None
    update_plan = _update_plan(weight, grad, ids, table_sizes, offsets is not None, pooling, optimizer,
                               deterministic, config)
    state_arg = state if optimizer.has_state else weight
    entries = _run_update(update_plan, None, weight, state_arg, lr, grad, ids, table_sizes, row_offsets, offsets)
    return None if copied else (update_plan, entries, optimizer.has_state)


def update_again(record: tuple, weight: torch.Tensor, state: torch.Tensor, lr: torch.Tensor, grad: torch.Tensor,
                 ids: torch.Tensor, table_sizes: torch.Tensor, row_offsets: torch.Tensor,
                 offsets: torch.Tensor | None) -> None:
    """The update that :func:`update_` returned ``record`` for, on new tensors: the caller guarantees the same
    shapes, dtypes, strides, storage offsets and 16-byte alignment (and ``offsets`` given or not). Its workspace
    is allocated anew (on the current stream: CUDA-graph capturable)."""
    update_plan, entries, has_state = record
    _run_update(update_plan, entries, weight, state if has_state else weight, lr, grad, ids, table_sizes,
                row_offsets, offsets)
