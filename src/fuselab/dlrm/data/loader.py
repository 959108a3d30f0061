"""Datasets (npy shards, parquet), the Kaggle split, id hashing and the prefetching batch loader.

The loader reads contiguous row ranges of the shards with ``os.preadv`` straight into pinned host buffers
(no page-fault storm of a memory map, the GIL released during the read), copies them to the GPU on a side
CUDA stream from a background thread, and hands out batches whose copy has finished (a CUDA event the
compute stream waits on). ``prefetch`` batches are kept in flight.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..model import Batch
from .shards import COLUMNS, read_metadata

SPLITS = ("train", "test", "val", "all")


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


class _Chunk:
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

    def __init__(self, chunks: list[_Chunk], meta: dict[str, Any]):
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

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[_Chunk, int, int, int]]:
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
        chunks.append(_Chunk(arrays, paths))
    return CriteoDataset(chunks, meta)


def open_dataset(path: str | Path) -> CriteoDataset:
    """Open a dataset directory: npy shards (``preprocess``/``synth``) or parquet files + a metadata JSON."""
    root = Path(path)
    if root.suffix == ".parquet" or (root.is_dir() and any(root.glob("*.parquet"))):
        from .parquet import open_parquet

        return open_parquet(root)
    meta = read_metadata(root)
    if meta.get("format") != "fuselab-dlrm-npy":
        raise ValueError(f"{root}: unsupported dataset format {meta.get('format')!r} (TSV must be preprocessed "
                         "first: `fuselab dlrm preprocess`)")
    return _open_npy(root, meta)


class Hasher(nn.Module):
    """Raw categorical ids [B, F] int64 -> table rows [B, F] int64, on the ids' device.

    ``modulus``: ``id mod rows_t``. ``vocab``: position in the sorted vocabulary of feature t, plus 1; ids not
    in it (rarer than the preprocessing threshold) map to row 0; then ``mod rows_t`` (a no-op unless capped).
    """

    def __init__(self, table_sizes: list[int], mode: str = "modulus", vocabs: list[np.ndarray] | None = None):
        super().__init__()
        self.mode = mode
        self.register_buffer("sizes", torch.tensor(table_sizes, dtype=torch.int64), persistent=False)
        if mode == "vocab":
            if vocabs is None or len(vocabs) != len(table_sizes):
                raise ValueError("vocab hashing needs one sorted vocabulary array per feature")
            for t, v in enumerate(vocabs):
                self.register_buffer(f"vocab{t}", torch.from_numpy(np.asarray(v, dtype=np.int64)), persistent=False)
        elif mode != "modulus":
            raise ValueError(f"hashing must be 'modulus' or 'vocab', got {mode!r}")

    def forward(self, ids: Tensor) -> Tensor:
        if self.mode == "modulus":
            return torch.remainder(ids, self.sizes)
        cols = []
        for t in range(ids.shape[1]):
            vocab = getattr(self, f"vocab{t}")
            col = ids[:, t].contiguous()
            if vocab.numel() == 0:
                cols.append(torch.zeros_like(col))
                continue
            pos = torch.searchsorted(vocab, col).clamp_(max=vocab.numel() - 1)
            cols.append(torch.where(vocab[pos] == col, pos + 1, torch.zeros_like(pos)))
        return torch.remainder(torch.stack(cols, dim=1), self.sizes)


def load_vocabs(root: str | Path, num_sparse: int) -> list[np.ndarray]:
    folder = Path(root) / "vocab"
    vocabs = []
    for t in range(num_sparse):
        path = folder / f"C{t + 1}.npy"
        if not path.is_file():
            raise FileNotFoundError(f"{path} missing: preprocess the data with a vocabulary (it always writes one)")
        vocabs.append(np.load(path))
    return vocabs


class BatchLoader:
    """Batches of rows ``[start, stop)`` of a dataset, prefetched to ``device`` by a background thread.

    ``shuffle``: ``"batch"`` permutes the order of contiguous batches each epoch (fast reads), ``"row"`` permutes
    rows (gathers), ``"none"`` keeps file order. The order depends only on (seed, epoch), so a run resumed at
    ``start_batch`` sees the same batches. ``drop_last`` drops a final partial batch (static shapes).
    """

    def __init__(self, ds: CriteoDataset, start: int, stop: int, batch_size: int, device: torch.device | str = "cpu",
                 shuffle: str = "none", seed: int = 0, drop_last: bool = False, prefetch: int = 3):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if shuffle not in ("batch", "row", "none"):
            raise ValueError(f"shuffle must be batch, row or none, got {shuffle!r}")
        self.ds, self.start, self.stop = ds, start, stop
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.shuffle, self.seed, self.drop_last, self.prefetch = shuffle, seed, drop_last, max(0, prefetch)
        rows = stop - start
        self.num_batches = rows // batch_size if drop_last else -(-rows // batch_size)
        if self.num_batches == 0:
            raise ValueError(f"rows [{start}, {stop}) give no batch of {batch_size} (drop_last={drop_last})")

    def __len__(self) -> int:
        return self.num_batches

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(self.num_batches)
        perm = None
        if self.shuffle == "batch":
            order = rng.permutation(self.num_batches)
        elif self.shuffle == "row":
            perm = rng.permutation(self.stop - self.start) + self.start
        return order, perm

    def _bounds(self, b: int) -> tuple[int, int]:
        a = self.start + b * self.batch_size
        return a, min(a + self.batch_size, self.stop)

    def epoch(self, epoch: int = 0, start_batch: int = 0) -> Iterator[Batch]:
        """Iterate the batches of ``epoch`` from position ``start_batch`` on ``device``."""
        order, perm = self._plan(epoch)
        todo = order[start_batch:]
        if self.prefetch == 0:
            for b in todo:
                yield self._host_batch(int(b), perm, None).to(self.device)
            return
        yield from self._prefetched(todo, perm)

    def _host_batch(self, b: int, perm: np.ndarray | None, slot: dict[str, np.ndarray] | None) -> Batch:
        a, z = self._bounds(b)
        if perm is not None:
            rows = np.sort(perm[a - self.start: z - self.start])
            return self.ds.take(rows)
        n = z - a
        if slot is None:
            return self.ds.read(a, z)
        for name in COLUMNS:
            self.ds.read_column_into(name, a, z, slot[name][:n])
        return Batch(*(torch.from_numpy(slot[name][:n]) for name in COLUMNS))

    def _prefetched(self, todo: np.ndarray, perm: np.ndarray | None) -> Iterator[Batch]:
        cuda = self.device.type == "cuda"
        out: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        slots: list[dict[str, Any]] = []
        if cuda:
            for _ in range(self.prefetch + 2):
                tensors = {
                    "dense": torch.empty((self.batch_size, 13), dtype=torch.float32).pin_memory(),
                    "sparse": torch.empty((self.batch_size, self.ds.num_sparse), dtype=torch.int64).pin_memory(),
                    "labels": torch.empty((self.batch_size,), dtype=torch.float32).pin_memory(),
                }
                slots.append({"np": {k: v.numpy() for k, v in tensors.items()}, "event": None})
            stream = torch.cuda.Stream(self.device)

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for i, b in enumerate(todo):
                    if stop.is_set():
                        return
                    if not cuda:
                        if not put((self._host_batch(int(b), perm, None), None)):
                            return
                        continue
                    slot = slots[i % len(slots)]
                    if slot["event"] is not None:
                        slot["event"].synchronize()  # the last copy out of this pinned slot is done
                    host = self._host_batch(int(b), perm, slot["np"] if perm is None else None)
                    if perm is not None:
                        host = host.pin_memory()
                    with torch.cuda.stream(stream):
                        dev = host.to(self.device, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(stream)
                    slot["event"] = event
                    if not put((dev, event)):
                        return
                put(None)
            except BaseException as exc:  # surfaced in the consumer
                put(exc)

        thread = threading.Thread(target=produce, name="dlrm-loader", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, event = item
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for t in (batch.dense, batch.sparse, batch.labels):
                        t.record_stream(current)
                yield batch
        finally:
            stop.set()
            thread.join(timeout=10)


def loader_throughput(ds: CriteoDataset, batch_size: int, device: torch.device | str = "cpu", batches: int = 50,
                      prefetch: int = 3, shuffle: str = "batch", warmup: int = 3) -> dict[str, float]:
    """Samples/s of the loader alone (read, pin, copy to ``device``), over ``batches`` batches after ``warmup``."""
    device = torch.device(device)
    loader = BatchLoader(ds, 0, len(ds), batch_size, device, shuffle=shuffle, drop_last=True, prefetch=prefetch)
    total = min(batches + warmup, len(loader))
    if total <= warmup:
        raise ValueError(f"dataset too small: {len(loader)} batches of {batch_size}, need more than {warmup}")
    it = loader.epoch(0)
    samples = 0
    t0 = 0.0
    for i, batch in enumerate(it):
        if i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
        if i >= warmup:
            samples += len(batch)
        if i + 1 >= total:
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    it.close()
    bytes_per_row = 13 * 4 + ds.num_sparse * 8 + 4
    return {"samples_per_s": samples / seconds, "GB_per_s": samples * bytes_per_row / seconds / 1e9,
            "batches": total - warmup, "batch_size": batch_size, "seconds": seconds}
