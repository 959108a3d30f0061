"""The stream bound: what a kernel that only moves a case's bytes reaches, timed like the providers.

The copy bandwidth (a 1 GiB copy) is the lab's fixed reference. A case that moves 60-300 MB per call cannot reach it
under ``do_bench``: every call pays costs that do not shrink with its bytes (the dirty lines that do_bench's L2 flush
leaves behind and that are written back during the call, the grid's ramp-up and tail). The stream bound measures that
per case: one Triton kernel reads the case's ``read_bytes`` and writes the rest of its ``bytes``, with no arithmetic
beyond one fp32 sum per program that keeps the reads live, timed by the same timer in the same run (same flush, same
L2-cold rotation, same CUDA-graph option), the best of :data:`VARIANTS` (steps x warps x eviction hint of the reads).
A provider's ``of_stream`` (stream time / its time) says how close it runs to the device's limit *at that size, under
that method*: about 1.0 is at the limit. It is a measured reference, not a proof: a kernel whose own access pattern
suits the device better than these tilings (the row reductions do, by a few percent) can pass it.

The bound is a CUDA measurement; on a CPU the kernel runs under the Triton interpreter (tests) but is never timed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuselab.core.device import sm_count

from . import results as R
from .spec import BenchCase, dtype_name
from .timing import Timer, TimingJob

#: provider name of the bound's rows in results and tables
NAME = "stream"


@dataclass(frozen=True)
class Variant:
    step_bytes: int  # bytes a program loads (or stores) per unrolled step
    warps: int
    evict: str  # eviction hint of the reads: "" (Triton's default) or "evict_first"
    steps: int = 8  # unrolled steps per chunk, reads and writes together (at least; see plan())
    per_sm: int = 0  # programs per SM, each looping over every per_sm x SMs-th chunk; 0: one program per chunk

    def describe(self) -> str:
        hint = self.evict or "default"
        grid = f", {self.per_sm} programs per SM" if self.per_sm else ""
        return f"{self.steps} x {self.step_bytes // 1024} KiB steps, {self.warps} warps, {hint} reads{grid}"


#: the tilings tried per case: of 24 timed, these four were each case's best or close to it (evict_first reads
#: where a case only reads, the default hint where it also writes;
#: benchmarks/notes/lab.md#the-stream-bound-fuselabbenchstream)
VARIANTS: tuple[Variant, ...] = (
    Variant(16384, 16, "evict_first", 4), Variant(4096, 4, "evict_first", 4), Variant(8192, 8, "", 8),
    Variant(16384, 16, "", 8),
)


@triton.jit
def _stream_kernel(
    SRC,  # [n_read] read once
    DST,  # [n_write] written once (values independent of the reads, so stores never wait for loads)
    PARTIAL,  # [programs] fp32: each program's sum of what it read (keeps the loads live)
    n_read,
    n_write,
    chunks,  # chunk c reads READ_STEPS and writes WRITE_STEPS steps; program p takes chunks p, p + programs, ...
    STEP: tl.constexpr,  # elements per step
    READ_STEPS: tl.constexpr,  # steps a chunk reads (unrolled: all its loads in flight together)
    WRITE_STEPS: tl.constexpr,  # steps a chunk writes
    EVICT: tl.constexpr,
):
    # bytes: read n_read + write n_write elements (+ 4 per program)
    lanes = tl.arange(0, STEP)
    acc = tl.zeros([STEP], dtype=tl.float32)
    for chunk in range(tl.program_id(0), chunks, tl.num_programs(0)):
        start = tl.cast(chunk, tl.int64) * (READ_STEPS * STEP)
        for i in tl.static_range(READ_STEPS):
            offs = start + i * STEP + lanes
            acc += tl.load(SRC + offs, mask=offs < n_read, other=0.0, eviction_policy=EVICT).to(tl.float32)
        start = tl.cast(chunk, tl.int64) * (WRITE_STEPS * STEP)
        if start < n_write:  # chunks past the output issue no stores (masked-off stores slow the reads: notes/lab.md)
            for i in tl.static_range(WRITE_STEPS):
                offs = start + i * STEP + lanes
                tl.store(DST + offs, (lanes & 255).to(DST.dtype.element_ty), mask=offs < n_write)
    tl.store(PARTIAL + tl.program_id(0), tl.sum(acc, axis=0))


@dataclass
class Stream:
    """One set of buffers and its launch."""

    src: torch.Tensor
    dst: torch.Tensor
    partial: torch.Tensor
    launch: Callable[[], None]


def plan(read_elems: int, write_elems: int, itemsize: int, variant: Variant, sms: int = 1
         ) -> tuple[int, int, int, int, int]:
    """(programs, chunks, step, read steps, write steps) per chunk, step in elements; ``sms``: the device's SMs.

    Each chunk reads and writes in the proportion of the whole (read and write steps in the ratio of
    ``read_elems : write_elems``, the closest over ``steps`` to ``2 x steps`` steps in all), so reads and writes stream
    together over the grid. Writes under ``1 / steps`` of the reads (a reduction's output) take one step in the first
    chunks only, after their ``steps`` reads."""
    if read_elems < 1 or write_elems < 0:
        raise ValueError(f"read_elems must be >= 1 and write_elems >= 0, got {read_elems} and {write_elems}")
    step = max(16, variant.step_bytes // itemsize)
    if write_elems == 0:
        reads, writes = variant.steps, 0
    elif write_elems * variant.steps <= read_elems:
        reads, writes = variant.steps, 1
    else:
        share = read_elems / (read_elems + write_elems)
        reads, writes = min(((max(1, min(t - 1, round(t * share))), t) for t in range(max(2, variant.steps),
                                                                                     2 * variant.steps + 1)),
                            key=lambda rt: (abs(rt[0] / rt[1] - share), rt[1]))
        writes -= reads
    chunks = max(triton.cdiv(read_elems, reads * step), triton.cdiv(write_elems, writes * step) if writes else 1)
    programs = min(chunks, variant.per_sm * sms) if variant.per_sm else chunks
    return programs, chunks, step, reads, writes


def launch(src: torch.Tensor, dst: torch.Tensor, partial: torch.Tensor, read_elems: int, write_elems: int,
           variant: Variant) -> None:
    """Read ``src[:read_elems]``, write ``dst[:write_elems]``, one fp32 sum per program into ``partial``."""
    programs, chunks, step, reads, writes = plan(read_elems, write_elems, src.element_size(), variant,
                                                 sm_count(src.device))
    if partial.numel() < programs:
        raise ValueError(f"partial must hold {programs} programs' sums, got {partial.numel()}")
    _stream_kernel[(programs,)](src, dst, partial, read_elems, write_elems, chunks, STEP=step, READ_STEPS=reads,
                                WRITE_STEPS=writes, EVICT=variant.evict, num_warps=variant.warps)


def stream(read_elems: int, write_elems: int, dtype: torch.dtype, device: torch.device, variant: Variant) -> Stream:
    """Fresh random buffers and the launch that reads ``read_elems`` and writes ``write_elems`` elements."""
    programs = plan(read_elems, write_elems, dtype.itemsize, variant, sm_count(torch.device(device)))[0]
    src = torch.randn(read_elems, device=device).to(dtype)
    dst = torch.empty(max(write_elems, 1), dtype=dtype, device=device)
    partial = torch.empty(programs, dtype=torch.float32, device=device)
    return Stream(src, dst, partial, lambda: launch(src, dst, partial, read_elems, write_elems, variant))


def case_elements(case: BenchCase) -> tuple[int, int] | None:
    """(read, write) elements of the case's dtype that carry its bytes, or None if the case declares no split."""
    if case.read_bytes is None:
        return None
    size = case.dtype.itemsize
    return -(-case.read_bytes // size), -(-(case.bytes - case.read_bytes) // size)


def measure(case: BenchCase, device: torch.device, timer: Timer, sets: int = 1, cuda_graph: bool = False,
            variants: Sequence[Variant] = VARIANTS) -> R.Result:
    """The stream bound of ``case``: a result row (provider :data:`NAME`, status ``bound``), the fastest variant's
    time; ``detail`` names it. ``sets`` > 1 rotates that many buffer sets (the case's L2-cold timing)."""
    r = R.Result(op=case.op, case=case.label, dtype=dtype_name(case.dtype), mode=case.mode, provider=NAME,
                 numel=case.numel, bytes=case.bytes, flops=0, status=R.BOUND, l2_cold=case.l2_cold)
    elems = case_elements(case)
    if elems is None:
        r.status, r.detail = R.SKIPPED, "the case declares no read/write split"
        return r
    best, best_variant, failed = None, None, []
    for variant in variants:
        try:
            streams = [stream(*elems, case.dtype, device, variant) for _ in range(sets)]
            stats = timer.measure(TimingJob(steps=[s.launch for s in streams], provider=NAME, case_key=case.key,
                                            cuda_graph=cuda_graph))
        except Exception as e:  # a variant that cannot launch (memory) is not the bound; the others still are
            failed.append(f"{variant.describe()}: {R.short_error(e)}")
            continue
        finally:
            streams = None  # free this variant's buffers before the next one allocates
        if best is None or stats.median_ms < best.median_ms:
            best, best_variant = stats, variant
    skipped = "; ".join(failed)
    if best is None:
        r.status, r.detail = R.FAILED, skipped
        return r
    r.median_ms, r.p20_ms, r.p80_ms, r.timer = best.median_ms, best.p20_ms, best.p80_ms, timer.kind
    r.detail = (f"best of {len(variants) - len(failed)}: {best_variant.describe()}"
                + (" (CUDA graph)" if cuda_graph else "") + (f"; skipped {skipped}" if failed else ""))
    return r
