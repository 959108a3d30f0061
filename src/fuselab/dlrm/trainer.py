"""The DLRM trainer: build, restore, step, evaluate, log, checkpoint; exact resume; safe interruption.

Determinism: the model's initial weights depend on ``cfg.seed``; the batch order on (seed, epoch); the learning
rate on the step (:mod:`.schedule`); so a run resumed from a checkpoint at step k replays exactly the losses of an
uninterrupted run from step k on (bitwise on CPU; on CUDA up to the non-determinism of atomics in the embedding
backward).

Interruption (:mod:`.interrupt`): while :meth:`Trainer.run` trains, SIGINT and SIGTERM (main thread only) are
caught; the current step finishes, a checkpoint is written (to ``checkpoint_dir``, else ``<run_dir>/checkpoints``)
and :class:`~fuselab.dlrm.interrupt.TrainingInterrupted` is raised with its path.

Divergence (:mod:`.health`): losses are checked where they are read anyway, weights before every checkpoint; a
non-finite one raises :class:`~fuselab.dlrm.health.TrainingDiverged`, and no checkpoint is written with it.

Parallelism (:mod:`.parallelism`): what differs between one process and several (device, model, the rank's part of
each batch, checkpoint IO, agreeing on stopping) is the trainer's strategy object, :class:`SingleProcess` by default.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fuselab._io import writable_dir, writable_file
from fuselab.core.flags import SECONDS

from . import checkpoint as ckpt
from . import health
from .config import DEFAULT_RUN_DIR, DLRMConfig
from .data.batch import Batch
from .data.device import DeviceBatches
from .data.loader import BatchLoader, CriteoDataset, Hasher, kaggle_split, load_vocabs, open_dataset
from .evaluation import best_auc, evaluate
from .interrupt import SignalCatcher, TrainingInterrupted
from .layout import check_layout, table_sizes
from .parallelism import Parallelism, SingleProcess
from .runtime import (
    PhaseTimer,
    RateMeter,
    StepProfiler,
    default_dataset,
    progress_bar,
    resolve_kernels,
    step_profiler,
)
from .schedule import LRSchedule


@dataclass
class RunOptions:
    """Everything of a run that is not the model's config: outputs, resume, logging."""

    checkpoint_dir: str | Path | None = None  # None: <run_dir>/checkpoints when cfg.checkpoint_every (and run_dir)
    resume: str | Path | None = None
    run_dir: str | Path | None = None  # interrupt checkpoints go to <run_dir>/checkpoints without checkpoint_dir
    json_path: str | Path | None = None  # checked before training (the caller writes it)
    tensorboard_dir: str | Path | None = None
    profile_dir: str | Path | None = None
    breakdown: bool = False
    time_budget: float | None = None
    eval_split: str = "test"
    progress: bool = True


def _silent(*_args: Any, **_kwargs: Any) -> None:
    return None


class Trainer:
    """One training run of ``cfg`` on ``data`` (a dataset directory or object; None: a small synthetic set).

    ``Trainer(cfg, data, options).run()`` returns the summary (see :meth:`summary`). Every output path of
    ``options`` is checked when the trainer is created, before the data is opened (``PathError`` naming it).
    ``parallelism``: the strategy of a run over several processes
    (:class:`~fuselab.dlrm.distributed.hybrid.HybridParallel`); None: :class:`~fuselab.dlrm.parallelism.SingleProcess`.
    Only its main rank logs and writes the run's files. ``ValueError`` for a config the strategy cannot run.
    """

    def __init__(self, cfg: DLRMConfig, data: str | Path | CriteoDataset | None = None,
                 options: RunOptions | None = None, log=print, parallelism: Parallelism | None = None):
        self.cfg = cfg.validate()
        self.parallelism = parallel = parallelism if parallelism is not None else SingleProcess()
        self.opts = parallel.rank_options(options or RunOptions())
        self.log = log if parallel.is_main else _silent
        run_checkpoints = Path(self.opts.run_dir) / "checkpoints" if self.opts.run_dir is not None else None
        #: where periodic and final checkpoints go: checkpoint_dir, else <run_dir>/checkpoints when checkpoint_every
        self.checkpoint_dir = (Path(self.opts.checkpoint_dir) if self.opts.checkpoint_dir is not None
                               else run_checkpoints if cfg.checkpoint_every else None)
        self._check_outputs()
        parallel.check(cfg)
        self.device = parallel.device(cfg)
        self.kernels = resolve_kernels(cfg.kernels, self.device)
        if cfg.cuda_graph == "auto":  # the graph where it applies: fused kernels on CUDA
            self.cfg = cfg = dataclasses.replace(cfg, cuda_graph=self.device.type == "cuda"
                                                 and self.kernels == "fuselab")
        if cfg.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph needs a CUDA device, this run is on {self.device}")
        self.data = data
        self.step_count = 0
        self.first_step = 0
        self.losses: list[torch.Tensor] = []
        self.evals: list[dict[str, Any]] = []
        self.signals = SignalCatcher()
        #: the time budget is spent (the loop stops before the next step)
        self.out_of_time = False
        self.finite = health.FiniteWatch()
        #: the last checkpoint this run wrote or resumed from: (path, step)
        self.last_good: tuple[Path, int] | None = None

    # ------------------------------------------------------------------------------------------------ build
    def _check_outputs(self) -> None:
        o = self.opts
        if o.time_budget is not None:
            SECONDS.check(o.time_budget)  # ValueError: expected a finite number > 0
        if self.checkpoint_dir is not None:
            ckpt.check_checkpoint_dir(self.checkpoint_dir)
        if o.run_dir is not None:
            writable_dir(o.run_dir, "run folder")
        if o.json_path is not None:
            writable_file(o.json_path, "--json file")
        if o.tensorboard_dir is not None:
            writable_dir(o.tensorboard_dir, "TensorBoard folder")
        if o.profile_dir is not None:
            writable_dir(o.profile_dir, "profile folder")
        self.parallelism.clean_checkpoints(self.interrupt_dir(), self.log)

    def build(self) -> Trainer:
        """Open the data, build hasher, model, optimizers, step, schedule and loaders."""
        torch.manual_seed(self.cfg.seed)
        self._open_data()
        self._build_model()
        self.schedule = LRSchedule.from_config(self.cfg)
        self._build_loaders()
        self.per_epoch = len(self.train_batches)
        self.total_steps = (self.cfg.steps if self.cfg.steps is not None
                            else max(1, math.ceil(self.cfg.epochs * self.per_epoch)))
        if self.schedule.decay_steps and self.total_steps > self.schedule.decay_end:
            self.log(f"note: the learning rate is 0 from step {self.schedule.decay_end} (decay_start_step + "
                     f"decay_steps) of this run's {self.total_steps}; set decay_start_step/decay_steps to change it")
        return self

    def _open_data(self) -> None:
        cfg, data = self.cfg, self.data
        ds = data if isinstance(data, CriteoDataset) else open_dataset(data if data is not None
                                                                        else default_dataset(self.log))
        self.ds, self.split = ds, kaggle_split(len(ds))
        self.sizes = table_sizes(cfg, ds.meta)
        check_layout(cfg, self.sizes, ds)
        vocabs = load_vocabs(ds.meta["root"], ds.num_sparse) if cfg.hashing == "vocab" else None
        self.hasher = Hasher(self.sizes, cfg.hashing, vocabs, cfg.multi_hot_sizes).to(self.device)

    def _build_model(self) -> None:
        parts = self.parallelism.build(self)
        self.model, self.optimizers, self.train_step = parts.model, parts.optimizers, parts.step

    @property
    def step_mode(self) -> str:
        graph, compiled = self.cfg.cuda_graph, self.cfg.compile
        return "compile_graph" if graph and compiled else "cuda_graph" if graph else "compile" if compiled else "eager"

    def _build_loaders(self) -> None:
        """The train and evaluation loaders (each reading this rank's part of every batch)."""
        cfg, device, part = self.cfg, self.device, self.parallelism.loader_part()
        start, stop = self.split["train"]
        if cfg.data_on_device:
            self.train_batches: BatchLoader | DeviceBatches = DeviceBatches(
                self.ds, start, stop, cfg.batch_size, device, cfg.shuffle, cfg.seed, drop_last=True,
                transform=self.hasher, max_id=max(self.sizes), part=part)
        else:
            self.train_batches = BatchLoader(self.ds, start, stop, cfg.batch_size, device, cfg.shuffle, cfg.seed,
                                             drop_last=True, prefetch=cfg.prefetch, part=part)
        self.eval_loader = BatchLoader(self.ds, *self.split[self.opts.eval_split], cfg.eval_batch_size, device,
                                       "none", prefetch=cfg.prefetch, part=part)

    def restore(self, resume: str | Path) -> int:
        """Load model, optimizer state, RNG states and schedule of a checkpoint (the strategy's format); returns
        its step."""
        restored = self.parallelism.restore(self, resume)
        if restored.schedule is not None and LRSchedule(**restored.schedule) != self.schedule:
            self.log(f"note: keeping the learning-rate schedule of {restored.path} ({restored.schedule}); this "
                     "run's config differs")
            self.schedule = LRSchedule(**restored.schedule)
        self.step_count = self.first_step = restored.step
        self.last_good = (restored.path, self.step_count)
        self.log(f"resumed from {restored.path} at step {self.step_count}{restored.note}")
        return self.step_count

    # ------------------------------------------------------------------------------------------------ step
    def step(self, batch: Batch) -> torch.Tensor:
        """One update on ``batch`` at the scheduled learning rates; returns the loss (on the device)."""
        self.optimizers.set_lr(*self.schedule(self.step_count))
        sparse = batch.sparse if self.cfg.data_on_device else self.hasher(batch.sparse)
        loss = self.train_step(batch.dense, sparse, batch.labels)
        self.step_count += 1
        return loss

    def evaluate(self, writer=None) -> dict[str, Any]:
        """Metrics on the evaluation split at the current step (appended to ``evals``, logged)."""
        metrics = evaluate(self.model, self.hasher, self.eval_loader.epoch(0), self.cfg.precision,
                           self.cfg.eval_batches, gather=self.parallelism.gather())
        metrics["step"] = self.step_count
        self.evals.append(metrics)
        if writer is not None:
            for key in ("auc", "logloss", "accuracy"):
                writer.add_scalar(f"eval/{key}", metrics[key], self.step_count)
        self.log(f"step {self.step_count}: {self.opts.eval_split} AUC {metrics['auc']:.4f}  "
                 f"logloss {metrics['logloss']:.4f}  accuracy {metrics['accuracy']:.4f}")
        return metrics

    def checkpoint(self, directory: str | Path | None = None) -> Path:
        """Write a checkpoint of the current step to ``directory`` (default: the run's checkpoint folder; several
        processes: collective)."""
        directory = directory if directory is not None else self.checkpoint_dir
        if directory is None:
            raise ValueError("no checkpoint folder")
        step = self.step_count
        return self.parallelism.save(self, Path(directory), {
            "config": self.cfg.to_dict(), "kernels": self.kernels, "table_sizes": self.sizes,
            "epoch": step // self.per_epoch, "batch_in_epoch": step % self.per_epoch, "hashing": self.cfg.hashing,
            "schedule": self.schedule.to_dict()})

    def save(self, directory: str | Path | None = None) -> Path:
        """:meth:`checkpoint` after checking that the losses and the weights are finite (else
        :class:`~fuselab.dlrm.health.TrainingDiverged`, and nothing is written)."""
        self.check_finite(weights=True)
        path = self.checkpoint(directory)
        self.last_good = (path, self.step_count)
        return path

    def check_finite(self, weights: bool = False) -> None:
        """Raise :class:`~fuselab.dlrm.health.TrainingDiverged` when a loss since the last check (with
        ``weights``: or a weight) is not finite. Every rank calls it at the same step (distributed: collective)."""
        step, names = self.finite.first_bad(self.losses, self.first_step, self.model if weights else None,
                                            self.step_count)
        self._stop_if_diverged(self.parallelism.agree_on_divergence(step, self.device), names)
        self.finite.passed(len(self.losses), self.step_count if weights else None)

    def _stop_if_diverged(self, step: int | None, names: list[str] | tuple = ()) -> None:
        if step is not None:
            raise health.TrainingDiverged(step, self.schedule(max(0, step - 1)), names, self.last_good)

    def interrupt_dir(self) -> Path:
        """Where a checkpoint goes on SIGINT/SIGTERM: the checkpoint folder, else ``<run_dir>/checkpoints``."""
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        return Path(self.opts.run_dir if self.opts.run_dir is not None else DEFAULT_RUN_DIR) / "checkpoints"

    # ------------------------------------------------------------------------------------------------ run
    def _stop_for_signal(self, signum: int) -> None:
        path = self.save(self.interrupt_dir())
        raise TrainingInterrupted(signum, self.step_count, path)

    def run(self) -> dict[str, Any]:
        """Build, restore (``options.resume``), train to ``total_steps``, evaluate; returns :meth:`summary`. The
        strategy is closed at the end (several processes: the process group it joined is left; after an exception
        without waiting for the other ranks)."""
        try:
            summary = self._run()
        except BaseException:
            self.parallelism.close(self, failed=True)
            raise
        self.parallelism.close(self)
        return summary

    def _run(self) -> dict[str, Any]:
        self.build()
        if self.opts.resume is not None:
            self.restore(self.opts.resume)
        writer = None
        if self.opts.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(self.opts.tensorboard_dir))
        try:
            with self.signals.catching():
                self._loop(writer)
                self.check_finite(weights=True)
                signum = self.parallelism.interrupt_signal(self)
                if signum is not None:
                    self._stop_for_signal(signum)
            cfg = self.cfg
            if self.checkpoint_dir is not None and (not cfg.checkpoint_every
                                                    or self.step_count % cfg.checkpoint_every):
                self.save()
            self.evaluate(writer)
        finally:
            if writer is not None:
                writer.close()
        return self.summary()

    def _loop(self, writer) -> None:
        opts = self.opts
        self._writer = writer
        prof = self._profiler()
        self.timer = timer = PhaseTimer(self.device, opts.breakdown)
        meter = RateMeter(self.device, warmup=min(5, max(1, (self.total_steps - self.step_count) // 4)))
        bar = progress_bar(opts.progress)
        last_log = self._started = time.perf_counter()
        with bar, (prof or contextlib.nullcontext()):
            task = bar.add_task("train", total=self.total_steps, completed=self.step_count, info="")
            self.model.train()
            while self.step_count < self.total_steps and not self.parallelism.stopping(self):
                epoch, pos = divmod(self.step_count, self.per_epoch)
                batches = self.train_batches.epoch(epoch, pos)
                try:
                    while self.step_count < self.total_steps and not self.parallelism.stopping(self):
                        with timer.phase("data"):
                            batch = next(batches, None)
                        if batch is None:
                            break
                        with timer.phase("step"):
                            self.losses.append(self.step(batch))
                        timer.steps += 1
                        meter.count(self.samples(batch))
                        if prof is not None:
                            prof.step()
                        now = time.perf_counter()
                        if now - last_log > 0.5 or self.step_count == self.total_steps:
                            if self.parallelism.is_main:  # the latest loss costs a host sync
                                self._log_progress(bar, task, meter, writer)
                            last_log = now
                        self._periodic(now)
                finally:
                    batches.close()
        meter.finish()
        self.meter = meter

    def _profiler(self) -> StepProfiler | None:
        """The ``--profile`` window of this run, clear of periodic evaluations and checkpoints where one fits."""
        if self.opts.profile_dir is None:
            return None
        periods = (self.cfg.eval_every, self.cfg.checkpoint_every if self.checkpoint_dir is not None else 0)
        return step_profiler(Path(self.opts.profile_dir), self.device, self.log, self.step_count, self.total_steps,
                             periods)

    def _periodic(self, now: float) -> None:
        cfg, step = self.cfg, self.step_count
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and self.checkpoint_dir is not None:
            self.save()
        if cfg.eval_every and step % cfg.eval_every == 0 and step < self.total_steps:
            self.check_finite()
            self.evaluate(self._writer)
        if self.opts.time_budget is not None and now - self._started > self.opts.time_budget:
            self.out_of_time = True

    def samples(self, batch: Batch) -> int:
        """Samples one step trains on (the global batch when distributed)."""
        return len(batch) * self.parallelism.world_size

    def _latest_loss(self) -> float:
        """The latest loss; the losses since the last check are checked in the same host read
        (:class:`~fuselab.dlrm.health.TrainingDiverged`), unless the strategy checks them when the ranks agree."""
        if self.parallelism.agrees_on_losses:
            return self.losses[-1].item()
        current, step = self.finite.latest(self.losses, self.first_step)
        self._stop_if_diverged(step)
        self.finite.passed(len(self.losses))
        return current

    def _log_progress(self, bar, task, meter: RateMeter, writer) -> None:
        """Progress bar and TensorBoard scalars (one host sync for the latest loss)."""
        rate = meter.rate()
        current = self._latest_loss()
        bar.update(task, completed=self.step_count, info=f"loss {current:.4f}  {rate or 0:,.0f} samples/s")
        if writer is not None:
            writer.add_scalar("train/loss", current, self.step_count)
            writer.add_scalar("train/samples_per_s", rate or 0.0, self.step_count)
            lr_dense, lr_sparse = self.schedule(max(0, self.step_count - 1))
            writer.add_scalar("train/lr_dense", lr_dense, self.step_count)
            writer.add_scalar("train/lr_sparse", lr_sparse, self.step_count)

    def summary(self) -> dict[str, Any]:
        """``losses`` (every step of this invocation, from ``first_step``), ``steps`` (the run's total),
        ``steps_this_run``, ``evals``, ``final``, ``samples_per_s`` (None when too few steps to measure),
        ``breakdown_ms`` (with ``breakdown``), ``best_auc`` (synthetic data), ``model``, ``hasher``."""
        start, stop = self.eval_loader.start, self.eval_loader.stop
        if self.cfg.eval_batches:
            stop = min(stop, start + self.cfg.eval_batches * self.eval_loader.batch_size)
        meter = getattr(self, "meter", None)
        summary: dict[str, Any] = {
            "config": self.cfg.to_dict(), "device": str(self.device), "kernels": self.kernels,
            "table_sizes": self.sizes, "embedding_rows": sum(self.sizes),
            "train_rows": self.split["train"][1] - self.split["train"][0], "first_step": self.first_step,
            "steps": self.step_count, "steps_this_run": self.step_count - self.first_step,
            "losses": torch.stack(self.losses).float().cpu().tolist() if self.losses else [],
            "evals": self.evals, "final": self.evals[-1],
            "samples_per_s": meter.rate() if meter is not None else None,
            "train_seconds": meter.seconds if meter is not None else 0.0, "eval_split": self.opts.eval_split,
            "best_auc": best_auc(self.ds, start, stop), "model": self.model, "hasher": self.hasher,
        }
        if self.opts.breakdown:
            summary["breakdown_ms"] = self.timer.report()
        self.parallelism.summary(self, summary)
        return summary
