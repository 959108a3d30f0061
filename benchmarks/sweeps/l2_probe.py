"""How the L2 state left by the timer moves read-heavy kernels, and what eviction hints and tiles buy.

    python3 benchmarks/sweeps/l2_probe.py --out DIR

Question: ``triton.testing.do_bench`` clears L2 before every call by *writing* a 256 MB buffer, so each
timed call starts with L2 full of dirty lines. A kernel that streams its input through L2 evicts them,
and their write-back shares DRAM bandwidth with its reads: a fixed cost of up to one L2 of writes
(50 MB: ~17 µs at 3 TB/s) that weighs most on short read-only kernels (reductions of 64-134 MB).
Inductor marks read-once loads ``evict_first``, which keeps the stream out of most of L2.

Three timings per provider, each a median over ``REPS`` calls with CUDA events around the call:
  dirty  do_bench's own flush (write 256 MB), i.e. what ``fuselab bench`` reports;
  clean  the same write, then a read-only pass over the flush buffer: L2 cold and clean;
  graph  ``GRAPH_CALLS`` back-to-back calls captured in a CUDA graph after a clean flush, per call
         (no host time, no launch gaps; steady state).
Providers: torch, torch.compile, fuselab with ``evict_first`` streams, fuselab with the default policy.
Then a bias_act sweep (dirty timing, as the lab) of the launchers' tile and grid knobs.
Writes ``l2_probe.json`` and the Inductor sources of the bf16 reductions into ``--out``.
"""

# every closure below is timed within the loop iteration that defines it
# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
from _timing import clean_flush, copy_gbps, dirty_flush, events_ms, graph_ms  # benchmarks/sweeps/_timing.py

import fuselab
from fuselab.ops import _bias_act_triton as ba
from fuselab.ops import _reduce_triton as rt
from fuselab.profile import _inductor_modules

CASES = (((10000, 10000), torch.float32, None), ((2**28,), torch.float32, None), ((8192, 8192), torch.bfloat16, None),
         ((10000, 10000), torch.float32, -1), ((8192, 8192), torch.bfloat16, -1), ((65536, 512), torch.bfloat16, -1),
         ((10000, 10000), torch.float32, 0), ((8192, 8192), torch.bfloat16, 0), ((65536, 512), torch.bfloat16, 0))


def with_eviction(policy: str, fn):
    def run():
        old = rt.STREAM_EVICTION
        rt.STREAM_EVICTION = dict.fromkeys((2, 4, 8), policy)
        try:
            return fn()
        finally:
            rt.STREAM_EVICTION = old
    return run


def reduce_probe(copy: float, out: Path) -> list[dict]:
    rows = []
    for shape, dtype, dim in CASES:
        x = torch.randn(shape, dtype=dtype, device="cuda")
        nbytes = x.numel() * x.element_size()
        label = f"{'all' if dim is None else f'dim={dim}'}/{'x'.join(map(str, shape))} {str(dtype)[6:]}"
        mean = (lambda t: torch.mean(t)) if dim is None else (lambda t, d=dim: torch.mean(t, d))
        before = {id(m) for m in _inductor_modules()}
        compiled = torch.compile(mean, dynamic=False)
        ref = torch.mean(x.double()) if dim is None else torch.mean(x.double(), dim)
        providers = {
            "torch": lambda: mean(x),
            "torch.compile": lambda: compiled(x),
            "fuselab": with_eviction("evict_first", lambda: fuselab.mean(x, dim)),
            "fuselab-noevict": with_eviction("", lambda: fuselab.mean(x, dim)),
        }
        for name, fn in providers.items():
            err = (fn().double() - ref).abs().max().item() / (ref.abs().max().item() + 1e-30)
            rec = {"case": label, "provider": name, "bytes": nbytes, "rel_err": err}
            for mode, ms in (("dirty", events_ms(fn, dirty_flush)), ("clean", events_ms(fn, clean_flush)),
                             ("graph", graph_ms(fn))):
                rec[f"{mode}_us"] = ms * 1e3
                rec[f"{mode}_frac"] = nbytes / ms / 1e6 / copy
            rows.append(rec)
            print(f"{label:26s} {name:16s} " + "  ".join(
                f"{m} {rec[f'{m}_us']:7.1f}us {rec[f'{m}_frac']:.2f}" for m in ("dirty", "clean", "graph")), flush=True)
        if dtype == torch.bfloat16:
            for i, m in enumerate(m for m in _inductor_modules() if id(m) not in before):
                src = getattr(m, "__file__", None)
                if src:
                    name = f"inductor_reduce_{label.replace('/', '_').replace(' ', '_').replace('=', '')}_{i}.py"
                    (out / name).write_text(Path(src).read_text())
    return rows


def bias_act_sweep(copy: float) -> list[dict]:
    """Forward: tile bytes × programs per SM; backward: tile bytes × widest column block × programs per SM."""
    rows = []
    cases = (((65536, 512), torch.bfloat16, "relu"), ((16384, 4096), torch.bfloat16, "gelu_tanh"),
             ((16384, 4096), torch.float32, "gelu_tanh"), ((262144, 1024), torch.bfloat16, "gelu_tanh"))
    defaults = (ba.FWD_TILE_BYTES, ba.BWD_TILE_BYTES, ba.FWD_PROGRAMS_PER_SM, ba.BWD_PROGRAMS_PER_SM, ba.BWD_COL_BYTES)

    def set_knobs(fwd_tile, bwd_tile, fwd_per_sm, bwd_per_sm, col_bytes):
        ba.FWD_TILE_BYTES, ba.BWD_TILE_BYTES, ba.FWD_PROGRAMS_PER_SM, ba.BWD_PROGRAMS_PER_SM, ba.BWD_COL_BYTES = (
            fwd_tile, bwd_tile, fwd_per_sm, bwd_per_sm, col_bytes)
        ba.FWD_FLAT = False  # the 2-D forward tiles (contiguous operands take the flat kernel since session 19)
        ba._fwd_plan.cache_clear()
        ba._bwd_plan.cache_clear()

    for (m, n), dtype, act in cases:
        label = f"{m}x{n} {act} {str(dtype)[6:]}"
        x = torch.randn(m, n, dtype=dtype, device="cuda")
        r = torch.randn_like(x)
        b = torch.randn(n, dtype=dtype, device="cuda")
        g = torch.randn_like(x)
        mn_bytes = x.numel() * x.element_size()
        activation = torch.relu if act == "relu" else lambda z: torch.nn.functional.gelu(z, approximate="tanh")
        compiled = torch.compile(lambda x, r, b: activation(x + r + b), dynamic=False)
        expect = activation(x.double() + r.double() + b.double())
        base = events_ms(lambda: compiled(x, r, b), dirty_flush)
        rows.append({"case": label, "pass": "fwd", "variant": "torch.compile", "us": base * 1e3,
                     "frac": 3 * mn_bytes / base / 1e6 / copy})
        print(f"{label:28s} fwd torch.compile {base * 1e3:7.1f}us {rows[-1]['frac']:.2f}", flush=True)
        y = torch.empty_like(x)
        for tile in (16384, 32768):
            for per_sm in (16, 64, 256):
                set_knobs(tile, defaults[1], per_sm, defaults[3], defaults[4])
                ms = events_ms(lambda: ba.bias_act_fwd_(x, b, r, y, None, 1.0, act), dirty_flush)
                err = ((y.double() - expect).abs() / (expect.abs() + 1)).max().item()
                rows.append({"case": label, "pass": "fwd", "variant": f"tile={tile} per_sm={per_sm}", "us": ms * 1e3,
                             "frac": 3 * mn_bytes / ms / 1e6 / copy, "err": err})
                print(f"{label:28s} fwd {rows[-1]['variant']:36s} {ms * 1e3:7.1f}us {rows[-1]['frac']:.2f}"
                      f"  err {err:.1e}", flush=True)
        # backward: read grad, saved (y for relu, z otherwise); write grad_x, grad_residual; fused bias grad
        saved = torch.relu(x) if act == "relu" else (x.float() + r.float() + b.float()).to(dtype)
        gx, gr = torch.empty_like(x), torch.empty_like(x)
        gb = torch.empty(n, dtype=dtype, device="cuda")
        for tile in (8192, 16384):
            for col_bytes in (512, 2048, 65536):
                for per_sm in (4, 8, 16):
                    set_knobs(defaults[0], tile, defaults[2], per_sm, col_bytes)
                    part = ba.bias_grad_partials(m, n, dtype, x.device)
                    ms = events_ms(lambda: ba.bias_act_bwd_(g, saved, None, 1.0, act, gx, gr, part, gb), dirty_flush)
                    variant = f"tile={tile} col={col_bytes} per_sm={per_sm}"
                    frac = 4 * mn_bytes / ms / 1e6 / copy
                    rows.append({"case": label, "pass": "bwd", "variant": variant, "us": ms * 1e3, "frac": frac})
                    print(f"{label:28s} bwd {rows[-1]['variant']:36s} {ms * 1e3:7.1f}us {rows[-1]['frac']:.2f}",
                          flush=True)
        set_knobs(*defaults)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--skip", nargs="*", default=(), choices=("reduce", "bias_act"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = copy_gbps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
          f"copy {copy:.0f} GB/s", flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_gbps": copy, "command": "python3 benchmarks/sweeps/l2_probe.py"}
    if "reduce" not in args.skip:
        result["reduce"] = reduce_probe(copy, args.out)
        (args.out / "l2_probe.json").write_text(json.dumps(result, indent=1))
    if "bias_act" not in args.skip:
        result["bias_act"] = bias_act_sweep(copy)
        (args.out / "l2_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
