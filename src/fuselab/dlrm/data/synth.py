"""Synthetic Criteo-format data from a seeded generator whose best achievable AUC is known.

Generator (everything vectorised numpy; shard ``k`` uses ``default_rng([seed, k])``, so the output does not
depend on the number of worker processes):

* categorical ids: a bounded power law (continuous Zipf, exponent ``zipf_alpha``) over each feature's
  cardinality (the Kaggle cardinalities times ``scale``), rank scrambled by a bijection mod n;
* dense features: count-like ``floor(exp(N(mu_j, sigma_j))) - 1`` (feature 2 can be -1 like Criteo's I2),
  missing with a per-feature probability (empty in TSV, 0 after the transform);
* labels: Bernoulli(sigmoid(logit)), the hidden model
  ``logit = bias + signal * (Σ_j a_j·log1p(max(x_j, 0)) + Σ_f s_f·g(f, id_f))`` with ``g`` a hash of (feature,
  id) mapped to a unit-variance uniform, and ``bias`` calibrated to ``positive_rate`` (25.6% by default);
* multi-hot (``multi_hot_sizes``, MLPerf's DLRM-DCNv2 data): feature ``f`` draws a bag of ``n_f`` ids per row
  (stored as ``n_f`` columns, table order); its term is ``s_f·Σ g(f, id) / sqrt(n_f)`` over the bag. npy only.

The true logit of every row is stored (``truth`` column, npy format), so the best achievable AUC, the AUC of the
true probabilities on the data, is exact; it is written to the metadata for all rows and for the Kaggle test split
(in the TSV formats it is computed from the logits in memory, which are not written). Every file is written
atomically (:mod:`fuselab._io`); the output folder is checked for writing before anything is generated.

For analyses of the hidden model (``benchmarks/dlrm_oracle_auc.py``): :func:`hidden_model` (table sizes, parameters,
bias of a spec), :func:`generate_shard` (a shard's rows in memory, the same as written) and :func:`logit_parts` (the
true logit split into its dense term and one term per feature).
"""

from __future__ import annotations

import gzip
import io
import multiprocessing as mp
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuselab._io import atomic_write, atomic_write_json, writable_dir

from .shards import FORMAT, KAGGLE_CARDINALITIES, METADATA, dense_transform, write_shard
from .textin import os_errors_as_path_errors

_SCRAMBLE = 2654435761  # a prime larger than any cardinality: id -> id * P mod n is a bijection


@dataclass
class SynthSpec:
    rows: int = 200_000
    scale: float = 1e-3
    seed: int = 0
    positive_rate: float = 0.256
    zipf_alpha: float = 1.2
    signal: float = 1.0
    cardinalities: tuple[int, ...] | None = None  # default: Kaggle's times scale
    #: ids per sample of each table (fixed-size multi-hot bags, npy format only); None: one id per table
    multi_hot_sizes: tuple[int, ...] | None = None

    def validate(self) -> SynthSpec:
        if self.rows <= 0:
            raise ValueError(f"rows must be positive, got {self.rows}")
        if not 0 < self.scale <= 1:
            raise ValueError(f"scale must be in (0, 1], got {self.scale}")
        if not 0 < self.positive_rate < 1:
            raise ValueError(f"positive_rate must be in (0, 1), got {self.positive_rate}")
        if self.zipf_alpha <= 0:
            raise ValueError(f"zipf_alpha must be positive, got {self.zipf_alpha}")
        if self.multi_hot_sizes is not None and (len(self.multi_hot_sizes) != len(self.table_cardinalities())
                                                 or any(int(n) < 1 for n in self.multi_hot_sizes)):
            raise ValueError(f"multi_hot_sizes must be {len(self.table_cardinalities())} positive ints (one per "
                             f"table), got {list(self.multi_hot_sizes)[:8]}")
        return self

    def table_cardinalities(self) -> list[int]:
        if self.cardinalities is not None:
            return [int(n) for n in self.cardinalities]
        return [max(2, round(n * self.scale)) for n in KAGGLE_CARDINALITIES]

    def bag_sizes(self) -> list[int]:
        """Ids per sample of each table (1 each without ``multi_hot_sizes``)."""
        cards = self.table_cardinalities()
        return [1] * len(cards) if self.multi_hot_sizes is None else [int(n) for n in self.multi_hot_sizes]


def _hidden_params(seed: int, num_sparse: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 1 << 30])
    return {
        "mu": rng.uniform(0.0, 4.0, 13),
        "sigma": rng.uniform(0.5, 2.0, 13),
        "missing": rng.choice([0.0, 0.05, 0.2, 0.45], 13),
        "dense_w": rng.normal(0.0, 0.15, 13),
        "sparse_w": rng.uniform(0.1, 0.6, num_sparse) * (rng.uniform(size=num_sparse) < 0.8),
    }


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _id_effect(feature: int, ids: np.ndarray, seed: int) -> np.ndarray:
    """g(f, id): a fixed pseudo-random unit-variance value per (seed, feature, id), from a hash."""
    key = ids.astype(np.uint64) * np.uint64(64) + np.uint64(feature) + np.uint64(seed) * np.uint64(0x1000193)
    unit = (_splitmix(key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return (unit - 0.5) * np.sqrt(12.0)


def _generate(spec: SynthSpec, cards: list[int], params: dict[str, np.ndarray], rng: np.random.Generator,
              n: int, bias: float) -> dict[str, np.ndarray]:
    """n rows: raw dense counts (NaN = missing), ids, true logits (without labels when bias is NaN)."""
    raw = np.floor(np.exp(rng.normal(params["mu"], params["sigma"], (n, 13)))) - 1.0
    raw[:, 1] -= rng.integers(0, 2, n)  # Criteo's I2 goes down to -1
    raw[rng.uniform(size=(n, 13)) < params["missing"]] = np.nan
    dense = dense_transform(np.nan_to_num(raw, nan=0.0))
    logit = dense.astype(np.float64) @ params["dense_w"]
    bags = spec.bag_sizes()
    sparse = np.empty((n, sum(bags)), dtype=np.int64)
    a = 1.0 - spec.zipf_alpha
    col = 0
    for f, (card, size) in enumerate(zip(cards, bags)):
        u = rng.uniform(size=(n, size))
        if abs(a) < 1e-9:
            x = np.exp(u * np.log(card + 1.0))
        else:
            x = (u * ((card + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
        rank = np.minimum(x.astype(np.int64) - 1, card - 1)
        ids = (rank * _SCRAMBLE) % card
        sparse[:, col: col + size] = ids
        col += size
        if params["sparse_w"][f] != 0:  # a bag of s ids: their effects summed / sqrt(s) (unit variance as one id)
            logit += params["sparse_w"][f] * (_id_effect(f, ids, spec.seed).sum(1) / np.sqrt(size))
    logit *= spec.signal
    return {"raw": raw, "dense": dense, "sparse": sparse, "logit": logit + bias}


def _calibrate_bias(spec: SynthSpec, cards: list[int], params: dict[str, np.ndarray]) -> float:
    sample = _generate(spec, cards, params, np.random.default_rng([spec.seed, 1 << 31]), 200_000, 0.0)["logit"]
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        rate = np.mean(1.0 / (1.0 + np.exp(-(sample + mid))))
        lo, hi = (mid, hi) if rate < spec.positive_rate else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class HiddenModel:
    """The generator's hidden model of a spec: table sizes, parameters, and the bias calibrated to the positive
    rate."""

    cardinalities: list[int]
    params: dict[str, np.ndarray]
    bias: float


def hidden_model(spec: SynthSpec) -> HiddenModel:
    """The hidden model of ``spec`` (validated first: ``ValueError`` for a bad spec)."""
    spec = spec.validate()
    cards = spec.table_cardinalities()
    params = _hidden_params(spec.seed, len(cards))
    return HiddenModel(cards, params, _calibrate_bias(spec, cards, params))


def generate_shard(spec: SynthSpec, model: HiddenModel, index: int, n: int) -> dict[str, np.ndarray]:
    """Rows of shard ``index`` (``n`` of them), exactly as :func:`write_synthetic` writes them: ``raw`` dense
    counts (NaN = missing), ``dense`` (transformed), ``sparse`` ids, ``logit`` (float64, the true logit) and
    ``labels`` (float32 draws of Bernoulli(sigmoid(logit)))."""
    rng = np.random.default_rng([spec.seed, index])
    data = _generate(spec, model.cardinalities, model.params, rng, n, model.bias)
    data["labels"] = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-data["logit"]))).astype(np.float32)
    return data


def logit_parts(spec: SynthSpec, model: HiddenModel, dense: np.ndarray, sparse: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The true logit of rows split into its terms: ``(dense_term [n], id_terms [n, F])`` (float64) with
    ``logit = bias + dense_term + id_terms.sum(1)`` (the signal factor included in both terms); a feature
    without an effect has a zero column."""
    dense_term = spec.signal * (dense.astype(np.float64) @ model.params["dense_w"])
    bags = spec.bag_sizes()
    id_terms = np.zeros((sparse.shape[0], len(bags)), dtype=np.float64)
    col = 0
    for f, (weight, size) in enumerate(zip(model.params["sparse_w"], bags)):
        if weight != 0:
            effect = _id_effect(f, sparse[:, col: col + size], spec.seed).sum(1) / np.sqrt(size)
            id_terms[:, f] = spec.signal * weight * effect
        col += size
    return dense_term, id_terms


def _shard_job(job: tuple) -> dict[str, Any]:
    spec, model, index, start, n, root, fmt = job
    data = generate_shard(spec, model, index, n)
    labels = data["labels"]
    name = f"part-{index:05d}"
    if fmt == "npy":
        write_shard(Path(root), name, data["dense"], data["sparse"], labels, truth=data["logit"].astype(np.float32))
        return {"name": name, "rows": n, "positives": int(labels.sum()), "start": start}
    _write_tsv(Path(root) / f"{name}.{fmt}", labels, data["raw"], data["sparse"])
    return {"name": name, "rows": n, "positives": int(labels.sum()), "start": start,
            "truth": data["logit"].astype(np.float32), "labels": labels}


def _write_tsv(path: Path, labels: np.ndarray, raw: np.ndarray, sparse: np.ndarray) -> None:
    n = len(labels)
    cols = [labels.astype(np.int64).astype(str)]
    for j in range(13):
        col = raw[:, j]
        text = np.where(np.isnan(col), "", np.nan_to_num(col, nan=0).astype(np.int64).astype(str))
        cols.append(text)
    for f in range(sparse.shape[1]):
        cols.append(np.char.mod("%08x", sparse[:, f]))
    lines = cols[0].astype(object)
    for col in cols[1:]:
        lines = lines + "\t" + col.astype(object)
    data = ("\n".join(lines.tolist()) + ("\n" if n else "")).encode()

    def write(f: io.BufferedIOBase) -> None:
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:
                z.write(data)
        else:
            f.write(data)

    atomic_write(path, write, "TSV file")


def _truth_auc(truth: np.ndarray, labels: np.ndarray) -> float:
    import torch

    from ..metrics import roc_auc

    return roc_auc(torch.from_numpy(truth), torch.from_numpy(labels))


def synthetic_truth_auc(root: str | Path, start: int = 0, stop: int | None = None) -> float:
    """AUC of the stored true logits on rows [start, stop) of an npy synthetic dataset."""
    from .loader import open_dataset

    ds = open_dataset(root)
    stop = len(ds) if stop is None else stop
    return _truth_auc(ds.read_column("truth", start, stop), ds.read_column("labels", start, stop))


def write_synthetic(out: str | Path, spec: SynthSpec | None = None, fmt: str = "npy", shard_rows: int = 1 << 20,
                    workers: int = 0, progress: bool = False) -> dict[str, Any]:
    """Generate ``spec.rows`` rows into ``out`` (npy shards + metadata.json, or TSV/TSV.gz files).

    Returns the metadata. ``workers=0`` uses one process per core (at most 16). Raises ``ValueError`` for a bad
    spec or format, :class:`fuselab._io.PathError` (a ``ValueError`` naming the path) when ``out`` cannot be
    written, before any row is generated. ``best_auc`` / ``best_auc_test`` are NaN in the returned dict (``null``
    in metadata.json) only when the rows hold a single class.
    """
    with os_errors_as_path_errors("synth: cannot write"):
        return _write_synthetic(out, spec, fmt, shard_rows, workers, progress)


def _worker_signals() -> None:
    """A generator process ends on SIGTERM (how the pool stops it) whatever handler it inherited from its parent,
    and leaves Ctrl-C to the parent."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _write_synthetic(out: str | Path, spec: SynthSpec | None, fmt: str, shard_rows: int, workers: int,
                     progress: bool) -> dict[str, Any]:
    spec = (spec or SynthSpec()).validate()
    if fmt not in ("npy", "tsv", "tsv.gz"):
        raise ValueError(f"fmt must be npy, tsv or tsv.gz, got {fmt!r}")
    if fmt != "npy" and spec.multi_hot_sizes is not None:
        raise ValueError("multi-hot bags have no Criteo TSV form: write them as npy")
    if shard_rows <= 0:
        raise ValueError(f"shard_rows must be positive, got {shard_rows}")
    root = writable_dir(out, "output folder")
    if fmt == "npy":
        writable_dir(root / "shards", "output folder")
    model = hidden_model(spec)
    cards = model.cardinalities
    starts = list(range(0, spec.rows, shard_rows))
    jobs = [(spec, model, k, s, min(shard_rows, spec.rows - s), str(root), fmt) for k, s in enumerate(starts)]
    workers = workers or min(16, os.cpu_count() or 1)
    workers = max(1, min(workers, len(jobs)))
    results: list[dict[str, Any]] = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("synth", total=spec.rows)
        if workers == 1:
            for job in jobs:
                results.append(_shard_job(job))
                bar.advance(task, job[4])
        else:
            with mp.get_context("fork").Pool(workers, initializer=_worker_signals) as pool:
                for res in pool.imap(_shard_job, jobs):
                    results.append(res)
                    bar.advance(task, res["rows"])
    positives = sum(r["positives"] for r in results)
    meta: dict[str, Any] = {
        "format": FORMAT if fmt == "npy" else f"criteo-{fmt}",
        "source": "synth",
        "num_rows": spec.rows,
        "num_dense": 13,
        "num_sparse": len(cards),
        "cardinalities": cards,
        "positive_rate": positives / spec.rows,
        "shards": [{"name": r["name"], "rows": r["rows"]} for r in results],
        "synth": {**asdict(spec), "bias": model.bias, "cardinalities": cards},
    }
    if spec.multi_hot_sizes is not None:  # the sparse columns: each table's bag of ids, in table order
        meta["multi_hot_sizes"] = spec.bag_sizes()
    from .loader import kaggle_split

    test = kaggle_split(spec.rows)["test"] if spec.rows >= 7 else (0, spec.rows)
    if fmt == "npy":
        atomic_write_json(root / METADATA, meta, "metadata file", indent=1)
        meta["best_auc"] = synthetic_truth_auc(root)
        meta["best_auc_test"] = synthetic_truth_auc(root, test[0], test[1])
    else:  # the TSV holds the labels only: the AUC of the true logits, from memory
        truth = np.concatenate([r.pop("truth") for r in results])
        labels = np.concatenate([r.pop("labels") for r in results])
        meta["best_auc"] = _truth_auc(truth, labels)
        meta["best_auc_test"] = _truth_auc(truth[test[0]:test[1]], labels[test[0]:test[1]])
    atomic_write_json(root / METADATA, meta, "metadata file", indent=1)
    return meta
