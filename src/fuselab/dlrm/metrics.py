"""Evaluation metrics: exact ROC AUC (rank-based, ties averaged), log loss, accuracy.

Everything runs on the tensors' device (the GPU when present), one sort of the scores.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(scores: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    if scores.dim() != 1 or labels.shape != scores.shape:
        raise ValueError(f"scores and labels must be 1-D of equal length, got {tuple(scores.shape)} and "
                         f"{tuple(labels.shape)}")
    return scores.detach().float(), labels.detach().to(device=scores.device)


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """Exact area under the ROC curve = P(score(pos) > score(neg)) + ½·P(tie).

    Mann-Whitney form: rank all scores (tied scores get their average rank), then
    ``AUC = (Σ rank(pos) − P(P+1)/2) / (P·N)``. Any monotone transform of the scores (logits or
    probabilities) gives the same AUC. Returns NaN when only one class is present.
    """
    scores, labels = _check(scores, labels)
    n = scores.numel()
    positives = labels > 0.5
    num_pos = int(positives.sum())
    num_neg = n - num_pos
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    sorted_scores, order = torch.sort(scores)
    new_group = torch.ones(n, dtype=torch.bool, device=scores.device)
    new_group[1:] = sorted_scores[1:] != sorted_scores[:-1]
    group = torch.cumsum(new_group, 0) - 1  # tie group of each sorted element
    counts = torch.bincount(group).to(torch.float64)
    ends = torch.cumsum(counts, 0)  # 1-based rank of each group's last element
    average_rank = ends - (counts - 1) / 2
    rank_sum = average_rank[group][positives[order]].sum().item()
    return (rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg)


def evaluate_predictions(logits: Tensor, labels: Tensor) -> dict[str, float]:
    """``{"auc", "logloss", "accuracy", "calibration", "mean_prediction", "positive_rate", "samples"}`` from
    logits (not probabilities). ``calibration`` is mean predicted probability / mean label (1 is calibrated;
    NaN when there is no positive label)."""
    logits, labels = _check(logits, labels)
    labels = labels.float()
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double()).item()
    accuracy = ((logits > 0).float() == labels).double().mean().item()
    mean_prediction = torch.sigmoid(logits.double()).mean().item()
    positive_rate = labels.double().mean().item()
    return {
        "auc": roc_auc(logits, labels),
        "logloss": logloss,
        "accuracy": accuracy,
        "calibration": mean_prediction / positive_rate if positive_rate > 0 else float("nan"),
        "mean_prediction": mean_prediction,
        "positive_rate": positive_rate,
        "samples": int(labels.numel()),
    }
