"""Embedding bag collection argument checks (see ``docs/embedding.md``): :func:`validate_lookup` turns a lookup's
arguments (:class:`LookupArgs`) into a :class:`LookupCall`, :func:`validate_update` an update's (plus
:class:`UpdateArgs`) into an :class:`UpdateCall`; each raises ``TypeError``/``ValueError`` naming the argument. They
read no tensor values (that would synchronise with the device): ids are wrapped into their tables by the kernels.

The update writes ``weight``, its optimizer ``state`` and the rounding ``seed`` in place: their elements
must be distinct (a function of shapes and strides, checked once per signature) and none of them may overlap another
operand (:func:`check_writes`: the actual tensors decide, so it runs on every call).

:class:`EmbeddingConfig`, the kernels' tuning knobs, is an argument of the public functions and part of the call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from fuselab.backend import triton_for
from fuselab.core.checks import require_disjoint, require_distinct_elements, require_same_device, require_tensor
from fuselab.core.embedding_optimizer import (
    ROWWISE_ADAGRAD,
    SGD,
    Adagrad,
    EmbeddingOptimizer,
    RowwiseAdagrad,
    embedding_optimizer,
)
from fuselab.core.reductions import REDUCTIONS

#: weight dtypes of the Triton path: fp32, or half precision with fp32 math and stochastically rounded updates
KERNEL_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_WEIGHT_DTYPES = (torch.float16, torch.bfloat16)
_ID_DTYPES = (torch.int32, torch.int64)
#: the optimizers the kernels implement: their ``OPTIMIZER`` constexpr
KERNEL_OPTIMIZERS: dict[type[EmbeddingOptimizer], int] = {SGD: 0, Adagrad: 1, RowwiseAdagrad: 2}


def kernel_optimizer(optimizer: EmbeddingOptimizer) -> tuple[int, float]:
    """The kernels' ``OPTIMIZER`` constexpr and ``eps`` of ``optimizer``. Raises ValueError for a kind the kernels do
    not implement (it runs on the reference path)."""
    code = KERNEL_OPTIMIZERS.get(type(optimizer))
    if code is None:
        names = ", ".join(kind.name for kind in KERNEL_OPTIMIZERS)
        raise ValueError(f"optimizer {optimizer.name!r} has no fused kernel (the kernels implement {names}); use "
                         "the reference path (kernels='torch')")
    return code, float(getattr(optimizer, "eps", 0.0))


@functools.cache
def optimizer_of(name: str, eps: float) -> EmbeddingOptimizer:
    """The optimizer the custom ops' schema carries as its name and eps."""
    return embedding_optimizer(name, eps=eps)


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
    ``segment_dim``: updates of one id per feature at D <= this (0: none) sum their runs with the segment kernel
    (a segmented scan over ``segment_elements``: contiguous sorted positions times D per step) instead of the
    items: at small D most runs are a few positions long, and a step of contiguous positions reads whole lines.
    ``num_warps``: warps per program of the one-id lookup and of the rows, item-numbering, segment and carry
    kernels;
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
    segment_dim: int = 16
    segment_elements: int = 4096

    def __post_init__(self) -> None:
        for name in ("lookup_elements", "update_elements", "rows_block", "carry_elements", "num_warps",
                     "update_chunk", "lookup_unroll", "update_unroll", "bag_warps", "update_warps", "segment_dim",
                     "segment_elements"):
            value = getattr(self, name)
            if name == "segment_dim" and value == 0:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                zero = " or 0" if name == "segment_dim" else ""
                raise ValueError(f"EmbeddingConfig.{name} must be a positive power of two{zero}, got {value!r}")


DEFAULT_CONFIG = EmbeddingConfig()


def config_of(knobs: tuple[int, ...] | list[int]) -> EmbeddingConfig:
    """The config of the custom ops' ``knobs`` (its fields in order; empty: :data:`DEFAULT_CONFIG`)."""
    return EmbeddingConfig(*knobs) if len(knobs) else DEFAULT_CONFIG


def knobs_of(config: object) -> tuple[int, ...]:
    """The custom ops' ``knobs`` of ``config`` (None: the default, ``()``); ``TypeError`` naming it otherwise."""
    if config is None:
        return ()
    if not isinstance(config, EmbeddingConfig):
        raise TypeError(f"config must be an EmbeddingConfig, got {type(config).__name__}")
    return tuple(getattr(config, f.name) for f in dataclasses.fields(config))


def state_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The optimizer state's dtype for a weight of ``weight_dtype``: float32 for half-precision weights (their math
    is fp32), else the weight's own."""
    return torch.float32 if weight_dtype in HALF_WEIGHT_DTYPES else weight_dtype


# ---------------------------------------------------------------------------------------------- calls
@dataclass(frozen=True)
class LookupArgs:
    """A lookup's arguments as given (of :func:`fuselab.ops.embedding.embedding_bag_lookup`)."""

    weight: Any
    ids: Any
    table_sizes: Any
    row_offsets: Any
    offsets: Any = None
    pooling: Any = "sum"
    config: Any = None


@dataclass(frozen=True)
class UpdateArgs:
    """An update's own arguments as given (``grad`` None: the backward's, not known yet)."""

    state: Any
    lr: Any
    seed: Any = None
    optimizer: Any = ROWWISE_ADAGRAD
    deterministic: Any = True
    grad: Any = None


@dataclass(frozen=True, slots=True, eq=False)
class LookupCall:
    """One validated lookup. The custom op's arguments after its operands (:meth:`arguments`): ``pooling`` and
    ``knobs`` (``config``'s fields; empty for the default). Derived: ``config`` (the knobs' :class:`EmbeddingConfig`),
    ``shape`` (B, F, D) of the output, ``bags`` (offsets given), ``triton`` (the backend: the Triton kernels, else the
    PyTorch reference), ``signature`` (see :mod:`fuselab.ops.opdef`; None on the reference path, which has nothing to
    plan)."""

    pooling: str
    knobs: tuple[int, ...]
    config: EmbeddingConfig
    shape: tuple[int, int, int]
    bags: bool
    triton: bool
    signature: Hashable | None = None

    def arguments(self) -> tuple[str, list[int]]:
        return self.pooling, list(self.knobs)


@dataclass(frozen=True, slots=True, eq=False)
class UpdateCall:
    """One validated update (of :func:`~fuselab.ops.embedding.embedding_bag_update_`, or of the training lookup,
    whose backward is that update): its ``lookup``'s call, ``optimizer`` (an
    :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer`), ``deterministic``, ``signature``. The custom ops'
    arguments after their operands: pooling, the optimizer's name and eps, deterministic, knobs."""

    lookup: LookupCall
    optimizer: EmbeddingOptimizer
    deterministic: bool
    signature: Hashable | None = None

    def arguments(self) -> tuple[str, str, float, bool, list[int]]:
        return (self.lookup.pooling, self.optimizer.name, float(getattr(self.optimizer, "eps", 0.0)),
                self.deterministic, list(self.lookup.knobs))


def unchecked_lookup(args: LookupArgs, knobs: tuple[int, ...] | list[int], triton: bool) -> LookupCall:
    """The call of a custom op's inputs as they are (fake tensors, symbolic shapes; its registered autograd)."""
    f_count = args.table_sizes.shape[0]
    batch = args.ids.shape[0] if args.offsets is None else (args.offsets.shape[0] - 1) // f_count
    return LookupCall(args.pooling, tuple(knobs), config_of(knobs), (batch, f_count, args.weight.shape[1]),
                      args.offsets is not None, triton)


def with_signature(call: UpdateCall, signature: Hashable | None) -> UpdateCall:
    """``call`` under another signature (the backward's update of a training lookup)."""
    return dataclasses.replace(call, signature=signature if call.lookup.triton else None)


# ---------------------------------------------------------------------------------------------- lookup
def _check_index(args: LookupArgs, f_count: int) -> int:
    """ids and offsets against F tables; returns the batch size B."""
    ids, offsets = args.ids, args.offsets
    if ids.dtype not in _ID_DTYPES:
        raise TypeError(f"ids must be int64 or int32, got {ids.dtype}")
    if offsets is None:
        if ids.dim() != 2 or ids.shape[1] != f_count:
            raise ValueError(f"ids must be (B, F={f_count}) with one id per feature (or (N,) with offsets), "
                             f"got shape {tuple(ids.shape)}")
        return ids.shape[0]
    require_tensor("offsets", offsets)
    if offsets.dtype != torch.int64:
        raise TypeError(f"offsets must be int64, got {offsets.dtype}")
    if ids.dim() != 1:
        raise ValueError(f"ids must be (N,) flat bag values when offsets are given, got shape {tuple(ids.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] < 1 or (offsets.shape[0] - 1) % f_count:
        raise ValueError(f"offsets must be (B*F + 1,) with F={f_count}, got shape {tuple(offsets.shape)}")
    return (offsets.shape[0] - 1) // f_count


def validate_lookup(args: LookupArgs, signature: Hashable | None, triton: bool | None = None) -> LookupCall:
    """Every check of a lookup, and the backend: ``triton`` (None: :func:`fuselab.backend.triton_for` of the weight),
    whose kernels also need a contiguous weight of :data:`KERNEL_WEIGHT_DTYPES` (``signature``: the call's).

    Raises TypeError (not a tensor, wrong dtype, a config that is no :class:`EmbeddingConfig`) or ValueError (rank,
    shapes, F mismatch, offsets not ``(B*F + 1,)``, mixed devices, unknown pooling), naming the argument."""
    weight, table_sizes, row_offsets = args.weight, args.table_sizes, args.row_offsets
    for name, t in (("weight", weight), ("ids", args.ids), ("table_sizes", table_sizes),
                    ("row_offsets", row_offsets)):
        require_tensor(name, t)
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
    batch = _check_index(args, f_count)
    if not isinstance(args.pooling, str) or args.pooling not in REDUCTIONS:
        raise ValueError(f"pooling must be one of {', '.join(REDUCTIONS)}, got {args.pooling!r}")
    require_same_device(weight=weight, ids=args.ids, table_sizes=table_sizes, row_offsets=row_offsets,
                        offsets=args.offsets)
    knobs = knobs_of(args.config)
    if triton is None:
        triton = triton_for(weight)
    if triton:
        require_kernel_layout("weight", weight)
    return LookupCall(args.pooling, knobs, config_of(knobs), (batch, f_count, weight.shape[1]),
                      args.offsets is not None, triton, signature if triton else None)


def require_lookup_out(out: object, call: LookupCall, device: torch.device) -> None:
    """``out`` of an out-param lookup: a contiguous float32 tensor of the output's shape on the weight's
    ``device``."""
    require_tensor("out", out)
    if (tuple(out.shape) != call.shape or out.dtype != torch.float32 or not out.is_contiguous()
            or out.device != device):
        raise ValueError(f"out must be a contiguous float32 tensor of shape {call.shape} on {device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")


def require_kernel_layout(name: str, t: torch.Tensor) -> None:
    """What the Triton kernels read: a contiguous ``weight`` of :data:`KERNEL_WEIGHT_DTYPES` (a contiguous state)."""
    if name == "weight" and t.dtype not in KERNEL_WEIGHT_DTYPES:
        raise TypeError(f"weight must be float32, float16 or bfloat16 for the Triton kernels, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous for the Triton kernels")


# ---------------------------------------------------------------------------------------------- update
def _check_state(weight: torch.Tensor, update: UpdateArgs) -> None:
    """the optimizer, the state's shape and dtype, and the rounding seed of a half-precision weight."""
    optimizer, state, seed = update.optimizer, update.state, update.seed
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


def validate_update(args: LookupArgs, update: UpdateArgs, signature: Hashable | None) -> UpdateCall:
    """Every check of an update: the lookup's (:func:`validate_lookup`, the backend included), then ``state``,
    ``lr``, ``grad`` (when given: the output's shape), ``seed``, the optimizer (on the Triton path one the kernels
    implement), the written tensors' distinct elements and :func:`check_writes`; same errors."""
    lookup = validate_lookup(args, signature)
    triton = lookup.triton
    grad = update.grad
    for name, t in (("state", update.state), ("lr", update.lr)) + ((("grad", grad),) if grad is not None else ()):
        require_tensor(name, t)
    weight, lr = args.weight, update.lr
    _check_state(weight, update)
    if lr.dim() != 0 or not lr.is_floating_point():
        raise ValueError(f"lr must be a 0-dim floating tensor, got shape {tuple(lr.shape)} {lr.dtype}")
    if grad is not None:
        if not grad.is_floating_point():
            raise TypeError(f"grad must have a floating dtype, got {grad.dtype}")
        if tuple(grad.shape) != lookup.shape:
            raise ValueError(f"grad must have the output's shape {lookup.shape}, got {tuple(grad.shape)}")
    require_same_device(weight=weight, state=update.state, lr=lr, grad=grad)
    if triton:
        require_kernel_layout("state", update.state)
        kernel_optimizer(update.optimizer)
    if not torch.compiler.is_compiling():
        for name, t in (("weight", weight), ("state", update.state), ("seed", update.seed)):
            if t is not None:
                require_distinct_elements(name, t, remedy="")
        check_writes(weight, update.state, update.seed,
                     {"lr": lr, "grad": grad, "ids": args.ids, "offsets": args.offsets, "table_sizes": args.table_sizes,
                      "row_offsets": args.row_offsets})
    return UpdateCall(lookup, update.optimizer, bool(update.deterministic), signature if triton else None)


def check_writes(weight: torch.Tensor, state: torch.Tensor, seed: torch.Tensor | None,
                 read: dict[str, torch.Tensor | None]) -> None:
    """``weight``, ``state`` and ``seed``, which the update writes in place, overlap neither each other nor an
    operand it reads (``read``: by name): ``ValueError`` naming both. For every call (the actual tensors decide)."""
    require_disjoint({"weight": weight, "state": state, "seed": seed}, read, remedy="")
