"""The sharding planner: which rank holds which rows of which embedding table.

Tables are placed whole on one rank (table-wise) when they fit; a table larger than one rank's share of the total
bytes, or larger than a rank's memory budget, is split into ``world_size`` contiguous row ranges (row-wise), one
per rank. Table-wise placement is greedy (largest first) and balances two loads at once: bytes held (rows x (D x
element bytes + optimizer state bytes per row)) and lookups per sample (the table's pooling factor; a row-wise
shard takes the fraction of lookups proportional to its rows, i.e. uniform ids).

With a ``global_batch``, a table whose gradient all-reduce moves fewer bytes than exchanging its ids and pooled
rows (:func:`replicates`: small tables) is instead held whole by every rank (data-parallel, ``replicated``), as
HugeCTR's ``dp_sharding_threshold`` and TorchRec's planner do.

A :class:`ShardingPlan` lists the shards; the local order of a rank's shards (:meth:`ShardingPlan.shards_of`) is
the order of its local embedding module's tables. Plans are JSON-serialisable (:meth:`ShardingPlan.to_dict`,
:meth:`ShardingPlan.from_dict`) and printable (:meth:`ShardingPlan.format_table`); the caller saves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer


@dataclass(frozen=True)
class Shard:
    """Rows ``[row_start, row_end)`` of table ``table`` held by rank ``rank``."""

    table: int
    rank: int
    row_start: int
    row_end: int

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start


@dataclass
class ShardingPlan:
    """Shards of every table over ``world_size`` ranks, with the costs the planner balanced.

    ``bytes_per_row``: weight + optimizer state bytes of one row; ``pooling_factors``: lookups per sample of each
    table; ``budget_bytes``: each rank's memory budget (None: unbounded); ``replicated``: the tables every rank
    holds whole (no shards).
    """

    world_size: int
    dim: int
    table_sizes: list[int]
    shards: list[Shard]
    bytes_per_row: int
    pooling_factors: list[float]
    budget_bytes: list[int] | None = None
    kinds: list[str] = field(default_factory=list)  # "table" | "row" | "replicated" per table
    replicated: list[int] = field(default_factory=list)

    def shards_of(self, rank: int) -> list[Shard]:
        """The shards held by ``rank``, in the order of its local embedding module's tables."""
        return [s for s in self.shards if s.rank == rank]

    def shards_of_table(self, table: int) -> list[Shard]:
        """The shards of ``table``, sorted by first row."""
        return sorted((s for s in self.shards if s.table == table), key=lambda s: s.row_start)

    def rank_bytes(self) -> list[int]:
        replicas = sum(self.table_sizes[t] for t in self.replicated) * self.bytes_per_row
        out = [replicas] * self.world_size
        for s in self.shards:
            out[s.rank] += s.rows * self.bytes_per_row
        return out

    def rank_lookups(self) -> list[float]:
        """Expected lookups per sample of the global batch on each rank (uniform ids within a table; a replicated
        table serves the rank's own samples)."""
        replicas = sum(self.pooling_factors[t] for t in self.replicated) / self.world_size
        out = [replicas] * self.world_size
        for s in self.shards:
            out[s.rank] += self.pooling_factors[s.table] * s.rows / self.table_sizes[s.table]
        return out

    def validate(self) -> ShardingPlan:
        """Raise ``ValueError`` unless every table's rows are covered exactly once by shards on valid ranks and no
        rank holds more bytes than its budget."""
        if len(self.pooling_factors) != len(self.table_sizes):
            raise ValueError("plan: pooling_factors and table_sizes differ in length")
        replicated = set(self.replicated)
        if sorted(replicated) != list(self.replicated) or not replicated <= set(range(len(self.table_sizes))):
            raise ValueError(f"plan: replicated tables {self.replicated} must be ascending table indices in range")
        for s in self.shards:
            if not (0 <= s.table < len(self.table_sizes)) or not (0 <= s.rank < self.world_size):
                raise ValueError(f"plan: shard {s} names a table or rank out of range")
            if not (0 <= s.row_start < s.row_end <= self.table_sizes[s.table]):
                raise ValueError(f"plan: shard {s} has an empty or out-of-range row range")
            if s.table in replicated:
                raise ValueError(f"plan: shard {s} is of a replicated table")
        for t, n in enumerate(self.table_sizes):
            if t in replicated:
                continue
            end = 0
            for s in self.shards_of_table(t):
                if s.row_start != end:
                    raise ValueError(f"plan: table {t} rows [{end}, {s.row_start}) uncovered or covered twice")
                end = s.row_end
            if end != n:
                raise ValueError(f"plan: table {t} covers rows [0, {end}) of {n}")
        if self.budget_bytes is not None:
            for r, used in enumerate(self.rank_bytes()):
                if used > self.budget_bytes[r]:
                    raise ValueError(f"plan: rank {r} holds {used} bytes, over its budget {self.budget_bytes[r]}")
        return self

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shards"] = [[s.table, s.rank, s.row_start, s.row_end] for s in self.shards]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPlan:
        values = dict(data)
        values["shards"] = [Shard(*map(int, s)) for s in data["shards"]]
        return cls(**values).validate()

    def format_table(self) -> str:
        """One line per rank (bytes, lookups per sample, shards ``t<table>[start:end]``)."""
        lines = [f"sharding plan: {len(self.table_sizes)} tables, D={self.dim}, {self.world_size} ranks",
                 f"{'rank':>4}  {'MiB':>10}  {'lookups':>8}  shards"]
        lookups = self.rank_lookups()
        for r, used in enumerate(self.rank_bytes()):
            parts = [f"t{s.table}" if self.kinds[s.table] == "table" else f"t{s.table}[{s.row_start}:{s.row_end}]"
                     for s in self.shards_of(r)] if self.kinds else [f"t{s.table}" for s in self.shards_of(r)]
            lines.append(f"{r:>4}  {used / 2**20:>10.2f}  {lookups[r]:>8.2f}  {' '.join(parts)}")
        if self.replicated:
            lines.append(f"every rank (data-parallel, included above): {' '.join(f't{t}' for t in self.replicated)}")
        return "\n".join(lines)

    __str__ = format_table


def row_bytes(dim: int, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, element_bytes: int = 4) -> int:
    """Bytes of one table row: ``dim`` weights plus the optimizer's per-row state (fp32). Raises TypeError for an
    ``optimizer`` that is no EmbeddingOptimizer."""
    if not isinstance(optimizer, EmbeddingOptimizer):
        raise TypeError(f"optimizer must be an EmbeddingOptimizer (fuselab.core.embedding_optimizer), got "
                        f"{type(optimizer).__name__}")
    return dim * element_bytes + 4 * optimizer.state_floats_per_row(dim)


def replicates(rows: int, dim: int, world_size: int, global_batch: int, pooling_factor: float = 1.0,
               wire_bytes: int = 4) -> bool:
    """Whether a table of ``rows`` x ``dim`` moves fewer bytes between the ranks data-parallel than model-parallel,
    per step of ``global_batch`` samples over ``world_size`` ranks. Model-parallel, the other ranks' share
    ((W - 1) / W) of the samples sends its ids (int32, ``pooling_factor`` per sample) and gets its pooled rows
    back, then sends their gradients (``wire_bytes`` per element each way). Data-parallel, a ring all-reduce of
    the table's fp32 gradient sends 2 (W - 1) / W of it from every rank."""
    if world_size < 2:
        return False
    exchange = (world_size - 1) / world_size * global_batch * (2 * dim * wire_bytes + 4 * pooling_factor)
    return 2 * (world_size - 1) * rows * dim * 4 < exchange


def _row_ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    bounds = [rows * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts) if bounds[k + 1] > bounds[k]]


class PlanDoesNotFit(ValueError):
    """The tables do not fit the ranks' memory budgets."""


def plan_sharding(table_sizes: Sequence[int], dim: int, world_size: int, *,
                  pooling_factors: Sequence[float] | None = None, optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                  element_bytes: int = 4, budget_bytes: int | Sequence[int] | None = None,
                  row_wise_share: float = 1.0, global_batch: int | None = None,
                  wire_bytes: int = 4) -> ShardingPlan:
    """Plan the placement of ``table_sizes`` (rows of each table, width ``dim``) over ``world_size`` ranks.

    With ``global_batch`` (samples per step over all ranks), the tables that :func:`replicates` says are cheaper
    data-parallel (pooled rows sent as ``wire_bytes`` per element) are held by every rank (their bytes count
    against every rank's budget). Of the others, a table whose bytes exceed ``row_wise_share`` x (their total bytes
    / world_size), or any rank's budget, is split row-wise over all ranks; the others are placed whole, largest
    first, on the rank that keeps the larger of its two normalised loads (bytes, lookups per sample) smallest among
    the ranks with room. ``pooling_factors``
    defaults to 1 lookup per sample per table.

    Raises ``ValueError`` for bad arguments, and :class:`PlanDoesNotFit` (a ``ValueError``) when the tables cannot
    fit the budgets (naming the table or rank).
    """
    sizes = [int(n) for n in table_sizes]
    if not sizes or any(n <= 0 for n in sizes):
        raise ValueError(f"table_sizes must be positive row counts, got {sizes[:8]}")
    if dim <= 0 or world_size <= 0:
        raise ValueError(f"dim and world_size must be positive, got dim={dim}, world_size={world_size}")
    pf = [1.0] * len(sizes) if pooling_factors is None else [float(p) for p in pooling_factors]
    if len(pf) != len(sizes) or any(p < 0 for p in pf):
        raise ValueError(f"pooling_factors must be {len(sizes)} non-negative numbers, got {pf[:8]}")
    if row_wise_share <= 0:
        raise ValueError(f"row_wise_share must be positive, got {row_wise_share}")
    if (global_batch is not None and global_batch <= 0) or wire_bytes <= 0:
        raise ValueError(f"global_batch and wire_bytes must be positive, got {global_batch}, {wire_bytes}")
    per_row = row_bytes(dim, optimizer, element_bytes)
    budgets = None
    if budget_bytes is not None:
        budgets = [int(budget_bytes)] * world_size if isinstance(budget_bytes, int) else [int(b) for b in budget_bytes]
        if len(budgets) != world_size:
            raise ValueError(f"budget_bytes must be one int or {world_size} ints, got {len(budgets)}")
    replicated = [t for t, n in enumerate(sizes) if global_batch is not None
                  and replicates(n, dim, world_size, global_batch, pf[t], wire_bytes)]
    table_bytes = [0 if t in replicated else n * per_row for t, n in enumerate(sizes)]
    # what each rank's budget leaves for the sharded tables once it holds every replicated one
    replica_bytes = sum(sizes[t] for t in replicated) * per_row
    room = None if budgets is None else [b - replica_bytes for b in budgets]
    if room is not None and sum(table_bytes) > sum(room):
        raise PlanDoesNotFit(f"tables need {sum(table_bytes)} bytes, the ranks' budgets total {sum(room)}")
    share = row_wise_share * sum(table_bytes) / world_size
    smallest_budget = min(room) if room else None
    row_wise = [world_size > 1 and (b > share or (smallest_budget is not None and b > smallest_budget))
                for b in table_bytes]
    used, looks = [0] * world_size, [0.0] * world_size
    shards: list[Shard] = []
    for t in (t for t in range(len(sizes)) if row_wise[t]):
        for r, (lo, hi) in enumerate(_row_ranges(sizes[t], world_size)):
            shards.append(Shard(t, r, lo, hi))
            used[r] += (hi - lo) * per_row
            looks[r] += pf[t] * (hi - lo) / sizes[t]
    total_b, total_l = max(sum(table_bytes), 1), max(sum(pf), 1e-12)
    order = sorted((t for t in range(len(sizes)) if not row_wise[t] and t not in replicated),
                   key=lambda t: -(table_bytes[t] / total_b + pf[t] / total_l))
    for t in order:
        fits = [r for r in range(world_size) if room is None or used[r] + table_bytes[t] <= room[r]]
        if not fits:
            raise PlanDoesNotFit(f"table {t} ({sizes[t]} rows, {table_bytes[t]} bytes) fits no rank's remaining budget "
                             f"(free: {[b - u for b, u in zip(room or [], used)]}); raise budget_bytes or "
                             f"lower row_wise_share to split it")
        r = min(fits, key=lambda r: (max((used[r] + table_bytes[t]) / total_b, (looks[r] + pf[t]) / total_l),
                                     used[r], r))
        shards.append(Shard(t, r, 0, sizes[t]))
        used[r] += table_bytes[t]
        looks[r] += pf[t]
    shards.sort(key=lambda s: (s.rank, s.table, s.row_start))
    kinds = ["replicated" if t in replicated else "row" if rw else "table" for t, rw in enumerate(row_wise)]
    return ShardingPlan(world_size, dim, sizes, shards, per_row, pf, budgets, kinds, replicated).validate()
