"""``train()``: one call that runs a :class:`~fuselab.dlrm.trainer.Trainer`, and the run summary's text and JSON.

The trainer: BCE-with-logits, SGD / Adagrad / row-wise Adagrad with separate embedding and MLP learning rates on a
warm-up/decay schedule, fp32 / TF32 / bf16, torch.compile of the dense part, streaming or device-resident data,
periodic evaluation (AUC, logloss, accuracy, calibration), progress bar, TensorBoard scalars, a profiled window,
atomic checkpoints, exact resume, and a checkpoint on SIGINT/SIGTERM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fuselab.core.console import wrap_fields

from .config import DLRMConfig
from .data.datasets import CriteoDataset
from .distributed.hybrid import HybridParallel
from .trainer import RunOptions, Trainer, TrainingInterrupted

__all__ = ["RunOptions", "Trainer", "TrainingInterrupted", "format_summary", "json_summary", "train"]


def train(cfg: DLRMConfig, data: str | Path | CriteoDataset | None = None, *, breakdown: bool = False,
          profile_dir: str | Path | None = None, tensorboard_dir: str | Path | None = None,
          checkpoint_dir: str | Path | None = None, resume: str | Path | None = None,
          time_budget: float | None = None, eval_split: str = "test", progress: bool = True,
          run_dir: str | Path | None = None, json_path: str | Path | None = None, log=print,
          distributed: bool = False) -> dict[str, Any]:
    """Train ``cfg`` on ``data`` (a dataset directory or object; None: a small synthetic set) and evaluate.

    ``distributed``: this process is one rank of a job started by torchrun (or ``--nproc``): the trainer takes the
    :class:`~fuselab.dlrm.distributed.hybrid.HybridParallel` strategy (sharded tables, data-parallel MLPs).
    Returns :meth:`Trainer.summary`. Output paths are checked before the data is opened (``PathError``);
    SIGINT/SIGTERM during training raise :class:`TrainingInterrupted` after writing a checkpoint.
    """
    options = RunOptions(checkpoint_dir=checkpoint_dir, resume=resume, run_dir=run_dir, json_path=json_path,
                         tensorboard_dir=tensorboard_dir, profile_dir=profile_dir, breakdown=breakdown,
                         time_budget=time_budget, eval_split=eval_split, progress=progress)
    parallelism = HybridParallel.join(cfg) if distributed else None
    return Trainer(cfg, data, options, log=log, parallelism=parallelism).run()


def format_summary(summary: dict[str, Any], width: int | None = None) -> list[str]:
    """The summary as lines of text of at most ``width`` columns (default: the console's,
    :func:`fuselab.core.console.console_width`): steps of this invocation and of the run, rate, final metrics."""
    cfg, final = summary["config"], summary["final"]
    ran, total = summary["steps_this_run"], summary["steps"]
    where = f"{cfg['name']}, batch {cfg['batch_size']}, {cfg['optimizer']}, {summary['device']}"
    if summary.get("world_size", 1) > 1:
        where += f" x {summary['world_size']} ranks"
    steps = [f"trained {ran} steps"]
    if summary["first_step"]:
        steps.append(f"(steps {summary['first_step'] + 1}-{total} of the run; {total} in total)")
    rate = summary["samples_per_s"]
    speed = f"{rate:,.0f} samples/s" if rate is not None else "too few steps to measure samples/s"
    lines = wrap_fields([*steps, f"({where})", f"in {summary['train_seconds']:.1f} s: {speed}"], width, sep=" ")
    best = summary.get("best_auc")
    metrics = [f"{summary['eval_split']}: AUC {final['auc']:.4f}"]
    if best is not None:
        metrics.append(f"generator's best AUC {best:.4f} (gap {best - final['auc']:.4f})")
    metrics += [f"logloss {final['logloss']:.4f}", f"accuracy {final['accuracy']:.4f}",
                f"calibration {final['calibration']:.3f}"]
    lines += wrap_fields(metrics, width)
    if "breakdown_ms" in summary:
        parts = [f"{k} {v:.2f}" for k, v in summary["breakdown_ms"].items()]
        lines += wrap_fields(["step time (ms, synchronized):", *parts,
                              f"total {sum(summary['breakdown_ms'].values()):.2f}"], width, sep="  ")
    return lines


def json_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the model objects, JSON-ready."""
    return {k: v for k, v in summary.items() if k not in ("model", "hasher")}
