"""What one epoch on the Kaggle train split can reach: test AUC of oracle predictors of the synthetic generator.

The generator's label model (``fuselab.dlrm.data.synth``) is ``logit = bias + dense_term + Σ_f id_term_f``, with
an independent random effect per (feature, id). The effect of an id that never occurs in the train split carries
no information a model could learn from that split. Oracles, each the AUC of its logit on the test split:

* ``true``: the true logit (the generator's best AUC, ``best_auc_test`` in the dataset's metadata);
* ``seen>=k``: bias + the true dense term + the true id terms of the (feature, id) pairs that occur at least ``k``
  times in the train split (0 for the others); ``k = 1`` bounds what any model trained on that split can learn
  of the id effects, larger ``k`` shows how much rests on rare ids;
* ``estimated``: bias + the true dense term + each id term estimated from the train split's labels with every other
  term of the logit known: its MAP under the true prior (Gaussian of the term's variance), ``--newton-steps``
  Newton steps from 0 (3 reach the optimum to 1e-6 in AUC at full scale): what an ideal learner that knows
  everything but the id effects makes of the train labels, a realistic ceiling for a trained model;
* ``dense only``: bias + the true dense term (no id effect at all).

``coverage`` is the share of the id terms' variance in the test rows that the oracle keeps: Σ over test lookups
of ``s_f²`` for the kept pairs over the same sum for all (``s_f`` the feature's effect weight).

The rows are regenerated in memory shard by shard with the generator's own functions (``generate_shard``), so
they are the rows ``fuselab dlrm synth --rows R --scale S --seed N --shard-rows K`` writes. Memory: one shard
(about 1 GB at 2^20 rows), per embedding row an int32 count and three float64 arrays (about 0.9 GB at full scale), the
test split's terms.

    python3 benchmarks/dlrm_oracle_auc.py --rows 8000000 --scale 1.0 --out benchmarks/results/cpu/dlrm_oracle_auc.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fuselab._io import atomic_write_json, writable_file
from fuselab.dlrm.data.datasets import kaggle_split
from fuselab.dlrm.data.synth import HiddenModel, SynthSpec, generate_shard, hidden_model, logit_parts
from fuselab.dlrm.metrics import roc_auc

THRESHOLDS = (1, 2, 3, 5, 10)


def _overlap(lo: int, hi: int, start: int, stop: int) -> tuple[int, int]:
    """Rows [lo, hi) of the dataset that fall in the shard [start, stop), as shard-local indices."""
    a, b = max(lo, start), min(hi, stop)
    return (a - start, b - start) if a < b else (0, 0)


class _TrainStats:
    """Per (feature, id) over the train split: occurrences, and the MAP estimate of the id's term with every other
    term of the logit known (Newton steps from 0 on the train rows' log-likelihood plus a Gaussian prior of the
    term's true variance, ``(signal · s_f)²``: g has unit variance)."""

    def __init__(self, spec: SynthSpec, model: HiddenModel):
        self.spec, self.model = spec, model
        self.counts = [np.zeros(card, dtype=np.int32) for card in model.cardinalities]
        self.theta = [np.zeros(card if w else 0) for card, w in zip(model.cardinalities, model.params["sparse_w"])]
        self.prior_precision = [1.0 / (spec.signal * w) ** 2 if w else 0.0 for w in model.params["sparse_w"]]
        self._sums: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, data: dict[str, np.ndarray], a: int, b: int, count: bool) -> None:
        """Rows [a, b) of a shard: the residual and curvature sums of this Newton step (and the counts)."""
        sparse, labels, logit = data["sparse"][a:b], data["labels"][a:b], data["logit"][a:b]
        _, id_terms = logit_parts(self.spec, self.model, data["dense"][a:b], sparse)
        if not self._sums:
            self._sums = [(np.zeros_like(t), np.zeros_like(t)) for t in self.theta]
        for f, theta in enumerate(self.theta):
            ids = sparse[:, f]
            if count:
                self.counts[f] += np.bincount(ids, minlength=len(self.counts[f])).astype(np.int32)
            if len(theta):
                p = 1.0 / (1.0 + np.exp(id_terms[:, f] - logit - theta[ids]))  # the term replaced by its estimate
                residual, curvature = self._sums[f]
                residual += np.bincount(ids, labels - p, minlength=len(theta))
                curvature += np.bincount(ids, p * (1.0 - p), minlength=len(theta))

    def newton_update(self) -> None:
        for f, (residual, curvature) in enumerate(self._sums):
            if len(residual):
                precision = self.prior_precision[f]
                self.theta[f] += (residual - precision * self.theta[f]) / (curvature + precision)
        self._sums = []

    def estimated_terms(self, sparse: np.ndarray) -> np.ndarray:
        """[n, F] the current estimates of the id terms of rows with these ids."""
        out = np.zeros(sparse.shape)
        for f, theta in enumerate(self.theta):
            if len(theta):
                out[:, f] = theta[sparse[:, f]]
        return out


def collect(spec: SynthSpec, shard_rows: int, newton_steps: int = 3, log=print) -> dict[str, Any]:
    """Train-split statistics per (feature, id), and the test split's labels, terms and ids; one pass over the
    rows per Newton step (the first also keeps the test split and counts)."""
    model = hidden_model(spec)
    split = kaggle_split(spec.rows)
    stats = _TrainStats(spec, model)
    test: dict[str, list[np.ndarray]] = {"labels": [], "logit": [], "dense_term": [], "id_terms": [], "sparse": []}
    worst = 0.0
    for step in range(newton_steps):
        for index, start in enumerate(range(0, spec.rows, shard_rows)):
            stop = min(start + shard_rows, spec.rows)
            a, b = _overlap(*split["train"], start, stop)
            c, d = _overlap(*split["test"], start, stop) if step == 0 else (0, 0)
            if b <= a and d <= c:
                continue
            data = generate_shard(spec, model, index, stop - start)
            if b > a:
                stats.add(data, a, b, count=step == 0)
            if d > c:
                dense_term, id_terms = logit_parts(spec, model, data["dense"][c:d], data["sparse"][c:d])
                worst = max(worst, float(np.abs(model.bias + dense_term + id_terms.sum(1) - data["logit"][c:d]).max()))
                for key, value in (("labels", data["labels"][c:d]), ("logit", data["logit"][c:d]),
                                   ("dense_term", dense_term), ("id_terms", id_terms), ("sparse", data["sparse"][c:d])):
                    test[key].append(value)
            log(f"Newton step {step + 1}/{newton_steps}: shard {index}, rows {start:,}-{stop:,}")
        stats.newton_update()
    if worst > 1e-9:
        raise RuntimeError(f"logit_parts does not rebuild the generator's logit (max error {worst:.3g})")
    out = {key: np.concatenate(parts) for key, parts in test.items()}
    out["counts"], out["model"], out["split"] = stats.counts, model, split
    out["estimated_terms"] = stats.estimated_terms(out["sparse"])
    return out


def oracles(collected: dict[str, Any], thresholds: tuple[int, ...] = THRESHOLDS) -> list[dict[str, Any]]:
    """One row per oracle: name, k (None but for seen>=k), test AUC, coverage, share of test lookups whose pair
    is kept."""
    labels = torch.from_numpy(collected["labels"])
    sparse, id_terms = collected["sparse"], collected["id_terms"]
    base = collected["model"].bias + collected["dense_term"]
    weight2 = collected["model"].params["sparse_w"] ** 2
    seen = np.stack([collected["counts"][f][sparse[:, f]] for f in range(sparse.shape[1])], axis=1)
    total_var = float(weight2.sum()) * len(labels)

    def row(name: str, k: int | None, logit: np.ndarray, kept: np.ndarray) -> dict[str, Any]:
        coverage = float((kept * weight2).sum()) / total_var if total_var else float("nan")
        return {"oracle": name, "k": k, "auc": roc_auc(torch.from_numpy(logit), labels),
                "coverage": coverage, "lookups_kept": float(kept[:, weight2 > 0].mean())}

    rows = [row("true", None, collected["logit"], np.ones_like(seen, dtype=bool))]
    for k in thresholds:
        kept = seen >= k
        rows.append(row(f"seen>={k}", k, base + (id_terms * kept).sum(1), kept))
    rows.append(row("estimated", None, base + collected["estimated_terms"].sum(1), seen >= 1))
    rows.append(row("dense only", None, base, np.zeros_like(seen, dtype=bool)))
    return rows


def table(rows: list[dict[str, Any]], best: float) -> str:
    lines = [f"{'oracle':<12} {'test AUC':>9} {'gap':>7} {'coverage':>9} {'lookups kept':>13}"]
    for r in rows:
        lines.append(f"{r['oracle']:<12} {r['auc']:>9.4f} {best - r['auc']:>7.4f} {r['coverage']:>9.3f} "
                     f"{r['lookups_kept']:>13.3f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8_000_000)
    p.add_argument("--scale", type=float, default=1.0, help="times the Kaggle cardinalities")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-rows", type=int, default=1 << 20, help="as given to `fuselab dlrm synth`")
    p.add_argument("--thresholds", type=int, nargs="+", default=list(THRESHOLDS), help="the k of seen>=k")
    p.add_argument("--newton-steps", type=int, default=3, help="of the estimated oracle (one pass each)")
    p.add_argument("--out", type=Path, help="JSON file to write")
    args = p.parse_args(argv)
    if args.rows < 7 or args.shard_rows <= 0 or args.newton_steps < 1 or any(k < 1 for k in args.thresholds):
        p.error("--rows must be >= 7 (the Kaggle split); --shard-rows, --newton-steps and --thresholds positive")
    if args.out is not None:
        try:
            writable_file(args.out, "--out file")
        except ValueError as exc:
            p.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    spec = SynthSpec(rows=args.rows, scale=args.scale, seed=args.seed)
    try:
        spec.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    collected = collect(spec, args.shard_rows, args.newton_steps,
                        log=lambda msg: print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True))
    rows = oracles(collected, tuple(args.thresholds))
    best = rows[0]["auc"]
    split = collected["split"]
    print(f"{args.rows:,} rows, scale {args.scale}, seed {args.seed}: train rows {split['train'][1]:,}, test rows "
          f"{split['test'][1] - split['test'][0]:,}, embedding rows {sum(collected['model'].cardinalities):,}")
    print(table(rows, best))
    if args.out is not None:
        atomic_write_json(args.out, {
            "benchmark": "dlrm_oracle_auc", "command": [sys.executable, *sys.argv],
            "spec": {"rows": args.rows, "scale": args.scale, "seed": args.seed, "shard_rows": args.shard_rows},
            "newton_steps": args.newton_steps,
            "train_rows": split["train"][1] - split["train"][0], "test_rows": split["test"][1] - split["test"][0],
            "embedding_rows": sum(collected["model"].cardinalities), "oracles": rows,
            "seconds": round(time.perf_counter() - t0, 1)})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
