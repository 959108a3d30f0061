"""Work stealing in the reduction kernels, on or off, and its item size and programs per SM, alternating in rounds.

    python3 benchmarks/sweeps/reduce_steal_ab.py [--rounds 3] [--cases all dim=0]

The prototype (``reduce_steal_proto.py``) lifted the all-element mean of 8192² bf16 from 0.81 to 0.85 of copy
bandwidth. Here the kernels' own stealing path (``_reduce_plan.STEAL``) runs every lab case, so it shows where else
it helps (``dim=-1``: tiles of whole rows) and where it costs. (The cols kernel had a stealing path in one run of this
script, ``probes/reduce_steal_ab.txt``: 0.24-0.45 against 0.68-0.83; it was removed.) Each variant: median over
rounds of CUDA events after a dirty flush (the lab's method) [min-max] | per call of 10 calls in a CUDA graph.
"""

from __future__ import annotations

import argparse
import statistics

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from reduce_split_ab import _registers  # benchmarks/sweeps/reduce_split_ab.py
from reduce_split_probe import _home, _variant  # benchmarks/sweeps/reduce_split_probe.py
from reduce_sweep import case_input  # benchmarks/sweeps/reduce_sweep.py

from fuselab.ops import _reduce_plan as P

CASES = [  # label, shape, dtype, dim: the lab's nine, and two more
    ("all/8192x8192", (8192, 8192), torch.bfloat16, None),
    ("all/10000x10000", (10000, 10000), torch.float32, None),
    ("all/n=2^28", (2**28,), torch.float32, None),
    ("dim=-1/8192x8192", (8192, 8192), torch.bfloat16, -1),
    ("dim=-1/65536x512", (65536, 512), torch.bfloat16, -1),
    ("dim=-1/10000x10000", (10000, 10000), torch.float32, -1),
    ("dim=0/8192x8192", (8192, 8192), torch.bfloat16, 0),
    ("dim=0/65536x512", (65536, 512), torch.bfloat16, 0),
    ("dim=0/10000x10000", (10000, 10000), torch.float32, 0),
]
KNOBS = ("STEAL", "STEAL_ITEM_BYTES", "STEAL_WARPS_PER_SM", "STEAL_MAX_PARTIALS", "STEAL_INT64")
VARIANTS = {  # name: knobs over the shipped ones
    "no stealing": dict(STEAL=None),
    "split plans steal, 32 KiB items, 32 warps/SM, int64": dict(STEAL="split", STEAL_ITEM_BYTES=32768,
                                                                STEAL_WARPS_PER_SM=32, STEAL_INT64=True),
    "split plans steal, 64 KiB items": dict(STEAL="split", STEAL_ITEM_BYTES=65536),
    "split plans steal, 32-bit offsets": dict(STEAL="split", STEAL_INT64=False),
    "split plans steal, 128 KiB items": dict(STEAL="split", STEAL_ITEM_BYTES=131072),
    "split plans steal, 48 warps/SM": dict(STEAL="split", STEAL_WARPS_PER_SM=48),
    "every rows plan steals": dict(STEAL="all"),
    "every rows plan steals, 48 warps/SM": dict(STEAL="all", STEAL_WARPS_PER_SM=48),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=None, help="keep the cases whose label contains one of these")
    args = parser.parse_args()
    copy = timing.copy_gbps()
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; fractions of it, median over {args.rounds} "
          "alternating rounds [min-max] (dirty flush | CUDA graph)")
    defaults = {name: getattr(_home(name), name) for name in KNOBS}
    for label, shape, dtype, dim in CASES:
        if args.cases and not any(c in label for c in args.cases):
            continue
        x, dims, frac = case_input(shape, dtype, dim, copy)
        expected = x.double().mean(dim=dims)
        variants, seen = {}, []
        for name, knobs in VARIANTS.items():
            plan, fn = _variant(x, dims, **{**defaults, **knobs})
            launch_knobs = {k: v for k, v in knobs.items() if _home(k) is not P}
            if any(plan == p and launch_knobs == k for p, k in seen):
                continue  # the same plan and launch as an earlier variant (stealing does not apply to this case)
            seen.append((plan, launch_knobs))
            got = fn().double().view(expected.shape)
            assert torch.allclose(got, expected, rtol=1e-2, atol=1e-3), (name, (got - expected).abs().max().item())
            variants[name] = plan, fn
        regs = {name: _registers(fn) for name, (_, fn) in variants.items()}
        dirty = {name: [] for name in variants}
        graph = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (_, fn) in variants.items():
                dirty[name].append(frac(timing.events_ms(fn, timing.dirty_flush)))
                graph[name].append(frac(timing.graph_ms(fn)))
        print(f"\n{label} {str(dtype)[6:]}")
        for name, (plan, _) in variants.items():
            d, g = dirty[name], graph[name]
            print(f"  {statistics.median(d):.3f} [{min(d):.3f}-{max(d):.3f}] | {statistics.median(g):.3f}  {name:50s}"
                  f" grid {plan.grid} split {plan.split} block_r {plan.block_r} block_i {plan.block_i} "
                  f"warps {plan.num_warps} registers {regs.get(name)}", flush=True)
        del x, variants, expected
    for name, value in defaults.items():
        setattr(_home(name), name, value)


if __name__ == "__main__":
    main()
