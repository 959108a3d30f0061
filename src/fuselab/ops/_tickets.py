"""Single-launch two-stage reductions: the last program to finish sums the partials, in a fixed order.

A split reduction writes one partial per program and needs a second pass over them. Launching that pass as a
second kernel costs a whole launch of host time (10-27 µs on the H100 machine's host, more than the pass itself).
Instead, each group of programs that share an output counts its arrivals on an int32 *ticket counter*; the
program that draws the last ticket sums the group's partials (index order, so the bits do not depend on which
program came last) and resets the counter to zero for the next launch. Integer atomics only: deterministic.

Counters live in a zeroed int32 buffer per (device, stream), created once and left zeroed by every kernel. While
a CUDA graph is being captured each call gets fresh zeros instead (a memset node in the graph), so a graph never
shares counters with eager launches. The partials themselves can live in a scratch buffer per (device, stream,
shape) (:func:`scratch`): launches on one stream run one after the other, so each may reuse the last one's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuselab.core.device import device_index, next_power_of_2

from .opdef import LaunchCache

#: smallest counter buffer kept per (device, stream)
MIN_COUNTERS = 1024
#: partials the last program reads per step of :func:`sum_partials` (32 KiB of fp32): few, wide steps, each an
#: L2 round trip on one SM
FINAL_SUM_ELEMS = 8192

#: distinct scratch buffers kept before the cache is emptied (each is a few MB at most)
MAX_SCRATCH = 64
_COUNTERS = LaunchCache("ticket counters")
_SCRATCH = LaunchCache("scratch", limit=MAX_SCRATCH)


def _stream_key(device: torch.device) -> tuple[int, int] | None:
    """(device index, current raw stream) of a CUDA device, the key of the per-stream buffers; None off CUDA and
    while a CUDA graph is being captured (a graph gets buffers of its own)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return None
    index = device_index(device)
    return index, torch._C._cuda_getCurrentRawStream(index)


def ticket_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed int32 counters on ``device`` for one launch on the current stream.

    Kernels that draw tickets from them must leave them zeroed (:func:`last_to_arrive` does)."""
    key = _stream_key(device)
    if key is None:
        return torch.zeros(n, dtype=torch.int32, device=device)
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < n:
        counters = torch.zeros(max(n, MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS.keep(key, counters)
    return counters


def scratch(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized buffer for one launch's partials on the current stream of ``device``.

    Reused by every later request of the same shape and dtype on that stream: launches on one stream run in
    order, so a kernel that writes the partials before it reads them may share it. Fresh while a CUDA graph is
    being captured (a graph keeps its own) and off CUDA. Saves an allocation per call in hot paths."""
    stream = _stream_key(device)
    if stream is None:
        return torch.empty(shape, dtype=dtype, device=device)
    key = (*stream, shape, dtype)
    buffer = _SCRATCH.get(key)
    if buffer is None:
        buffer = torch.empty(shape, dtype=dtype, device=device)
        _SCRATCH.keep(key, buffer)
    return buffer


@triton.jit
def last_to_arrive(counter_ptr, n_programs):
    """True in the one program, of the ``n_programs`` sharing ``counter_ptr``, that arrives last.

    Call it after the program's partial stores. The barrier orders every thread's stores before the ticket, the
    acquire-release atomic makes them visible to the last program, which sets the counter back to zero. Read the
    partials with ``cache_modifier=".cg"`` (L2, not a stale L1 line)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == n_programs - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return last


def final_sum_rows(n_rows: int, width: int) -> int:
    """``BLOCK_ROWS`` of :func:`sum_partials` for ``n_rows`` partial rows of ``width`` outputs."""
    return min(next_power_of_2(n_rows), max(1, FINAL_SUM_ELEMS // width))


@triton.jit
def sum_partials(ptr, row_stride, cols, col_mask, n_rows, BLOCK_ROWS: tl.constexpr, WIDTH: tl.constexpr,
                 ACC: tl.constexpr):
    """``Σ_r ptr[r * row_stride + cols]`` over ``r < n_rows``, in row order: ``[WIDTH]`` sums of the partials
    (read through L2, ``.cg``) that the last program of a group found with :func:`last_to_arrive`."""
    total = tl.zeros([BLOCK_ROWS, WIDTH], dtype=ACC)
    for r0 in range(0, n_rows, BLOCK_ROWS):
        rows = (r0 + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        total += tl.load(ptr + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg")
    return tl.sum(total, axis=0)
