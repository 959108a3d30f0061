"""Which rows of a global batch each of ``world`` ranks reads (data parallelism: no rank reads the whole batch).

The split is contiguous and rank-major, the first ``global % world`` ranks one row more: the sample order of
:class:`fuselab.dlrm.distributed.ShardedEmbeddingCollection`'s global batch.
"""

from __future__ import annotations

__all__ = ["check_part", "local_rows", "local_slice"]


def check_part(part: tuple[int, int] | None) -> tuple[int, int]:
    """``(rank, world)`` of a loader's ``part`` argument (``None``: ``(0, 1)``, the whole batch). Raises
    ``ValueError`` when it is not two ints with ``0 <= rank < world``."""
    if part is None:
        return 0, 1
    try:
        rank, world = (int(x) for x in part)
    except (TypeError, ValueError):
        raise ValueError(f"part must be (rank, world), got {part!r}") from None
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"part: rank {rank} must be in [0, world={world})")
    return rank, world


def local_slice(global_batch_size: int, rank: int, world: int) -> slice:
    """Rows of a global batch that ``rank`` reads. Raises ``ValueError`` when rank/world are out of range or the
    batch has fewer rows than ranks."""
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} must be in [0, world={world})")
    if global_batch_size < world:
        raise ValueError(f"global batch {global_batch_size} has fewer rows than the {world} ranks")
    base, extra = divmod(global_batch_size, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def local_rows(batch_index: int, global_batch_size: int, rank: int, world: int, num_rows: int) -> tuple[int, int]:
    """Dataset rows ``[start, stop)`` that ``rank`` reads for the contiguous global batch ``batch_index`` (the last
    batch may be short). Raises ``ValueError`` for a batch past ``num_rows``."""
    first = batch_index * global_batch_size
    size = min(global_batch_size, num_rows - first)
    if size <= 0:
        raise ValueError(f"batch {batch_index} starts at row {first}, past the {num_rows} rows")
    part = local_slice(size, rank, world)
    return first + part.start, first + part.stop
