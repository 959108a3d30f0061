"""The device memory a DLRM run will need, counted before anything is allocated, and what to do when it does not fit.

The count is the tables and their optimizer state (exact), the dense parameters with their gradients and optimizer
state (exact), the activations of one training step (an estimate: every layer's output kept for the backward and
its gradient, in the compute precision) and the update's workspace per id, plus the train split when it is held on
the device. :func:`plan` makes a :class:`MemoryPlan`; :meth:`MemoryPlan.check` raises :class:`DoesNotFit` (a
``ValueError``) with a message that names the ways out, instead of an out-of-memory error deep in the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from fuselab.core.device import device_index

#: bytes per element of each embedding table dtype
TABLE_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: the device memory a run cannot use: the CUDA context, cuBLAS and Triton workspaces, the allocator's slack
RESERVE_BYTES = 2 << 30
#: per id of a batch, the update's workspace: global row (int32), sorted row, permutation (int64), bag (int64)
UPDATE_BYTES_PER_ID = 4 + 4 + 8 + 8
GIB = 1 << 30


class DoesNotFit(ValueError):
    """A run needs more device memory than the device has; the message names the ways out."""


@dataclass(frozen=True)
class MemoryItem:
    """One line of a plan: what, its bytes, how they were counted."""

    name: str
    bytes: int
    detail: str
    estimate: bool = False


@dataclass(frozen=True)
class MemoryPlan:
    """What a run needs on its device (``items``) against what the device has (``capacity``, None: unknown)."""

    items: tuple[MemoryItem, ...]
    capacity: int | None
    device_name: str

    @property
    def total(self) -> int:
        return sum(item.bytes for item in self.items)

    def fits(self) -> bool:
        return self.capacity is None or self.total + RESERVE_BYTES <= self.capacity

    def lines(self) -> list[str]:
        """The plan as printed before training: one line per item, the total and the verdict."""
        out = [f"memory plan on {self.device_name}:"]
        for item in self.items:
            size = f"{'~' if item.estimate else ''}{item.bytes / GIB:.1f} GiB"
            out.append(f"  {item.name:<18} {size:>11}  {item.detail}")
        verdict = "" if self.capacity is None else (
            f" of {self.capacity / GIB:.1f} GiB (2 GiB kept for the CUDA context and workspaces): "
            + ("fits" if self.fits() else "does NOT fit"))
        out.append(f"  {'total':<18} {self.total / GIB:>7.1f} GiB{verdict}")
        return out

    def check(self, ways_out: list[str]) -> None:
        """Raise :class:`DoesNotFit` naming ``ways_out`` when the plan does not fit the device."""
        if self.fits():
            return
        need = (self.total + RESERVE_BYTES) / GIB
        raise DoesNotFit("\n".join([*self.lines(), f"the run needs about {need:.1f} GiB; ways out:",
                                    *(f"  {w}" for w in ways_out)]))


@dataclass(frozen=True)
class RunShape:
    """What the count reads of a run: the tables, the model's widths, the batch and the precisions.

    ``dense_widths``: every dense layer's (in, out) features; ``activation_widths``: the per-sample widths of the
    tensors a training step keeps for its backward (layer outputs, the interaction's intermediates)."""

    table_rows: tuple[int, ...]
    dim: int
    ids_per_sample: int
    table_dtype: str
    state_bytes_per_row: int
    dense_widths: tuple[tuple[int, int], ...]
    activation_widths: tuple[int, ...]
    batch: int
    activation_bytes: int
    data_bytes: int = 0


def plan(shape: RunShape, capacity: int | None, device_name: str) -> MemoryPlan:
    """The :class:`MemoryPlan` of a run of ``shape`` on a device with ``capacity`` bytes."""
    rows = sum(shape.table_rows)
    table_bytes = rows * shape.dim * TABLE_DTYPE_BYTES[shape.table_dtype]
    params = sum(i * o + o for i, o in shape.dense_widths)
    emb_out = shape.batch * len(shape.table_rows) * shape.dim * (4 + shape.activation_bytes)  # fp32 + its cast
    acts = shape.batch * sum(shape.activation_widths) * shape.activation_bytes * 2  # kept + its gradient
    items = [
        MemoryItem("embedding tables", table_bytes, f"{rows:,} rows x {shape.dim}, {shape.table_dtype}"),
        MemoryItem("optimizer state", rows * shape.state_bytes_per_row,
                   f"{shape.state_bytes_per_row} bytes per row"),
        MemoryItem("dense parameters", params * 4 * 3, f"{params:,} fp32, with gradients and optimizer state"),
        MemoryItem("activations", emb_out + acts + shape.batch * shape.ids_per_sample * UPDATE_BYTES_PER_ID,
                   f"batch {shape.batch:,}, {shape.ids_per_sample} ids per sample", estimate=True),
    ]
    if shape.data_bytes:
        items.append(MemoryItem("data on device", shape.data_bytes, "the train split (--data-on-device)"))
    return MemoryPlan(tuple(items), capacity, device_name)


#: the plan's items that are the tables themselves (what a sharding plan places)
TABLE_ITEMS = ("embedding tables", "optimizer state")


def non_table_bytes(shape: RunShape) -> int:
    """What a run of ``shape`` needs besides its tables and their optimizer state: the dense parameters, the
    activations and the data on the device."""
    return sum(item.bytes for item in plan(shape, None, "").items if item.name not in TABLE_ITEMS)


def data_bytes(cfg, num_id_columns: int, rows: int) -> int:
    """Device bytes of ``rows`` samples of the train split under ``--data-on-device`` (ids held as int32); 0
    without it."""
    return rows * (13 * 4 + num_id_columns * 4 + 4) if cfg.data_on_device else 0


def run_shape(cfg, table_rows: list[int], batch: int, data_bytes: int = 0) -> RunShape:
    """The :class:`RunShape` of a :class:`~fuselab.dlrm.config.DLRMConfig` run over tables of ``table_rows``."""
    dim, f_count = cfg.embedding_dim, len(table_rows)
    bottom = [13, *cfg.bottom_mlp]
    width = (f_count + 1) * dim  # the interaction's input, flattened
    kind = cfg.interaction.kind
    if kind == "dot":
        inter_out = dim + (f_count + 1) * f_count // 2
        inter = [width, inter_out]
    elif kind == "dcn":
        inter_out = width
        inter = [width, *[cfg.interaction.low_rank + 2 * width] * cfg.interaction.layers]
    else:
        inter_out = width
        inter = [width]
    top = [inter_out, *cfg.top_mlp]
    dense = [*pairwise(bottom), *pairwise(top)]
    if kind == "dcn":
        rank = cfg.interaction.low_rank
        dense += [(width, rank), (rank, width)] * cfg.interaction.layers
    state = 4 * cfg.embedding_optimizer.state_floats_per_row(dim)
    ids = sum(cfg.multi_hot_sizes) if cfg.multi_hot_sizes else f_count
    return RunShape(tuple(table_rows), dim, ids, cfg.embedding_dtype, state, tuple(dense),
                    (*bottom[1:], *inter, *top[1:]), batch, 2 if cfg.precision == "bf16" else 4, data_bytes)


def ways_out(shape: RunShape) -> list[str]:
    """What a user can change so that a run of ``shape`` needs less device memory, each with what it saves."""
    out = []
    if shape.table_dtype == "fp32":
        half = sum(shape.table_rows) * shape.dim * 2
        out.append(f"--set embedding_dtype=fp16 (or bf16): tables in half precision, {half / GIB:.1f} GiB less")
    out.append("--nproc N: the tables split over N GPUs of this machine")
    biggest = max(shape.table_rows)
    target = max(1, biggest // 4)
    out.append(f"--set max_rows_per_table={target}: the largest tables capped (ids hashed into fewer rows)")
    if shape.batch > 1024:
        out.append(f"--batch-size {shape.batch // 2}: half the activations")
    if shape.data_bytes:
        out.append("without --data-on-device: the data streamed from disk")
    return out


def check_device(cfg, table_rows: list[int], num_id_columns: int, train_rows: int, device, log) -> MemoryPlan | None:
    """Before a single-process run allocates anything on a CUDA ``device``: log its plan (one line per item) and
    raise :class:`DoesNotFit` naming the ways out when it needs more than the device has free. None on other
    devices (nothing is counted there)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device_index(device))
    shape = run_shape(cfg, table_rows, cfg.batch_size, data_bytes(cfg, num_id_columns, train_rows))
    result = plan(shape, free, f"{torch.cuda.get_device_name(device)} ({free / GIB:.1f} GiB free)")
    for line in result.lines():
        log(line)
    result.check(ways_out(shape))
    return result
