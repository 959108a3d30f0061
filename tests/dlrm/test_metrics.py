"""Exact AUC vs a pairwise (Mann-Whitney) reference with ties; logloss and accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fuselab.dlrm.metrics import evaluate_predictions, roc_auc


def _pairwise_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return (greater + 0.5 * ties) / (len(pos) * len(neg))


@pytest.mark.parametrize("n,levels", [(2, 0), (50, 0), (777, 5), (1000, 2), (313, 1)])
def test_auc_matches_pairwise_reference_with_ties(n, levels):
    rng = np.random.default_rng(n)
    labels = (rng.uniform(size=n) < 0.3).astype(np.float32)
    labels[0], labels[-1] = 1, 0
    scores = rng.normal(size=n) + labels
    if levels:  # heavy ties
        scores = np.round(scores * levels) / levels
    if levels == 1:
        scores[:] = 0.5  # all tied: AUC exactly 0.5
    got = roc_auc(torch.from_numpy(scores).float(), torch.from_numpy(labels))
    ref = _pairwise_auc(scores.astype(np.float32), labels)
    assert abs(got - ref) < 1e-12
    if levels == 1:
        assert got == 0.5


def test_auc_is_invariant_to_monotone_transforms_and_order():
    rng = np.random.default_rng(0)
    labels = torch.from_numpy((rng.uniform(size=500) < 0.4).astype(np.float32))
    logits = torch.from_numpy(rng.normal(size=500).astype(np.float32)) + labels
    perm = torch.randperm(500)
    a = roc_auc(logits, labels)
    assert a == pytest.approx(roc_auc(torch.sigmoid(logits.double()).float(), labels), abs=1e-6)
    assert a == pytest.approx(roc_auc(logits[perm], labels[perm]), abs=1e-12)


def test_auc_edge_cases():
    assert math.isnan(roc_auc(torch.rand(5), torch.ones(5)))
    assert roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([0.0, 1.0])) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0])) == 0.0
    with pytest.raises(ValueError, match="1-D"):
        roc_auc(torch.rand(3, 2), torch.rand(3, 2))


def test_logloss_and_accuracy():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    m = evaluate_predictions(logits, labels)
    p = torch.sigmoid(logits.double())
    ref = -(labels * p.log() + (1 - labels) * (1 - p).log()).mean().item()
    assert m["logloss"] == pytest.approx(ref, rel=1e-12)
    assert m["accuracy"] == 0.5
    assert m["positive_rate"] == 0.5 and m["samples"] == 4
