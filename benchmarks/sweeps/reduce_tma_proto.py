"""``mean(dim=0)`` read through pipelined asynchronous copies (TMA, or ``cp.async``) vs the shipped cols kernel.

    python3 benchmarks/sweeps/reduce_tma_proto.py [--check] [--prefetch] [float32|bfloat16 ...]

Question (session 21): ``dim=0`` of 10000² fp32 reads at 0.89 of copy bandwidth where a plain read of the same bytes
reaches 0.96 (0.99 vs 1.08 in a CUDA graph), and the bf16 cases trail the plain read by 8-16%
(``results/*/probes/stream_bound.txt``). Tile shapes, strip widths, read orders and grid sizes do not close it
(``reduce_cols_wide.txt``, sessions 16 and 20). What they all share: a loop of synchronous loads, so a program has one
tile in flight and waits for it before it asks for the next. Prediction: a loop that keeps 2-4 tiles in flight per
program through shared memory (Hopper's TMA with mbarriers, or ``cp.async``; Triton pipelines a ``tl.range`` loop
with ``num_stages``) hides more DRAM latency with fewer registers, and lifts ``dim=0`` to within 2-3% of the plain
read (≥ 0.93 at 10000² fp32). TMA also zero-fills out-of-bounds boxes: no masks in the loop.

The prototype kernel is the cols kernel's loop with its final step unchanged (the shipped ``_store_result``: partials,
tickets, the last program's sum in split order), so the comparison is of the reads alone. Each variant is checked
against ``torch.mean`` before it is timed; alternating rounds, dirty flush and CUDA graph, as ``_timing.alternate``.
The TTGIR of the first variant of each kind is scanned for the async copies, to show the loop was pipelined.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuselab.ops._reduce_triton import _store_result
from fuselab.ops._tickets import final_sum_rows, ticket_counters

CASES = (((10000, 10000), torch.float32), ((8192, 8192), torch.bfloat16), ((65536, 512), torch.bfloat16))
ROUNDS = 3


@triton.jit
def _cols_async_kernel(
    x_desc,  # TMA descriptor of x [R, I] (row-major, 16-byte aligned rows), box [BLOCK_R, BLOCK_I]; only if TMA
    x_ptr,  # x [R, I], row stride s_r, contiguous rows; only without TMA
    out_ptr,  # [I] means (x's dtype)
    part_ptr,  # [n_split, I] fp32 partials
    count_ptr,  # [cdiv(I, BLOCK_I)] int32 tickets, zero before and after
    I, R, s_r, r_per_split,  # r_per_split: a multiple of BLOCK_R
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr, BLOCK_S: tl.constexpr,
    OUT_BF16: tl.constexpr, EVICT: tl.constexpr,
):
    # bytes: read R*I elements once, write I means (+ n_split*I fp32 partials, read back once by the last programs)
    tile = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    col0 = tile * BLOCK_I
    cols = col0 + tl.arange(0, BLOCK_I)
    col_mask = cols < I
    r_start = split * r_per_split
    r_end = tl.minimum(r_start + r_per_split, R)
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    rr = tl.arange(0, BLOCK_R)
    if STAGES == 0:  # pointers, double-buffered in registers: the next tile's loads go out before this tile's adds
        rows = (r_start + rr).to(tl.int64)
        nxt = tl.load(x_ptr + rows[:, None] * s_r + cols[None, :], mask=(rows < r_end)[:, None] & col_mask[None, :],
                      other=0.0, eviction_policy=EVICT)
        for r in tl.range(r_start + BLOCK_R, r_end, BLOCK_R, num_stages=1):
            cur = nxt
            rows = (r + rr).to(tl.int64)
            nxt = tl.load(x_ptr + rows[:, None] * s_r + cols[None, :],
                          mask=(rows < r_end)[:, None] & col_mask[None, :], other=0.0, eviction_policy=EVICT)
            acc += cur.to(tl.float32)
        acc += nxt.to(tl.float32)
    else:
        for r in tl.range(r_start, r_end, BLOCK_R, num_stages=STAGES):
            if TMA:
                acc += x_desc.load([r, col0]).to(tl.float32)  # rows past R read as zeros
            else:
                rows = (r + rr).to(tl.int64)
                mask = (rows < R)[:, None] & col_mask[None, :]
                acc += tl.load(x_ptr + rows[:, None] * s_r + cols[None, :], mask=mask, other=0.0,
                               eviction_policy=EVICT).to(tl.float32)
    _store_result(tl.sum(acc, axis=0), cols, col_mask, out_ptr, part_ptr, count_ptr, tile, split, n_split, I, R,
                  BLOCK_I, True, BLOCK_S, tl.float32, True, OUT_BF16)


@dataclasses.dataclass(frozen=True)
class Variant:
    block_r: int
    block_i: int
    stages: int
    warps: int
    per_sm: int
    tma: bool
    evict: str = ""  # pointer loads only

    def name(self, split: int) -> str:
        kind = "TMA" if self.tma else f"{'cp.async' if self.stages else 'register prefetch'} {self.evict or 'default'}"
        return (f"{kind} [{self.block_r}x{self.block_i}] x{self.stages} stages, {self.warps} warps, "
                f"{self.per_sm}/SM -> split {split}")


def launcher(x: torch.Tensor, v: Variant, sms: int):
    """``(out, fn, split)``: ``fn()`` writes ``x.mean(0)`` into ``out`` with variant ``v``."""
    R, I = x.shape
    tiles = triton.cdiv(I, v.block_i)
    split = max(1, min(triton.cdiv(sms * v.per_sm, tiles), triton.cdiv(R, v.block_r)))
    r_per_split = triton.cdiv(triton.cdiv(R, split), v.block_r) * v.block_r
    split = triton.cdiv(R, r_per_split)
    out = torch.full((I,), float("nan"), dtype=x.dtype, device=x.device)
    partials = torch.empty(split, I, dtype=torch.float32, device=x.device)
    counters = ticket_counters(x.device, tiles)
    desc = TensorDescriptor.from_tensor(x, [v.block_r, v.block_i]) if v.tma else None
    kernel = _cols_async_kernel[(tiles, split)]

    def fn():
        return kernel(desc, x, out, partials, counters, I, R, x.stride(0), r_per_split, BLOCK_R=v.block_r,
                      BLOCK_I=v.block_i, STAGES=v.stages, TMA=v.tma, BLOCK_S=final_sum_rows(split, v.block_i),
                      OUT_BF16=x.dtype == torch.bfloat16, EVICT=v.evict, num_warps=v.warps)

    return out, fn, split


def pipelined(compiled) -> str:
    """What the loop's TTGIR holds: async copies and barrier waits (pipelined) or none (synchronous loads)."""
    ir = compiled.asm.get("ttgir", "")
    marks = ("async_tma_copy_global_to_local", "async_copy_global_to_local", "wait_barrier", "async_wait")
    ptx = compiled.asm.get("ptx", "")
    hints = f"; PTX: cp.async x{ptx.count('cp.async.')}, L2::cache_hint x{ptx.count('L2::cache_hint')}"
    return (", ".join(f"{m} x{ir.count(m)}" for m in marks if m in ir) or "no async copies") + hints


def variants(dtype: torch.dtype):
    """The shipped strips (1 KiB of each fp32 row, 128 B of each bf16 row) in boxes of 2-32 KiB. fp32: the second
    grid, around the first grid's best (``probes/reduce_tma_proto_fp32.txt``: 8 KiB boxes, 3 stages, 4 warps, 2/SM;
    TMA ahead of cp.async), TMA only. bf16, third grid: TMA and cp.async lost to the shipped kernel under the dirty
    flush (``probes/reduce_tma_proto.txt``) though ahead in a CUDA graph; the shipped kernel loads bf16 with
    ``evict_first`` (``STREAM_EVICTION``), which TMA loads cannot carry: cp.async with and without it."""
    if "--prefetch" in sys.argv:  # fourth grid: pointer loads double-buffered in registers (0 stages), hint kept
        rows = (8, 16, 32) if dtype == torch.float32 else (32, 64, 128)
        evicts = ("",) if dtype == torch.float32 else ("evict_first",)
        grid = itertools.product((256 if dtype == torch.float32 else 64,), rows, (0,), (4, 8), (2, 3, 4), (False,),
                                 evicts)
    elif dtype == torch.float32:
        grid = itertools.product((256,), (4, 8, 16), (2, 3, 4, 6), (2, 4), (1, 2, 3), (True,), ("",))
    else:
        grid = itertools.product((64,), (32, 64, 128), (2, 3, 4), (4, 8), (2, 3, 4), (False,), ("", "evict_first"))
    for bi, br, stages, warps, per_sm, tma, evict in grid:
        box = br * bi * (4 if dtype == torch.float32 else 2)
        if box * stages * per_sm <= 200 * 1024:  # shared memory per SM (none for 0 stages)
            yield Variant(br, bi, stages, warps, per_sm, tma, evict)


def check() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape, dtype in (((300, 200), torch.float32), ((129, 64), torch.bfloat16)):
        x = torch.randn(shape, device=device, dtype=dtype)
        for tma, stages in ((True, 2), (False, 2), (False, 0)):
            out, fn, _ = launcher(x, Variant(16, 64, stages, 4, 2, tma), 4)
            fn()
            torch.testing.assert_close(out.float(), x.double().mean(0).float(), rtol=1e-2 if dtype != torch.float32
                                       else 1e-5, atol=1e-3)
    print("check: prototype == torch")


def main() -> None:
    from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py
    from reduce_sweep import plan_call

    from fuselab.ops import _reduce_plan as P
    from fuselab.ops._launch import sm_count

    # TMA descriptors built on the host need no device allocator; Triton asks for one only for device-side ones
    check()
    bw = copy_gbps()
    ab_header(bw, ROUNDS)
    sms = sm_count(torch.device("cuda"))
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    for shape, dtype in CASES:
        if wanted and str(dtype)[6:] not in wanted:
            continue
        x = torch.randn(shape, device="cuda", dtype=dtype)
        want = x.float().mean(0)
        nbytes = x.numel() * x.element_size()
        fraction = lambda ms, n=nbytes: n / ms / 1e6 / bw
        src, kept, red = P.prepare(x, (0,))
        plan = P.plan_reduction(src, kept, red)
        out, fn = plan_call(src, (0,), plan)
        calls = {f"shipped cols kernel: [{plan.block_r}x{plan.block_i}], split {plan.split}, {plan.num_warps} warps":
                 (fn, fraction)}
        shown = set()
        for v in variants(dtype):
            out, fn, split = launcher(x, v, sms)
            compiled = fn()
            torch.testing.assert_close(out.float(), want, rtol=1e-2 if x.element_size() == 2 else 1e-5, atol=1e-3)
            if (v.tma, v.evict, v.stages > 0) not in shown:
                shown.add((v.tma, v.evict, v.stages > 0))
                print(f"  TTGIR of {v.name(split)}: {pipelined(compiled)}", flush=True)
            calls[v.name(split)] = (fn, fraction)
        print(f"\ndim=0 of {shape[0]}x{shape[1]} {str(dtype)[6:]} ({nbytes / 1e6:.0f} MB), {len(calls)} calls",
              flush=True)
        results = alternate(calls, ROUNDS)
        ranked = sorted(results, key=lambda name: -sorted(results[name][0])[ROUNDS // 2])
        for name in ranked[:12] + [name for name in ranked[12:] if name.startswith("shipped")]:
            print(f"  {spread(*results[name])}  {name}", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()
