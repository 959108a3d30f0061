"""The ``fuselab`` command: ``env``, ``bench``, ``bench compare``, ``profile``, ``dlrm``.

Every default comes from the Python API (:class:`fuselab.bench.options.BenchOptions`,
:data:`~fuselab.bench.options.COMPARE_THRESHOLD`), so the CLI and the API agree. Bad
arguments (unknown op, provider, dtype, mode, shape; unwritable output folder) exit with
code 2 and a message listing the valid choices, never a traceback. On a machine without a
GPU, ``TRITON_INTERPRET=1`` is set at start-up (before Triton is imported) so the Triton
providers run under the interpreter, for correctness only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from fuselab.bench.options import COMPARE_THRESHOLD, BenchOptions
from fuselab.bench.spec import DTYPES, MODES
from fuselab.core.console import guarded_console, make_console
from fuselab.core.flags import POSITIVE_INT, Number

_DEFAULTS = BenchOptions()


class CliError(Exception):
    """A user error: printed as ``fuselab: error: ...`` with exit code 2."""


def _console():
    return make_console()


def _names(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """Accept ``--providers a b`` and ``--providers a,b``."""
    if not values:
        return None
    return tuple(v for item in values for v in item.split(",") if v)


# ---------------------------------------------------------------- env
def cmd_env(args: argparse.Namespace) -> int:
    from fuselab.envinfo import environment

    info = environment()
    if info["device_type"] == "cuda" and not args.no_measure:
        import torch

        from fuselab.bench.ceilings import measure
        from fuselab.bench.timing import CudaTimer

        ceilings = measure(torch.device("cuda"), CudaTimer())
        info["copy_gbps"] = round(ceilings.copy_gbps, 1)
        info["copy_check_gbps"] = round(ceilings.copy_check_gbps or 0.0, 1)
        info["matmul_bf16_tflops"] = round(ceilings.matmul_tflops or 0.0, 1)
    elif info["device_type"] != "cuda":
        info["copy_gbps"] = "no GPU (fuselab bench measures the CPU memcpy bandwidth)"
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
    return 0


# ---------------------------------------------------------------- bench
def options_from_args(args: argparse.Namespace, argv: Sequence[str]) -> BenchOptions:
    return BenchOptions(
        ops=tuple(args.ops), providers=_names(args.providers), dtypes=_names(args.dtype), modes=_names(args.mode),
        cases=_names(args.case),
        quick=args.quick, out=Path(args.out) if args.out else None, plot=args.plot, l2_cold=args.l2_cold,
        cuda_graph=args.cuda_graph, stream=args.stream, wide=args.wide, command="fuselab " + " ".join(argv),
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from fuselab.bench.lab import run

    options = options_from_args(args, args.argv)
    try:
        run(options, console=_console())
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from e
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fuselab.bench.compare import compare_files, compare_table, warnings

    try:
        a, b, rows = compare_files(Path(args.a), Path(args.b), args.threshold, args.any_device)
    except ValueError as e:
        raise CliError(str(e)) from e
    console = _console()
    console.print(compare_table(a, b, rows, args.threshold, args.a, args.b))
    regressions = sum(r.is_regression for r in rows)
    improvements = sum(r.verdict == "improvement" for r in rows)
    noise = sum(r.verdict == "within noise" or r.verdict.endswith("(noisy)") for r in rows)
    console.print(f"{regressions} regression(s), {improvements} improvement(s), {noise} difference(s) within "
                  f"noise or between noisy timings over {len(rows)} result(s)")
    for line in warnings(a, b, rows):
        print(line, file=sys.stderr)
    return 1 if regressions and args.fail_on_regression else 0


# ---------------------------------------------------------------- profile
def cmd_profile(args: argparse.Namespace) -> int:
    from fuselab.profile import profile_case, render_kernel_table

    try:
        res = profile_case(args.op, args.provider, shape=args.shape, dtype=args.dtype, mode=args.mode,
                           steps=args.steps, trace=Path(args.trace) if args.trace else None,
                           out_dir=Path(args.out) if args.out else None)
    except (ValueError, OSError) as e:
        raise CliError(str(e)) from e
    except RuntimeError as e:
        print(f"fuselab profile: {e}", file=sys.stderr)
        return 1
    console = _console()
    on_gpu = res.device == "cuda"
    title = f"{res.case} · {res.provider} · {res.steps} calls · " + (
        "GPU kernels" if on_gpu else "CPU ops (no GPU: top-level ATen ops, CPU time)")
    console.print(render_kernel_table(res.rows, title=title, device=on_gpu, steps=res.steps))
    what = "kernel launches per call" if on_gpu else "CPU compute ops per call"
    console.print(f"{what}: {res.launches_per_call:g}")
    if res.device_us_per_call is not None:
        console.print(f"device time per call: {res.device_us_per_call:.1f} µs")
    console.print(f"host time per call (inside the call; launch overhead on a GPU): {res.host_us_per_call:.1f} µs")
    console.print(f"wall time per call (synchronized): {res.wall_us_per_call:.1f} µs")
    if res.fused:
        console.print("Inductor fused kernels: " + ", ".join(res.fused))
    for path in res.inductor_sources:
        console.print(f"Inductor source: {path}")
    if res.trace is not None:
        console.print(f"Chrome trace: {res.trace} (open in chrome://tracing or ui.perfetto.dev)")
    return 0


# ---------------------------------------------------------------- parsers
def _bench_parser(sub: argparse._SubParsersAction) -> None:
    from fuselab.bench.suites import op_names

    p = sub.add_parser(
        "bench", help="check and time ops against eager, torch.compile, TorchScript and peers",
        description="Check every provider against a float64 reference, then time it; report GB/s, fraction of "
                    "the measured copy bandwidth, speedups. Also: `fuselab bench compare A.json B.json`.")
    p.add_argument("ops", nargs="*", metavar="OP", help=f"ops to run (default: all): {', '.join(op_names())}")
    p.add_argument("--providers", nargs="+", metavar="P", help="provider names to keep (default: all)")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), help="dtypes (default: each op's defaults)")
    p.add_argument("--mode", nargs="+", choices=list(MODES), help="modes (default: each op's defaults)")
    p.add_argument("--case", nargs="+", metavar="LABEL",
                   help="keep the cases whose label contains one of these (default: all but opt-in cases, such as "
                        "the full-size DLRM, which run only when named in full)")
    p.add_argument("--quick", action="store_true", default=_DEFAULTS.quick, help="one or two sizes per op")
    p.add_argument("--out", metavar="DIR",
                   help="output folder of <op>.json, <op>.csv (and PNGs with --plot); default: "
                        "./benchmarks/results/<device> under the current folder, e.g. "
                        "./benchmarks/results/cpu")
    p.add_argument("--plot", action="store_true", default=_DEFAULTS.plot, help="also write PNG plots")
    p.add_argument("--wide", action="store_true", default=_DEFAULTS.wide,
                   help="print every column (spread, %% stream, TFLOP/s, vs compile, error, memory); the default "
                        "table fits 100 terminal columns, the JSON/CSV files hold every figure")
    p.add_argument("--l2-cold", action="store_true", default=_DEFAULTS.l2_cold,
                   help="time small cases over rotating input sets (> 2x L2) (GPU)")
    p.add_argument("--cuda-graph", action="store_true", default=_DEFAULTS.cuda_graph,
                   help="time fwd and fwd+bwd cases as CUDA graph replays: device time without host overhead (GPU)")
    p.add_argument("--no-stream", dest="stream", action="store_false", default=_DEFAULTS.stream,
                   help="skip the stream bound: a kernel that only moves each case's bytes, timed the same way, "
                        "the limit at that size (GPU)")
    p.set_defaults(func=cmd_bench)


def _compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fuselab bench compare",
                                description="Show two result JSONs side by side and mark regressions: slower by more "
                                            "than the threshold and outside the p20-p80 spread of both runs. Runs "
                                            "of different devices, timers or timing options are refused.")
    p.add_argument("a", metavar="A.json")
    p.add_argument("b", metavar="B.json")
    p.add_argument("--threshold", type=Number(float, 0).parse, default=COMPARE_THRESHOLD,
                   help=f"relative slow-down that counts as a regression (>= 0; default {COMPARE_THRESHOLD})")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any regression is found")
    p.add_argument("--any-device", action="store_true",
                   help="compare runs of different devices, timers or timing options anyway (with a warning)")
    p.set_defaults(func=cmd_compare)
    return p


def _profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="one op x provider x shape under torch.profiler",
                       description="Per-kernel device-time table, launches per call, host overhead; "
                                   "Chrome trace; Inductor's generated source for torch.compile.")
    p.add_argument("op")
    p.add_argument("--provider", help="provider name (default: the op's baseline: eager for most ops, "
                                      "torch.square for square, torch for reduce)")
    p.add_argument("--shape", help="case label, e.g. n=2^24 (default: the op's first quick case)")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--mode", choices=list(MODES), default="fwd")
    p.add_argument("--steps", type=POSITIVE_INT.parse, default=10, help="profiled calls (after 3 warm-up calls)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace (JSON) here")
    p.add_argument("--out", metavar="DIR", help="where Inductor's source goes (default: next to the trace)")
    p.set_defaults(func=cmd_profile)


def _dlrm_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dlrm", help="the DLRM recommender: data, training, export")
    try:
        from fuselab.dlrm.cli import configure_parser
    except ImportError as e:
        message = f"the dlrm command is unavailable: {e}"
        p.set_defaults(func=lambda args: print(message, file=sys.stderr) or 1)
        return
    configure_parser(p)


def build_parser() -> argparse.ArgumentParser:
    from fuselab import __version__

    parser = argparse.ArgumentParser(prog="fuselab", description="Fused GPU kernels and the lab that proves them.")
    parser.add_argument("--version", action="version", version=f"fuselab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{env,bench,profile,dlrm}")
    sub.required = True
    env = sub.add_parser("env", help="device, driver, versions, Triton mode, measured copy bandwidth")
    env.add_argument("--json", action="store_true", help="print JSON")
    env.add_argument("--no-measure", action="store_true", help="skip the bandwidth measurement")
    env.set_defaults(func=cmd_env)
    _bench_parser(sub)
    _profile_parser(sub)
    _dlrm_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fuselab`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from fuselab.envinfo import enable_interpreter_if_no_cuda

    enable_interpreter_if_no_cuda()  # before anything imports triton
    with guarded_console():  # a closed pipe or a full disk under stdout/stderr never stops the work
        return _run(argv)


def _run(argv: list[str]) -> int:
    if argv[:2] == ["bench", "compare"]:
        parser = _compare_parser()
        args = parser.parse_args(argv[2:])
    else:
        parser = build_parser()
        args = parser.parse_args(argv)
    args.argv = argv
    try:
        return int(args.func(args) or 0)
    except CliError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
