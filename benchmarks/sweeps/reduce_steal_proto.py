"""All-element reductions: session 16's split plan against two other schedules, alternating in rounds.

The prototype that led to work stealing in the kernels (``reduce_steal_ab.py`` times those); its results are in
``benchmarks/results/h100/probes/reduce_steal_proto.txt``.

    python3 benchmarks/sweeps/reduce_steal_proto.py [--rounds 4]

Session 16 found the all-element mean of 8192² bf16 at 0.81 of copy bandwidth (dirty flush) against 0.89 for
``dim=-1`` of the same tensor, with its SMs idle 11% of the elapsed cycles against 8%. Two schedules that give the
all-element read the shape of the ``dim=-1`` one:

* **two passes**: ``fuselab.sum`` over ``dim=-1`` of a ``(-1, C)`` view (short programs, no tickets), then a sum of
  the row sums (a second, tiny launch);
* **work stealing** (prototype kernel below): a grid of resident programs that take fixed chunks from an atomic
  counter until none is left, so no SM idles while another still has a long program to finish; each chunk's fp32
  partial lands at the chunk's index and the last program sums them in index order (deterministic).

Each is timed after do_bench's writing flush (the lab's method), after a clean flush, and per call in a CUDA graph.
"""

from __future__ import annotations

import argparse
import statistics

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
import triton
import triton.language as tl

import fuselab
from fuselab.ops._launch import sm_count
from fuselab.ops._tickets import last_to_arrive, ticket_counters

CASES = [("all/8192x8192", (8192, 8192), torch.bfloat16), ("all/10000x10000", (10000, 10000), torch.float32)]


@triton.jit
def _steal_kernel(
    x_ptr,  # [N] input, contiguous
    out_ptr,  # [1] mean (fp32)
    part_ptr,  # [n_chunks] fp32 partials, one per chunk
    grab_ptr,  # [1] int32 chunk counter, zero before and after
    count_ptr,  # [1] int32 ticket counter, zero before and after
    N, n_chunks, inv_n,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, FINAL: tl.constexpr, EVICT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK).to(tl.int64)
    c = tl.atomic_add(grab_ptr, 1, sem="relaxed", scope="gpu")
    while c < n_chunks:
        nxt = tl.atomic_add(grab_ptr, 1, sem="relaxed", scope="gpu")  # the next chunk, asked for early
        start = c.to(tl.int64) * CHUNK
        end = tl.minimum(start + CHUNK, N)
        n_full = (end - start) // BLOCK
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for b in range(0, n_full):  # read CHUNK elements: BLOCK per step
            acc += tl.load(x_ptr + start + b * BLOCK + cols, eviction_policy=EVICT).to(tl.float32)
        tail = start + n_full * BLOCK + cols
        acc += tl.load(x_ptr + tail, mask=tail < end, other=0.0, eviction_policy=EVICT).to(tl.float32)
        tl.store(part_ptr + c, tl.sum(acc, axis=0))
        c = nxt
    if last_to_arrive(count_ptr, tl.num_programs(0)):
        tl.atomic_xchg(grab_ptr, 0, sem="relaxed", scope="gpu")
        offs = tl.arange(0, FINAL)
        total = tl.zeros([FINAL], dtype=tl.float32)
        for r0 in range(0, n_chunks, FINAL):
            total += tl.load(part_ptr + r0 + offs, mask=r0 + offs < n_chunks, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr, tl.sum(total, axis=0) * inv_n)


def steal(x: torch.Tensor, chunk_bytes: int, per_sm: int):
    """The work-stealing mean of all of ``x``: a launch closure (16-warp programs, 8 KiB (bf16) / 16 KiB steps)."""
    n = x.numel()
    block = (8192 if x.element_size() == 2 else 16384) // x.element_size()
    chunk = max(block, chunk_bytes // x.element_size())
    n_chunks = triton.cdiv(n, chunk)
    parts = torch.empty(n_chunks, dtype=torch.float32, device=x.device)
    out = torch.empty(1, dtype=torch.float32, device=x.device)
    counters = ticket_counters(x.device, 2)
    grab, count = counters[0:1], counters[1:2]
    grid = (per_sm * sm_count(x.device),)
    evict = "evict_first" if x.element_size() == 2 else ""

    def run():
        _steal_kernel[grid](x.view(-1), out, parts, grab, count, n, n_chunks, 1.0 / n, CHUNK=chunk, BLOCK=block,
                            FINAL=min(8192, triton.next_power_of_2(n_chunks)), EVICT=evict, num_warps=16, maxnreg=64)
        return out

    return run


def two_pass(x: torch.Tensor, row: int):
    """Row sums of a ``(-1, row)`` view (fuselab's dim=-1 plan), then their mean scaled back: two launches."""
    view = x.view(-1, row)

    def run():
        return fuselab.mean(fuselab.mean(view, dim=-1, dtype=torch.float32))

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    copy = timing.copy_gbps()
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; fractions of it, median over {args.rounds} "
          "alternating rounds [min-max] (dirty flush | clean flush | CUDA graph)")
    for label, shape, dtype in CASES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        nbytes = x.numel() * x.element_size()
        ref = x.double().mean().item()
        variants = {
            "shipped fuselab.mean(x)": lambda x=x: fuselab.mean(x),
            "dim=-1 of the same tensor (not the same op)": lambda x=x: fuselab.mean(x, dim=-1),
            "torch.mean(x)": lambda x=x: torch.mean(x),
            **{f"two passes, rows of {r * x.element_size() // 1024} KiB": two_pass(x, r)
               for r in (4096, 8192, 16384) if x.numel() % r == 0},
            **{f"stealing {c // 1024} KiB chunks, {p} per SM": steal(x, c, p) for c in (16384, 32768, 65536)
               for p in (3, 4)},
        }
        errors = {}
        for name, fn in variants.items():
            if "dim=-1" in name:
                continue
            got = fn().double().item()
            errors[name] = abs(got - ref) / max(abs(ref), 1e-30)
            assert errors[name] < 1e-2 or abs(got - ref) < 1e-5, (name, got, ref)
        first = [variants[n]().double().item() for n in variants if n.startswith("stealing")]
        again = [variants[n]().double().item() for n in variants if n.startswith("stealing")]
        assert first == again, "the stealing kernel is not deterministic"
        results = {name: ([], [], []) for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                d, c, g = results[name]
                d.append(nbytes / timing.events_ms(fn, timing.dirty_flush) / 1e6 / copy)
                c.append(nbytes / timing.events_ms(fn, timing.clean_flush) / 1e6 / copy)
                g.append(nbytes / timing.graph_ms(fn) / 1e6 / copy)
        print(f"\n{label} {str(dtype)[6:]} ({nbytes / 1e6:.1f} MB)")
        for name, (d, c, g) in results.items():
            err = f"  |err| {errors[name]:.1e}" if name in errors else ""
            print(f"  {statistics.median(d):.3f} [{min(d):.3f}-{max(d):.3f}] | {statistics.median(c):.3f} | "
                  f"{statistics.median(g):.3f}  {name}{err}", flush=True)
        del x, variants


if __name__ == "__main__":
    main()
