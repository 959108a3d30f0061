"""DLRM for Criteo click logs: model, data pipeline, trainer, export (``fuselab dlrm ...``).

Names resolve lazily so ``import fuselab.dlrm`` (and the CLI) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers and "go to definition"
    from fuselab.dlrm.cli import configure_parser as configure_parser
    from fuselab.dlrm.config import DLRMConfig as DLRMConfig
    from fuselab.dlrm.config import load_config as load_config
    from fuselab.dlrm.data.batch import Batch as Batch
    from fuselab.dlrm.data.datasets import kaggle_split as kaggle_split
    from fuselab.dlrm.data.datasets import open_dataset as open_dataset
    from fuselab.dlrm.data.synth import write_synthetic as write_synthetic
    from fuselab.dlrm.data.tsv import preprocess as preprocess
    from fuselab.dlrm.evaluation import evaluate_checkpoint as evaluate_checkpoint
    from fuselab.dlrm.interaction import INTERACTIONS as INTERACTIONS
    from fuselab.dlrm.interaction import torchrec_permutation as torchrec_permutation
    from fuselab.dlrm.metrics import evaluate_predictions as evaluate_predictions
    from fuselab.dlrm.metrics import roc_auc as roc_auc
    from fuselab.dlrm.model import DLRM as DLRM
    from fuselab.dlrm.model import DenseArch as DenseArch
    from fuselab.dlrm.model import OverArch as OverArch
    from fuselab.dlrm.optim import Optimizers as Optimizers
    from fuselab.dlrm.schedule import LRSchedule as LRSchedule
    from fuselab.dlrm.sparse import FusedEmbeddingCollection as FusedEmbeddingCollection
    from fuselab.dlrm.sparse import TorchEmbeddingCollection as TorchEmbeddingCollection
    from fuselab.dlrm.step import TrainStep as TrainStep
    from fuselab.dlrm.train import train as train
    from fuselab.dlrm.trainer import Trainer as Trainer
    from fuselab.dlrm.trainer import TrainingInterrupted as TrainingInterrupted

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
