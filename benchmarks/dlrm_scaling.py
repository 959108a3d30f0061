"""DLRM weak scaling over the GPUs of one host: the hybrid-parallel training step at 1, 2, ... ranks.

Kaggle model (the 26 Kaggle cardinalities, D=16, bottom 13-512-256-64-16, top 368-512-256-1, row-wise Adagrad;
``--model mlperf-v2``: MLPerf's DLRM-DCNv2 with its multi-hot bags, tables times ``--scale``),
``--batch`` samples per rank (weak scaling: the global batch grows with the ranks), random device-resident
batches (power-law ids, a different stream per rank). The step is :func:`fuselab.dlrm.distributed.hybrid.
build_hybrid`'s, the one ``fuselab dlrm train --nproc N`` trains with: tables sharded whole (table-wise), fused
lookup + update, pooled embeddings exchanged with all_to_all (bf16 under bf16), dense gradients averaged by DDP
(``eager``) or by one flat all-reduce inside the captured step (``cuda_graph``). At one rank the same code runs
without collectives; ``single`` is the one-process ``DLRM(kernels="fuselab")`` step in a CUDA graph (no sharding
code at all), measured in the same run for reference.

Per (ranks, mode): samples/s of the global batch over the slowest rank's median window step time (``--windows`` x
``--steps`` steps, CUDA events, no synchronization inside a window), weak-scaling efficiency against the same mode
at one rank, device time per step of NCCL's all_to_all and all_reduce kernels and of all kernels (torch.profiler,
rank 0), peak memory (largest rank). One launch per (world size, mode) starts the ranks (torch's elastic
launcher); results: ``--out DIR/dlrm_scaling.json``.

    python3 benchmarks/dlrm_scaling.py --out benchmarks/results/h100x2            # 1 and 2 GPUs, ~3 min
    python3 benchmarks/dlrm_scaling.py --device cpu --quick --out /tmp/scaling    # gloo smoke test
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from fuselab import envinfo

envinfo.enable_interpreter_if_no_cuda()  # before anything imports triton

from collective_timeline import CollectiveTimeline  # noqa: E402  (benchmarks/, beside this script)
from rank_timing import Pipelined, comm_profile, digest, measure, peak_gb  # noqa: E402

from fuselab._io import atomic_write_json, writable_dir  # noqa: E402
from fuselab.dlrm.config import load_config  # noqa: E402
from fuselab.dlrm.data.random import random_batches  # noqa: E402
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES  # noqa: E402
from fuselab.dlrm.distributed import init_from_env, shutdown  # noqa: E402
from fuselab.dlrm.distributed.hybrid import build_hybrid  # noqa: E402
from fuselab.dlrm.distributed.parallel import MULTICAST_OFF  # noqa: E402
from fuselab.dlrm.model import DLRM  # noqa: E402
from fuselab.dlrm.optim import Optimizers  # noqa: E402
from fuselab.dlrm.step import StepOptions, TrainStep  # noqa: E402

MODES = ("eager", "cuda_graph")


def _say(ctx, text: str) -> None:
    print(f"[rank {ctx.rank}/{ctx.world_size} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def worker(spec: dict[str, Any]) -> None:
    """One rank: build each mode's hybrid step, measure it; rank 0 writes ``spec["result"]``. A mode that hangs
    (a collective or a graph launch that never returns) prints every thread's stack and ends the rank after
    ``spec["hang_s"]`` seconds."""
    on_cpu = spec["device"] == "cpu"
    ctx = init_from_env(backend="gloo" if on_cpu else None, timeout_s=spec["hang_s"])
    if on_cpu:
        torch.set_num_threads(1)
    world = ctx.world_size
    batch = spec["global_batch"] // world if spec.get("global_batch") else spec["batch"]
    cfg = load_config(spec["model"], precision=spec["precision"], optimizer=spec["optimizer"],
                      batch_size=batch * world, seed=0, data_parallel_tables=spec.get("data_parallel_tables", True),
                      embedding_dtype=spec.get("embedding_dtype", "fp32"))
    sizes = [max(2, round(n * spec["scale"])) for n in (cfg.cardinalities or KAGGLE_CARDINALITIES)]
    sizes = [min(n, cfg.max_rows_per_table or n) for n in sizes]
    kernels = "torch" if on_cpu else "fuselab"
    batches = random_batches(batch, sizes, ctx.device, spec["ids"], count=4, seed=1234 + ctx.rank,
                             multi_hot_sizes=cfg.multi_hot_sizes)
    runs = []
    modes = [m for m in spec["modes"] if not (on_cpu and m == "cuda_graph")]
    variants = [(mode, overlap) for mode in modes for overlap in spec.get("overlap", [False])]
    for mode, overlap in variants:
        faulthandler.dump_traceback_later(spec["hang_s"], exit=True)
        name = f"{mode}{' +overlap' if overlap else ''}"
        _say(ctx, f"{name}: build")
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        if mode == "single":
            with torch.device(ctx.device):  # MLPerf's full tables are drawn where they train
                model = DLRM.from_config(cfg.__class__(**{**cfg.to_dict(), "kernels": "fuselab"}), sizes)
            optimizers = Optimizers(model, lr_dense=cfg.lr_dense, lr_sparse=cfg.lr_sparse)
            step = TrainStep(model, optimizers, precision=cfg.precision, mode="cuda_graph",
                             options=StepOptions(overlap=cfg.overlap if overlap is None else overlap))
            plan = None
        else:
            model, optimizers, step, plan = build_hybrid(cfg, sizes, ctx, kernels=kernels, mode=mode,
                                                         overlap=overlap, pipeline=spec.get("pipeline", False))
            if spec.get("pipeline"):
                step = Pipelined(step, batches)
        if overlap is None:  # the default of the mode: what build_hybrid chose
            overlap = getattr(step, "side_stream", None) is not None
        run: dict[str, Any] = {"mode": mode, "overlap": overlap, "pipeline": bool(spec.get("pipeline")) and
                               mode != "single", "ranks": world, "batch_per_rank": batch,
                               "global_batch": batch * world}
        try:
            _say(ctx, f"{name}: measure")
            timeline = (CollectiveTimeline(step.side_stream) if spec.get("timeline") and mode == "cuda_graph"
                        else None)
            if timeline is None:
                run.update(measure(step, batches, ctx.device, spec["steps"], spec["windows"]))
            else:
                with timeline:
                    run.update(measure(step, batches, ctx.device, spec["steps"], spec["windows"]))
                run["timeline"] = timeline.replay(step, batches)
                if world > 1:  # every rank's, in rank order
                    gathered = [None] * world
                    dist.all_gather_object(gathered, run["timeline"])
                    run["timeline"] = gathered
            _say(ctx, f"{name}: {run['step_ms']:.3f} ms/step; profile")
            run["samples_per_s"] = batch * world / (run["step_ms"] / 1e3)
            # torch.profiler over replays of a graph holding NCCL kernels hung at 2 ranks (H100, torch 2.11): the
            # eager mode's profile gives the communication kernels' times there
            if not spec.get("no_profile") and (mode != "cuda_graph" or world == 1):
                run.update(comm_profile(step, batches, ctx.device))
            run["peak_gb"] = peak_gb(ctx.device)
            run["weights_digest"] = digest(model, ctx.device)
            if plan is not None and ctx.is_main:
                run["plan"] = plan.format_table()
        except Exception as exc:  # recorded; the other modes still run
            run["error"] = f"{type(exc).__name__}: {exc}"[:500]
        runs.append(run)
        if ctx.is_main:  # after every mode: a later hang keeps what was measured
            Path(spec["result"]).write_text(json.dumps(runs))
        faulthandler.cancel_dump_traceback_later()
        if hasattr(step, "release"):
            step.release()  # before the communicators go (pytorch/pytorch#115388)
        del model, optimizers, step
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    shutdown()


class _OutOfTime(Exception):
    pass


def _alarm(signum, frame):
    raise _OutOfTime


def launch(world: int, spec: dict[str, Any], limit_s: int) -> list[dict[str, Any]]:
    """Run :func:`worker` on ``world`` ranks of this host for at most ``limit_s`` seconds; returns rank 0's runs
    (those finished, plus an error entry when a rank failed or time ran out)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "runs.json"
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=f"scale-{uuid.uuid4().hex[:8]}",
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5)
        error = None
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(limit_s)
        try:
            elastic_launch(config, sys.executable)(__file__, "--worker", json.dumps({**spec, "result": str(result)}))
        except ChildFailedError as exc:
            error = f"a rank failed: {exc}"[:800]
        except _OutOfTime:
            error = f"stopped after {limit_s} s (a mode hung)"
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        runs = json.loads(result.read_text()) if result.is_file() else []
        return runs + ([{"ranks": world, "mode": ",".join(spec["modes"]), "error": error}] if error else [])


def efficiencies(runs: list[dict[str, Any]]) -> None:
    """Each run's ``speedup`` (samples/s over the same mode's at one rank) and ``efficiency`` (speedup / ranks):
    weak scaling with a batch per rank, strong scaling with ``--global-batch``."""
    def key(r: dict[str, Any]) -> tuple:
        return r.get("mode"), bool(r.get("overlap"))
    base = {key(r): r["samples_per_s"] for r in runs if r.get("ranks") == 1 and "samples_per_s" in r}
    for r in runs:
        if "samples_per_s" in r and key(r) in base:
            r["speedup"] = r["samples_per_s"] / base[key(r)]
            r["efficiency"] = r["speedup"] / r["ranks"]


def same_weights(runs: list[dict[str, Any]]) -> None:
    """Each overlapped run's ``same_weights_as_plain``: its weights digest equals the plain run's (same ranks and
    mode, the same steps from the same start)."""
    plain = {(r.get("ranks"), r.get("mode")): r.get("weights_digest") for r in runs if not r.get("overlap")}
    for r in runs:
        ref = plain.get((r.get("ranks"), r.get("mode")))
        if r.get("overlap") and ref is not None and r.get("weights_digest") is not None:
            r["same_weights_as_plain"] = r["weights_digest"] == ref


def _num(run: dict[str, Any], key: str, fmt: str) -> str:
    value = run.get(key)
    return format(value, fmt) if value is not None else "-"


def print_table(runs: list[dict[str, Any]]) -> None:
    print(f"{'ranks':>5} {'mode':>10} {'overlap':>7} {'samples/s':>12} {'step ms':>8} {'eff':>5} {'a2a us':>7} "
          f"{'allred us':>9} {'peak GB':>7} {'same w':>6}")
    for r in runs:
        flag = "yes" if r.get("overlap") else "no"
        if "error" in r:
            print(f"{r.get('ranks', '?'):>5} {r.get('mode', '?'):>10} {flag:>7} ERROR {r['error'][:80]}")
            continue
        same = {True: "yes", False: "NO"}.get(r.get("same_weights_as_plain"), "-")
        print(f"{r['ranks']:>5} {r['mode']:>10} {flag:>7} {r['samples_per_s']:>12,.0f} {r['step_ms']:>8.3f} "
              f"{_num(r, 'efficiency', '.3f'):>5} {_num(r, 'all_to_all_us', '.0f'):>7} "
              f"{_num(r, 'all_reduce_us', '.0f'):>9} {_num(r, 'peak_gb', '.1f'):>7} {same:>6}")


def _record(path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """The results file to extend: the existing one when it was measured with the same spec on the same kind of
    device (runs of the world sizes measured now replace its runs of those sizes), else a new one."""
    env = envinfo.environment()
    fresh = {"commands": [], "date": datetime.now(timezone.utc).isoformat(), "environment": env, "spec": spec,
             "runs": []}
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = None
        if old and old.get("spec") == spec and old.get("environment", {}).get("device") == env.get("device"):
            fresh = old
    fresh["commands"].append(" ".join(sys.argv))
    return fresh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", default=None, help="world sizes, e.g. 1,2 (default: 1, 2, 4, ... GPUs here)")
    parser.add_argument("--batch", type=int, default=65536, help="samples per rank (weak scaling)")
    parser.add_argument("--global-batch", type=int, default=None,
                        help="strong scaling: this many samples per step split over the ranks (instead of --batch)")
    parser.add_argument("--embedding-dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                        help="the sharded tables' weights (half precision: half the memory)")
    parser.add_argument("--model", choices=("kaggle", "mlperf-v2"), default="kaggle",
                        help="kaggle, or MLPerf's DLRM-DCNv2 (D=128, DCNv2, multi-hot bags, the 1TB tables)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the table sizes by this")
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="bf16")
    parser.add_argument("--optimizer", default="rowwise_adagrad")
    parser.add_argument("--ids", choices=("powerlaw", "uniform"), default="powerlaw")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--no-data-parallel-tables", action="store_true",
                        help="shard every table (default: the planner replicates the small ones)")
    parser.add_argument("--overlap", choices=("on", "off", "both", "auto"), default="both",
                        help="the lookup and its exchanges on a side stream beside the bottom MLP (both: each mode "
                             "with and without, and whether their weights end the same; auto: each mode's default, "
                             "as the CLI trains)")
    parser.add_argument("--pipeline", action="store_true",
                        help="each step sends the next batch's ids ahead (the hybrid modes; each call then walks the "
                             "batches in its own cycle)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny tables and batches, 2 windows (smoke test)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--timeline", action="store_true",
                        help="cuda_graph: time each collective and the compute between them inside the graph")
    parser.add_argument("--limit-s", type=int, default=240, help="wall-time limit of each (world size, mode) launch")
    parser.add_argument("--hang-s", type=float, default=120.0,
                        help="a mode still running after this many seconds is a hang: stacks printed, ranks ended")
    parser.add_argument("--out", help="folder of dlrm_scaling.json (required)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if not args.out:
        parser.error("--out is required")
    out = writable_dir(args.out, "--out folder")
    gpus = torch.cuda.device_count() if args.device == "cuda" else 2
    worlds = ([int(w) for w in args.nproc.split(",")] if args.nproc
              else [w for w in (1, 2, 4, 8, 16) if w <= max(1, gpus)])
    if args.device == "cuda" and max(worlds) > gpus:
        parser.error(f"--nproc asks for {max(worlds)} ranks, this host has {gpus} GPUs")
    if args.global_batch is not None and (args.global_batch <= 0 or any(args.global_batch % w for w in worlds)):
        parser.error(f"--global-batch {args.global_batch} must be a positive multiple of every world size {worlds}")
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    spec = {"batch": 512 if args.quick else args.batch, "scale": 1e-4 if args.quick else args.scale,
            "model": args.model,
            "precision": args.precision, "optimizer": args.optimizer, "ids": args.ids,
            "modes": args.modes.split(","), "steps": 3 if args.quick else args.steps,
            "windows": 2 if args.quick else args.windows, "device": args.device, "no_profile": args.no_profile,
            "timeline": args.timeline,
            "overlap": {"on": [True], "off": [False], "both": [False, True], "auto": [None]}[args.overlap],
            "global_batch": args.global_batch, "embedding_dtype": args.embedding_dtype, "pipeline": args.pipeline,
            "data_parallel_tables": not args.no_data_parallel_tables,
            "hang_s": args.hang_s}
    record = _record(out / "dlrm_scaling.json", spec)
    for world in worlds:
        on_cuda = args.device == "cuda"
        modes = [*(m for m in spec["modes"] if on_cuda or m != "cuda_graph"), *(["single"] if world == 1 and on_cuda
                                                                                 else [])]
        # one launch per mode: each builds its tables in fresh processes (MLPerf's fill most of a GPU)
        runs = [run for mode in modes for run in launch(world, {**spec, "modes": [mode]}, args.limit_s)]
        record["runs"] = [r for r in record["runs"] if r.get("ranks") != world] + runs
        record["runs"].sort(key=lambda r: (r.get("ranks", 0), str(r.get("mode")), bool(r.get("overlap"))))
        efficiencies(record["runs"])
        same_weights(record["runs"])
        atomic_write_json(out / "dlrm_scaling.json", record, "scaling results")
    print_table(record["runs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
