"""Metrics of a model on a dataset split: in the trainer (periodic evaluation) and for a saved checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .checkpoint import open_checkpoint
from .config import config_from_dict
from .data.batch import Batch
from .data.loader import BatchLoader, CriteoDataset, Hasher, kaggle_split, load_vocabs, open_dataset
from .layout import check_layout
from .metrics import evaluate_predictions, roc_auc
from .model import DLRM
from .runtime import resolve_device

SPLIT_NAMES = ("train", "test", "val", "all")


@torch.no_grad()
def evaluate(model: nn.Module, hasher: Hasher, batches: Iterable[Batch], precision: str = "fp32",
             max_batches: int = 0, gather: Callable[[Tensor], Tensor] | None = None) -> dict[str, float]:
    """Metrics (:func:`~fuselab.dlrm.metrics.evaluate_predictions`) of ``model`` on ``batches`` (raw ids;
    all batches, or the first ``max_batches``). ``gather`` (distributed: every rank's rows, e.g.
    :func:`fuselab.dlrm.distributed.gather_rows`) collects the logits and labels of all ranks before the metrics.
    ``ValueError`` when there is no batch."""
    was_training = model.training
    model.eval()
    logits, labels = [], []
    try:
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            with torch.autocast(batch.dense.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits.append(model(batch.dense, hasher(batch.sparse)).float())
            labels.append(batch.labels)
    finally:
        model.train(was_training)
    if not logits:
        raise ValueError("evaluation got no batch")
    logits_all, labels_all = torch.cat(logits), torch.cat(labels)
    if gather is not None:
        logits_all, labels_all = gather(logits_all), gather(labels_all)
    return evaluate_predictions(logits_all, labels_all)


def best_auc(ds: CriteoDataset, start: int, stop: int) -> float | None:
    """AUC of the hidden true logits on rows [start, stop) (synthetic data only), else None."""
    if "truth" not in ds.chunks[0].arrays:
        return None
    truth = ds.read_column("truth", start, stop)
    labels = ds.read_column("labels", start, stop)
    return roc_auc(torch.from_numpy(truth), torch.from_numpy(labels))


def split_rows(ds: CriteoDataset, split: str) -> tuple[int, int]:
    """Row range of a Kaggle split name (train, test, val) or ``all``; ``ValueError`` for another name."""
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    return kaggle_split(len(ds))[split]


def _warn(message: str) -> None:
    print(f"fuselab dlrm: {message}", file=sys.stderr)


def evaluate_checkpoint(checkpoint: str | Path, data: str | Path, split: str = "test", batch_size: int = 65536,
                        device: str | None = None, max_batches: int = 0,
                        log: Callable[[str], Any] = _warn) -> dict[str, Any]:
    """Metrics of a checkpoint's model on a split of a dataset (logloss, AUC, accuracy, calibration, ...).

    ``checkpoint`` is a file or a checkpoint folder (its latest), checked against its manifest before it is read.
    Raises ``ValueError`` when the dataset's table sizes differ from the checkpoint's,
    :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` (a ``ValueError`` naming the file) for a damaged checkpoint,
    ``FileNotFoundError``/``PathError`` for missing or corrupt files; ``log`` gets the warnings (a checkpoint
    without a manifest is loaded unchecked).
    """
    dev = resolve_device(device)
    path, state = open_checkpoint(checkpoint, log=log, map_location=dev)
    cfg = config_from_dict(state["config"])
    ds = open_dataset(data)
    sizes = list(state["table_sizes"])
    try:
        check_layout(cfg, sizes, ds)
    except ValueError as exc:
        raise ValueError(f"checkpoint {path} and dataset {data}: {exc}") from None
    vocabs = load_vocabs(ds.meta["root"], ds.num_sparse) if cfg.hashing == "vocab" else None
    hasher = Hasher(sizes, cfg.hashing, vocabs, cfg.multi_hot_sizes).to(dev)
    model = DLRM.from_config(cfg, sizes, kernels="torch")
    model.load_state_dict(state["model"])
    model = model.to(dev)
    start, stop = split_rows(ds, split)
    loader = BatchLoader(ds, start, stop, batch_size, dev, "none", prefetch=2)
    metrics = evaluate(model, hasher, loader.epoch(0), cfg.precision, max_batches)
    rows_seen = min(stop, start + max_batches * batch_size) if max_batches else stop
    return {**metrics, "checkpoint": str(path), "step": int(state["step"]), "data": str(data), "split": split,
            "best_auc": best_auc(ds, start, rows_seen), "config": cfg.name}
