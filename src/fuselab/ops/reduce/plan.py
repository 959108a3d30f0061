"""The schedule of ``fuselab.sum``/``fuselab.mean``: which kernel, tile, split and read order (pure Python, cached).

Every reduction is planned as ``out[o, i] = Σ_r x[o·s_o + r·s_r + i·s_i]`` (:class:`ReduceSchedule`): the
reduced axes coalesce into one axis ``r`` of ``R`` elements and the kept axes into at most two
groups ``o`` and ``i`` (``K = O·I`` outputs, written contiguously in the output's axis order).
Strided and permuted views are read in place whenever that holds; otherwise the input is copied
once into ``(kept..., reduced...)`` order (see :func:`prepare`). The kernels that run a schedule are in
:mod:`fuselab.ops.reduce.kernels`. The knobs are :class:`ReduceTuning`'s; the measurements that set them are in
``benchmarks/notes/reduce.md#planner-knobs``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from fuselab.core.device import INT32_MAX, cdiv, fast_memory, next_power_of_2, sm_count, tma_capable
from fuselab.ops.opdef import memo
from fuselab.ops.tuning import current


@dataclass(frozen=True, eq=False)
class ReduceTuning:
    """The planner's and the launcher's knobs (:func:`fuselab.ops.tuning.override` changes them for a sweep). The
    dicts are keyed by element size (or kernel); treat them as read-only. The measurement behind each value:
    ``benchmarks/notes/reduce.md#planner-knobs``, one entry per field."""

    #: bytes each program loads per loop iteration, by element size: enough in flight to cover DRAM latency
    tile_bytes: dict[int, int] = field(default_factory=lambda: {2: 8192, 4: 16384, 8: 16384})
    #: the rows kernel's step when each program reads whole rows: small enough that a row's last, masked step wastes
    #: little
    row_tile_bytes: int = 8192
    #: the same on devices with :func:`~fuselab.core.device.fast_memory`, by element size (others as row_tile_bytes):
    #: more bandwidth per SM wants shorter 16-bit steps
    fast_memory_row_tile_bytes: dict[int, int] = field(default_factory=lambda: {2: 4096})
    #: the same under the interpreter (CPU): larger tiles, fewer (serially run) programs
    interpreter_tile_bytes: int = 262144
    #: programs per SM a split reduction of the rows kernel aims for: a few waves of resident programs
    programs_per_sm: int = 8
    #: warps of a rows-kernel program whose tile is one row of at least row_tile_bytes: more warps hide more DRAM
    #: latency; packed short rows keep 8
    row_warps: int = 16
    #: programs per SM of the cols kernel, which needs more registers than the rows kernel (a cap spills)
    cols_programs_per_sm: int = 4
    #: narrowest column tile of the cols kernel, in bytes per row, by element size: the planner narrows the tile (more
    #: tiles, fewer splits) down to this
    min_col_bytes: dict[int, int] = field(default_factory=lambda: {2: 128, 4: 1024, 8: 1024})
    #: smallest split at which the programs of a split reduction read the reduced axis interleaved (program s of S:
    #: blocks s, s+S, s+2S, ...) rather than in S contiguous chunks (see _chunk), by kernel; None: never
    interleave_min_split: dict[str, int | None] = field(default_factory=lambda: {"rows": None, "cols": 16})
    #: widest column tile of the cols kernel (1 KiB rows on GPUs), and most rows per program of the rows kernel, as a
    #: fraction of the tile
    max_col_fraction: int = 16
    #: cols plans read through TMA (:func:`~fuselab.core.device.tma_capable` devices), by element size: (bytes per box,
    #: stages in flight, warps, programs per SM). Each program streams ``[block_r, block_i]`` boxes into shared memory,
    #: ``stages`` of them in flight, instead of synchronous loads; bf16 keeps pointer loads, whose ``evict_first`` hint
    #: TMA loads cannot carry. Applies where the layout allows a descriptor: one kept group (``O == 1``), contiguous
    #: columns, rows 16-byte aligned
    cols_tma: dict[int, tuple[int, int, int, int]] = field(default_factory=lambda: {4: (16384, 2, 4, 3)})
    #: the same on devices with :func:`~fuselab.core.device.fast_memory`: smaller boxes, more of them in flight
    fast_memory_cols_tma: dict[int, tuple[int, int, int, int]] = field(default_factory=lambda: {4: (8192, 3, 2, 3)})
    #: smallest input read through TMA: Triton encodes the descriptor on every launch, host time that only a long
    #: kernel hides; smaller inputs are read through pointers
    cols_tma_min_bytes: int = 2**27
    #: which schedules of the rows kernel run by work stealing (see ReduceSchedule.steal): None (none), "split" (those
    #: that split the reduced axis: few outputs, e.g. all elements) or "all". A grid of resident programs takes work
    #: items (a tile of outputs x a chunk of the reduced axis) from an atomic counter until none is left, so no SM
    #: idles while another finishes a long program; schedules of many short programs gain nothing from it
    steal: str | None = "split"
    #: bytes of input per work item of a split plan (chunks of the reduced axis), by element size: larger items cost
    #: balance, smaller ones more atomics and partials
    steal_item_bytes: dict[int, int] = field(default_factory=lambda: {2: 32768, 4: 65536, 8: 65536})
    #: most partials (split x outputs) of a stealing split plan: its last program sums all of them alone
    steal_max_partials: int = 65536
    #: warps a stealing grid puts on each SM (programs = this // warps per program). They must all be resident at once:
    #: the kernels cap their registers to fit (steal_maxnreg: 64 for 32 warps)
    steal_warps_per_sm: int = 32
    #: register cap of the rows kernel: a lower cap (for more resident programs) makes the compiler issue a tile's
    #: loads in batches
    rows_maxnreg: int = 64
    #: cache eviction hint of the input loads (read once), by element size. "evict_first" keeps the stream from
    #: displacing other L2 contents (after an L2 flush that wrote, the flush's dirty lines, whose write-back would
    #: otherwise share DRAM bandwidth with the read); it helps 16-bit inputs and costs fp32 ones. "" is Triton's default
    stream_eviction: dict[int, str] = field(default_factory=lambda: {2: "evict_first", 4: "", 8: ""})
    #: 64-bit index math in stealing launches whatever their size (the compiler schedules those loads better)
    steal_int64: bool = True


@dataclass(frozen=True)
class ReduceSchedule:
    """``out[o*I + i] = Σ_{r<R} x[o*s_o + r*s_r + i*s_i]``; ``kind`` is ``"rows"`` or ``"cols"``."""

    kind: str
    O: int
    I: int
    R: int
    s_o: int
    s_i: int
    s_r: int
    block_r: int
    block_i: int  # cols: columns per program; rows: rows (outputs) per program
    split: int  # chunks of the reduced axis (grid axis 1); > 1 means a second stage
    r_per_split: int
    num_warps: int
    interleave: bool  # split programs read every split-th block (see _chunk), not one contiguous chunk each
    steal: int = 0  # rows: > 0: that many programs take the tiles x split items from a counter (0: one per item)
    stages: int = 0  # cols: > 0: read through TMA boxes of [block_r, block_i], that many in flight (tuning.cols_tma)

    @property
    def tiles(self) -> int:
        """Output tiles: rows-kernel programs of ``block_i`` outputs, cols-kernel column blocks."""
        if self.kind == "rows":
            return cdiv(self.K, self.block_i)
        return self.O * cdiv(self.I, self.block_i)

    @property
    def K(self) -> int:
        return self.O * self.I

    @property
    def grid(self) -> tuple[int, int]:
        return (self.steal, 1) if self.steal else (self.tiles, self.split)


def _coalesce(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (size, stride) axes, outer to inner, where the outer stride equals size·stride of the inner."""
    merged: list[tuple[int, int]] = []
    for size, stride in dims:
        if size == 1:
            continue
        if merged and merged[-1][1] == size * stride:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged


@memo(maxsize=4096)
def _strided_layout(shape: tuple[int, ...], stride: tuple[int, ...], dims: tuple[int, ...]):
    """(kept groups, reduced axis) of a tensor read in place, or ``None`` when it needs a copy."""
    kept = _coalesce([(shape[d], stride[d]) for d in range(len(shape)) if d not in dims])
    # the order of the reduced axes is free: largest stride outermost, then merge
    red = _coalesce(sorted(((shape[d], stride[d]) for d in dims), key=lambda t: -t[1]))
    if len(kept) > 2 or len(red) > 1:
        return None
    return tuple(kept), (red[0] if red else (1, 0))


Groups = tuple[tuple[int, int], ...]  # (size, stride) axes


def prepare(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, Groups, tuple[int, int]]:
    """The tensor the kernels read (``x`` itself when its strides allow, else one copy) and its layout.

    The copy happens only when the reduced axes cannot be merged into one strided axis (e.g.
    ``dim=(0, 2)`` of a contiguous 3-d tensor) or the kept axes need more than two strided groups.
    """
    layout = _strided_layout(tuple(x.shape), x.stride(), dims)
    if layout is None:
        kept_axes = [d for d in range(x.dim()) if d not in dims]
        x = x.permute(*kept_axes, *dims).contiguous()
        layout = _strided_layout(tuple(x.shape), x.stride(), tuple(range(len(kept_axes), x.dim())))
        assert layout is not None
    return x, *layout


def plan_reduction(x: torch.Tensor, kept, red: tuple[int, int]) -> ReduceSchedule:
    """Pick kernel, tile sizes and split for reading ``x`` with the layout from :func:`prepare`, under the
    :class:`ReduceTuning` in force."""
    t = current(ReduceTuning)
    on_gpu = x.device.type == "cuda"
    tma = None  # (box bytes, stages, warps, programs per SM) of cols plans read through TMA
    if tma_capable(x.device) and x.numel() * x.element_size() >= t.cols_tma_min_bytes:
        tma = (t.fast_memory_cols_tma if fast_memory(x.device) else t.cols_tma).get(x.element_size())
    return _plan(tuple(kept), tuple(red), x.element_size(), on_gpu, sm_count(x.device), t.programs_per_sm,
                 t.cols_programs_per_sm, row_tile_bytes(x, t), tma, t)


def row_tile_bytes(x: torch.Tensor, t: ReduceTuning) -> int:
    """Bytes per loop step of a rows-kernel program that reads whole rows of ``x`` (``t.row_tile_bytes``, by device)."""
    if fast_memory(x.device):
        return t.fast_memory_row_tile_bytes.get(x.element_size(), t.row_tile_bytes)
    return t.row_tile_bytes


@memo(maxsize=4096)
def _plan(kept: tuple[tuple[int, int], ...], red: tuple[int, int], elsize: int, on_gpu: bool, sms: int,
          rows_per_sm: int, cols_per_sm: int, row_bytes: int,
          tma: tuple[int, int, int, int] | None, t: ReduceTuning) -> ReduceSchedule:
    R, s_r = red
    tile = (t.tile_bytes.get(elsize, 16384) if on_gpu else t.interpreter_tile_bytes) // elsize
    inner_stride = kept[-1][1] if kept else None
    use_rows = inner_stride is None or abs(s_r) <= abs(inner_stride)
    if use_rows:
        if len(kept) == 2:
            (O, s_o), (I, s_i) = kept
        elif len(kept) == 1:
            (O, s_o), (I, s_i) = kept[0], (1, 0)
        else:
            O, s_o, I, s_i = 1, 0, 1, 0
        # one pass per row first (row_bytes: row_tile_bytes()); a plan that must split the rows takes the larger tile
        for tile_bytes in (row_bytes, t.tile_bytes.get(elsize, 16384)):
            tile = (tile_bytes if on_gpu else t.interpreter_tile_bytes) // elsize
            block_r = min(next_power_of_2(R), tile)
            rows = max(1, min(tile // block_r, tile // t.max_col_fraction, next_power_of_2(O * I)))
            tiles = cdiv(O * I, rows)
            split, r_per_split, interleave = _split(R, block_r, tiles, sms * rows_per_sm, "rows", t)
            if split == 1:
                break
        warps = t.row_warps if rows == 1 and block_r * elsize >= row_bytes else 8 if rows * block_r >= 4096 else 4
        return _stealing(ReduceSchedule("rows", O, I, R, s_o, s_i, s_r, block_r, rows, split, r_per_split, warps,
                                    interleave), elsize, sms, t)
    if len(kept) == 2:
        (O, s_o), (I, s_i) = kept
    else:
        (O, s_o), (I, s_i) = (1, 0), kept[0]
    target = sms * cols_per_sm
    # widest column tile (≤ 1 KiB rows) that still leaves enough tiles to keep splits small
    block_i = min(next_power_of_2(I), max(1, tile // t.max_col_fraction))
    min_block_i = max(1, t.min_col_bytes.get(elsize, 128) // elsize)
    while block_i > min_block_i and O * cdiv(I, block_i) < target // 8:
        block_i //= 2
    block_r = max(1, min(tile // block_i, next_power_of_2(R)))
    warps = 8 if block_r * block_i >= 4096 else 4
    stages = 0
    box_i = min(block_i, TMA_MAX_BOX)  # GPU plans have ≤ 256 fp32 columns already; the interpreter's more
    if tma and _tma_layout(O, I, R, s_i, s_r, box_i, elsize):
        block_i = box_i
        box_bytes, stages, warps, per_sm = tma
        block_r = max(1, min(box_bytes // (block_i * elsize), TMA_MAX_BOX, next_power_of_2(R)))
        target = sms * per_sm
    tiles = O * cdiv(I, block_i)
    split, r_per_split, interleave = _split(R, block_r, tiles, target, "cols", t)
    return ReduceSchedule("cols", O, I, R, s_o, s_i, s_r, block_r, block_i, split, r_per_split, warps,
                      interleave and not stages, stages=stages)


#: most elements along each dimension of a TMA box
TMA_MAX_BOX = 256


def _tma_layout(O: int, I: int, R: int, s_i: int, s_r: int, block_i: int, elsize: int) -> bool:
    """Whether a cols plan's input can be described to TMA as a 2-d ``[R, I]`` tensor read in ``[*, block_i]``
    boxes: one kept group, contiguous columns, a 16-byte aligned row stride, 16-byte box rows, extents below 2^30
    (box coordinates and the kernel's row bounds are int32; the base address's alignment is checked at launch)."""
    return (O == 1 and s_i == 1 and s_r > 0 and (s_r * elsize) % 16 == 0 and (block_i * elsize) % 16 == 0
            and max(R, I) < 2**30 and s_r <= INT32_MAX)


def _stealing(schedule: ReduceSchedule, elsize: int, sms: int, t: ReduceTuning) -> ReduceSchedule:
    """A rows ``schedule`` run by work stealing where ``t.steal`` says so and there are more items than resident
    programs: a split schedule's chunks become ``t.steal_item_bytes`` each (whole blocks, read in order); the rest is
    unchanged."""
    if t.steal is None or (t.steal == "split" and schedule.split == 1):
        return schedule
    split, r_per_split = schedule.split, schedule.r_per_split
    if split > 1:
        item_bytes = t.steal_item_bytes.get(elsize, 32768)
        r_per_split = max(1, item_bytes // (elsize * schedule.block_i * schedule.block_r)) * schedule.block_r
        split = cdiv(schedule.R, r_per_split)
        if split <= 1 or split * schedule.K > t.steal_max_partials:
            return schedule
    programs = max(1, t.steal_warps_per_sm // schedule.num_warps) * sms
    if schedule.tiles * split <= programs:
        return schedule
    return dataclasses.replace(schedule, split=split, r_per_split=r_per_split, interleave=False, steal=programs)


def _split(R: int, block_r: int, tiles: int, target: int, kind: str, t: ReduceTuning) -> tuple[int, int, bool]:
    """``(split, r_per_split, interleave)``: chunks of the reduced axis so that ``tiles·split`` ≈ ``target`` programs,
    each chunk a multiple of ``block_r``; read interleaved from ``ReduceTuning.interleave_min_split[kind]`` splits up.

    The split is rounded to what chunks of whole blocks allow in both orders (an exact interleaved split ran slower:
    ``benchmarks/notes/reduce.md#planner-knobs``)."""
    if tiles >= target or block_r * 2 >= R:
        return 1, R, False
    split = min(cdiv(target, tiles), cdiv(R, block_r))
    r_per_split = cdiv(cdiv(R, split), block_r) * block_r
    split = cdiv(R, r_per_split)
    if split <= 1:
        return 1, R, False
    threshold = t.interleave_min_split[kind]
    return split, r_per_split, threshold is not None and split >= threshold


def workspace_numel(schedule: ReduceSchedule) -> int:
    """fp32 (fp64) elements of the stage-1 partials ``[split, K]`` (0 without a second stage)."""
    return schedule.split * schedule.K if schedule.split > 1 else 0
