"""Datasets: the rows of a preprocessed dataset (npy shards or parquet files), the Kaggle split, vocabularies.

:func:`open_dataset` is the one entry point: it reads the metadata of an npy dataset (``preprocess``/``synth``)
or the columns of a parquet dataset (:mod:`.parquet`, which returns plain arrays) and wraps them in a
:class:`CriteoDataset`. The loaders (:mod:`.loader`, :mod:`.device`) import this module; it imports neither.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .batch import Batch
from .parquet import read_parquet
from .shards import COLUMNS, read_metadata

__all__ = ["Chunk", "CriteoDataset", "kaggle_split", "load_vocabs", "open_dataset"]


def kaggle_split(num_rows: int, days: int = 7) -> dict[str, tuple[int, int]]:
    """facebookresearch/dlrm's Kaggle split, as row ranges ``[start, stop)`` of the file order.

    The rows are cut into ``days`` = 7 consecutive "days" of ``num_rows // 7`` rows, the first
    ``num_rows % 7`` days one row longer. The first 6 days are the train split; the last day is cut
    in two with ``np.array_split``: its first half (the longer one when odd) is ``test``, the rest ``val``.
    (The reference then shuffles the train rows; our loader shuffles per epoch.)
    """
    if num_rows < days:
        raise ValueError(f"the Kaggle split needs at least {days} rows, got {num_rows}")
    per_day, extras = divmod(num_rows, days)
    sizes = [per_day + (1 if d < extras else 0) for d in range(days)]
    train_stop = sum(sizes[:-1])
    last = sizes[-1]
    test_stop = train_stop + (last + 1) // 2
    return {"train": (0, train_stop), "test": (train_stop, test_stop), "val": (test_stop, num_rows),
            "all": (0, num_rows)}


class Chunk:
    """One shard: its columns as memory maps (npy) or in-memory arrays (parquet)."""

    def __init__(self, arrays: dict[str, np.ndarray], paths: dict[str, Path] | None = None):
        self.arrays = arrays
        self.paths = paths or {}
        self.rows = len(arrays["labels"])

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Copy rows [start, stop) of column ``name`` into ``out`` (C-contiguous, right shape)."""
        src = self.arrays[name]
        path = self.paths.get(name)
        if path is not None and isinstance(src, np.memmap) and hasattr(os, "preadv"):
            row_bytes = src.strides[0]
            view = memoryview(out).cast("B")
            offset = src.offset + start * row_bytes
            fd = os.open(path, os.O_RDONLY)
            try:
                done = 0
                while done < view.nbytes:
                    got = os.preadv(fd, [view[done:]], offset + done)
                    if got <= 0:
                        raise OSError(f"short read from {path}")
                    done += got
            finally:
                os.close(fd)
        else:
            np.copyto(out, src[start:stop])


class CriteoDataset:
    """Rows of a preprocessed dataset: ``dense`` [N, 13] float32, ``sparse`` [N, F] int64, ``labels`` [N]."""

    def __init__(self, chunks: list[Chunk], meta: dict[str, Any]):
        if not chunks:
            raise ValueError("dataset has no rows")
        self.chunks = chunks
        self.meta = meta
        self.offsets = np.cumsum([0] + [c.rows for c in chunks])
        self.num_sparse = chunks[0].arrays["sparse"].shape[1]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def cardinalities(self) -> list[int]:
        return [int(n) for n in self.meta["cardinalities"]]

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[Chunk, int, int, int]]:
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows [{start}, {stop}) outside [0, {len(self)})")
        k = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pos = start
        while pos < stop:
            chunk, base = self.chunks[k], int(self.offsets[k])
            end = min(stop, base + chunk.rows)
            yield chunk, pos - base, end - base, pos - start
            pos = end
            k += 1

    def read_column_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        for chunk, a, b, at in self._pieces(start, stop):
            chunk.read_into(name, a, b, out[at: at + b - a])

    def read_column(self, name: str, start: int, stop: int) -> np.ndarray:
        first = self.chunks[0].arrays[name]
        out = np.empty((stop - start, *first.shape[1:]), dtype=first.dtype)
        self.read_column_into(name, start, stop, out)
        return out

    def read(self, start: int, stop: int) -> Batch:
        """Rows [start, stop) as a CPU :class:`Batch`."""
        return Batch(*(torch.from_numpy(self.read_column(c, start, stop)) for c in COLUMNS))

    def take(self, rows: np.ndarray) -> Batch:
        """Arbitrary rows (sorted for locality by the caller) as a CPU :class:`Batch`."""
        which = np.searchsorted(self.offsets, rows, side="right") - 1
        cols = []
        for name in COLUMNS:
            first = self.chunks[0].arrays[name]
            out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
            for k in np.unique(which):
                sel = which == k
                out[sel] = self.chunks[k].arrays[name][rows[sel] - self.offsets[k]]
            cols.append(torch.from_numpy(out))
        return Batch(*cols)


def _open_npy(root: Path, meta: dict[str, Any]) -> CriteoDataset:
    meta = {**meta, "root": str(root)}
    chunks = []
    for shard in meta["shards"]:
        arrays, paths = {}, {}
        for name in (*COLUMNS, "truth"):
            path = root / "shards" / f"{shard['name']}.{name}.npy"
            if not path.is_file():
                if name == "truth":
                    continue
                raise FileNotFoundError(f"shard file {path} is missing (incomplete preprocessing?)")
            arrays[name] = np.load(path, mmap_mode="r")
            paths[name] = path
        if len(arrays["labels"]) != shard["rows"]:
            raise ValueError(f"shard {shard['name']}: {len(arrays['labels'])} rows, metadata says {shard['rows']}")
        chunks.append(Chunk(arrays, paths))
    return CriteoDataset(chunks, meta)


def open_dataset(path: str | Path) -> CriteoDataset:
    """Open a dataset directory: npy shards (``preprocess``/``synth``) or parquet files + a metadata JSON.

    Raises ``NotADirectoryError`` for a missing path, ``ValueError`` for a file that is not a dataset (a TSV
    file must be preprocessed first; the message says how) or an unsupported format.
    """
    root = Path(path)
    if root.suffix == ".parquet" or (root.is_dir() and any(root.glob("*.parquet"))):
        arrays, meta = read_parquet(root)
        return CriteoDataset([Chunk(a) for a in arrays], meta)
    if root.is_file():
        raise ValueError(f"{root} is a file, not a dataset directory: make one with `fuselab dlrm preprocess "
                         f"{root} --out DIR` (Criteo TSV) and pass --data DIR")
    meta = read_metadata(root)
    if meta.get("format") != "fuselab-dlrm-npy":
        raise ValueError(f"{root}: unsupported dataset format {meta.get('format')!r} (TSV must be preprocessed "
                         "first: `fuselab dlrm preprocess`)")
    return _open_npy(root, meta)


def load_vocabs(root: str | Path, num_sparse: int) -> list[np.ndarray]:
    folder = Path(root) / "vocab"
    vocabs = []
    for t in range(num_sparse):
        path = folder / f"C{t + 1}.npy"
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing: preprocess the data with a vocabulary (it always writes one)")
        vocabs.append(np.load(path))
    return vocabs
