"""A/B of the split reductions' read order and column-tile width, alternating variants in rounds.

    python3 benchmarks/sweeps/reduce_split_ab.py [--rounds 4] [--cases all dim=0/65536]

``reduce_split_probe.py`` times each variant once; there, two runs of one configuration differed by 2-5%. Here
each variant of a case is timed once per round, variants alternating, and the median over rounds is printed with
the spread (dirty flush, the lab's method; and the CUDA-graph per-call time).
"""

from __future__ import annotations

import argparse

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from reduce_split_probe import KNOBS, _home, _order, _variant  # benchmarks/sweeps/reduce_split_probe.py
from reduce_sweep import case_input  # benchmarks/sweeps/reduce_sweep.py

from fuselab.ops import _launch

CASES = [  # label, shape, dtype, dim
    ("dim=0/10000x10000", (10000, 10000), torch.float32, 0),
    ("dim=0/8192x8192", (8192, 8192), torch.bfloat16, 0),
    ("dim=0/65536x512", (65536, 512), torch.bfloat16, 0),
    ("all/8192x8192", (8192, 8192), torch.bfloat16, None),
    ("all/10000x10000", (10000, 10000), torch.float32, None),
]
VARIANTS = {  # name: knobs over the shipped ones
    "shipped": {},
    "chunked": dict(INTERLEAVE_MIN_SPLIT=_order(False)),
    "interleaved": dict(INTERLEAVE_MIN_SPLIT=_order(True)),
    "chunked, 128 B column tiles": dict(INTERLEAVE_MIN_SPLIT=_order(False),
                                        MIN_COL_BYTES=dict.fromkeys((2, 4, 8), 128)),
    "chunked, 1 KiB column tiles": dict(INTERLEAVE_MIN_SPLIT=_order(False), MAX_COL_FRACTION=4,
                                        MIN_COL_BYTES=dict.fromkeys((2, 4, 8), 1024)),
    "interleaved, 1 KiB column tiles": dict(INTERLEAVE_MIN_SPLIT=_order(True), MAX_COL_FRACTION=4,
                                            MIN_COL_BYTES=dict.fromkeys((2, 4, 8), 1024)),
    # all-element plans: interleaved reads took 46 registers (2 resident 16-warp programs per SM, chunked: 40, 3) and
    # still ran level with chunked (probes/reduce_waves_ab.txt): with the residency back, do they win?
    **{f"{order}, at most {cap} registers": dict(INTERLEAVE_MIN_SPLIT=_order(order == "interleaved"), ROWS_MAXNREG=cap)
       for order in ("interleaved", "chunked") for cap in (32, 40)},
}


def _registers(fn) -> int | None:
    """Registers per thread of the kernel that ``fn`` launches (compiled afresh into an emptied launch cache)."""
    _launch._COMPILED.clear()
    fn()
    entries = list(_launch._COMPILED.values())
    return getattr(entries[-1][0], "n_regs", None) if entries else None


def start(rounds: int) -> tuple[argparse.Namespace, float]:
    """The A/B scripts' command line (``--rounds``, ``--cases``), and the copy bandwidth, printed with the header."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--cases", nargs="*", default=None, help="keep the cases whose label contains one of these")
    args = parser.parse_args()
    copy = timing.copy_gbps()
    timing.ab_header(copy, args.rounds)
    return args, copy


def selected(cases, args: argparse.Namespace, copy: float):
    """The cases (label, shape, dtype, dim) that ``--cases`` keeps, each with a fresh input:
    (label, dtype, dim, x, dims, ms -> fraction of copy bandwidth)."""
    for label, shape, dtype, dim in cases:
        if not args.cases or any(c in label for c in args.cases):
            yield (label, dtype, dim, *case_input(shape, dtype, dim, copy))


def alternate_and_report(label: str, dtype: torch.dtype, variants: dict, rounds: int, frac, width: int) -> None:
    """Time ``variants`` (name -> (plan, call)) in alternating rounds, after a dirty flush and in a CUDA graph, and
    print one line per variant: median [min-max] | graph median, the plan and the kernel's registers."""
    regs = {name: _registers(fn) for name, (_, fn) in variants.items()}
    times = timing.alternate({name: (fn, frac) for name, (_, fn) in variants.items()}, rounds)
    print(f"\n{label} {str(dtype)[6:]}")
    for name, (plan, _) in variants.items():
        print(f"  {timing.spread(*times[name])}  {name:{width}s}"
              f" grid {plan.grid} split {plan.split} block_r {plan.block_r} block_i {plan.block_i} "
              f"warps {plan.num_warps} registers {regs.get(name)}", flush=True)


def main() -> None:
    args, copy = start(rounds=4)
    defaults = {name: getattr(_home(name), name) for name in KNOBS}
    for label, dtype, dim, x, dims, frac in selected(CASES, args, copy):
        variants = {name: _variant(x, dims, **{**defaults, **knobs}) for name, knobs in VARIANTS.items()
                    if ("column" not in name or dim == 0) and ("per SM" not in name or dim is None)}
        alternate_and_report(label, dtype, variants, args.rounds, frac, width=36)
        _variant(x, dims, **defaults)
        del x, variants


if __name__ == "__main__":
    main()
