"""How a training run spreads over processes: the strategy object a :class:`~fuselab.dlrm.trainer.Trainer` takes.

A strategy answers what differs between one process and several: the device, the rank's part of each batch, the
model it builds (whole tables or shards), how evaluation rows are gathered, how checkpoints are written and read,
and how the ranks agree on stopping and on divergence. :class:`SingleProcess` is the trivial one;
:class:`fuselab.dlrm.distributed.hybrid.HybridParallel` shards the tables over the ranks of ``torch.distributed``.
The trainer owns the run (loop, schedule, losses, signals, outputs) and asks its strategy at each of those points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from . import checkpoint as ckpt
from .config import DLRMConfig
from .memory import check_device
from .model import DLRM
from .optim import Optimizers
from .runtime import resolve_device
from .step import GRAPH_MODES, StepOptions, TrainStep

if TYPE_CHECKING:
    from .trainer import RunOptions, Trainer

__all__ = ["Parallelism", "Restored", "SingleProcess", "TrainingParts", "local_stop"]


@dataclass(frozen=True)
class TrainingParts:
    """What a strategy builds for the trainer: the model on this rank, its optimizers and its training step."""

    model: nn.Module
    optimizers: Optimizers
    step: TrainStep


@dataclass(frozen=True)
class Restored:
    """A checkpoint a strategy loaded: where it is, its step, the learning-rate schedule it saved (None: none saved)
    and a note for the log (e.g. the world size that saved it)."""

    path: Path
    step: int
    schedule: dict[str, Any] | None
    note: str = ""


class Parallelism(Protocol):
    """The strategy protocol. ``trainer`` arguments are the :class:`~fuselab.dlrm.trainer.Trainer` asking."""

    #: processes of the run, this one's rank, whether it writes the run's files and logs
    world_size: int
    rank: int
    is_main: bool
    #: the losses are checked for divergence at the ranks' agreements instead of at every read of the latest loss
    agrees_on_losses: bool

    def device(self, cfg: DLRMConfig) -> torch.device: ...
    def check(self, cfg: DLRMConfig) -> None: ...
    def rank_options(self, options: RunOptions) -> RunOptions: ...
    def clean_checkpoints(self, folder: Path, log: Callable[[str], Any]) -> None: ...
    def build(self, trainer: Trainer) -> TrainingParts: ...
    def loader_part(self) -> tuple[int, int] | None: ...
    def gather(self) -> Callable[[Tensor], Tensor] | None: ...
    def save(self, trainer: Trainer, directory: Path, state: dict[str, Any]) -> Path: ...
    def restore(self, trainer: Trainer, resume: str | Path) -> Restored: ...
    def agree_on_divergence(self, step: int | None, device: torch.device) -> int | None: ...
    def stopping(self, trainer: Trainer) -> bool: ...
    def interrupt_signal(self, trainer: Trainer) -> int | None: ...
    def summary(self, trainer: Trainer, summary: dict[str, Any]) -> None: ...
    def close(self, trainer: Trainer, failed: bool = False) -> None: ...


def local_stop(trainer: Trainer) -> bool:
    """This process's own reasons to stop before the next step: a signal arrived or the time budget is spent."""
    return trainer.signals.signum is not None or trainer.out_of_time


class SingleProcess:
    """One process: whole tables on one device, files written with ``torch.save`` (:mod:`fuselab.dlrm.checkpoint`),
    nothing to agree on."""

    world_size = 1
    rank = 0
    is_main = True
    agrees_on_losses = False

    def device(self, cfg: DLRMConfig) -> torch.device:
        return resolve_device(cfg.device)

    def check(self, cfg: DLRMConfig) -> None:
        return None

    def rank_options(self, options: RunOptions) -> RunOptions:
        return options

    def clean_checkpoints(self, folder: Path, log: Callable[[str], Any]) -> None:
        """Remove what killed checkpoint writes left in ``folder`` (temporary files)."""
        if folder.is_dir() and (removed := ckpt.clean_checkpoint_dir(folder)):
            log(f"removed {len(removed)} temporary file(s) of an interrupted checkpoint write in {folder}")

    def build(self, trainer: Trainer) -> TrainingParts:
        """The whole model on the trainer's device (its memory checked first: ``ValueError`` when it cannot fit)."""
        cfg, device = trainer.cfg, trainer.device
        check_device(cfg, trainer.sizes, trainer.ds.num_sparse, len(range(*trainer.split["train"])), device,
                     trainer.log)
        # built where it trains: tables of MLPerf's size would otherwise be drawn and held on the host first
        with torch.device(device):
            model = DLRM.from_config(dataclasses.replace(cfg, kernels=trainer.kernels), trainer.sizes)
        optimizers = Optimizers(model, lr_dense=cfg.lr_dense, lr_sparse=cfg.lr_sparse)
        # the lookup beside the bottom MLP where it was measured faster: a CUDA graph step
        overlap = cfg.overlap and device.type == "cuda" and trainer.step_mode in GRAPH_MODES
        return TrainingParts(model, optimizers, TrainStep(model, optimizers, precision=cfg.precision,
                                                          mode=trainer.step_mode,
                                                          options=StepOptions(overlap=overlap)))

    def loader_part(self) -> tuple[int, int] | None:
        return None

    def gather(self) -> Callable[[Tensor], Tensor] | None:
        return None

    def save(self, trainer: Trainer, directory: Path, state: dict[str, Any]) -> Path:
        """One checkpoint file of the model, the optimizers and the run's ``state`` (atomic, verified on load)."""
        return ckpt.save_checkpoint(directory, trainer.step_count, {
            "model": trainer.model.state_dict(), "optimizers": trainer.optimizers.state_dict(), **state})

    def restore(self, trainer: Trainer, resume: str | Path) -> Restored:
        """Load model, optimizer state and RNG states of ``resume`` (a file, a folder or ``"latest"``: the newest
        intact checkpoint there). ``ValueError`` when its table sizes differ from this run's."""
        opts = trainer.opts
        folder = (trainer.checkpoint_dir if trainer.checkpoint_dir is not None
                  else trainer.interrupt_dir() if opts.run_dir is not None else None)
        path, state = ckpt.open_checkpoint(resume, folder, fallback=True, log=trainer.log,
                                           map_location=trainer.device)
        if list(state["table_sizes"]) != trainer.sizes:
            raise ValueError(f"checkpoint {path} has other table sizes than this dataset/config")
        trainer.model.load_state_dict(state["model"])
        trainer.optimizers.load_state_dict(state["optimizers"])
        ckpt.set_rng_state(state["rng"])
        return Restored(Path(path), int(state["step"]), state.get("schedule"))

    def agree_on_divergence(self, step: int | None, device: torch.device) -> int | None:
        return step

    def stopping(self, trainer: Trainer) -> bool:
        return local_stop(trainer)

    def interrupt_signal(self, trainer: Trainer) -> int | None:
        return trainer.signals.signum

    def summary(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        return None

    def close(self, trainer: Trainer, failed: bool = False) -> None:
        return None
