"""Split reductions (``mean`` over all elements and over ``dim=0``): the order in which split programs read the
reduced axis, column-tile width and programs per SM, timed in one process against torch and torch.compile.

    python3 benchmarks/sweeps/reduce_split_probe.py [--cases all dim=0]

Question: in a CUDA graph (device time only) ``mean`` over all of 8192² bf16 ran at 0.93 of copy bandwidth and over
``dim=-1`` of the same tensor at 1.01 (``probes/reduce_rows_probe.txt``): same bytes, same tile and warps. The split
plan gives each of its ~1024 programs one contiguous 128 KB chunk, so the ~264 resident programs read 264 streams
128 KB apart, where the dim=-1 plan's programs read neighbouring rows. Interleaving the blocks (program s of S reads
blocks s, s+S, ...) keeps every moment's reads in one window. ``dim=0`` (cols kernel) reads 128-512 B of each row
per tile: wider column tiles read longer runs of each DRAM page, at the cost of a longer final sum.
Each variant: median of CUDA events after a dirty flush (the lab's method) | per call of 10 calls in a CUDA graph.
"""

from __future__ import annotations

import argparse
import itertools

import _timing as timing  # benchmarks/sweeps/_timing.py
import torch
from reduce_sweep import case_input, run_once  # benchmarks/sweeps/reduce_sweep.py: a case's input; a fixed plan

from fuselab.ops import _launch
from fuselab.ops import _reduce_plan as P
from fuselab.ops import _reduce_triton as K

CASES = [  # label, shape, dtype, dim
    ("all/8192x8192", (8192, 8192), torch.bfloat16, None),
    ("all/10000x10000", (10000, 10000), torch.float32, None),
    ("all/n=2^28", (2**28,), torch.float32, None),
    ("dim=0/10000x10000", (10000, 10000), torch.float32, 0),
    ("dim=0/8192x8192", (8192, 8192), torch.bfloat16, 0),
    ("dim=0/65536x512", (65536, 512), torch.bfloat16, 0),
    ("dim=-1/8192x8192", (8192, 8192), torch.bfloat16, -1),  # the unsplit reference read of the same bytes
]
KNOBS = ("INTERLEAVE_MIN_SPLIT", "PROGRAMS_PER_SM", "COLS_PROGRAMS_PER_SM", "MAX_COL_FRACTION", "MIN_COL_BYTES",
         "TILE_BYTES", "ROWS_MAXNREG")


def _home(name: str):
    """The module that holds a knob: the planner's, or the kernels' (register cap, eviction hint)."""
    return P if hasattr(P, name) else K


def _variant(x: torch.Tensor, dims: tuple[int, ...], **knobs):
    """The plan under ``knobs`` and a call that runs it. The planner's knobs are baked into the plan; the kernels'
    (read at launch) are set again by every call, so variants can be timed alternately."""
    for name, value in knobs.items():
        setattr(_home(name), name, value)
    P._plan.cache_clear()
    _launch._COMPILED.clear()
    plan, run = run_once(x, dims, None)
    at_launch = {name: value for name, value in knobs.items() if _home(name) is K}

    def fn():
        for name, value in at_launch.items():
            setattr(K, name, value)
        return run()

    fn()
    torch.cuda.synchronize()
    return plan, fn


def _order(interleave: bool) -> dict:
    """Knob value: every split plan interleaved, or none."""
    return dict.fromkeys(("rows", "cols"), 2 if interleave else None)


def _variants(dim: int | None, elsize: int, defaults: dict):
    tile = defaults["TILE_BYTES"][elsize]
    if dim is None:  # rows kernel, split over the whole tensor
        for interleave, per_sm, tile_bytes in itertools.product((True, False), (4, 8, 16), (tile, 2 * tile)):
            yield dict(INTERLEAVE_MIN_SPLIT=_order(interleave), PROGRAMS_PER_SM=per_sm,
                       TILE_BYTES=dict.fromkeys((2, 4, 8), tile_bytes))
    elif dim == 0:  # cols kernel: (widest column tile as a fraction of the tile, narrowest column tile in bytes)
        for interleave, (fraction, min_col), per_sm in itertools.product(
                (True, False), ((16, 128), (16, 512), (8, 512), (4, 1024), (2, 2048)), (4, 8)):
            yield dict(INTERLEAVE_MIN_SPLIT=_order(interleave), MAX_COL_FRACTION=fraction,
                       MIN_COL_BYTES=dict.fromkeys((2, 4, 8), min_col),
                       COLS_PROGRAMS_PER_SM=per_sm)
    else:
        yield {}


def probe(label: str, shape: tuple, dtype: torch.dtype, dim: int | None, copy: float, defaults: dict) -> None:
    x, dims, frac = case_input(shape, dtype, dim, copy)

    def eager(t):
        return torch.mean(t) if dim is None else torch.mean(t, dim)

    compiled = torch.compile(eager)
    compiled(x)
    rows = [(name, frac(timing.events_ms(lambda f=f: f(x), timing.dirty_flush)),
             frac(timing.graph_ms(lambda f=f: f(x)))) for name, f in (("torch", eager), ("torch.compile", compiled))]
    plan, fn = _variant(x, dims, **defaults)
    rows.append((f"shipped: grid {plan.grid} block_r {plan.block_r} block_i {plan.block_i} warps {plan.num_warps} "
                 f"interleave {plan.interleave}", frac(timing.events_ms(fn, timing.dirty_flush)),
                 frac(timing.graph_ms(fn))))
    for knobs in _variants(dim, x.element_size(), defaults):
        plan, fn = _variant(x, dims, **{**defaults, **knobs})
        shown = {k: (v.get(x.element_size(), v.get("rows")) if isinstance(v, dict) else v) for k, v in knobs.items()}
        name = " ".join(f"{k.lower()} {v}" for k, v in shown.items())
        rows.append((f"{name} | grid {plan.grid} block_r {plan.block_r} block_i {plan.block_i}",
                     frac(timing.events_ms(fn, timing.dirty_flush)), frac(timing.graph_ms(fn))))
    _variant(x, dims, **defaults)
    print(f"\n{label} {str(dtype)[6:]} ({x.numel() * x.element_size() / 1e6:.0f} MB)")
    for name, dirty, graph in sorted(rows, key=lambda r: -r[1])[:14]:
        print(f"  {dirty:.3f} | {graph:.3f}  {name}")
    for name, dirty, graph in rows[:3]:
        print(f"  [{name.split(':')[0]}] {dirty:.3f} | {graph:.3f}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="*", default=None)
    args = parser.parse_args()
    copy = timing.copy_gbps()
    print(f"# {torch.cuda.get_device_name()}  copy {copy:.0f} GB/s; fractions of it (dirty flush | CUDA graph)")
    defaults = {name: getattr(_home(name), name) for name in KNOBS}
    for case in CASES:
        if args.cases is None or any(c in case[0] for c in args.cases):
            probe(*case, copy, defaults)


if __name__ == "__main__":
    main()
