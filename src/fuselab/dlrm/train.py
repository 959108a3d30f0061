"""The DLRM trainer: BCE-with-logits, SGD/Adagrad with separate embedding and MLP learning rates, bf16
autocast, torch.compile of the dense part, periodic evaluation (AUC, logloss, accuracy), progress bar,
TensorBoard scalars, a profiled window, atomic checkpoints and exact resume.

Determinism: the model's initial weights depend on ``cfg.seed``; the batch order on (seed, epoch); so a run
resumed from a checkpoint at step k replays exactly the losses of an uninterrupted run from step k on
(bitwise on CPU; on CUDA up to the non-determinism of atomics in the embedding backward).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import checkpoint as ckpt
from .config import DLRMConfig, table_sizes
from .data.loader import BatchLoader, CriteoDataset, Hasher, kaggle_split, load_vocabs, open_dataset
from .metrics import evaluate_predictions
from .model import DLRM

PHASES = ("data", "forward", "backward", "optimizer")


class Optimizers:
    """One optimizer for the MLPs (lr_dense) and one for the embedding tables (lr_sparse, sparse grads)."""

    def __init__(self, model: DLRM, cfg: DLRMConfig):
        kind = torch.optim.SGD if cfg.optimizer == "sgd" else torch.optim.Adagrad
        self.dense = kind(model.dense_parameters(), lr=cfg.lr_dense)
        self.sparse = kind(model.embedding_parameters(), lr=cfg.lr_sparse)
        self.all = (self.dense, self.sparse)

    def step(self) -> None:
        for opt in self.all:
            opt.step()

    def zero_grad(self) -> None:
        for opt in self.all:
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {"dense": self.dense.state_dict(), "sparse": self.sparse.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dense.load_state_dict(state["dense"])
        self.sparse.load_state_dict(state["sparse"])


class PhaseTimer:
    """Wall time per phase; synchronizes the device at phase boundaries only when enabled."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.totals[name] += time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def report(self) -> dict[str, float]:
        """Milliseconds per step of each phase."""
        return {k: 1e3 * v / max(1, self.steps) for k, v in self.totals.items()}


def train_step(model: nn.Module, hasher: Hasher, opts: Optimizers, loss_fn: nn.Module, batch, cfg: DLRMConfig,
               device: torch.device, timer: PhaseTimer) -> torch.Tensor:
    """One optimizer step on ``batch`` (forward, backward, optimizer phases); returns the detached loss."""
    with timer.phase("forward"), torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        logits = model(batch.dense, hasher(batch.sparse))
        loss = loss_fn(logits.float(), batch.labels)
    with timer.phase("backward"):
        loss.backward()
    with timer.phase("optimizer"):
        opts.step()
        opts.zero_grad()
    return loss.detach()


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


@torch.no_grad()
def evaluate(model: nn.Module, hasher: Hasher, loader: BatchLoader, cfg: DLRMConfig, max_batches: int = 0
             ) -> dict[str, float]:
    """Metrics of ``model`` on the loader's rows (all batches, or the first ``max_batches``)."""
    was_training = model.training
    model.eval()
    logits, labels = [], []
    with torch.autocast(loader.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        for i, batch in enumerate(loader.epoch(0)):
            if max_batches and i >= max_batches:
                break
            logits.append(model(batch.dense, hasher(batch.sparse)).float())
            labels.append(batch.labels)
    model.train(was_training)
    return evaluate_predictions(torch.cat(logits), torch.cat(labels))


def _best_auc(ds: CriteoDataset, loader: BatchLoader, max_batches: int) -> float | None:
    """AUC of the hidden true logits on the evaluated rows (synthetic data only), else None."""
    if "truth" not in ds.chunks[0].arrays:
        return None
    from .metrics import roc_auc

    stop = loader.stop if not max_batches else min(loader.stop, loader.start + max_batches * loader.batch_size)
    truth = ds.read_column("truth", loader.start, stop)
    labels = ds.read_column("labels", loader.start, stop)
    return roc_auc(torch.from_numpy(truth), torch.from_numpy(labels))


def _default_dataset(log) -> Path:
    from .cli import DEFAULT_SYNTH_DIR
    from .data.synth import SynthSpec, write_synthetic

    root = Path(DEFAULT_SYNTH_DIR)
    if not (root / "metadata.json").is_file():
        log(f"no --data given: writing a small synthetic dataset to {root} ...")
        write_synthetic(root, SynthSpec(rows=1_000_000, scale=1e-4, seed=0), shard_rows=1 << 18)
    return root


def _profiler(directory: Path, device: torch.device, log, active_steps: int = 5):
    """A profiler over steps 5..(4 + active_steps) of the run: Chrome trace, TensorBoard trace, kernel table."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    directory.mkdir(parents=True, exist_ok=True)
    tb_handler = tensorboard_trace_handler(str(directory / "tensorboard"))

    def on_ready(prof) -> None:
        tb_handler(prof)  # writes a Chrome trace (*.pt.trace.json) that TensorBoard's profiler plugin reads
        import shutil

        newest = max((directory / "tensorboard").glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
        shutil.copyfile(newest, directory / "trace.json")  # one save per trace: copy it for chrome://tracing
        try:
            import io

            from rich.console import Console

            from fuselab.profile import kernel_table, render_kernel_table

            on_gpu = device.type == "cuda"
            table = render_kernel_table(kernel_table(prof, device=on_gpu), title="DLRM training steps",
                                        device=on_gpu, steps=active_steps)
            console = Console(file=io.StringIO(), width=150, record=True)
            console.print(table)
            text = console.export_text()
        except (ImportError, AttributeError, TypeError):
            sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            text = prof.key_averages().table(sort_by=sort, row_limit=30)
        (directory / "kernels.txt").write_text(text)
        log(text)
        log(f"profile: {directory / 'trace.json'} (Chrome), {directory / 'tensorboard'} (TensorBoard), "
            f"{directory / 'kernels.txt'}")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, schedule=schedule(wait=2, warmup=2, active=active_steps, repeat=1),
                   on_trace_ready=on_ready, record_shapes=True)


def train(cfg: DLRMConfig, data: str | Path | CriteoDataset | None = None, *, breakdown: bool = False,
          profile_dir: str | Path | None = None, tensorboard_dir: str | Path | None = None,
          checkpoint_dir: str | Path | None = None, resume: str | Path | None = None,
          time_budget: float | None = None, eval_split: str = "test", progress: bool = True,
          log=print) -> dict[str, Any]:
    """Train ``cfg`` on ``data`` (a dataset directory or object; None: a small synthetic set) and evaluate.

    Returns a summary: ``losses`` (every step run by this call, with its step number ``first_step``),
    ``evals`` (metrics at each evaluation), ``final`` (last evaluation), ``samples_per_s``, ``breakdown_ms``
    (per step, when ``breakdown``), ``best_auc`` (synthetic data: the generator's best on this split).
    """
    cfg.validate()
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    device = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    ds = data if isinstance(data, CriteoDataset) else open_dataset(data if data is not None else _default_dataset(log))
    split = kaggle_split(len(ds))
    sizes = table_sizes(cfg, ds.meta)
    if len(sizes) != ds.num_sparse:
        raise ValueError(f"metadata lists {len(sizes)} cardinalities, data has {ds.num_sparse} sparse columns")
    vocabs = load_vocabs(ds.meta["root"], ds.num_sparse) if cfg.hashing == "vocab" else None
    hasher = Hasher(sizes, cfg.hashing, vocabs).to(device)
    model = DLRM.from_config(cfg, sizes).to(device)
    opts = Optimizers(model, cfg)
    if cfg.compile:
        model.compile_dense(dynamic=False)

    train_loader = BatchLoader(ds, *split["train"], cfg.batch_size, device, cfg.shuffle, cfg.seed, drop_last=True,
                               prefetch=cfg.prefetch)
    eval_loader = BatchLoader(ds, *split[eval_split], cfg.eval_batch_size, device, "none", prefetch=cfg.prefetch)
    per_epoch = len(train_loader)
    total_steps = cfg.steps if cfg.steps is not None else max(1, math.ceil(cfg.epochs * per_epoch))

    step = 0
    if resume is not None:
        path = ckpt.resolve_checkpoint(resume, checkpoint_dir)
        state = ckpt.load_checkpoint(path, map_location=device)
        if state["table_sizes"] != sizes:
            raise ValueError(f"checkpoint {path} has other table sizes than this dataset/config")
        model.load_state_dict(state["model"])
        opts.load_state_dict(state["optimizers"])
        ckpt.set_rng_state(state["rng"])
        step = int(state["step"])
        log(f"resumed from {path} at step {step}")

    writer = None
    if tensorboard_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(tensorboard_dir))
    prof = _profiler(Path(profile_dir), device, log) if profile_dir is not None else None
    timer = PhaseTimer(device, breakdown)
    loss_fn = nn.BCEWithLogitsLoss()
    losses: list[torch.Tensor] = []
    evals: list[dict[str, Any]] = []
    first_step = step

    def save(at: int) -> None:
        if checkpoint_dir is not None:
            ckpt.save_checkpoint(checkpoint_dir, at, {
                "model": model.state_dict(), "optimizers": opts.state_dict(), "config": cfg.to_dict(),
                "table_sizes": sizes, "epoch": at // per_epoch, "batch_in_epoch": at % per_epoch,
                "hashing": cfg.hashing})

    def run_eval(at: int) -> None:
        metrics = evaluate(model, hasher, eval_loader, cfg, cfg.eval_batches)
        metrics["step"] = at
        evals.append(metrics)
        if writer is not None:
            for key in ("auc", "logloss", "accuracy"):
                writer.add_scalar(f"eval/{key}", metrics[key], at)
        log(f"step {at}: {eval_split} AUC {metrics['auc']:.4f}  logloss {metrics['logloss']:.4f}  "
            f"accuracy {metrics['accuracy']:.4f}")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn())
    warmup_steps = min(5, max(1, (total_steps - step) // 4))
    t_start = time.perf_counter()
    t_measure, measured = None, 0
    last_log = time.perf_counter()
    with Progress(*columns, disable=not progress, transient=True) as bar, (prof or contextlib.nullcontext()):
        task = bar.add_task("train", total=total_steps, completed=step, info="")
        model.train()
        while step < total_steps:
            epoch, pos = divmod(step, per_epoch)
            batches = train_loader.epoch(epoch, pos)
            while step < total_steps:
                with timer.phase("data"):
                    batch = next(batches, None)
                if batch is None:
                    break
                losses.append(train_step(model, hasher, opts, loss_fn, batch, cfg, device, timer))
                step += 1
                timer.steps += 1
                if step - first_step == warmup_steps:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t_measure, measured = time.perf_counter(), 0
                elif t_measure is not None:
                    measured += len(batch)
                if prof is not None:
                    prof.step()
                now = time.perf_counter()
                if now - last_log > 0.5 or step == total_steps:
                    rate = measured / (now - t_measure) if t_measure and measured else 0.0
                    current = losses[-1].item()
                    bar.update(task, completed=step, info=f"loss {current:.4f}  {rate:,.0f} samples/s")
                    if writer is not None:
                        writer.add_scalar("train/loss", current, step)
                        writer.add_scalar("train/samples_per_s", rate, step)
                    last_log = now
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    save(step)
                if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                    run_eval(step)
                if time_budget is not None and now - t_start > time_budget:
                    total_steps = step
            batches.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_end = time.perf_counter()
    samples_per_s = measured / (t_end - t_measure) if t_measure is not None and measured else float("nan")
    if checkpoint_dir is not None and (not cfg.checkpoint_every or step % cfg.checkpoint_every):
        save(step)
    run_eval(step)
    if writer is not None:
        writer.close()
    summary: dict[str, Any] = {
        "config": cfg.to_dict(), "device": str(device), "table_sizes": sizes, "embedding_rows": sum(sizes),
        "train_rows": split["train"][1] - split["train"][0], "first_step": first_step, "steps": step,
        "losses": torch.stack(losses).float().cpu().tolist() if losses else [],
        "evals": evals, "final": evals[-1], "samples_per_s": samples_per_s,
        "train_seconds": t_end - t_start, "eval_split": eval_split,
        "best_auc": _best_auc(ds, eval_loader, cfg.eval_batches),
        "model": model, "hasher": hasher,
    }
    if breakdown:
        summary["breakdown_ms"] = timer.report()
    return summary


def _print_summary(summary: dict[str, Any], log) -> None:
    final = summary["final"]
    log(f"trained {summary['steps']} steps ({summary['config']['name']}, batch {summary['config']['batch_size']}, "
        f"{summary['device']}) in {summary['train_seconds']:.1f} s: {summary['samples_per_s']:,.0f} samples/s")
    best = summary.get("best_auc")
    gap = f"   generator's best AUC {best:.4f} (gap {best - final['auc']:.4f})" if best is not None else ""
    log(f"{summary['eval_split']}: AUC {final['auc']:.4f}{gap}   logloss {final['logloss']:.4f}   "
        f"accuracy {final['accuracy']:.4f}")
    if "breakdown_ms" in summary:
        parts = "  ".join(f"{k} {v:.2f}" for k, v in summary["breakdown_ms"].items())
        log(f"step time (ms, synchronized): {parts}   total {sum(summary['breakdown_ms'].values()):.2f}")


def json_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the model objects, JSON-ready."""
    return {k: v for k, v in summary.items() if k not in ("model", "hasher")}


def main_from_args(args) -> int:
    """``fuselab dlrm train``: flags -> config -> train (or measure the loader) -> print, optional JSON."""
    import json

    from .config import load_config

    cfg = load_config(args.config, args.overrides, device=args.device, compile=args.compile, epochs=args.epochs,
                      steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
                      eval_batches=args.eval_batches, optimizer=args.optimizer, lr_dense=args.lr_dense,
                      lr_sparse=args.lr_sparse, bf16=args.bf16, hashing=args.hashing, seed=args.seed)
    if args.loader_only:
        from .data.loader import loader_throughput

        device = resolve_device(cfg.device)
        ds = open_dataset(args.data if args.data is not None else _default_dataset(print))
        result = loader_throughput(ds, cfg.batch_size, device, batches=args.steps or 50, prefetch=cfg.prefetch)
        print(f"loader alone ({device}, batch {cfg.batch_size}): {result['samples_per_s']:,.0f} samples/s, "
              f"{result['GB_per_s']:.2f} GB/s")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    summary = train(cfg, args.data, breakdown=args.breakdown, profile_dir=args.profile,
                    tensorboard_dir=args.tensorboard, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                    time_budget=args.time_budget, progress=not args.quiet)
    _print_summary(summary, print)
    if args.json:
        Path(args.json).write_text(json.dumps(json_summary(summary), indent=1, default=str))
    return 0
