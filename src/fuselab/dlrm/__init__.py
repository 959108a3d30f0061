"""DLRM for Criteo click logs: model, data pipeline, trainer, export (``fuselab dlrm ...``).

Names resolve lazily so ``import fuselab.dlrm`` (and the CLI) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_API: dict[str, str] = {
    "DLRM": "fuselab.dlrm.model",
    "DenseArch": "fuselab.dlrm.model",
    "OverArch": "fuselab.dlrm.model",
    "TorchEmbeddingCollection": "fuselab.dlrm.sparse",
    "FusedEmbeddingCollection": "fuselab.dlrm.sparse",
    "INTERACTIONS": "fuselab.dlrm.interaction",
    "Batch": "fuselab.dlrm.data.batch",
    "torchrec_permutation": "fuselab.dlrm.interaction",
    "DLRMConfig": "fuselab.dlrm.config",
    "load_config": "fuselab.dlrm.config",
    "roc_auc": "fuselab.dlrm.metrics",
    "evaluate_predictions": "fuselab.dlrm.metrics",
    "train": "fuselab.dlrm.train",
    "Trainer": "fuselab.dlrm.trainer",
    "TrainingInterrupted": "fuselab.dlrm.trainer",
    "LRSchedule": "fuselab.dlrm.schedule",
    "Optimizers": "fuselab.dlrm.optim",
    "TrainStep": "fuselab.dlrm.step",
    "evaluate_checkpoint": "fuselab.dlrm.evaluation",
    "open_dataset": "fuselab.dlrm.data.datasets",
    "kaggle_split": "fuselab.dlrm.data.datasets",
    "write_synthetic": "fuselab.dlrm.data.synth",
    "preprocess": "fuselab.dlrm.data.tsv",
    "configure_parser": "fuselab.dlrm.cli",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fuselab.dlrm' has no attribute {name!r}")
