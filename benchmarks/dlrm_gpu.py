"""DLRM "proof on the GPU" in one process: data, loader, training throughput, a reference baseline, accuracy.

    python3 benchmarks/dlrm_gpu.py --out DIR [--rows N] [--quick]

Phases (each with a time budget; progress printed as it goes; notes in ``benchmarks/notes/dlrm.md``):

1. ``data``: ``write_synthetic`` (the project's generator, one process per core) writes Kaggle-shaped npy
   shards (full Kaggle cardinalities, 33.8M embedding rows; 24M rows by default) to a temporary directory
   (``--data-dir``; removed at the end unless ``--keep-data``; never under ``--out``). The generator's best
   achievable AUC on the test split is read from its metadata.
2. ``loader``: ``loader_throughput`` (``BatchLoader``: preadv into pinned buffers, side-stream copy to the
   device, prefetch 3) at every batch size, no model.
3. ``fuselab-eager``: the ``kaggle`` config (Adagrad, fused table, sparse grads) built from the trainer's pieces;
   the largest batch trains on >= 20M samples (310 x 65536) and is then evaluated on the test split (logloss,
   AUC, accuracy vs the generator's best AUC); then the other batch sizes.
4. ``fb-dlrm-baseline``: ``dlrm_baseline.py``'s re-creation of facebookresearch/dlrm's eager loop.
5. ``fuselab-compile``: the same fuselab model with ``compile_dense`` (``--compile`` of ``fuselab dlrm train``).

Each (provider, batch size) run: warm-up steps (compilation included), a synchronized step-time breakdown
(data/forward/backward/optimizer, the trainer's ``PhaseTimer``), then an unsynchronized throughput window
(samples/s over wall time; per-step times from CUDA events, median reported). Results go to
``DIR/dlrm_kaggle.json`` (rewritten atomically after every phase; a watchdog writes what exists and exits before
the hard limit). ``--quick`` (or ``--rows`` below 2M) shrinks everything to run on a CPU in about a minute.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from dlrm_baseline import ReferenceDLRM, ReferenceTrainer
from dlrm_harness import Report, StepFn, baseline_step, cycle, fuselab_step, measure

from fuselab import envinfo
from fuselab.dlrm.config import load_config, table_sizes
from fuselab.dlrm.data.loader import BatchLoader, CriteoDataset, Hasher, kaggle_split, loader_throughput, open_dataset
from fuselab.dlrm.data.synth import SynthSpec, write_synthetic
from fuselab.dlrm.model import DLRM
from fuselab.dlrm.train import PHASES, Optimizers, evaluate

REPO = Path(__file__).resolve().parents[1]
RESULT_FILE = "dlrm_kaggle.json"


@dataclass(frozen=True)
class Profile:
    """Sizes and time budgets (seconds) of one invocation."""

    name: str
    rows: int
    scale: float  # times the Kaggle cardinalities
    batch_sizes: tuple[int, ...]
    long_samples: int  # fuselab-eager at the largest batch trains on at least this many samples, then evaluates
    long_budget_s: float  # cap on that run's throughput window
    window_s: float  # throughput window of every other run
    warmup: int
    breakdown_steps: int
    loader_samples: int  # per loader measurement
    compile_min_s: float  # a compile run starts only with this much budget left
    budget_s: float  # soft budget: phases shrink or are skipped to end near it
    hard_s: float  # watchdog: results so far are written and the process exits


FULL = Profile(name="full", rows=24_000_000, scale=1.0, batch_sizes=(8192, 65536), long_samples=310 * 65536,
               long_budget_s=150, window_s=15, warmup=5, breakdown_steps=20, loader_samples=6_000_000,
               compile_min_s=90, budget_s=460, hard_s=520)
QUICK = Profile(name="quick", rows=300_000, scale=1e-3, batch_sizes=(1024, 4096), long_samples=24 * 4096,
                long_budget_s=30, window_s=2, warmup=2, breakdown_steps=3, loader_samples=100_000, compile_min_s=15,
                budget_s=100, hard_s=150)


class Bench:
    """The phases, sharing the dataset, the config and the report."""

    def __init__(self, args: argparse.Namespace, prof: Profile, report: Report):
        self.args, self.prof, self.report = args, prof, report
        self.cfg = load_config("kaggle", seed=args.seed)
        self.ds: CriteoDataset | None = None
        self.device = torch.device("cpu")
        self.created_data_dir: Path | None = None
        self.sizes: list[int] = []
        self.model: DLRM | None = None
        self.hasher: Hasher | None = None

    # ------------------------------------------------------------------ data and loader
    def data(self) -> None:
        args, prof, rep = self.args, self.prof, self.report
        if args.data_dir:
            root = Path(args.data_dir)
        else:
            root = self.created_data_dir = Path(tempfile.mkdtemp(prefix="fuselab-dlrm-bench-"))
        spec = SynthSpec(rows=prof.rows, scale=prof.scale, seed=args.seed)
        meta_path = root / "metadata.json"
        old = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        same = {"rows": spec.rows, "scale": spec.scale, "seed": spec.seed}
        reused = "best_auc_test" in old and all(old.get("synth", {}).get(k) == v for k, v in same.items())
        t = time.perf_counter()
        if not reused:
            workers = args.workers or min(16, os.cpu_count() or 1)
            rep.log(f"writing {spec.rows:,} rows, cardinalities x{spec.scale:g}, {workers} workers -> {root}")
            write_synthetic(root, spec, shard_rows=args.shard_rows, workers=workers)
        gen_s = time.perf_counter() - t
        self.ds = ds = open_dataset(root)
        sizes = table_sizes(self.cfg, ds.meta)
        split = kaggle_split(len(ds))
        nbytes = sum(p.stat().st_size for p in (root / "shards").glob("*.npy"))
        rep.result["data"] = {
            "dir": str(root), "reused": reused, "generator": "fuselab.dlrm.data.synth.write_synthetic (npy shards)",
            "synth": ds.meta.get("synth"), "rows": len(ds), "seconds": round(gen_s, 2),
            "rows_per_s": len(ds) / gen_s if not reused else None, "bytes_on_disk": nbytes,
            "splits": {k: v[1] - v[0] for k, v in split.items()}, "embedding_rows": sum(sizes),
            "embedding_bytes_fp32": sum(sizes) * self.cfg.embedding_dim * 4, "positive_rate": ds.meta["positive_rate"],
            "best_auc_all": ds.meta.get("best_auc"), "best_auc_test": ds.meta.get("best_auc_test")}
        rep.log(f"data: {len(ds):,} rows ({nbytes / 1e9:.2f} GB) in {gen_s:.1f} s, {sum(sizes):,} embedding rows, "
                f"generator's best AUC (test split) {ds.meta.get('best_auc_test', float('nan')):.4f}")

    def environment(self) -> None:
        self.device = torch.device(self.args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        env = envinfo.environment()
        env["git_commit"] = envinfo.git_commit(REPO)
        env["run_device"] = str(self.device)
        self.report.result["env"] = env
        self.report.result["config"] = self.cfg.to_dict()
        self.report.log(f"device {env['device']} ({self.device}); torch {env['torch']}, triton {env['triton']}, "
                        f"commit {env['git_commit']}")

    def loader(self) -> None:
        assert self.ds is not None
        out = self.report.result.setdefault("loader", {})
        for bs in self.prof.batch_sizes:
            batches = max(4, self.prof.loader_samples // bs)
            res = loader_throughput(self.ds, bs, self.device, batches=batches, prefetch=self.cfg.prefetch)
            out[str(bs)] = res
            self.report.log(f"loader alone, batch {bs}: {res['samples_per_s']:,.0f} samples/s "
                            f"({res['GB_per_s']:.2f} GB/s, {res['batches']} batches)")

    # ------------------------------------------------------------------ training runs
    def _train_loader(self, bs: int) -> BatchLoader:
        assert self.ds is not None
        start, stop = kaggle_split(len(self.ds))["train"]
        return BatchLoader(self.ds, start, stop, bs, self.device, self.cfg.shuffle, self.cfg.seed, drop_last=True,
                           prefetch=self.cfg.prefetch)

    def _run(self, provider: str, bs: int, step: StepFn, *, max_steps: int, window_s: float,
             after: Callable[[dict[str, Any]], None] | None = None) -> None:
        rep = self.report
        rep.log(f"-- {provider}, batch {bs}: up to {max_steps} steps / {window_s:.0f} s after warm-up")
        entry: dict[str, Any] = {"provider": provider, "batch_size": bs}
        rep.result["runs"].append(entry)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        batches = cycle(self._train_loader(bs))
        try:
            entry.update(measure(step, batches, self.device, batch_size=bs, warmup=self.prof.warmup,
                                 breakdown_steps=self.prof.breakdown_steps, max_steps=max_steps, window_s=window_s,
                                 log=rep.log))
            if self.device.type == "cuda":
                entry["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
            parts = "  ".join(f"{k} {v:.2f}" for k, v in entry["breakdown_ms"].items())
            rep.log(f"   {entry['samples_per_s']:,.0f} samples/s, median step {entry['step_ms_median']:.2f} ms "
                    f"(warm-up {entry['warmup_s']:.1f} s); breakdown ms: {parts}")
            if after is not None:
                after(entry)
        except Exception as exc:
            entry["error"] = repr(exc)
            rep.error(f"{provider} batch {bs}", exc)
        finally:
            batches.close()
            rep.save()

    def _skip(self, provider: str, bs: int, why: str) -> None:
        self.report.log(f"-- {provider}, batch {bs}: skipped ({why})")
        self.report.result["runs"].append({"provider": provider, "batch_size": bs, "skipped": why})

    def build_fuselab(self) -> None:
        assert self.ds is not None
        t = time.perf_counter()
        self.sizes = table_sizes(self.cfg, self.ds.meta)
        self.model = DLRM.from_config(self.cfg, self.sizes).to(self.device)
        self.hasher = Hasher(self.sizes, self.cfg.hashing).to(self.device)
        self.report.log(f"fuselab model built in {time.perf_counter() - t:.1f} s")

    def _parts(self) -> tuple[CriteoDataset, DLRM, Hasher]:
        assert self.ds is not None and self.model is not None and self.hasher is not None, "build phase missing"
        return self.ds, self.model, self.hasher

    def fuselab_eager(self) -> None:
        """The >= 20M-sample run at the largest batch (then evaluated), then the other batch sizes."""
        prof, rep, cfg = self.prof, self.report, self.cfg
        ds, model, hasher = self._parts()
        step = fuselab_step(model, hasher, Optimizers(model, cfg), cfg, self.device)
        big = max(prof.batch_sizes)

        def evaluate_long(entry: dict[str, Any]) -> None:
            t = time.perf_counter()
            start, stop = kaggle_split(len(ds))["test"]
            loader = BatchLoader(ds, start, stop, cfg.eval_batch_size, self.device, "none", prefetch=cfg.prefetch)
            metrics = evaluate(model, hasher, loader, cfg)
            best = ds.meta.get("best_auc_test")
            metrics.update({"split": "test", "provider": "fuselab-eager", "batch_size": big,
                            "train_samples": entry["train_samples"], "best_auc_test": best,
                            "reached_long_samples": entry["train_samples"] >= prof.long_samples,
                            "auc_gap": best - metrics["auc"] if best is not None else None,
                            "seconds": round(time.perf_counter() - t, 2)})
            entry["eval"] = rep.result["eval"] = metrics
            rep.log(f"   eval after {entry['train_samples']:,} samples: AUC {metrics['auc']:.4f} (generator's best "
                    f"{best:.4f}), logloss {metrics['logloss']:.4f}, accuracy {metrics['accuracy']:.4f}")

        long_steps = math.ceil(prof.long_samples / big) - prof.warmup - prof.breakdown_steps
        window = min(prof.long_budget_s, max(prof.long_budget_s / 3, rep.left() - prof.budget_s / 4))
        self._run("fuselab-eager", big, step, max_steps=long_steps, window_s=window, after=evaluate_long)
        for bs in sorted(prof.batch_sizes)[:-1]:
            self._timed_run("fuselab-eager", bs, step, need_s=prof.window_s + 5)

    def baseline(self) -> None:
        _, _, hasher = self._parts()
        self._free()  # the eager run's optimizer state
        t = time.perf_counter()
        trainer = ReferenceTrainer(ReferenceDLRM.from_config(self.cfg, self.sizes, self.device))
        self.report.log(f"baseline model built in {time.perf_counter() - t:.1f} s")
        step = baseline_step(trainer, hasher)
        try:
            for bs in sorted(self.prof.batch_sizes):
                self._timed_run("fb-dlrm-baseline", bs, step, need_s=self.prof.window_s + 5)
        finally:
            del trainer, step
            self._free()

    def fuselab_compile(self) -> None:
        """The same model (fresh optimizer state) with ``compile_dense``, like ``fuselab dlrm train --compile``."""
        _, model, hasher = self._parts()
        model.compile_dense(dynamic=False)
        step = fuselab_step(model, hasher, Optimizers(model, self.cfg), self.cfg, self.device)
        for bs in sorted(self.prof.batch_sizes):
            self._timed_run("fuselab-compile", bs, step, need_s=self.prof.compile_min_s)

    def _timed_run(self, provider: str, bs: int, step: StepFn, need_s: float) -> None:
        if self.report.left() < need_s:
            self._skip(provider, bs, f"{self.report.left():.0f} s of budget left, needs {need_s:.0f} s")
            return
        self._run(provider, bs, step, max_steps=1_000_000, window_s=self.prof.window_s)

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def summarize(result: dict[str, Any]) -> None:
    """``result["summary"]``: samples/s per provider and batch size, and each provider's speed-up over the baseline."""
    rate = {(r["provider"], r["batch_size"]): r["samples_per_s"] for r in result["runs"] if "samples_per_s" in r}
    summary: dict[str, Any] = {"samples_per_s": {}, "speedup_vs_baseline": {}}
    for (provider, bs), value in rate.items():
        summary["samples_per_s"].setdefault(provider, {})[str(bs)] = value
        base = rate.get(("fb-dlrm-baseline", bs))
        if base and provider != "fb-dlrm-baseline":
            summary["speedup_vs_baseline"].setdefault(provider, {})[str(bs)] = value / base
    result["summary"] = summary


def print_table(result: dict[str, Any]) -> None:
    """A short readable summary of the JSON."""
    data, env = result.get("data", {}), result.get("env", {})
    print(f"\nDLRM kaggle config on {env.get('device', '?')} | {data.get('rows', 0):,} rows, "
          f"{data.get('embedding_rows', 0):,} embedding rows | status {result['status']} | {result['wall_s']} s")
    for bs, res in result.get("loader", {}).items():
        print(f"loader alone, batch {bs:>6}: {res['samples_per_s']:>13,.0f} samples/s  ({res['GB_per_s']:.2f} GB/s)")
    speedup = result.get("summary", {}).get("speedup_vs_baseline", {})
    head = f"{'provider':<18}{'batch':>7}{'samples/s':>13}{'vs base':>9}{'step ms':>9}"
    head += "".join(f"{p:>10}" for p in PHASES) + f"{'warm-up s':>11}"
    print(f"{head}\n{'-' * len(head)}")
    for r in result["runs"]:
        if "samples_per_s" not in r:
            print(f"{r['provider']:<18}{r['batch_size']:>7}  {r.get('skipped') or r.get('error')}")
            continue
        parts = "".join(f"{r['breakdown_ms'].get(p, float('nan')):>10.2f}" for p in PHASES)
        vs = speedup.get(r["provider"], {}).get(str(r["batch_size"]))
        print(f"{r['provider']:<18}{r['batch_size']:>7}{r['samples_per_s']:>13,.0f}"
              f"{f'{vs:.2f}x' if vs else '':>9}{r['step_ms_median']:>9.2f}{parts}{r['warmup_s']:>11.1f}")
    ev = result.get("eval")
    if ev:
        print(f"eval (test split, {ev['samples']:,} rows) after {ev['train_samples']:,} training samples: AUC "
              f"{ev['auc']:.4f} vs generator's best {ev['best_auc_test']:.4f} (gap {ev['auc_gap']:.4f}), "
              f"logloss {ev['logloss']:.4f}, accuracy {ev['accuracy']:.4f}")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Profile]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help=f"directory for {RESULT_FILE}")
    p.add_argument("--rows", type=int, default=None, help="rows to generate (default 24M; below 2M: quick sizes)")
    p.add_argument("--quick", action="store_true", help="tiny tables, small batches, short windows (CPU test)")
    p.add_argument("--scale", type=float, default=None, help="times the Kaggle cardinalities (default 1.0)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated, e.g. 8192,65536")
    p.add_argument("--budget", type=float, default=None, help="soft time budget of the whole script (s)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--data-dir", default=None, help="dataset directory (reused when it matches; default: a temp dir)")
    p.add_argument("--keep-data", action="store_true", help="keep the temporary dataset directory")
    p.add_argument("--workers", type=int, default=0, help="generator processes (0: one per core, at most 16)")
    p.add_argument("--shard-rows", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    prof = QUICK if args.quick or (args.rows is not None and args.rows < 2_000_000) else FULL
    if args.rows is not None:
        prof = replace(prof, rows=args.rows)
    if args.scale is not None:
        prof = replace(prof, scale=args.scale)
    if args.batch_sizes:
        prof = replace(prof, batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")))
    if args.budget is not None:
        prof = replace(prof, budget_s=args.budget, hard_s=max(args.budget + 30, args.budget * 1.15))
    return args, prof


def main(argv: list[str] | None = None) -> int:
    args, prof = parse_args(argv)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # as fuselab.dlrm.train does
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = Report(out / RESULT_FILE, prof.budget_s, {"profile": asdict(prof)})
    bench = Bench(args, prof, report)

    def cleanup() -> None:
        if bench.created_data_dir is not None and not args.keep_data:
            shutil.rmtree(bench.created_data_dir, ignore_errors=True)

    def expire() -> None:
        report.result["status"] = f"stopped by the {prof.hard_s:.0f} s watchdog during {report.phase}"
        report.log(report.result["status"])
        summarize(report.result)
        report.save()
        cleanup()
        os._exit(3)

    watchdog = threading.Timer(max(1.0, prof.hard_s - report.elapsed()), expire)
    watchdog.daemon = True
    watchdog.start()
    report.log(f"profile: {prof}")
    phases = (("data", bench.data, True), ("environment", bench.environment, True), ("loader", bench.loader, False),
              ("build", bench.build_fuselab, True), ("fuselab-eager", bench.fuselab_eager, False),
              ("fb-dlrm-baseline", bench.baseline, False), ("fuselab-compile", bench.fuselab_compile, False))
    try:
        for name, fn, required in phases:
            if not report.run_phase(name, fn) and required:
                report.result["status"] = f"failed in {name}"
                break
        else:
            report.result["status"] = "complete with errors" if report.result["errors"] else "complete"
    finally:
        watchdog.cancel()
        cleanup()
        summarize(report.result)
        report.save()
    print_table(report.result)
    print(f"\nwrote {report.path}", flush=True)
    return 0 if report.result["status"].startswith("complete") else 1


if __name__ == "__main__":
    raise SystemExit(main())
