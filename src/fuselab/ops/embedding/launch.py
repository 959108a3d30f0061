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

from dataclasses import dataclass, replace

import torch

from fuselab.core.device import INT32_MAX, cdiv, needs_int64, next_power_of_2, sm_count
from fuselab.core.embedding_optimizer import SGD, Adagrad, EmbeddingOptimizer, RowwiseAdagrad
from fuselab.ops._launch import launch, relaunch
from fuselab.reference.embedding import POOLINGS

from . import kernels

#: the optimizers the kernels implement: their ``OPTIMIZER`` constexpr
KERNEL_OPTIMIZERS: dict[type[EmbeddingOptimizer], int] = {SGD: 0, Adagrad: 1, RowwiseAdagrad: 2}
#: weight dtypes of the Triton path: fp32, or half precision with fp32 math and stochastically rounded updates
KERNEL_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_WEIGHT_DTYPES = (torch.float16, torch.bfloat16)
_ID_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class EmbeddingConfig:
    """Tuning knobs of the kernels (all powers of two; tiles are rows x D padded to a power of two).

    ``lookup_elements``: tile of a lookup program (4096: 256 rows of D=16, 8 elements per thread on 4 warps); with
    bags, ``lookup_unroll`` ids of each bag per step share it (rows = elements / (unroll * D)).
    ``update_elements``: tile of the update's item kernel: items per step times ``update_unroll`` gathered
    gradient rows per item times D.
    ``update_chunk``: sorted positions per chunk: a segment longer than a chunk is summed in pieces, which the
    carry kernel adds in chunk order (short chunks balance hot rows; long ones shorten the carry's walk).
    ``rows_block``: id positions per program of the row-computing and item-numbering kernels.
    ``carry_elements``: tile of chunk partials the carry kernel adds per step along a segment that crosses chunks.
    ``num_warps``: warps per program of the one-id lookup and of the rows, item-numbering and carry kernels;
    ``bag_warps`` and ``update_warps``: of the bag lookup and of the update's item kernel (one warp per bag or item
    keeps many independent gathers in flight; a wider program waits for its longest bag or item).

    The defaults are the fastest of a sweep on an H200 at the MLPerf DCNv2 shapes (26 multi-hot features, D 128,
    B 65536): one warp per item, 8 gradient rows in flight each; the lookup's 4-warp programs of 8 bags, 4 ids of
    each per step (``benchmarks/notes/embedding.md``).
    """

    lookup_elements: int = 4096
    update_elements: int = 1024
    rows_block: int = 1024
    carry_elements: int = 4096
    num_warps: int = 4
    update_chunk: int = 256
    lookup_unroll: int = 4
    update_unroll: int = 8
    bag_warps: int = 4
    update_warps: int = 1

    def __post_init__(self) -> None:
        for name in ("lookup_elements", "update_elements", "rows_block", "carry_elements", "num_warps",
                     "update_chunk", "lookup_unroll", "update_unroll", "bag_warps", "update_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"EmbeddingConfig.{name} must be a positive power of two, got {value!r}")


DEFAULT_CONFIG = EmbeddingConfig()


@dataclass(frozen=True)
class Plan:
    """Block sizes of one embedding dim: ``block_d`` (D padded to a power of two); rows per lookup program of one
    id per feature, and of bags (``bag_rows``, ``config.lookup_unroll`` ids each per step); items per step of the
    update's item kernel (``config.update_unroll`` gradient rows each); chunk partials per carry step."""

    block_d: int
    lookup_rows: int
    bag_rows: int
    update_items: int
    carry_chunks: int


def plan(dim: int, config: EmbeddingConfig = DEFAULT_CONFIG) -> Plan:
    """The block sizes for embedding dim ``dim`` under ``config``'s element budgets (at least one row each)."""
    block_d = next_power_of_2(dim)
    return Plan(block_d, max(1, config.lookup_elements // block_d),
                max(1, config.lookup_elements // (block_d * config.lookup_unroll)),
                max(1, config.update_elements // (block_d * config.update_unroll)),
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


def state_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The optimizer state's dtype for a weight of ``weight_dtype``: float32 for half-precision weights (their math
    is fp32), else the weight's own."""
    return torch.float32 if weight_dtype in HALF_WEIGHT_DTYPES else weight_dtype


def check_update(weight: torch.Tensor, state: torch.Tensor, lr: torch.Tensor, grad: torch.Tensor | None,
                 optimizer: EmbeddingOptimizer, batch: int, f_count: int, seed: torch.Tensor | None = None) -> None:
    """Validate an update's own arguments (after :func:`check`; ``grad`` None: not yet known); same errors as
    :func:`check`. A half-precision weight needs ``seed``, a 0-dim int64 tensor on its device (the stochastic
    rounding's seed, advanced by every update)."""
    for name, t in (("state", state), ("lr", lr)) + ((("grad", grad),) if grad is not None else ()):
        _require_tensor(name, t)
    if not isinstance(optimizer, EmbeddingOptimizer):
        raise TypeError(f"optimizer must be an EmbeddingOptimizer (fuselab.core.embedding_optimizer), got "
                        f"{type(optimizer).__name__}")
    rows, dim = weight.shape
    expect = optimizer.state_shape(rows, dim)
    if optimizer.has_state and tuple(state.shape) != expect:
        raise ValueError(f"state must have shape {expect} for {optimizer.name}, got {tuple(state.shape)}")
    if optimizer.has_state and state.dtype != state_dtype(weight.dtype):
        raise TypeError(f"state must be {state_dtype(weight.dtype)} for a {weight.dtype} weight, got {state.dtype}")
    if weight.dtype in HALF_WEIGHT_DTYPES:
        if not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.dim() != 0:
            raise ValueError(f"a {weight.dtype} weight needs seed, a 0-dim int64 tensor (the stochastic rounding's "
                             f"seed), got {seed if not isinstance(seed, torch.Tensor) else (seed.dtype, seed.shape)}")
        if seed.device != weight.device:
            raise ValueError(f"seed is on {seed.device} but weight is on {weight.device}")
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
    if weight.dtype not in KERNEL_WEIGHT_DTYPES:
        raise TypeError(f"weight must be float32, float16 or bfloat16 for the Triton kernels, got {weight.dtype}")
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
    bags = offsets is not None
    block_rows = blocks.bag_rows if bags else blocks.lookup_rows
    s_ib, s_if = _id_strides(ids, bags)
    f_count = table_sizes.shape[0]
    grid = (cdiv(out.shape[0], block_rows), f_count) if bags else (cdiv(num_bags, block_rows), 1)
    wide = needs_int64(out, ids) or num_bags + block_rows > INT32_MAX
    record = _step(kernels.lookup_kernel, grid,
                   (weight, ids, offsets if bags else table_sizes, table_sizes, row_offsets, out),
                   (ids.shape[0] if bags else 0, num_bags, f_count, s_ib, s_if),
                   dict(D=dim, BLOCK_ROWS=block_rows, BLOCK_D=blocks.block_d, BAGS=bags, MEAN=pooling == "mean",
                        WIDE=wide, UNROLL=config.lookup_unroll if bags else 1,
                        num_warps=config.bag_warps if bags else config.num_warps), 1)
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


@dataclass(frozen=True)
class UpdatePlan:
    """Sizes and launches of one update: ``steps`` holds each kernel's (grid, scalars, constexprs, dynamic-scalar
    count), in launch order: rows; then atomic SGD, or the two item-numbering passes, the item kernel and the
    carry kernel."""

    n_pos: int
    key_dtype: torch.dtype
    n_chunks: int
    block_d: int
    atomic: bool
    steps: tuple


def _update_plan(weight: torch.Tensor, grad: torch.Tensor, ids: torch.Tensor, table_sizes: torch.Tensor,
                 bags: bool, pooling: str, optimizer: EmbeddingOptimizer, deterministic: bool,
                 config: EmbeddingConfig) -> UpdatePlan:
    """The update's sizes and, per kernel, its grid, scalars, constexprs and dynamic-scalar count."""
    n_pos, f_count, dim = ids.numel(), table_sizes.shape[0], weight.shape[1]
    key_dtype = torch.int32 if weight.shape[0] <= INT32_MAX else torch.int64
    s_ib, s_if = _id_strides(ids, bags)
    wide = needs_int64(ids, grad) or n_pos + config.rows_block > INT32_MAX
    blocks = plan(dim, config)
    block_d, warps = blocks.block_d, config.num_warps
    mean = pooling == "mean"
    n_ids = ids.shape[0] if bags else 0
    stochastic = weight.dtype in HALF_WEIGHT_DTYPES
    rows_grid = (cdiv(n_pos, config.rows_block),)
    steps = [(rows_grid, (n_pos, n_ids, f_count, s_ib, s_if),
              dict(BLOCK=config.rows_block, BAGS=bags, MEAN=mean, WIDE=wide, STOCHASTIC=stochastic, num_warps=warps),
              2)]
    code, eps = kernel_optimizer(optimizer)
    # atomics cannot round stochastically: half-precision weights take the sorted path
    atomic = code == KERNEL_OPTIMIZERS[SGD] and not deterministic and not stochastic
    if atomic:
        block_p = max(1, config.update_elements // block_d)
        steps.append(((cdiv(n_pos, block_p),), (n_pos, n_ids, f_count, *grad.stride()),
                      dict(BLOCK_P=block_p, BAGS=bags, MEAN=mean, WIDE=wide, D=dim, BLOCK_D=block_d, num_warps=warps),
                      2))
        return UpdatePlan(n_pos, key_dtype, 0, block_d, True, tuple(steps))
    chunk = config.update_chunk
    for starts in (False, True):
        steps.append((rows_grid, (n_pos,), dict(BLOCK=config.rows_block, CHUNK=chunk, STARTS=starts, num_warps=warps),
                      1))
    # a persistent grid of 32 warps per multiprocessor: items are at most N, their count is known on the device only
    programs = min(cdiv(n_pos, blocks.update_items), max(1, 32 // config.update_warps) * sm_count(weight.device))
    steps.append(((max(programs, 1),), (n_pos, f_count, *grad.stride(), eps),
                  dict(D=dim, BLOCK_S=blocks.update_items, UNROLL=config.update_unroll, BLOCK_D=block_d, CHUNK=chunk,
                       OPTIMIZER=code, SCALED=bags, FLAT_GRAD=grad.stride(0) == f_count * grad.stride(1),
                       num_warps=config.update_warps), 1))
    n_chunks = cdiv(n_pos, chunk)
    # most carry programs read 3 keys and exit; a segment crossing chunks adds (carry_chunks, D) tiles
    steps.append(((n_chunks,), (n_pos, n_chunks, eps),
                  dict(CHUNK=chunk, BLOCK_C=blocks.carry_chunks, OPTIMIZER=code, D=dim, BLOCK_D=block_d,
                       num_warps=warps), 2))
    return UpdatePlan(n_pos, key_dtype, n_chunks, block_d, False, tuple(steps))


@dataclass(frozen=True)
class UpdateTensors:
    """The tensors of one update: ``weight`` (R, D) and its optimizer ``state`` updated in place, ``lr`` () fp32,
    ``seed`` () int64 (half-precision weights: the stochastic rounding's seed, advanced by every update; None for
    fp32), the output gradient ``grad`` (B, F, D), and the lookup's ids, table metadata and offsets."""

    weight: torch.Tensor
    state: torch.Tensor
    lr: torch.Tensor
    seed: torch.Tensor | None
    grad: torch.Tensor
    ids: torch.Tensor
    table_sizes: torch.Tensor
    row_offsets: torch.Tensor
    offsets: torch.Tensor | None


def _run_update(update_plan: UpdatePlan, entries: tuple | None, t: UpdateTensors) -> tuple:
    """The update's workspace and launches, in stream order: each kernel launched (``entries`` None: returns their
    entries) or relaunched from its entry (returns ``entries``)."""
    p = update_plan
    launched = []

    def run(i: int, kernel, tensors: tuple) -> None:
        grid, scalars, constexprs, dynamic = p.steps[i]
        if entries is None:
            launched.append(_step(kernel, grid, tensors, scalars, constexprs, dynamic)[0])
        else:
            relaunch(entries[i], grid, tensors, scalars)

    weight, lr, offsets, device = t.weight, t.lr, t.offsets, t.weight.device
    state = t.state if t.state.numel() else weight  # sgd: no state (never read)
    seed = t.seed if t.seed is not None else lr  # fp32 weights: never read
    keys = torch.empty(p.n_pos, dtype=p.key_dtype, device=device)
    bags = offsets is not None
    bag = _bag_of_positions(offsets, p.n_pos) if bags else keys
    scale = torch.empty(p.n_pos if bags else 0, dtype=torch.float32, device=device)
    run(0, kernels.rows_kernel, (t.ids, bag, t.table_sizes, t.row_offsets, keys, offsets if bags else keys,
                                 scale if bags else keys, seed))
    if p.atomic:
        run(1, kernels.atomic_sgd_kernel, (t.grad, keys, bag, offsets if bags else keys, weight, lr))
        return entries if entries is not None else tuple(launched)
    sorted_keys, perm = torch.sort(keys, stable=True)
    flags = torch.empty(p.n_pos, dtype=torch.int32, device=device)
    starts = torch.empty(p.n_pos + 1, dtype=torch.int64, device=device)
    count = torch.empty(1, dtype=torch.int64, device=device)
    run(1, kernels.items_kernel, (sorted_keys, flags, perm, starts, count))
    number = torch.cumsum(flags, 0)
    run(2, kernels.items_kernel, (sorted_keys, flags, number, starts, count))
    # the gradient row and factor of each sorted position (one id per feature: the position is its bag)
    src = bag[perm] if bags else perm
    scale_sorted = scale[perm] if bags else lr
    head = torch.empty(p.n_chunks, p.block_d, dtype=torch.float32, device=device)
    tail = torch.empty_like(head)
    run(3, kernels.item_update_kernel, (sorted_keys, src, scale_sorted, starts, count, t.grad, weight, state, lr, seed,
                                        head, tail))
    run(4, kernels.carry_update_kernel, (sorted_keys, head, tail, weight, state, lr, seed))
    return entries if entries is not None else tuple(launched)


def update_(t: UpdateTensors, pooling: str, optimizer: EmbeddingOptimizer, deterministic: bool = True,
            config: EmbeddingConfig = DEFAULT_CONFIG) -> tuple | None:
    """Apply the ``optimizer`` update of the output gradient ``t.grad`` (B, F, D) to the rows the ids touched, in
    place.

    Deterministic: global rows (int32 keys when R < 2^31) -> stable ``torch.sort`` -> items numbered (runs of one
    row cut at chunk starts: two passes and a cumsum) -> the item kernel (sums each item, applies whole segments)
    -> the carry kernel (adds the pieces of segments longer than a chunk, in order, and applies them); about ten
    launches, the sort's included; workspace: keys, sorted keys, permutation, flags, item numbers and starts, the
    sorted sources, 2 partial rows per chunk.
    ``deterministic=False`` with SGD and an fp32 weight: one kernel of atomic adds, no sort (other optimizers
    and half-precision weights ignore the flag). No host synchronisation: every size comes from shapes. Returns a
    record for :func:`update_again` (None when nothing was launched or an index tensor was copied). Raises
    ValueError for an optimizer the kernels do not implement (:data:`KERNEL_OPTIMIZERS`).
    """
    _require_kernel_layout(t.weight, t.state)
    (offsets, table_sizes, row_offsets), copied = _dense_index(t.offsets, t.table_sizes, t.row_offsets)
    if t.ids.numel() == 0 or t.grad.numel() == 0:
        return None
    t = replace(t, offsets=offsets, table_sizes=table_sizes, row_offsets=row_offsets)
    update_plan = _update_plan(t.weight, t.grad, t.ids, table_sizes, offsets is not None, pooling, optimizer,
                               deterministic, config)
    entries = _run_update(update_plan, None, t)
    return None if copied else (update_plan, entries)


def update_again(record: tuple, t: UpdateTensors) -> None:
    """The update that :func:`update_` returned ``record`` for, on new tensors: the caller guarantees the same
    shapes, dtypes, strides, storage offsets and 16-byte alignment (and ``offsets`` given or not). Its workspace
    is allocated anew (on the current stream: CUDA-graph capturable)."""
    update_plan, entries = record
    _run_update(update_plan, entries, t)
