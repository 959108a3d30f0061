"""What one pass over the train split can learn: the generator's own model class, trained like the DLRM is.

The synthetic generator's label model (``fuselab.dlrm.data.synth``) is ``logit = bias + w·dense + Σ_f e_f[id_f]``
on the stored (log-transformed) dense features, with an independent effect per (feature, id). This script fits
exactly that model (a scalar per embedding row, 13 dense weights and a bias, float64) in one pass over the shuffled
train split in batches of ``--batch-size``, the DLRM's schedule, and reports the test AUC of each learner:

* ``bayes``: diagonal assumed-density filtering, the strongest one-pass learner of the class: every coordinate has
  a Gaussian posterior (mean, precision), each batch adds its log-likelihood's gradient and curvature (a Newton
  step per coordinate). The id effects start from the generator's true prior (``--prior-scale`` times its
  variance), an oracle's knowledge no trained model has; the bias and dense weights from variance 100;
* ``adagrad``: Adagrad (element-wise, which for a scalar row is also row-wise Adagrad) on the batch-mean loss, one
  run per ``--adagrad`` pair of dense and sparse rates;
* ``sgd``: SGD on the batch-mean loss, one run per ``--sgd`` pair of rates.

What these reach is the yardstick of a DLRM's one-epoch AUC: the DLRM learns the same effects from the same rows
in the same number of steps, through embeddings and MLPs instead of a scalar per id. Memory: the train split
in float64 / int64 (about 2.2 GB at 8M rows) and three float64 arrays per embedding row (0.8 GB at full scale).

    fuselab dlrm synth --rows 8000000 --scale 1.0 --out DIR
    python3 benchmarks/dlrm_one_pass.py --data DIR --out benchmarks/results/synth/dlrm_one_pass.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fuselab._io import atomic_write_json, writable_file
from fuselab.dlrm.data.datasets import CriteoDataset, kaggle_split, open_dataset
from fuselab.dlrm.data.synth import SynthSpec, hidden_model
from fuselab.dlrm.metrics import roc_auc

NUM_FIXED = 14  # the bias and 13 dense weights, before the id effects in the parameter vector
#: the default grid (``results/synth/dlrm_one_pass.json``): around each optimizer's best at B = 65536, full data
PRIOR_SCALES = (1.0, 0.5, 2.0)
ADAGRAD_RATES = ((0.1, 0.1), (0.1, 0.05), (0.1, 0.07), (0.1, 0.14), (0.1, 0.2), (0.03, 0.1), (0.05, 0.1), (0.2, 0.1),
                 (0.3, 0.1), (0.2, 0.14))
SGD_RATES = ((0.03, 16.0), (0.1, 4.0), (0.1, 8.0), (0.1, 16.0), (0.1, 32.0), (0.1, 64.0), (0.05, 16.0), (0.3, 4.0))


class Split:
    """The train rows in training order and the test rows: dense [n, 13] float64, ids [n, F] int64 as global
    coordinates (offset past the fixed coordinates and the earlier tables), labels [n] float64."""

    def __init__(self, train: tuple[Tensor, Tensor, Tensor], test: tuple[Tensor, Tensor, Tensor],
                 cardinalities: list[int]):
        self.dense, self.ids, self.labels = train
        self.test_dense, self.test_ids, self.test_labels = test
        self.cardinalities = cardinalities
        self.size = NUM_FIXED + sum(cardinalities)

    @classmethod
    def from_dataset(cls, ds: CriteoDataset, seed: int) -> Split:
        """The Kaggle split of a dataset, the train rows shuffled with ``seed``."""
        split = kaggle_split(len(ds))
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(ds.cardinalities)[:-1]]) + NUM_FIXED)
        train, test = ds.read(*split["train"]), ds.read(*split["test"])
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
        return cls((train.dense[order].double(), train.sparse[order] + offsets, train.labels[order].double()),
                   (test.dense.double(), test.sparse + offsets, test.labels), list(ds.cardinalities))

    def batches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """(dense, ids, labels) of each full batch, in order (the last partial batch is dropped, as in training)."""
        for start in range(0, len(self.labels) - batch_size + 1, batch_size):
            stop = start + batch_size
            yield self.dense[start:stop], self.ids[start:stop], self.labels[start:stop]

    def test_auc(self, theta: Tensor) -> float:
        logit = theta[0] + self.test_dense @ theta[1:NUM_FIXED] + theta[self.test_ids].sum(1)
        return roc_auc(logit.float(), self.test_labels)


def _batch_terms(theta: Tensor, dense: Tensor, ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per touched coordinate of one batch: its index, Σ (y - p)·x and Σ p(1-p)·x² over the rows (x = 1 for the
    bias and the id effects, the feature value for a dense weight)."""
    p = torch.sigmoid(theta[0] + dense @ theta[1:NUM_FIXED] + theta[ids].sum(1))
    residual, curvature = labels - p, p * (1.0 - p)
    rows, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    per_id = ids.shape[1]
    id_residual = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, inverse, residual.repeat_interleave(per_id))
    id_curvature = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, inverse,
                                                                         curvature.repeat_interleave(per_id))
    index = torch.cat([torch.arange(NUM_FIXED), rows])
    gradient = torch.cat([residual.sum().reshape(1), dense.T @ residual, id_residual])
    hessian = torch.cat([curvature.sum().reshape(1), (dense * dense).T @ curvature, id_curvature])
    return index, gradient, hessian


def fit_bayes(data: Split, batch_size: int, prior_var: Tensor) -> Tensor:
    """Diagonal assumed-density filtering; ``prior_var`` [size] the starting variance of every coordinate.
    Returns the posterior means [size]."""
    theta = torch.zeros(data.size, dtype=torch.float64)
    precision = 1.0 / prior_var
    for dense, ids, labels in data.batches(batch_size):
        index, gradient, hessian = _batch_terms(theta, dense, ids, labels)
        precision[index] += hessian
        theta[index] += gradient / precision[index]
    return theta


def fit_first_order(data: Split, batch_size: int, lr_dense: float, lr_sparse: float, adagrad: bool,
                    eps: float = 1e-8) -> Tensor:
    """SGD or Adagrad on the batch-mean log loss, one rate for the bias and dense weights, one for the ids.
    Returns the parameters [size]."""
    theta = torch.zeros(data.size, dtype=torch.float64)
    state = torch.zeros(data.size, dtype=torch.float64)
    for dense, ids, labels in data.batches(batch_size):
        index, gradient, _ = _batch_terms(theta, dense, ids, labels)
        gradient = gradient / batch_size  # the ascent direction of the mean log-likelihood
        rate = torch.full_like(gradient, lr_sparse)
        rate[:NUM_FIXED] = lr_dense
        if adagrad:
            state[index] += gradient * gradient
            rate = rate / (state[index].sqrt() + eps)
        theta[index] += rate * gradient
    return theta


def effect_variances(meta: dict[str, Any]) -> Tensor:
    """[F] the generator's variance of each feature's id effect, from a synthetic dataset's metadata (0 for a
    feature without an effect)."""
    synth = meta.get("synth")
    if not synth:
        raise ValueError("the dataset is not a synthetic one (its metadata has no 'synth' entry): no true prior")
    spec = SynthSpec(rows=synth["rows"], scale=synth["scale"], seed=synth["seed"],
                     zipf_alpha=synth["zipf_alpha"], signal=synth["signal"])
    weights = hidden_model(spec).params["sparse_w"]
    return torch.tensor([(spec.signal * w) ** 2 for w in weights], dtype=torch.float64)


def prior_variances(data: Split, per_feature: Tensor, scale: float) -> Tensor:
    """[size] every coordinate's starting variance: 100 for the fixed ones, ``scale`` times its feature's effect
    variance for the ids (a tiny floor keeps the ids of features without an effect at 0)."""
    per_row = torch.repeat_interleave(per_feature * scale, torch.tensor(data.cardinalities))
    return torch.cat([torch.full((NUM_FIXED,), 100.0, dtype=torch.float64), per_row.clamp_min(1e-12)])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a synthetic npy dataset (`fuselab dlrm synth`)")
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--seed", type=int, default=0, help="of the train split's shuffle")
    p.add_argument("--prior-scale", type=float, nargs="+", default=list(PRIOR_SCALES),
                   help="bayes: times the true variance, one run each")
    p.add_argument("--adagrad", type=float, nargs="*", default=[r for pair in ADAGRAD_RATES for r in pair],
                   help="pairs of dense and sparse rates, one run each (none: no Adagrad run)")
    p.add_argument("--sgd", type=float, nargs="*", default=[r for pair in SGD_RATES for r in pair],
                   help="pairs of dense and sparse rates, one run each (none: no SGD run)")
    p.add_argument("--out", type=Path, help="JSON file to write")
    args = p.parse_args(argv)
    if args.batch_size <= 0 or len(args.adagrad) % 2 or len(args.sgd) % 2:
        p.error("--batch-size must be positive; --adagrad and --sgd take pairs of rates")
    if any(s <= 0 for s in args.prior_scale):
        p.error("--prior-scale values must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:  # every file problem ends the run before the work, with exit status 2
        if args.out is not None:
            writable_file(args.out, "--out file")
        ds = open_dataset(args.data)
        meta = ds.meta
        per_feature = effect_variances(meta)
        data = Split.from_dataset(ds, args.seed)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    best = float(meta.get("best_auc_test", float("nan")))
    steps = len(data.labels) // args.batch_size
    if steps == 0:
        print(f"error: --batch-size {args.batch_size} is larger than the train split ({len(data.labels)} rows)",
              file=sys.stderr)
        return 2
    print(f"{args.data}: {len(data.labels):,} train rows, {steps} steps of {args.batch_size:,}; "
          f"generator's best test AUC {best:.4f}")
    runs: list[dict[str, Any]] = []

    def record(learner: str, settings: dict[str, float], auc: float) -> None:
        runs.append({"learner": learner, **settings, "test_auc": auc, "gap": best - auc})
        print(f"[{time.perf_counter() - t0:6.1f}s] {learner:<8} {settings}: AUC {auc:.4f}, gap {best - auc:.4f}",
              flush=True)

    for scale in args.prior_scale:
        theta = fit_bayes(data, args.batch_size, prior_variances(data, per_feature, scale))
        record("bayes", {"prior_scale": scale}, data.test_auc(theta))
    for learner, pairs in (("adagrad", args.adagrad), ("sgd", args.sgd)):
        for lr_dense, lr_sparse in zip(pairs[::2], pairs[1::2]):
            theta = fit_first_order(data, args.batch_size, lr_dense, lr_sparse, adagrad=learner == "adagrad")
            record(learner, {"lr_dense": lr_dense, "lr_sparse": lr_sparse}, data.test_auc(theta))
    if args.out is not None:
        atomic_write_json(args.out, {
            "benchmark": "dlrm_one_pass", "command": [sys.executable, *sys.argv], "data": str(args.data),
            "synth": meta.get("synth"), "best_auc_test": best, "batch_size": args.batch_size, "steps": steps,
            "train_rows": len(data.labels), "seed": args.seed, "runs": runs,
            "seconds": round(time.perf_counter() - t0, 1)})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
