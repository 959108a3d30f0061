"""Single-launch two-stage reductions: the last program to finish sums the partials, in a fixed order.

A split reduction writes one partial per program and needs a second pass over them. Launching that pass as a
second kernel costs a whole launch of host time (10-27 µs on the H100 machine's host, more than the pass itself).
Instead, each group of programs that share an output counts its arrivals on an int32 *ticket counter*; the
program that draws the last ticket sums the group's partials (index order, so the bits do not depend on which
program came last) and resets the counter to zero for the next launch. Integer atomics only: deterministic.

Counters live in a zeroed int32 buffer per (device, stream), created once and left zeroed by every kernel. While
a CUDA graph is being captured each call gets fresh zeros instead (a memset node in the graph), so a graph never
shares counters with eager launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: smallest counter buffer kept per (device, stream)
MIN_COUNTERS = 1024

_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def ticket_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` zeroed int32 counters on ``device`` for one launch on the current stream.

    Kernels that draw tickets from them must leave them zeroed (:func:`last_to_arrive` does)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    counters = _COUNTERS.get(key)
    if counters is None or counters.numel() < n:
        counters = torch.zeros(max(n, MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[key] = counters
    return counters


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
