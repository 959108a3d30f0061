"""The binary columnar dataset format written by ``preprocess`` and ``synth``.

A dataset is a directory::

    metadata.json                       format, num_rows, cardinalities, shards, counts, ...
    shards/<name>.dense.npy             [n, 13] float32, already clamped at 0 and log(x+1)-transformed
    shards/<name>.sparse.npy            [n, 26] int64 raw categorical ids (hex parsed; missing = 0)
    shards/<name>.labels.npy            [n] float32 in {0, 1}
    shards/<name>.truth.npy             [n] float32 (synthetic only: the hidden model's logit)
    vocab/C<k>.npy                      (preprocess only) sorted raw ids seen >= min_count times

Rows are in file order; shards are listed in order in ``metadata.json``. Files are written to a
temporary name and renamed, so a shard that exists is complete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fuselab._io import atomic_write, atomic_write_text, json_safe, read_json

FORMAT = "fuselab-dlrm-npy"
METADATA = "metadata.json"
COLUMNS = ("dense", "sparse", "labels")

#: categorical cardinalities of the Criteo Kaggle display-advertising set (facebookresearch/dlrm's counts)
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` atomically (:func:`fuselab._io.atomic_write`: never a half-written file)."""
    atomic_write(path, lambda f: np.save(f, array), "shard file", size_hint=array.nbytes + 4096)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as strict JSON (NaN as null; numpy scalars and arrays as numbers and lists), atomically."""
    text = json.dumps(json_safe(data), indent=1, default=_json_default, allow_nan=False) + "\n"
    atomic_write_text(path, text, "metadata file")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return json_safe(float(obj))
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def write_shard(root: Path, name: str, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
                **extra: np.ndarray) -> dict[str, Any]:
    """Write one shard's columns (labels last: its presence marks the shard complete)."""
    n = len(labels)
    if dense.shape != (n, 13) or sparse.ndim != 2 or sparse.shape[0] != n:
        raise ValueError(f"shard {name}: inconsistent shapes dense {dense.shape}, sparse {sparse.shape}, labels {n}")
    folder = root / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    save_npy_atomic(folder / f"{name}.dense.npy", np.ascontiguousarray(dense, dtype=np.float32))
    save_npy_atomic(folder / f"{name}.sparse.npy", np.ascontiguousarray(sparse, dtype=np.int64))
    for key, value in extra.items():
        save_npy_atomic(folder / f"{name}.{key}.npy", np.ascontiguousarray(value))
    save_npy_atomic(folder / f"{name}.labels.npy", np.ascontiguousarray(labels, dtype=np.float32))
    return {"name": name, "rows": int(n)}


def read_metadata(root: str | Path) -> dict[str, Any]:
    root = Path(root)
    path = root / METADATA
    if root.is_file():
        raise NotADirectoryError(f"{root} is a file, not a dataset directory (make one with `fuselab dlrm "
                                 "preprocess` or `fuselab dlrm synth`)")
    if not root.is_dir():
        raise NotADirectoryError(f"dataset directory {root} does not exist")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a dataset directory (run `fuselab dlrm preprocess` or "
                                "`fuselab dlrm synth` first)")
    return read_json(path, "dataset metadata")


def dense_transform(values: np.ndarray) -> np.ndarray:
    """Criteo dense preprocessing: clamp at 0, then log(x + 1), as float32."""
    return np.log1p(np.maximum(values, 0).astype(np.float64)).astype(np.float32)
