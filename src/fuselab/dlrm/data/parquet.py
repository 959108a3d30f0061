"""The parquet + metadata JSON format of the reference material.

A directory of ``*.parquet`` files (read in name order) with columns ``labels``, ``DENSE_0..DENSE_12`` and
``SPARSE_0..SPARSE_{F-1}`` (the numeric suffix orders them), plus an optional ``metadata.json``:

* ``cardinalities`` (or ``table_sizes``): rows per table; default ``max(id) + 1`` per sparse column;
* ``dense_log_transformed``: true when the dense columns already hold log(x + 1) values. Default: integer
  dense columns are raw counts (clamped at 0, then log(x + 1)), float columns are taken as they are.

Sparse ids must be non-negative integers. The columns are loaded into memory (this format is for data that
fits; convert larger sets with ``preprocess``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from fuselab._io import read_json

from .shards import dense_transform


def _ordered(names: list[str], prefix: str) -> list[str]:
    found = [(int(m.group(1)), n) for n in names if (m := re.fullmatch(rf"{prefix}_?(\d+)", n))]
    return [n for _, n in sorted(found)]


def read_parquet(path: str | Path) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """Columns of a parquet dataset directory (or of one ``.parquet`` file) and its metadata.

    Returns one ``{"dense", "sparse", "labels"}`` dict of arrays per file (name order) and the metadata
    (``cardinalities``, ``num_rows``, ``shards``, ...). Raises ``FileNotFoundError`` when there are no parquet files,
    ``ValueError`` for missing columns, negative ids or a cardinality list of the wrong length.
    """
    import pyarrow.parquet as pq

    root = Path(path)
    files = sorted(root.glob("*.parquet")) if root.is_dir() else [root]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no .parquet files in {root}")
    folder = root if root.is_dir() else root.parent
    meta: dict[str, Any] = {}
    if (folder / "metadata.json").is_file():
        meta = read_json(folder / "metadata.json", "parquet metadata")
    chunks = []
    maxima: np.ndarray | None = None
    for file in files:
        table = pq.read_table(file)
        names = table.column_names
        dense_names, sparse_names = _ordered(names, "DENSE"), _ordered(names, "SPARSE")
        if "labels" not in names or len(dense_names) != 13 or not sparse_names:
            raise ValueError(f"{file}: expected columns labels, DENSE_0..DENSE_12, SPARSE_*; got {names[:8]}...")
        labels = table.column("labels").to_numpy().astype(np.float32)
        dense_cols = [table.column(n).to_numpy() for n in dense_names]
        is_int = np.issubdtype(dense_cols[0].dtype, np.integer)
        dense = np.stack(dense_cols, axis=1)
        already = meta.get("dense_log_transformed", not is_int)
        dense = dense.astype(np.float32) if already else dense_transform(dense)
        sparse = np.stack([table.column(n).to_numpy().astype(np.int64) for n in sparse_names], axis=1)
        if len(sparse) and sparse.min() < 0:
            raise ValueError(f"{file}: sparse ids must be non-negative")
        col_max = sparse.max(axis=0) if len(sparse) else np.zeros(sparse.shape[1], np.int64)
        maxima = col_max if maxima is None else np.maximum(maxima, col_max)
        chunks.append({"dense": np.ascontiguousarray(dense), "sparse": sparse, "labels": labels})
    cards = meta.get("cardinalities", meta.get("table_sizes"))
    if cards is None:
        cards = [int(m) + 1 for m in maxima]
    if len(cards) != chunks[0]["sparse"].shape[1]:
        raise ValueError(f"metadata lists {len(cards)} cardinalities for {chunks[0]['sparse'].shape[1]} "
                         "sparse columns")
    rows = sum(len(c["labels"]) for c in chunks)
    full = {**meta, "format": "parquet", "root": str(folder), "num_rows": rows,
            "cardinalities": [int(c) for c in cards],
            "shards": [{"name": f.name, "rows": len(c["labels"])} for f, c in zip(files, chunks)]}
    return chunks, full
