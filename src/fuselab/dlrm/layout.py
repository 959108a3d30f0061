"""What a config takes from a dataset: the rows of each table (from its metadata) and the sparse columns' layout
(one id per table, or the config's multi-hot bags)."""

from __future__ import annotations

from typing import Any

from .config import DLRMConfig


def table_sizes(cfg: DLRMConfig, meta: dict[str, Any]) -> list[int]:
    """Rows of each embedding table from a dataset's metadata.

    ``modulus``: ``min(cardinality, max_rows_per_table)`` (ids are taken modulo this).
    ``vocab``: vocabulary size + 1 (row 0 holds every id rarer than the preprocessing threshold), capped.
    """
    if cfg.hashing == "vocab":
        if "vocab_sizes" not in meta:
            raise ValueError("hashing='vocab' needs a dataset preprocessed with a vocabulary (vocab_sizes in "
                             "metadata); synthetic and parquet datasets only support 'modulus'")
        sizes = [int(n) + 1 for n in meta["vocab_sizes"]]
    else:
        sizes = [max(1, int(n)) for n in meta["cardinalities"]]
    if cfg.max_rows_per_table:
        sizes = [min(n, cfg.max_rows_per_table) for n in sizes]
    return sizes


def check_layout(cfg: DLRMConfig, sizes: list[int], ds: Any) -> None:
    """The dataset's sparse columns fit the config: one per table, or the config's ``multi_hot_sizes`` (the
    dataset's own, when its metadata records them). Raises ``ValueError`` naming both."""
    width, bags = ds.num_sparse, ds.meta.get("multi_hot_sizes")
    if cfg.multi_hot_sizes is None:
        if bags is not None or width != len(sizes):
            raise ValueError(f"the dataset has {width} sparse columns{' (multi-hot bags)' if bags else ''} for "
                             f"{len(sizes)} tables; the config has no multi_hot_sizes")
        return
    if len(cfg.multi_hot_sizes) != len(sizes) or width != sum(cfg.multi_hot_sizes):
        raise ValueError(f"config multi_hot_sizes (sum {sum(cfg.multi_hot_sizes)}, {len(cfg.multi_hot_sizes)} "
                         f"tables) do not fit the dataset: {width} sparse columns, {len(sizes)} tables")
    if bags is not None and list(bags) != list(cfg.multi_hot_sizes):
        raise ValueError(f"config multi_hot_sizes {cfg.multi_hot_sizes[:8]} differ from the dataset's {bags[:8]}")
