"""Id hashing and the prefetching batch loader that streams a dataset from disk.

The loader reads contiguous row ranges of the shards with ``os.preadv`` straight into pinned host buffers
(no page-fault storm of a memory map, the GIL released during the read), copies them to the GPU on a side
CUDA stream from a background thread, and hands out batches whose copy has finished (a CUDA event the
compute stream waits on). ``prefetch`` batches are kept in flight. For a split that fits in device memory,
:mod:`.device` holds it there instead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from .batch import Batch
from .datasets import CriteoDataset, kaggle_split, load_vocabs, open_dataset
from .partition import check_part, local_slice
from .shards import COLUMNS

# the dataset names are re-exported: ``from fuselab.dlrm.data.loader import open_dataset`` keeps working
__all__ = ["BatchLoader", "CriteoDataset", "Hasher", "batch_order", "kaggle_split", "load_vocabs", "loader_throughput",
           "open_dataset"]


class Hasher(nn.Module):
    """Raw categorical ids [B, F] int64 -> table rows [B, F] int64, on the ids' device (multi-hot: [B, S], the
    columns of table f's bag taken modulo its size).

    ``modulus``: ``id mod rows_t``. ``vocab``: position in the sorted vocabulary of feature t, plus 1; ids not
    in it (rarer than the preprocessing threshold) map to row 0; then ``mod rows_t`` (a no-op unless capped).
    """

    def __init__(self, table_sizes: list[int], mode: str = "modulus", vocabs: list[np.ndarray] | None = None,
                 multi_hot_sizes: list[int] | None = None):
        super().__init__()
        self.mode = mode
        sizes = torch.tensor(table_sizes, dtype=torch.int64)
        if multi_hot_sizes is not None:  # ids [B, S]: table f's size repeated over its bag's columns
            if mode != "modulus":
                raise ValueError("multi-hot bags support hashing='modulus' only")
            sizes = sizes.repeat_interleave(torch.tensor(multi_hot_sizes, dtype=torch.int64))
        self.register_buffer("sizes", sizes, persistent=False)
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


def batch_order(num_batches: int, shuffle: str, seed: int, epoch: int) -> np.ndarray:
    """The order of the contiguous batches in ``epoch``: a permutation seeded by (seed, epoch) for ``"batch"``
    shuffling, file order otherwise (``"row"`` shuffles rows instead; ``"none"`` keeps the order)."""
    if shuffle == "batch":
        return np.random.default_rng([seed, epoch]).permutation(num_batches)
    return np.arange(num_batches)


class BatchLoader:
    """Batches of rows ``[start, stop)`` of a dataset, prefetched to ``device`` by a background thread.

    ``shuffle``: ``"batch"`` permutes the order of contiguous batches each epoch (fast reads), ``"row"`` permutes
    rows (gathers), ``"none"`` keeps file order. The order depends only on (seed, epoch), so a run resumed at
    ``start_batch`` sees the same batches. ``drop_last`` drops a final partial batch (static shapes).
    ``part=(rank, world)`` (data parallelism): read and hand out only this rank's rows of each batch
    (:func:`.partition.local_slice` of the batch's rows in file order).
    """

    def __init__(self, ds: CriteoDataset, start: int, stop: int, batch_size: int, device: torch.device | str = "cpu",
                 shuffle: str = "none", seed: int = 0, drop_last: bool = False, prefetch: int = 3,
                 part: tuple[int, int] | None = None):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if shuffle not in ("batch", "row", "none"):
            raise ValueError(f"shuffle must be batch, row or none, got {shuffle!r}")
        self.ds, self.start, self.stop = ds, start, stop
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.shuffle, self.seed, self.drop_last, self.prefetch = shuffle, seed, drop_last, max(0, prefetch)
        self.rank, self.world = check_part(part)
        rows = stop - start
        self.num_batches = rows // batch_size if drop_last else -(-rows // batch_size)
        if self.num_batches == 0:
            raise ValueError(f"rows [{start}, {stop}) give no batch of {batch_size} (drop_last={drop_last})")

    def __len__(self) -> int:
        return self.num_batches

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        order = batch_order(self.num_batches, self.shuffle, self.seed, epoch)
        perm = None
        if self.shuffle == "row":
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.stop - self.start) + self.start
        return order, perm

    def _bounds(self, b: int) -> tuple[int, int]:
        """Positions ``[a, z)`` of batch ``b``'s rows (this rank's part) in the split order."""
        a = self.start + b * self.batch_size
        z = min(a + self.batch_size, self.stop)
        if self.world == 1:
            return a, z
        part = local_slice(z - a, self.rank, self.world)
        return a + part.start, a + part.stop

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
        if perm is not None:  # this rank's part of the batch's rows, sorted (the rank-major order of the batch)
            first = self.start + b * self.batch_size
            batch_rows = np.sort(perm[first - self.start: min(first + self.batch_size, self.stop) - self.start])
            return self.ds.take(batch_rows[a - first: z - first])
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
