"""The trainer's parallelism strategy: both strategies implement the whole protocol, and the trainer asks its
strategy (not subclass overrides) for stopping, samples, checkpoint IO and the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fuselab.dlrm.config import load_config
from fuselab.dlrm.distributed import ParallelContext
from fuselab.dlrm.distributed.hybrid import HybridParallel
from fuselab.dlrm.parallelism import Parallelism, SingleProcess
from fuselab.dlrm.trainer import RunOptions, Trainer

PROTOCOL_MEMBERS = sorted(name for name in (*Parallelism.__annotations__, *vars(Parallelism))
                          if not name.startswith("_"))


def test_the_protocol_lists_what_the_trainer_asks():
    assert {"world_size", "rank", "is_main", "agrees_on_losses", "device", "build", "save", "restore", "stopping",
            "agree_on_divergence", "gather", "loader_part", "summary", "close"} <= set(PROTOCOL_MEMBERS)


@pytest.mark.parametrize("strategy", [SingleProcess(), HybridParallel(ParallelContext(0, 1, 0, torch.device("cpu"),
                                                                                      "gloo"))],
                         ids=["single", "hybrid"])
def test_each_strategy_has_every_member_of_the_protocol(strategy):
    missing = [name for name in PROTOCOL_MEMBERS if not hasattr(strategy, name)]
    assert not missing, missing


class Recording(SingleProcess):
    """One process that says it is one of 4 ranks, stops after 3 steps, and records what the trainer asked."""

    world_size = 4

    def __init__(self) -> None:
        self.asked: list[str] = []

    def stopping(self, trainer: Trainer) -> bool:
        self.asked.append("stopping")
        return trainer.step_count >= 3

    def save(self, trainer: Trainer, directory: Path, state: dict[str, Any]) -> Path:
        self.asked.append(f"save {trainer.step_count} {sorted(state)}")
        return super().save(trainer, directory, state)

    def summary(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        summary["strategy"] = "recording"

    def close(self, trainer: Trainer, failed: bool = False) -> None:
        self.asked.append("close after a failure" if failed else "close")


class FailingAtStep2(Recording):
    """A rank whose step 2 raises (an out-of-memory error, a bad batch): its peers may be inside a collective."""

    def stopping(self, trainer: Trainer) -> bool:
        if trainer.step_count == 2:
            raise RuntimeError("CUDA out of memory (simulated)")
        return super().stopping(trainer)


def test_the_trainer_asks_its_strategy(synth_dir, tmp_path):
    cfg = load_config("tiny", ["steps=8", "batch_size=512", "eval_batches=1", "checkpoint_every=0"])
    strategy = Recording()
    summary = Trainer(cfg, synth_dir, RunOptions(checkpoint_dir=tmp_path / "ck", progress=False),
                      log=lambda *a: None, parallelism=strategy).run()
    assert summary["steps"] == 3 and summary["strategy"] == "recording"
    assert strategy.asked.count("stopping") >= 3
    saves = [a for a in strategy.asked if a.startswith("save")]
    assert saves == ["save 3 ['batch_in_epoch', 'config', 'epoch', 'hashing', 'kernels', 'schedule', "
                     "'table_sizes']"]
    assert strategy.asked[-1] == "close"
    assert summary["samples_per_s"] is None or summary["samples_per_s"] > 0


def test_a_failed_run_closes_its_strategy_as_failed(synth_dir, tmp_path):
    """An exception in training reaches the caller after the strategy was closed as failed (several processes:
    the process group aborted, not destroyed in order, so that this rank does not wait for peers it left)."""
    cfg = load_config("tiny", ["steps=8", "batch_size=512", "eval_batches=1", "checkpoint_every=0"])
    strategy = FailingAtStep2()
    with pytest.raises(RuntimeError, match="simulated"):
        Trainer(cfg, synth_dir, RunOptions(progress=False), log=lambda *a: None, parallelism=strategy).run()
    assert strategy.asked[-1] == "close after a failure" and "close" not in strategy.asked


def test_a_rank_that_is_not_main_writes_and_logs_nothing(synth_dir, tmp_path):
    """Rank 1 of a 2-rank context: its options lose the run's files and progress, its log is silent (no collective
    runs before build)."""
    logged: list[str] = []
    two = ParallelContext(1, 2, 1, torch.device("cpu"), "gloo")
    trainer = Trainer(load_config("tiny", batch_size=512, device="cpu"), synth_dir,
                      RunOptions(json_path=tmp_path / "s.json", progress=True), log=logged.append,
                      parallelism=HybridParallel(two))
    assert trainer.opts.json_path is None and trainer.opts.progress is False
    trainer.log("anything")
    assert logged == []
