"""The `tiny` config's defaults learn with every optimizer, and the loss never rises above the untrained model's."""

from __future__ import annotations

import pytest

from fuselab.dlrm.config import load_config
from fuselab.dlrm.train import train


def _quiet(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def untrained_losses(synth_dir) -> list[float]:
    """Per-step losses with both learning rates 0: the initial model on the same batches (same order)."""
    cfg = load_config("tiny", ["optimizer=sgd", "lr_dense=0", "lr_sparse=0", "epochs=1", "eval_batches=1"])
    return train(cfg, synth_dir, progress=False, log=_quiet)["losses"]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_every_optimizer_learns_without_a_loss_jump(synth_dir, untrained_losses, optimizer):
    summary = train(load_config("tiny", [f"optimizer={optimizer}", "epochs=1"]), synth_dir, progress=False,
                    log=_quiet)
    losses = summary["losses"]
    assert len(losses) == len(untrained_losses) == 100
    # batch-to-batch noise is larger than the early changes, so each step is compared with the untrained model on
    # the same batch: the update never makes the model worse than where it started
    worst = max(a / b for a, b in zip(losses, untrained_losses, strict=True))
    assert worst <= 1.0 + 1e-6, f"{optimizer}: a loss rose {100 * (worst - 1):.2f}% above the untrained model's"
    late = sum(losses[-20:]) / 20
    assert late < 0.95 * sum(untrained_losses[-20:]) / 20
    assert summary["final"]["auc"] > 0.7, summary["final"]
