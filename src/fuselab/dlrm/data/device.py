"""A dataset split held in device memory: loaded once, shuffled and batched on the device.

The step never waits for the host: a batch is a slice (``shuffle="none"``/``"batch"``) or an ``index_select``
(``shuffle="row"``) of device tensors. The same code runs on the CPU (device ``cpu``), so it is tested there.

Order: ``"none"`` and ``"batch"`` give exactly the batches of the streaming :class:`~.loader.BatchLoader` (the
batch order is the same (seed, epoch) permutation, drawn on the host: it has one entry per batch). ``"row"``
draws its row permutation on the device (``torch.randperm`` with a device generator seeded from (seed, epoch)),
so its batches differ from the streaming loader's (which draws with numpy and sorts each batch's rows); it is
still a function of (seed, epoch) only, so a resumed run sees the same batches.

Ids are hashed once at load (``transform``) and stored as int32 when every table has fewer than 2**31 rows;
batches hand out int64 ids.

``part=(rank, world)`` (data parallelism): the device holds only this rank's rows of every batch
(:func:`.partition.local_slice` of each global batch), ``1/world`` of the split; ``shuffle="row"`` needs the whole
split and is refused there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from .batch import Batch
from .datasets import CriteoDataset
from .loader import batch_order
from .partition import check_part, local_slice

__all__ = ["DeviceBatches", "split_bytes"]


def split_bytes(rows: int, num_sparse: int, narrow_ids: bool = True) -> int:
    """Device bytes of ``rows`` rows: 13 float32 dense values, F ids (int32 or int64), one float32 label."""
    return rows * (13 * 4 + num_sparse * (4 if narrow_ids else 8) + 4)


class DeviceBatches:
    """Batches of rows ``[start, stop)`` of ``ds``, held on ``device``; same interface as ``BatchLoader``.

    ``transform`` maps raw ids [N, F] int64 (on the device) to table rows (the :class:`~.loader.Hasher`);
    ``max_id`` (the largest table size) decides whether rows fit int32. ``part=(rank, world)``: hold and hand out
    only this rank's part of each batch. Raises ``ValueError`` when the split gives no batch, for an unknown
    ``shuffle``, for ``shuffle="row"`` with several ranks, or (CUDA) when the split does not fit in the free device
    memory.
    """

    #: rows read, copied and hashed at a time while loading
    LOAD_ROWS = 1 << 22

    def __init__(self, ds: CriteoDataset, start: int, stop: int, batch_size: int, device: torch.device | str,
                 shuffle: str = "none", seed: int = 0, drop_last: bool = False,
                 transform: Callable[[Tensor], Tensor] | None = None, max_id: int | None = None,
                 part: tuple[int, int] | None = None):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if shuffle not in ("batch", "row", "none"):
            raise ValueError(f"shuffle must be batch, row or none, got {shuffle!r}")
        self.rank, self.world = check_part(part)
        if self.world > 1 and shuffle == "row":
            raise ValueError(f"shuffle='row' needs the whole split on every rank; with {self.world} ranks use "
                             "shuffle='batch' (or train without --data-on-device)")
        self.device = torch.device(device)
        self.start, self.stop, self.batch_size = start, stop, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        n = stop - start
        self.num_batches = n // batch_size if drop_last else -(-n // batch_size)
        if self.num_batches == 0:
            raise ValueError(f"rows [{start}, {stop}) give no batch of {batch_size} (drop_last={drop_last})")
        #: split rows loaded, as (first, last) ranges; ``held[b]``: the rows of batch b (this rank's part) as held
        self.ranges, self.held = self._parts()
        rows = sum(z - a for a, z in self.ranges)
        narrow = max_id is not None and max_id < 2**31
        need = split_bytes(rows, ds.num_sparse, narrow)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if need > 0.8 * free:
                raise ValueError(f"--data-on-device: the split needs {need / 1e9:.1f} GB, {self.device} has "
                                 f"{free / 1e9:.1f} GB free; train without --data-on-device (streaming)")
        self.nbytes = need
        self.dense = torch.empty((rows, 13), dtype=torch.float32, device=self.device)
        self.labels = torch.empty((rows,), dtype=torch.float32, device=self.device)
        self.sparse = torch.empty((rows, ds.num_sparse), dtype=torch.int32 if narrow else torch.int64,
                                  device=self.device)
        at = 0
        for first, last in self._merged(self.ranges):
            for a in range(first, last, self.LOAD_ROWS):  # in blocks: bounded host memory and hashing temporaries
                z = min(last, a + self.LOAD_ROWS)
                dst = slice(at, at + z - a)
                self.dense[dst] = torch.from_numpy(ds.read_column("dense", start + a, start + z))
                self.labels[dst] = torch.from_numpy(ds.read_column("labels", start + a, start + z))
                ids = torch.from_numpy(ds.read_column("sparse", start + a, start + z)).to(self.device)
                self.sparse[dst] = transform(ids) if transform is not None else ids
                at += z - a

    def _parts(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Split rows to load and held rows of this rank's part of each batch (in file order). One rank loads the
        whole split (a row permutation may pick any row, also of a dropped last batch)."""
        n, ranges, held, at = self.stop - self.start, [], [], 0
        if self.world == 1:
            return [(0, n)], [(b * self.batch_size, min((b + 1) * self.batch_size, n))
                              for b in range(self.num_batches)]
        for b in range(self.num_batches):
            a, z = b * self.batch_size, min((b + 1) * self.batch_size, n)
            part = local_slice(z - a, self.rank, self.world)
            ranges.append((a + part.start, a + part.stop))
            held.append((at, at + part.stop - part.start))
            at += part.stop - part.start
        return ranges, held

    @staticmethod
    def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Adjacent ranges joined (one rank: the whole split is one range)."""
        out: list[list[int]] = []
        for a, z in ranges:
            if out and out[-1][1] == a:
                out[-1][1] = z
            else:
                out.append([a, z])
        return [(a, z) for a, z in out]

    def __len__(self) -> int:
        return self.num_batches

    def _row_perm(self, epoch: int) -> Tensor:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(np.random.SeedSequence([self.seed, epoch]).generate_state(1, np.uint64)[0] >> 1))
        return torch.randperm(self.stop - self.start, generator=gen, device=self.device)

    def epoch(self, epoch: int = 0, start_batch: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from position ``start_batch`` (tensors on the device)."""
        order = batch_order(self.num_batches, self.shuffle, self.seed, epoch)
        perm = self._row_perm(epoch) if self.shuffle == "row" else None
        for b in order[start_batch:].tolist():
            a, z = self.held[b]
            if perm is None:
                yield Batch(self.dense[a:z], self.sparse[a:z].long(), self.labels[a:z])
            else:
                rows = perm[a:z]
                yield Batch(self.dense.index_select(0, rows), self.sparse.index_select(0, rows).long(),
                            self.labels.index_select(0, rows))
