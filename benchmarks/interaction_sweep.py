"""Sweep of the fused dot interaction's kernel variants and tuning knobs on a GPU, beside torch.compile.

Usage (on a CUDA machine, from a checkout; ``PYTHONPATH=src`` or an installed fuselab)::

    python benchmarks/interaction_sweep.py [--tag after] [--no-compile] [--no-variants] [--cases kaggle-bf16,...]

For each case (B x F x D, dtype) it times, with CUDA events (``triton.testing.do_bench`` medians):

* ``step`` columns, as ``fuselab bench interaction`` times them: the public call under ``no_grad`` (fwd), and
  forward + ``backward`` through autograd with the gradients reset first (fwd+bwd): host overhead included;
* ``graph`` columns: the same steps captured in a CUDA graph and replayed (device time alone);
* per variant (an :class:`~fuselab.ops.interaction.launch.InteractionTuning`), each kernel alone in a CUDA graph
  (``fwd`` and ``bwd`` in µs), after a check of its output and gradients against a float64 bmm + gather on
  the first rows (relative max error; ``BAD`` over the dtype's bound).

Providers: ``compile`` = torch.compile of the DLRM's eager bmm + gather (the bench suite's), ``fuselab`` = the
public :func:`~fuselab.ops.interaction.dot_interaction` with its default tuning. The last lines are a short table.
Without the variant launchers (an older fuselab) only the providers run.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

from fuselab.bench.suites.interaction import eager_interaction
from fuselab.ops.interaction import dot_interaction

try:
    from fuselab.ops.interaction.launch import DEFAULT_TUNING, InteractionTuning, launch_bwd, launch_fwd
except ImportError:  # an older fuselab: providers only
    DEFAULT_TUNING = InteractionTuning = launch_bwd = launch_fwd = None

#: name -> (B, F, D, dtype)
CASES = {
    "kaggle-fp32": (65536, 26, 16, torch.float32),
    "kaggle-bf16": (65536, 26, 16, torch.bfloat16),
    "kaggle8k-bf16": (8192, 26, 16, torch.bfloat16),
    "d128-fp32": (65536, 26, 128, torch.float32),
    "d128-bf16": (65536, 26, 128, torch.bfloat16),
}
#: relative max error bound of a variant's check, per dtype
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
CHECK_ROWS = 512


def case_bytes(b: int, f: int, d: int, itemsize: int) -> tuple[int, int]:
    """(forward, backward) bytes: read the inputs and write the output once; read the gradient's used columns and
    the inputs, write their gradients."""
    n, p = f + 1, (f + 1) * f // 2
    return b * (n * d + d + p) * itemsize, b * (d + p + 2 * n * d) * itemsize


def make_inputs(b: int, f: int, d: int, dtype: torch.dtype):
    dense = torch.randn(b, d, device="cuda", dtype=dtype)
    emb = torch.randn(b, f, d, device="cuda", dtype=dtype)
    grad = torch.randn(b, d + (f + 1) * f // 2, device="cuda", dtype=dtype)
    return dense, emb, grad


def step_times(fn, dense, emb, grad) -> dict[str, float]:
    """fwd and fwd+bwd of ``fn(dense, emb)`` as the bench times them (``step``) and as graph replays, in ms."""
    d_leaf, e_leaf = dense.detach().requires_grad_(True), emb.detach().requires_grad_(True)

    def fwd():
        with torch.no_grad():
            return fn(dense, emb)

    def fwd_bwd():
        d_leaf.grad = e_leaf.grad = None
        fn(d_leaf, e_leaf).backward(grad)

    out = {}
    for name, step in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        step()
        out[f"{name} step"] = do_bench(step, warmup=25, rep=100, return_mode="median")
        out[f"{name} graph"] = do_bench_cudagraph(step, rep=50, return_mode="median")
    return out


class _PyFloor(torch.autograd.Function):
    """``pad`` as a Python autograd Function whose backward is one C++ op: the host cost of Python on the
    autograd engine's thread, for scale."""

    @staticmethod
    def forward(ctx, x, width):
        ctx.dim = x.shape[1]
        return torch.nn.functional.pad(x, (0, width - x.shape[1]))

    @staticmethod
    def backward(ctx, g):
        return g[:, : ctx.dim], None


class _Timed(torch.autograd.Function):
    """Identity whose backward times ``ctx.calls`` (name -> function) on the autograd engine's thread."""

    @staticmethod
    def forward(ctx, x, calls, result):
        ctx.calls, ctx.result = calls, result
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.result.update(_time_calls(ctx.calls))
        return g, None, None


def _time_calls(calls: dict) -> dict[str, float]:
    import time

    out = {}
    for name, call in calls.items():
        call()
        t0 = time.perf_counter()
        for _ in range(100):
            call()
        out[name] = (time.perf_counter() - t0) / 100 * 1e6
    return out


def host_probe(dense, emb, grad, log) -> None:
    """Host µs per call (in a loop, no syncs) of the op's allocating forward and backward and of their parts, on
    the main thread and on the autograd engine's thread (inside a backward)."""
    from fuselab.ops.interaction import op

    gd, ge = torch.empty_like(dense), torch.empty_like(emb)
    calls = {"op._forward": lambda: op._forward(dense, emb, False, 1),
             "op._backward": lambda: op._backward(grad, dense, emb, False),
             "launch_bwd": lambda: launch_bwd(grad, dense, emb, gd, ge, False),
             "empty_like(emb)": lambda: torch.empty_like(emb),
             "current_device": torch.cuda.current_device,
             "data_ptr": dense.data_ptr}
    main = _time_calls(calls)
    engine: dict[str, float] = {}
    leaf = dense.detach().requires_grad_(True)
    _Timed.apply(leaf, calls, engine).sum().backward()
    torch.cuda.synchronize()
    for name in calls:
        there = engine.get(name, float("nan"))
        log(f"host {name:16s} main thread {main[name]:7.1f} us  autograd thread {there:7.1f} us")


def check_variant(tuning, dense, emb, grad) -> float:
    """Max relative error (over the reference's largest magnitude) of the output and both gradients of the
    launchers with ``tuning`` on the first :data:`CHECK_ROWS` rows, outputs poisoned with NaN first."""
    dn, en, gn = dense[:CHECK_ROWS], emb[:CHECK_ROWS], grad[:CHECK_ROWS]
    out = torch.full_like(gn, float("nan"))
    gd, ge = torch.full_like(dn, float("nan")), torch.full_like(en, float("nan"))
    launch_fwd(dn, en, out, False, tuning)
    launch_bwd(gn, dn, en, gd, ge, False, tuning)
    d64, e64 = dn.double().requires_grad_(True), en.double().requires_grad_(True)
    ref = eager_interaction(d64, e64, False, 1)
    ref.backward(gn.double())
    worst = 0.0
    for got, want in ((out, ref.detach()), (gd, d64.grad), (ge, e64.grad)):
        err = (got.double() - want).abs().max() / want.abs().max()
        worst = max(worst, float("inf") if not torch.isfinite(err) else err.item())
    return worst


def variant_times(tuning, dense, emb, grad) -> tuple[float, float]:
    """(fwd, bwd) device time in µs of the launchers with ``tuning``, each kernel alone in a CUDA graph."""
    out = torch.empty_like(grad)
    gd, ge = torch.empty_like(dense), torch.empty_like(emb)
    fwd = do_bench_cudagraph(lambda: launch_fwd(dense, emb, out, False, tuning), rep=30, return_mode="median")
    bwd = do_bench_cudagraph(lambda: launch_bwd(grad, dense, emb, gd, ge, False, tuning), rep=30,
                             return_mode="median")
    return fwd * 1e3, bwd * 1e3


def variants(grid: dict[str, tuple]) -> list:
    """Tunings to try: the default, then every combination in ``grid`` (outer products or tl.dot, rows per program,
    warps, pipelining stages, D chunk), with register budgets that let the rows through."""
    if InteractionTuning is None:
        return []
    big = dict(max_tile_elements=1 << 20, bwd_max_tile_elements=1 << 20)
    out = [DEFAULT_TUNING]
    for outer, rows, warps, stages, block_d, outer4 in itertools.product(*(grid[k] for k in GRID)):
        out.append(InteractionTuning(
            rows_per_program=rows, bwd_rows_per_program=rows, num_warps=warps, num_warps_large=warps,
            outer_max_dim=256, outer4=bool(outer4),
            num_stages=stages, max_block_d=block_d, fwd_outer_fp32=outer, fwd_outer_lowp=outer,
            bwd_outer_fp32=outer, bwd_outer_lowp=outer, **big))
    return out


#: the knobs a sweep varies, with their defaults (``--grid outer=0,1 rows=1,2,4 ...`` overrides)
GRID = {"outer": (0, 1), "rows": (1, 2, 4, 8), "warps": (4, 8), "stages": (1,), "block_d": (64,), "outer4": (1,)}


def describe(t) -> str:
    if t == DEFAULT_TUNING:
        return "default"
    outer = ("outer4" if t.outer4 else "outer") if t.fwd_outer_fp32 else "dot"
    return f"{outer} r{t.rows_per_program} w{t.num_warps} s{t.num_stages} d{t.max_block_d}"


def run_case(name: str, with_providers: bool, with_compile: bool, grid: dict | None, log) -> dict:
    b, f, d, dtype = CASES[name]
    dense, emb, grad = make_inputs(b, f, d, dtype)
    fwd_mb, bwd_mb = (x / 1e6 for x in case_bytes(b, f, d, dtype.itemsize))
    log(f"== {name}: {b}x{f}x{d} {str(dtype)[6:]}, fwd {fwd_mb:.1f} MB, bwd {bwd_mb:.1f} MB")
    row = {"case": name}
    width = d + (f + 1) * f // 2
    # floor: one op (pad) with a trivial backward: the host cost of a step through autograd, for scale
    providers = [("floor", lambda x, y: torch.nn.functional.pad(x, (0, width - d))),
                 ("pyfloor", lambda x, y: _PyFloor.apply(x, width)),
                 ("fuselab", lambda x, y: dot_interaction(x, y))]
    if not with_providers:
        providers = []
    if with_providers and with_compile:  # a fresh Dynamo cache and static shapes per case, as the bench's provider
        torch._dynamo.reset()
        compiled = torch.compile(eager_interaction, dynamic=False)
        providers.insert(0, ("compile", lambda x, y: compiled(x, y, False, 1)))
    for prov, fn in providers:
        times = step_times(fn, dense, emb, grad)
        row.update({f"{prov} {k}": v for k, v in times.items()})
        log(f"{prov:8s} " + "  ".join(f"{k} {v * 1e3:8.1f} us" for k, v in times.items()))
    if with_providers and launch_bwd is not None:
        with torch.autograd.set_multithreading_enabled(False):  # backwards on the calling thread
            times = step_times(lambda x, y: dot_interaction(x, y), dense, emb, grad)
        log("fuselab, autograd multithreading off: " + "  ".join(f"{k} {v * 1e3:8.1f} us" for k, v in times.items()))
        host_probe(dense, emb, grad, log)
    if grid is not None:
        best = {}
        for tuning in variants(grid):
            try:
                err = check_variant(tuning, dense, emb, grad)
                fwd_us, bwd_us = variant_times(tuning, dense, emb, grad)
            except Exception as e:  # a variant that does not compile (registers, shared memory) is reported
                log(f"  {describe(tuning):22s} FAILED {type(e).__name__}: {str(e)[:80]}")
                continue
            flag = "BAD" if err > TOLERANCE[dtype] else "ok"
            log(f"  {describe(tuning):22s} fwd {fwd_us:8.1f} us ({fwd_mb / fwd_us:5.2f} TB/s)  "
                         f"bwd {bwd_us:8.1f} us ({bwd_mb / bwd_us:5.2f} TB/s)  err {err:.1e} {flag}")
            if flag == "ok":
                for key, value in (("fwd", fwd_us), ("bwd", bwd_us)):
                    if key not in best or value < best[key][0]:
                        best[key] = (value, describe(tuning))
        for key, (value, what) in best.items():
            log(f"  best {key}: {value:.1f} us  {what}")
            row[f"best {key}"] = f"{value:.1f} us {what}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--tag", default="", help="label of this run in the summary table")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    parser.add_argument("--no-variants", action="store_true", help="time only the providers")
    parser.add_argument("--no-providers", action="store_true", help="time only the variants")
    parser.add_argument("--grid", nargs="*", default=[], metavar="KNOB=V1,V2",
                        help="override a knob's values: " + ", ".join(f"{k}={','.join(map(str, v))}"
                                                                     for k, v in GRID.items()))
    args = parser.parse_args(argv)
    grid = dict(GRID)
    for item in args.grid:
        knob, _, values = item.partition("=")
        if knob not in GRID or not values:
            parser.error(f"--grid takes KNOB=V1,V2 with KNOB in {', '.join(GRID)}, got {item!r}")
        grid[knob] = tuple(int(v) for v in values.split(","))
    if not torch.cuda.is_available():
        print("interaction_sweep needs a CUDA device", file=sys.stderr)
        return 2
    names = [n for n in args.cases.split(",") if n]
    for n in names:
        if n not in CASES:
            parser.error(f"unknown case {n!r}; valid: {', '.join(CASES)}")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, tag {args.tag or '-'}", flush=True)
    rows = [run_case(n, not args.no_providers, not args.no_compile, None if args.no_variants else grid,
                     lambda line: print(line, flush=True)) for n in names]
    keys = [k for k in rows[0] if k.endswith("step") or k.endswith("graph")]
    if not keys:
        return 0
    print(f"\n## summary {args.tag} (ms; step = as fuselab bench times it, graph = CUDA graph replay)")
    print("| case | " + " | ".join(keys) + " |")
    for r in rows:
        print(f"| {r['case']} | " + " | ".join(f"{r.get(k, float('nan')):.3f}" for k in keys) + " |")
    for r in rows:
        for key in ("best fwd", "best bwd"):
            if key in r:
                print(f"{r['case']} {key}: {r[key]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
