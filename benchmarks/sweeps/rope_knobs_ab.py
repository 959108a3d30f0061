"""RoPE forward: launch knobs of ``rope_kernel``, alternating variants in rounds.

    python3 benchmarks/sweeps/rope_knobs_ab.py evict [--rounds 4] [--cases 16x2048]

``evict`` (session 18, ``probes/rope_evict.txt``): eviction hints of the q/k loads and the output stores. Under
do_bench's flush L2 starts full of dirty lines. A kernel that reads N bytes and writes N bytes
leaves L2 full of *something* when it ends; every dirty line still there is written back after the timer stops.
With Triton's default hints the lines of the read stream (clean) compete with the outputs and the flush's lines
(dirty), so part of L2 ends the kernel holding clean lines, and more dirty bytes are written back inside the
timed region. ``evict_first`` on the loads should leave L2 to dirty lines and save up to the copy's own dirty
penalty (a copy of the D=64 shape's bytes: 0.953 dirty vs 1.018 clean, ``probes/rope_tiles.txt``).

``fuse`` (``probes/rope_fuse_qk.txt``; the kernel flag and this set are in commit d4e3d49, not kept: thd +1.1%,
8x4096x32/8 -0.5%, the rest within 0.4%): ``FUSE_QK``. A program that rotates q's heads and then k's has one
tensor's bytes in flight at a time, and waits for two load latencies in a row; loading both before storing either
doubles the bytes in flight per program. Inductor's kernel for the HF formula handles q and k at the same index in
one kernel when their shapes agree (4x4096x32/32x128: 0.97 vs our 0.96).

Each variant's launch is prepared once (``rope_launch`` with the knobs set) and replayed (``rope_relaunch``);
per round every variant and a same-size ``copy_`` are timed once after a dirty flush and once in a CUDA graph.
"""

from __future__ import annotations

import argparse
import functools

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from rope_tiles import forget_launches, restore, set_config  # benchmarks/sweeps/rope_tiles.py

from fuselab.bench.spec import CaseQuery
from fuselab.bench.suites import rope as suite
from fuselab.ops import _launch, rope_kernel

SETS = {  # set: {variant name: knobs of rope_kernel over the shipped ones}
    "evict": {
        "shipped": {},
        "default / default": dict(LOAD_EVICTION="", STORE_EVICTION=""),
        "load evict_first": dict(LOAD_EVICTION="evict_first", STORE_EVICTION=""),
        "store evict_first": dict(LOAD_EVICTION="", STORE_EVICTION="evict_first"),
        "both evict_first": dict(LOAD_EVICTION="evict_first", STORE_EVICTION="evict_first"),
        "load evict_first, store evict_last": dict(LOAD_EVICTION="evict_first", STORE_EVICTION="evict_last"),
    },
    # "plan" and "small" as run (results/h200/probes/rope_plan.txt, rope_small.txt; results/h100/probes/
    # rope_small_h100.txt) also had FUSE_QK variants: that flag is in commit d4e3d49's kernel only
    "plan": {  # tile x warps, for another GPU than the H100 of the sweeps
        "shipped": {},
        "tile 4096, 4 warps": dict(TILE=4096, WARPS=4),
        "tile 8192, 4 warps": dict(TILE=8192, WARPS=4),
        "tile 16384, 8 warps": dict(TILE=16384, WARPS=8),
        "tile 2048, 4 warps": dict(TILE=2048, WARPS=4),
    },
    "small": {  # smaller tiles and fewer warps, after "plan" found tile 2048 / 4 warps best on the H200
        "shipped": {},
        "tile 2048, 2 warps": dict(TILE=2048, WARPS=2),
        "tile 2048, 4 warps": dict(TILE=2048, WARPS=4),
        "tile 2048, 8 warps": dict(TILE=2048, WARPS=8),
        "tile 1024, 2 warps": dict(TILE=1024, WARPS=2),
        "tile 1024, 4 warps": dict(TILE=1024, WARPS=4),
    },
}


def prepared(q, k, cos, sin, layout, offsets, cu, inplace: bool, knobs: dict) -> tuple:
    """A call that replays the launch planned with ``knobs`` set in ``rope_kernel`` (``TILE``/``WARPS``: the plan's
    tile elements and warps, through ``rope_tiles.set_config``), its outputs, and a line describing its plan."""
    plan_knobs = {"TILE", "WARPS"}
    unknown = [name for name in knobs if name not in plan_knobs and not hasattr(rope_kernel, name)]
    if unknown:
        raise SystemExit(f"rope_kernel has no knob {unknown}")
    shipped = {name: getattr(rope_kernel, name) for name in knobs if name not in plan_knobs}
    for name, value in knobs.items():
        if name not in plan_knobs:
            setattr(rope_kernel, name, value)
    if plan_knobs & set(knobs):
        set_config(knobs.get("TILE", rope_kernel.tile_elements(q.device)), knobs.get("WARPS"))
    forget_launches()
    q_out, k_out = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
    tensor_offsets = offsets if isinstance(offsets, torch.Tensor) else None
    offset = 0 if tensor_offsets is not None else int(offsets or 0)
    args = (cos, sin, None, None, tensor_offsets, cu)
    record = rope_kernel.rope_launch(q, k, q_out, k_out, *args, layout=layout, half=cos.shape[-1],
                                     interleaved=False, conj=False, offset=offset)
    grid, _, constexprs, _, _ = next(iter(rope_kernel._PLANS.values()))
    regs = getattr(next(iter(_launch._COMPILED.values()))[0], "n_regs", None)
    plan = (f"grid {grid} T,HQ,HK {constexprs['BLOCK_T']},{constexprs['BLOCK_HQ']},{constexprs['BLOCK_HK']} "
            f"warps {constexprs['num_warps']} registers {regs}")
    for name, value in shipped.items():
        setattr(rope_kernel, name, value)
    restore()
    return (lambda: rope_kernel.rope_relaunch(record, q, k, q_out, k_out, *args, offset, 1.0)), q_out, k_out, plan


def _fraction(nbytes: int, ms: float, bw: float) -> float:
    return nbytes / ms / 1e6 / bw


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("set", choices=sorted(SETS))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-inplace", action="store_true", help="time the out-of-place launches only")
    parser.add_argument("--cases", nargs="*", default=None, help="keep the cases whose label contains one of these")
    args = parser.parse_args()
    bw = timing.copy_gbps()
    timing.ab_header(bw, args.rounds)
    query = CaseQuery(device_type="cuda", dtypes=(torch.bfloat16,), modes=("fwd",))
    for case in suite.cases(query):
        if case.params["kind"] == "decode" or (args.cases and not any(c in case.label for c in args.cases)):
            continue
        q, k, cos, sin, layout, offsets, cu, _ = suite.make_inputs(case, torch.device("cuda"))
        flat = torch.randn((q.numel() + k.numel(),), device="cuda").to(torch.bfloat16)
        dst = torch.empty_like(flat)
        fraction = functools.partial(_fraction, bw=bw)
        calls = {"copy_ of q, k (read + write)": (functools.partial(dst.copy_, flat),
                                                  functools.partial(fraction, 2 * flat.numel() * 2))}
        plans, reference = {}, None
        for inplace in (False,) if args.no_inplace else (False, True):
            for name, knobs in SETS[args.set].items():
                fn, q_out, k_out, plans[name] = prepared(q, k, cos, sin, layout, offsets, cu, inplace, knobs)
                if not inplace:  # every variant must write the same bits
                    fn()
                    reference = reference or (q_out.clone(), k_out.clone())
                    if not (torch.equal(q_out, reference[0]) and torch.equal(k_out, reference[1])):
                        print(f"  MISMATCH: {name}")
                label = f"{'in place' if inplace else 'out of place'}: {name}"
                calls[label] = (fn, functools.partial(fraction, case.bytes))
        times = timing.alternate(calls, args.rounds)
        print(f"\n{case.label} ({case.bytes / 1e6:.0f} MB)")
        for name, plan in plans.items():
            print(f"  plan of {name}: {plan}")
        for name in calls:
            print(f"  {timing.spread(*times[name])}  {name}", flush=True)
        del q, k, flat, dst, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
