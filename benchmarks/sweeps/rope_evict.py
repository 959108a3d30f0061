"""RoPE forward: eviction hints of the q/k loads and the output stores, alternating variants in rounds.

    python3 benchmarks/sweeps/rope_evict.py [--rounds 4] [--cases 16x2048]

Question: under do_bench's flush L2 starts full of dirty lines. A kernel that reads N bytes and writes N bytes
leaves L2 full of *something* when it ends; every dirty line still there is written back after the timer stops.
With Triton's default hints the lines of the read stream (clean) compete with the outputs and the flush's lines
(dirty), so part of L2 ends the kernel holding clean lines, and more dirty bytes are written back inside the
timed region. ``evict_first`` on the loads should leave L2 to dirty lines and save up to the copy's own dirty
penalty (a copy of the D=64 shape's bytes: 0.953 dirty vs 1.018 clean, ``probes/rope_tiles.txt``).

Each variant's launch is prepared once (``rope_launch`` with the knobs set) and replayed (``rope_relaunch``);
per round every variant and a same-size ``copy_`` are timed once after a dirty flush and once in a CUDA graph.
"""

from __future__ import annotations

import argparse
import statistics

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from rope_tiles import forget_launches  # benchmarks/sweeps/rope_tiles.py

from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import rope as suite
from fuselab.ops import rope_kernel

VARIANTS = {  # name: (LOAD_EVICTION, STORE_EVICTION)
    "shipped": None,
    "default / default": ("", ""),
    "load evict_first": ("evict_first", ""),
    "store evict_first": ("", "evict_first"),
    "both evict_first": ("evict_first", "evict_first"),
    "load evict_first, store evict_last": ("evict_first", "evict_last"),
}


def prepared(q, k, cos, sin, layout, offsets, cu, inplace: bool, hints) -> callable:
    """A call that replays the launch planned with ``hints`` (None: the shipped knobs)."""
    shipped = (rope_kernel.LOAD_EVICTION, rope_kernel.STORE_EVICTION)
    if hints is not None:
        rope_kernel.LOAD_EVICTION, rope_kernel.STORE_EVICTION = hints
    forget_launches()
    q_out, k_out = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
    tensor_offsets = offsets if isinstance(offsets, torch.Tensor) else None
    offset = 0 if tensor_offsets is not None else int(offsets or 0)
    args = (cos, sin, None, None, tensor_offsets, cu)
    record = rope_kernel.rope_launch(q, k, q_out, k_out, *args, layout=layout, half=cos.shape[-1],
                                     interleaved=False, conj=False, offset=offset)
    rope_kernel.LOAD_EVICTION, rope_kernel.STORE_EVICTION = shipped
    forget_launches()
    return lambda: rope_kernel.rope_relaunch(record, q, k, q_out, k_out, *args, offset, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cases", nargs="*", default=None, help="keep the cases whose label contains one of these")
    args = parser.parse_args()
    bw = timing.copy_gbps()
    print(f"# {torch.cuda.get_device_name()}  copy {bw:.0f} GB/s; fractions of it, median over {args.rounds} "
          "alternating rounds [min-max] (dirty flush | CUDA graph)")
    query = CaseQuery(device_type="cuda", dtypes=(torch.bfloat16,), modes=("fwd",))
    for case in suite.cases(query):
        if case.params["kind"] == "decode" or (args.cases and not any(c in case.label for c in args.cases)):
            continue
        q, k, cos, sin, layout, offsets, cu, _ = suite.make_inputs(case, torch.device("cuda"))
        flat = torch.randn((q.numel() + k.numel(),), device="cuda").to(torch.bfloat16)
        dst = torch.empty_like(flat)
        calls = {"copy_ of q, k (read + write)": (lambda: dst.copy_(flat), 2 * flat.numel() * 2)}
        for inplace in (False, True):
            for name, hints in VARIANTS.items():
                fn = prepared(q, k, cos, sin, layout, offsets, cu, inplace, hints)
                calls[f"{'in place' if inplace else 'out of place'}: {name}"] = (fn, case.bytes)
        dirty = {name: [] for name in calls}
        graph = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, (fn, nbytes) in calls.items():
                dirty[name].append(nbytes / timing.events_ms(fn, timing.dirty_flush) / 1e6 / bw)
                graph[name].append(nbytes / timing.graph_ms(fn) / 1e6 / bw)
        print(f"\n{case.label} ({case.bytes / 1e6:.0f} MB)")
        for name in calls:
            d, g = dirty[name], graph[name]
            print(f"  {statistics.median(d):.3f} [{min(d):.3f}-{max(d):.3f}] | {statistics.median(g):.3f}  {name}",
                  flush=True)
        del q, k, flat, dst, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
