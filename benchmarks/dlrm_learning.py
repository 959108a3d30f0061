"""DLRM learning sweep: one epoch of the ``kaggle`` config per (optimizer, learning rates, schedule) candidate.

Data: the 8M-row synthetic set at the full Kaggle cardinalities (``fuselab dlrm synth --rows 8000000 --scale 1.0``,
33.8M embedding rows; its Kaggle train split gives 104 steps of 65536), made in ``--data DIR`` unless it holds one
already (its rows, scale and seed must then match, else ``ValueError``). Each run: ``load_config("kaggle")`` with
the candidate's ``optimizer``, ``lr_dense``, ``lr_sparse``, ``warmup_steps``, ``decay_start_step``, ``decay_steps``
and ``seed`` (initial weights, batch order), trained one epoch through :func:`fuselab.dlrm.train.train` (kernels
fuselab, CUDA graph, data on the device, bf16 by default; progress off), evaluated on the test split.

Recorded per run: test AUC, the gap to the generator's best AUC of that split, first loss, the largest loss after
step 0 (whether it rose above the first, and by how much), the largest ratio of a step's loss to the *untrained*
model's loss on the same batch (``max_over_untrained``: before the first run of each seed a reference run with both
rates 0 gives those; batch-to-batch noise makes the first loss alone a noisy bar), mean loss of the last 10 steps,
final loss, every step's loss, samples/s, training and wall seconds. ``meets_target``: gap <= 0.01 and no loss above
the untrained model's.

Order: the grid (:func:`default_grid`, most promising first, the ``kaggle`` config's own values as each
optimizer's baseline) until ``--budget-s`` minus ``--confirm-s``; then the best steady run of each optimizer (and
the next best) again with seed 1 (``--confirm``) until ``--budget-s``; no run starts after it. ``--out
DIR/dlrm_learning.json`` (command, environment, options, untrained references, every run, candidates not run) is
rewritten atomically after every run; a table is printed at the end. Exit status 1 when a run failed (its error and
traceback are in the JSON). SIGINT/SIGTERM stop the sweep; the trainer then writes the interrupted run's checkpoint
under ``DATA/interrupted-run``.

    python3 benchmarks/dlrm_learning.py --data /tmp/kaggle8m --out benchmarks/results/<gpu>   # 7-8 min, one GPU
    python3 benchmarks/dlrm_learning.py --device cpu --quick --out /tmp/learn                # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from fuselab import envinfo

envinfo.enable_interpreter_if_no_cuda()  # before anything imports triton: the fuselab kernels on a CPU

from fuselab._io import atomic_write_json, writable_dir  # noqa: E402
from fuselab.dlrm.config import OPTIMIZERS, load_config  # noqa: E402
from fuselab.dlrm.data.loader import open_dataset  # noqa: E402
from fuselab.dlrm.data.synth import SynthSpec, write_synthetic  # noqa: E402
from fuselab.dlrm.train import TrainingInterrupted, train  # noqa: E402

#: the loss of a step above the first by more than this fraction counts as a jump (batch noise is ~0.3%)
JUMP_TOLERANCE = 0.01
#: the target: test AUC within this of the generator's best
TARGET_GAP = 0.01
#: note of the reference run: both learning rates 0, the initial model's loss on every batch of the epoch
UNTRAINED = "untrained (rates 0)"


@dataclass(frozen=True)
class Candidate:
    optimizer: str
    lr_dense: float
    lr_sparse: float
    warmup_steps: int
    decay_start_step: int
    decay_steps: int
    note: str = ""
    seed: int = 0  # the config's: initial weights and batch order (the data stay the same)
    adagrad_eps: float = 1e-8  # added to sqrt(state) by both Adagrads (the config's)
    interaction: str = "dot"  # the config's model (dot | cat | dcn); others for diagnosis only
    self_interaction: bool = False  # the dot interaction also keeps each vector's squared norm

    def overrides(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "note"}

    def key(self) -> tuple:
        return tuple(self.overrides().values())


def baseline(optimizer: str) -> Candidate:
    """The kaggle config's own rates and schedule for ``optimizer``."""
    cfg = load_config("kaggle", optimizer=optimizer)
    return Candidate(optimizer, cfg.lr_dense, cfg.lr_sparse, cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps,
                     "kaggle config", adagrad_eps=cfg.adagrad_eps)


_AFTER = (400, 200)  # the kaggle config's decay: it starts after the epoch's 104 steps
_LAST40 = (64, 40)  # quadratic decay to 0 over the epoch's last 40 steps
R, A, S = "rowwise_adagrad", "adagrad", "sgd"
#: (optimizer, lr_dense, lr_sparse, warmup_steps, (decay_start_step, decay_steps), note), most promising first.
#: "proxy": the CPU proxy (1M rows, scale 1/8, batch 8192, 104 steps; results/synth/dlrm_learning_proxy*.json and
#: benchmarks/notes/dlrm.md, "Learning: what one epoch can reach").
_GRID = [
    (R, 5e-4, 0.05, 10, _AFTER, "proxy: no loss above the untrained model's, on the AUC plateau"),
    (A, 5e-4, 0.05, 10, _AFTER, "as the row-wise lead"),
    (S, 0.1, 24.0, 40, _AFTER, "proxy: steady, AUC +0.018 over the config's 16"),
    None,  # the three baselines go here
    (R, 2.5e-4, 0.05, 10, _AFTER, "dense rate /2 (the full data has less gradient noise)"),
    (A, 2.5e-4, 0.05, 10, _AFTER, "dense rate /2"),
    (R, 5e-4, 0.1, 10, _AFTER, "sparse rate x2: ids are rarer at full scale"),
    (A, 5e-4, 0.1, 10, _AFTER, "sparse rate x2"),
    (S, 0.1, 24.0, 10, _AFTER, "warm-up 10 as the Adagrads' lead: one schedule serves every optimizer"),
    (S, 0.1, 32.0, 40, _AFTER, "proxy: AUC +0.024 over 16, spike on seed 1 (48+ spike, 256 diverges)"),
    (R, 5e-4, 0.05, 20, _AFTER, "longer warm-up"),
    (R, 2.5e-4, 0.1, 10, _AFTER, "dense /2, sparse x2"),
    (R, 5e-4, 0.05, 0, _AFTER, "proxy: steady without warm-up"),
    (R, 1e-4, 0.05, 10, _AFTER, "dense rate /5"),
    (R, 5e-4, 0.2, 10, _AFTER, "sparse rate x4"),
    (R, 1e-3, 0.05, 20, _AFTER, "proxy: best AUC on seed 0, a jump on seed 1"),
    (A, 5e-4, 0.05, 20, _AFTER, "longer warm-up"),
    (A, 2.5e-4, 0.1, 10, _AFTER, "dense /2, sparse x2"),
    (A, 5e-4, 0.05, 0, _AFTER, "no warm-up"),
    (A, 5e-4, 0.03, 10, _AFTER, "sparse rate x0.6"),
    (R, 5e-4, 0.03, 10, _AFTER, "sparse rate x0.6"),
    (S, 0.1, 48.0, 40, _AFTER, "proxy: max/init 1.093"),
    (S, 0.1, 32.0, 20, _AFTER, "shorter warm-up"),
    (S, 0.2, 32.0, 40, _AFTER, "dense rate x2"),
    (S, 0.05, 48.0, 40, _AFTER, "dense /2, sparse x1.5"),
    (S, 0.1, 64.0, 40, _AFTER, "proxy: max/init 1.047"),
    (R, 2.5e-4, 0.2, 10, _AFTER, "dense /2, sparse x4"),
    (A, 1e-3, 0.05, 20, _AFTER, "dense rate x2, longer warm-up"),
    (R, 5e-4, 0.05, 10, _LAST40, "decay in the epoch (proxy: lower AUC)"),
    (S, 0.1, 32.0, 40, _LAST40, "decay in the epoch"),
    (S, 0.1, 16.0, 10, _AFTER, "short warm-up"),
    (R, 1e-3, 0.1, 40, _AFTER, "dense rate /10 of the config's"),
    (A, 1e-4, 0.05, 10, _AFTER, "dense rate /5"),
]


def default_grid() -> list[Candidate]:
    """Candidates, most promising first: the CPU proxy's best per optimizer, the kaggle config's values (one
    baseline per optimizer), then the neighbourhood of the proxy's plateau (benchmarks/notes/dlrm.md, "Learning:
    what one epoch can reach"). Without duplicates (a baseline equal to a candidate runs once)."""
    grid: list[Candidate] = []
    for entry in _GRID:
        if entry is None:
            grid += [baseline(o) for o in (R, A, S)]
        else:
            optimizer, lr_dense, lr_sparse, warmup, (decay_start, decay_steps), note = entry
            grid.append(Candidate(optimizer, lr_dense, lr_sparse, warmup, decay_start, decay_steps, note))
    seen: set[tuple] = set()
    return [c for c in grid if not (c.key() in seen or seen.add(c.key()))]


def quick_grid() -> list[Candidate]:
    """Two candidates for the smoke test: row-wise Adagrad and SGD at the kaggle config's rates, no decay."""
    return [Candidate(R, 0.01, 0.05, 2, 0, 0, "quick"), Candidate(S, 0.1, 16.0, 2, 0, 0, "quick")]


def confirmations(runs: list[dict[str, Any]], count: int, seed: int = 1) -> list[Candidate]:
    """The best steady run of each optimizer, then the next best overall, up to ``count``, again with ``seed``
    (best: smallest gap; steady: no loss above the untrained model's on the same batch)."""
    steady = sorted((r for r in runs if r["status"] == "ok" and r["seed"] != seed and r["gap"] is not None
                     and not r.get("rose_above_untrained", r["loss_rose"])), key=lambda r: r["gap"])
    picked = sorted((next(r for r in steady if r["optimizer"] == o) for o in {r["optimizer"] for r in steady}),
                    key=lambda r: r["gap"])
    picked += [r for r in steady if r not in picked]
    fields = [f for f in Candidate.__dataclass_fields__ if f not in ("note", "seed")]
    return [Candidate(**{f: r[f] for f in fields if f in r}, note=f"seed {seed} of a best run", seed=seed)
            for r in sorted(picked[:count], key=lambda r: r["gap"])]


# -- data ----------------------------------------------------------------------------------------------------
def dataset(args: argparse.Namespace, log) -> Path:
    """``args.data``, written by the generator unless it already holds the wanted rows, scale and seed."""
    root = writable_dir(args.data, "--data folder")
    meta_path = root / "metadata.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        synth = meta.get("synth", {})
        have, want = (meta.get("num_rows"), synth.get("scale"), synth.get("seed")), (args.rows, args.scale,
                                                                                      args.data_seed)
        if have != want:
            raise ValueError(f"--data {root} holds rows/scale/seed {have}, not {want}: give another folder")
        log(f"reusing {root} ({args.rows:,} rows, scale {args.scale})")
        return root
    t0 = time.perf_counter()
    meta = write_synthetic(root, SynthSpec(rows=args.rows, scale=args.scale, seed=args.data_seed),
                           shard_rows=args.shard_rows)
    log(f"wrote {root}: {args.rows:,} rows, best test AUC {meta['best_auc_test']:.4f} "
        f"({time.perf_counter() - t0:.0f} s)")
    return root


# -- one run -------------------------------------------------------------------------------------------------
def _quiet(*args, **kwargs) -> None:
    pass


def loss_record(losses: list[float], untrained: list[float] | None = None) -> dict[str, Any]:
    """First loss, largest after step 0, whether (and by how much) it rose above the first, last-10 mean, final;
    with ``untrained`` (the losses of the initial model on the same batches) the largest ratio to it. A non-finite
    loss counts as +inf (``diverged``)."""
    safe = [x if math.isfinite(x) else math.inf for x in losses]
    first = safe[0]
    later = max(safe[1:]) if len(safe) > 1 else first
    record = {"first_loss": first, "max_loss_after_first": later, "loss_rose": later > first,
              "max_over_first": later / first, "jump": later > first * (1 + JUMP_TOLERANCE),
              "last10_loss": sum(safe[-10:]) / len(safe[-10:]), "final_loss": safe[-1],
              "diverged": math.inf in safe}
    if untrained is not None and len(untrained) == len(losses):
        worst = max(a / b for a, b in zip(safe, untrained))
        record.update(max_over_untrained=worst, rose_above_untrained=worst > 1 + 1e-6)
    return record


def run_candidate(cand: Candidate, data, args: argparse.Namespace,
                  untrained: list[float] | None = None) -> dict[str, Any]:
    """One epoch of ``cand``; the run's record (see the module docstring)."""
    overrides = {**cand.overrides(), "kernels": args.kernels, "precision": args.precision,
                 "cuda_graph": args.cuda_graph, "data_on_device": args.data_on_device, "device": args.device,
                 "epochs": 1.0, "batch_size": args.batch_size, "eval_batch_size": args.eval_batch_size}
    cfg = load_config("kaggle", **overrides)
    t0 = time.perf_counter()
    summary = train(cfg, data, progress=False, log=_quiet, run_dir=args.data / "interrupted-run")
    wall = time.perf_counter() - t0
    final, best = summary["final"], summary["best_auc"]
    row = {**asdict(cand), "status": "ok", "steps": summary["steps"], "test_auc": final["auc"], "best_auc": best,
           "gap": best - final["auc"] if best is not None else None, "test_logloss": final["logloss"],
           "calibration": final["calibration"], **loss_record(summary["losses"], untrained),
           "samples_per_s": summary["samples_per_s"], "train_s": summary["train_seconds"], "wall_s": wall,
           "losses": summary["losses"]}
    steady = not row.get("rose_above_untrained", row["loss_rose"])
    row["meets_target"] = row["gap"] is not None and row["gap"] <= TARGET_GAP and steady
    return row


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- output ----------------------------------------------------------------------------------------------------
def table(runs: list[dict[str, Any]]) -> str:
    """One line per run: candidate, test AUC, gap, loss ratios, last-10 loss, rate, wall time."""
    head = (f"{'optimizer':<16} {'lr_d':>7} {'lr_s':>6} {'eps':>6} {'warm':>4} {'decay':>6} {'seed':>4} {'AUC':>7} "
            f"{'gap':>7} {'max/first':>9} {'max/init':>8} {'last10':>7} {'Msamp/s':>7} {'s':>5}  note")
    lines = [head]
    for r in runs:
        decay = f"{r['decay_start_step']}+{r['decay_steps']}" if r["decay_steps"] else "-"
        what = (f"{r['optimizer']:<16} {r['lr_dense']:>7g} {r['lr_sparse']:>6g} {r.get('adagrad_eps', 1e-8):>6g} "
                f"{r['warmup_steps']:>4} {decay:>6} {r['seed']:>4}")
        if r["status"] != "ok":
            lines.append(f"{what} {r['status']}: {r.get('reason', '')}")
            continue
        rate = (r["samples_per_s"] or 0) / 1e6
        mark = " *" if r["meets_target"] else ""
        lines.append(f"{what} {r['test_auc']:>7.4f} {r['gap']:>7.4f} {r['max_over_first']:>9.3f} "
                     f"{r.get('max_over_untrained', math.nan):>8.3f} {r['last10_loss']:>7.4f} {rate:>7.3g} "
                     f"{r['wall_s']:>5.1f}  {r['note']}{mark}")
    return "\n".join([*lines, f"max/init: largest loss over the untrained model's on the same batch; * = gap <= "
                       f"{TARGET_GAP} and max/init <= 1 (max/first <= 1 without the untrained run)"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of dlrm_learning.json")
    p.add_argument("--data", type=Path, help="dataset folder, made when empty (default: OUT/data)")
    p.add_argument("--rows", type=int, help="synthetic rows (default 8,000,000; --quick 30,000)")
    p.add_argument("--scale", type=float, help="times the Kaggle cardinalities (default 1.0; --quick 1e-4)")
    p.add_argument("--data-seed", type=int, default=0, help="of the synthetic data")
    p.add_argument("--shard-rows", type=int, default=1 << 20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny data, batch 1024, two candidates, one confirmation")
    p.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, help="keep only these optimizers' candidates")
    p.add_argument("--grid", type=Path, help="JSON list of candidates (Candidate fields) instead of the default")
    p.add_argument("--kernels", choices=("fuselab", "torch"), help="default fuselab (torch on a CPU)")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), help="default bf16 (fp32 on a CPU)")
    p.add_argument("--no-cuda-graph", action="store_true")
    p.add_argument("--no-data-on-device", action="store_true")
    p.add_argument("--batch-size", type=int, help="default: the kaggle config's (65536; --quick 1024)")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no run after this many seconds")
    p.add_argument("--confirm", type=int, help="best runs repeated with seed 1 at the end (default 4; --quick 1)")
    p.add_argument("--confirm-s", type=float, default=60.0,
                   help="seconds of the budget kept for the confirmations: the grid starts no run after "
                        "budget - confirm-s")
    args = p.parse_args(argv)
    cpu = args.device == "cpu"
    if cpu:
        args.no_cuda_graph = True
    args.rows = args.rows or (30_000 if args.quick else 8_000_000)
    args.scale = args.scale or (1e-4 if args.quick else 1.0)
    args.kernels = args.kernels or ("torch" if cpu else "fuselab")
    args.precision = args.precision or ("fp32" if cpu else "bf16")
    args.batch_size = args.batch_size or (1024 if args.quick else load_config("kaggle").batch_size)
    args.eval_batch_size = min(65536, max(args.batch_size, 8192))
    args.confirm = args.confirm if args.confirm is not None else (1 if args.quick else 4)
    args.cuda_graph, args.data_on_device = not args.no_cuda_graph, not args.no_data_on_device
    if args.rows < 7 or args.batch_size <= 0 or args.shard_rows <= 0 or not 0 < args.scale <= 1:
        p.error("--rows must be >= 7, --batch-size and --shard-rows positive, --scale in (0, 1]")
    if args.confirm < 0 or args.confirm_s < 0 or args.budget_s < 0:
        p.error("--confirm, --confirm-s and --budget-s must be >= 0")
    args.out = writable_dir(args.out, "--out folder")
    args.data = args.data or args.out / "data"
    return args


def candidates(args: argparse.Namespace) -> list[Candidate]:
    """The grid of ``--grid``, else the default (or quick) one, filtered by ``--optimizers``."""
    if args.grid is not None:
        try:
            grid = [Candidate(**c) for c in json.loads(args.grid.read_text())]
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"--grid {args.grid}: expected a JSON list of candidates ({exc})") from None
    else:
        grid = quick_grid() if args.quick else default_grid()
    return [c for c in grid if not args.optimizers or c.optimizer in args.optimizers]


class Sweep:
    """Runs candidates until a deadline, the untrained reference of each seed first; the JSON after every run."""

    def __init__(self, args: argparse.Namespace, data, log, t0: float):
        self.args, self.data, self.log, self.t0 = args, data, log, t0
        self.path = args.out / "dlrm_learning.json"
        self.untrained: dict[int, list[float] | None] = {}
        self.result: dict[str, Any] = {
            "benchmark": "dlrm_learning", "command": [sys.executable, *sys.argv],
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": envinfo.environment(args.device),
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "best_auc_test": data.meta.get("best_auc_test"), "target_gap": TARGET_GAP, "untrained": {},
            "runs": [], "not_run": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def save(self) -> None:
        self.result["wall_s"] = round(self.elapsed(), 1)
        atomic_write_json(self.path, self.result)

    def _one(self, cand: Candidate) -> dict[str, Any]:
        try:
            row = run_candidate(cand, self.data, self.args, self.untrained.get(cand.seed))
        except TrainingInterrupted:  # SIGINT/SIGTERM: stop the sweep (the JSON holds every finished run)
            raise
        except Exception as exc:  # one failed candidate must not lose the others
            row = {**asdict(cand), "status": "error", "reason": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()}
        _release(self.args.device)
        return row

    def run(self, grid: list[Candidate], deadline: float, phase: str) -> None:
        for k, cand in enumerate(grid):
            if self.elapsed() > deadline:
                self.log(f"{phase}: {deadline:.0f} s spent, {len(grid) - k} candidates not run")
                self.result["not_run"] += [asdict(c) for c in grid[k:]]
                break
            if cand.seed not in self.untrained:
                reference = dataclasses.replace(cand, lr_dense=0.0, lr_sparse=0.0, note=UNTRAINED)
                row = self._one(reference)
                self.result["untrained"][str(cand.seed)] = row
                self.untrained[cand.seed] = row["losses"] if row["status"] == "ok" else None
            row = self._one(cand)
            self.result["runs"].append(row)
            self.save()
            what = (f"AUC {row['test_auc']:.4f} gap {row['gap']:.4f} max/init "
                    f"{row.get('max_over_untrained', math.nan):.3f}" if row["status"] == "ok" else row["reason"])
            self.log(f"{phase} {k + 1}/{len(grid)} {cand.optimizer} lr {cand.lr_dense:g}/{cand.lr_sparse:g} "
                     f"warm-up {cand.warmup_steps} decay {cand.decay_start_step}+{cand.decay_steps} seed "
                     f"{cand.seed}: {what}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    grid = candidates(args)
    data = open_dataset(dataset(args, log))
    sweep = Sweep(args, data, log, t0)
    sweep.run(grid, args.budget_s - args.confirm_s if args.confirm else args.budget_s, "grid")
    if args.confirm:
        sweep.run(confirmations(sweep.result["runs"], args.confirm), args.budget_s, "confirm")
    sweep.result["status"] = "done"
    sweep.save()
    print(table(sweep.result["runs"]), flush=True)
    print(f"wrote {sweep.path}", flush=True)
    return 0 if all(r["status"] == "ok" for r in sweep.result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
