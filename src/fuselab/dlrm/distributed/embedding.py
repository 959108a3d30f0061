"""Model-parallel embedding tables: :class:`ShardedEmbeddingCollection`.

Shapes: ``W`` ranks, ``B`` this rank's batch, ``Bg`` the global batch (sum of every rank's B, rank-major), ``F``
tables (features), ``D`` dim, ``K_q`` shards held by rank ``q`` (the plan's order), ``S = sum_q K_q``.

Forward, on every rank (the data-parallel input meets the model-parallel tables):

1. each id's row (``id mod n_f``) picks the shard holding it; ids are grouped by (owner q, sample b, local shard k);
2. ``all_to_all_single`` of (B, ids for q) per pair, then one ``all_to_all_single`` of [bag lengths (B x K_q),
   shard-local ids] per pair: the owner now holds every rank's bags of its shards, as ``Bg x K`` bags;
3. the local module pools them (sum): ``(Bg, K, D)``;
4. ``all_to_all_single`` sends rows ``[b0_r, b0_r + B_r)`` back to rank r (autograd function: its backward sends
   the gradients of the pooled embeddings back to the owners, divided by ``grad_divisor``);
5. the requester adds the partial sums of row-wise shards into ``(B, F, D)`` (mean pooling divides here).

The backward of the local module applies the optimizer to the rows (fused update or torch sparse step). The plan's
replicated tables (``plan.replicated``) are held whole by every rank (:class:`.replicated.ReplicatedTables`): their
bags are pooled where the samples are and never exchanged; their gradient is all-reduced in their backward.

Static exchange (``uniform_batch=True``, 2-D ids: one id per table or fixed-size bags, every table whole on one
rank: the Kaggle model's table-wise plans): every split size follows from the plan, the bag sizes and B, so steps
1-2 are one column gather and one ``all_to_all_single`` of the rows (int32 when every table's rows fit it) with
sizes known on the host. No host synchronization is
left in the forward or backward, and a training step with it can be captured in a CUDA graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer
from fuselab.core.reductions import REDUCTIONS

from ..bags import FixedBags, check_sizes
from ..sparse import TableSpec
from .exchange import Exchange, TableOrder
from .local import LocalFactory, fused_factory, init_rows
from .plan import Shard, ShardingPlan
from .replicated import ReplicatedTables


class ShardedEmbeddingCollection(nn.Module):
    """The shards of ``plan`` held by ``rank``, and the exchanges that serve every rank's lookups.

    ``factory`` builds the local module (default: the fused one; see :mod:`.local`); ``optimizer`` (an
    :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer`) and ``lr`` go to it. Rows start as
    :func:`.local.init_rows` (``seed``), which
    does not depend on the plan. ``grad_divisor`` (default: world size, as DDP averages dense gradients) divides
    the embedding gradients so that W ranks on a global batch train like one process on it (with one rank no
    exchange runs and it is not applied). ``comm_dtype`` (e.g. ``torch.bfloat16``): the dtype of the pooled
    embeddings and their gradients on the wire (None: the local module's, fp32); the sums stay fp32.
    ``pooling``: ``sum`` or ``mean`` over each bag. ``group``: the process group of the exchanges (a dedicated one
    lets the embedding exchanges and DDP's all-reduce run independently); unused when the plan has one rank.
    ``uniform_batch``: the caller promises that every rank passes the same B at every call in training mode; with
    2-D ids and a plan of whole tables the exchange is then static (module docstring); otherwise, and in eval mode,
    the flag changes nothing. ``multi_hot_sizes``: 2-D ids are fixed-size bags (B, S), ``S = sum(sizes)``, table
    ``f``'s bag in its own columns (:mod:`fuselab.dlrm.bags`); None: one id per table. ``table_dtype``: the sharded
    tables' weights (``fp32``; ``fp16`` or ``bf16`` with the fused factory: half the memory, updates rounded
    stochastically); replicated tables stay fp32 (their gradients are summed in their weight's dtype).

    Raises ``ValueError`` for a plan/rank mismatch, a bad pooling, or malformed ids/offsets in :meth:`forward`
    (``TypeError`` for non-integer ones).
    """

    def __init__(self, plan: ShardingPlan, rank: int, *, factory: LocalFactory = fused_factory,
                 optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD, lr: float = 0.01, pooling: str = "sum",
                 seed: int = 0, grad_divisor: float | None = None, group=None,
                 device: torch.device | str | None = None, comm_dtype: torch.dtype | None = None,
                 uniform_batch: bool = False, multi_hot_sizes: Sequence[int] | None = None,
                 table_dtype: str = "fp32"):
        super().__init__()
        plan.validate()
        if not 0 <= rank < plan.world_size:
            raise ValueError(f"rank {rank} is outside the plan's {plan.world_size} ranks")
        if plan.world_size > 1 and dist.is_initialized() and dist.get_world_size(group) != plan.world_size:
            raise ValueError(f"plan is for {plan.world_size} ranks, process group has {dist.get_world_size(group)}")
        if pooling not in REDUCTIONS:
            raise ValueError(f"pooling must be one of {', '.join(REDUCTIONS)}, got {pooling!r}")
        if comm_dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"comm_dtype must be None, float32, bfloat16 or float16, got {comm_dtype}")
        self.comm_dtype, self.optimizer = comm_dtype, optimizer
        self.plan, self.rank, self.group, self.pooling = plan, rank, group, pooling
        self.dim, self.num_features, self.world = plan.dim, len(plan.table_sizes), plan.world_size
        self.grad_scale = 1.0 / float(plan.world_size if grad_divisor is None else grad_divisor)
        self.local_shards: list[Shard] = plan.shards_of(rank)
        self.local = None
        if self.local_shards:
            self.local = factory([s.rows for s in self.local_shards], self.dim, optimizer=optimizer, lr=lr,
                                 device=device, dtype=table_dtype)
            with torch.no_grad():
                for s, start in zip(self.local_shards, self.local.row_offsets.tolist()):
                    init_rows(seed, s.table, plan.table_sizes[s.table], s.row_start, s.row_end, self.dim,
                              out=self.local.weight[start: start + s.rows])
        self.bag_sizes = (check_sizes(multi_hot_sizes, self.num_features) if multi_hot_sizes is not None
                          else [1] * self.num_features)
        self.bags = FixedBags(self.bag_sizes).to(device)
        self.replicas = self._replicas(plan, optimizer, lr, pooling, seed, device)
        self._build_routing(device)
        #: the static exchange applies to 2-D ids (B, S): every table whole on one rank, the same B on every rank
        self.static = bool(uniform_batch) and all(s.rows == plan.table_sizes[s.table] for s in plan.shards)
        #: a training step with it can be captured: a static exchange and a capturable local module
        self.capturable = self.static and (self.local is None or self.local.capturable)
        #: the ids of a coming batch, exchanged ahead (:meth:`prefetch`)
        self.register_buffer("_prefetched", None, persistent=False)
        start = [0, *itertools.accumulate(self.bag_sizes)]
        replicated_columns = [c for t in plan.replicated for c in range(start[t], start[t + 1])]
        self.register_buffer("_replicated_columns", torch.tensor(replicated_columns, dtype=torch.int64,
                                                                 device=device), persistent=False)
        if self.static:  # where table f arrives: owner's block start (in shards), block width, index in it
            exchange = [s for q in range(self.world) for s in plan.shards_of(q)]
            where = {s.table: (sum(self.counts[:s.rank]), self.counts[s.rank], plan.shards_of(s.rank).index(s))
                     for s in exchange}
            # a replicated table's rows follow the exchanged ones: block start sum(counts), width F_r
            where.update({t: (sum(self.counts), len(plan.replicated), r) for r, t in enumerate(plan.replicated)})
            for name, column in (("_block_start", 0), ("_block_width", 1), ("_local_index", 2)):
                values = [where[f][column] for f in range(self.num_features)]
                self.register_buffer(name, torch.tensor(values, dtype=torch.int64, device=device), persistent=False)
            self._identity_order = [s.table for s in exchange] == list(range(self.num_features))
            self.register_buffer("_exchange_tables", torch.tensor([s.table for s in exchange], dtype=torch.int64,
                                                                  device=device), persistent=False)
            # the id columns in exchange order (each table's bag columns), what each owner receives, its bags
            start = [0, *itertools.accumulate(self.bag_sizes)]
            columns = [c for s in exchange for c in range(start[s.table], start[s.table + 1])]
            self.register_buffer("_send_columns", torch.tensor(columns, dtype=torch.int64, device=device),
                                 persistent=False)
            self.register_buffer("_column_rows", self.table_sizes.repeat_interleave(
                torch.tensor(self.bag_sizes, device=self.table_sizes.device)), persistent=False)
            self.register_buffer("_send_rows", self._column_rows[self._send_columns, None], persistent=False)
            #: rows travel as int32 when every table's rows fit it (half the bytes of int64)
            self._id_dtype = torch.int32 if max(plan.table_sizes) <= torch.iinfo(torch.int32).max else torch.int64
            self._columns_of = [sum(self.bag_sizes[s.table] for s in plan.shards_of(q)) for q in range(self.world)]
            local_sizes = [self.bag_sizes[s.table] for s in self.local_shards]
            self._local_bags = FixedBags(local_sizes).to(device) if any(n > 1 for n in local_sizes) else None
            self.register_buffer("_mean_scale", torch.tensor([1.0 / n for n in local_sizes], device=device),
                                 persistent=False)
            self._row_index: dict[int, Tensor] = {}

    def _replicas(self, plan: ShardingPlan, optimizer: EmbeddingOptimizer, lr: float, pooling: str, seed: int,
                  device) -> ReplicatedTables | None:
        """The plan's replicated tables, whole on this rank (None without any)."""
        if not plan.replicated:
            return None
        bags = [self.bag_sizes[t] for t in plan.replicated]
        spec = TableSpec(tuple(plan.table_sizes[t] for t in plan.replicated), self.dim, pooling,
                         tuple(bags) if any(n > 1 for n in bags) else None)
        return ReplicatedTables(spec, list(plan.replicated), seed=seed, group=self.group,
                                grad_scale=self.grad_scale if self.world > 1 else 1.0, optimizer=optimizer, lr=lr,
                                device=device)

    def _build_routing(self, device) -> None:
        plan = self.plan
        shards = [s for q in range(self.world) for s in plan.shards_of(q)]  # exchange order: owner, then local
        table_start = torch.tensor([0, *plan.table_sizes], dtype=torch.int64).cumsum(0)
        by_row = sorted(range(len(shards)), key=lambda i: (shards[i].table, shards[i].row_start))
        local_index = [sum(1 for t in shards[:i] if t.rank == s.rank) for i, s in enumerate(shards)]
        buffers = {
            "table_sizes": torch.tensor(plan.table_sizes, dtype=torch.int64),
            "table_start": table_start[:-1].clone(),
            "bound": torch.tensor([int(table_start[shards[i].table]) + shards[i].row_start for i in by_row]),
            "sorted_owner": torch.tensor([shards[i].rank for i in by_row]),
            "sorted_local": torch.tensor([local_index[i] for i in by_row]),
            "sorted_lo": torch.tensor([shards[i].row_start for i in by_row]),
            "shard_table": torch.tensor([s.table for s in shards], dtype=torch.int64),
            "shards_per_rank": torch.tensor([len(plan.shards_of(q)) for q in range(self.world)]),
            "shards_before": torch.tensor([len([s for s in shards if s.rank < q]) for q in range(self.world)]),
            # a feature's place among the replicated tables (-1: sharded)
            "replicated_index": torch.tensor([plan.replicated.index(f) if f in plan.replicated else -1
                                              for f in range(self.num_features)]),
            "replicated_tables": torch.tensor(plan.replicated, dtype=torch.int64),
        }
        for name, value in buffers.items():
            self.register_buffer(name, value.to(device=device, dtype=torch.int64), persistent=False)
        self.counts = [len(plan.shards_of(q)) for q in range(self.world)]

    def set_lr(self, value: float) -> None:
        for module in (self.local, self.replicas):
            if module is not None:
                module.set_lr(value)

    def _bags(self, ids: Tensor, offsets: Tensor | None) -> tuple[Tensor, Tensor, int]:
        """(values (N,), bag of each value (N,), B) from (B, F) ids or flat ids + (B*F + 1,) offsets."""
        f_count = self.num_features
        for name, t in (("ids", ids), ("offsets", offsets)):
            if t is not None and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
                raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
        if offsets is None:
            if ids.dim() != 2 or ids.shape[1] != f_count:
                raise ValueError(f"ids must be (B, {f_count}) without offsets, got {tuple(ids.shape)}")
            b = ids.shape[0]
            return ids.reshape(-1).to(torch.int64), torch.arange(b * f_count, device=ids.device), b
        if ids.dim() != 1 or offsets.dim() != 1 or (offsets.shape[0] - 1) % f_count:
            raise ValueError(f"bags need ids (N,) and offsets (B*{f_count} + 1,), got {tuple(ids.shape)}, "
                             f"{tuple(offsets.shape)}")
        lengths = offsets.diff()
        if int(offsets[0]) != 0 or int(offsets[-1]) != ids.shape[0] or bool((lengths < 0).any()):
            raise ValueError("offsets must start at 0, end at len(ids) and never decrease")
        bag = torch.repeat_interleave(torch.arange(lengths.shape[0], device=ids.device), lengths,
                                      output_size=ids.shape[0])
        return ids.to(torch.int64), bag, (offsets.shape[0] - 1) // f_count

    def prefetch(self, ids: Tensor) -> None:
        """Send the ids (B, S) of a coming training batch to their tables' owners now (the static exchange's first
        all_to_all): :meth:`forward` with ``prefetched=True`` then looks them up without exchanging them, so a step
        can send the next batch's ids while its own dense part still runs (pipelining). The received ids live in one
        buffer whose address stays once made (CUDA graphs). Collective. Raises ValueError without the static
        exchange."""
        if not self.static:
            raise ValueError("prefetch needs the static exchange (uniform_batch=True and whole tables)")
        local = self._exchange_ids(self._check_static_ids(ids))
        if self._prefetched is None or self._prefetched.shape != local.shape:
            self._prefetched = torch.empty_like(local)
        self._prefetched.copy_(local)

    def forward(self, ids: Tensor, offsets: Tensor | None = None, *, prefetched: bool = False) -> Tensor:
        """ids (B, F) raw ids (one per feature), or bags: ids (N,) + offsets (B*F + 1,) int64, bag ``b*F + f`` ->
        (B, F, D) pooled embeddings (``id mod table_sizes[f]`` picks the row). ``prefetched``: the ids were sent
        ahead by :meth:`prefetch` (static exchange, training; ValueError without a prefetch for this batch size).
        Collective: every rank calls it."""
        if prefetched:
            if not (self.static and self.training and offsets is None):
                raise ValueError("prefetched ids need the static exchange in training mode (2-D ids, no offsets)")
            if self._prefetched is None or self._prefetched.shape[0] != self.world * ids.shape[0]:
                raise ValueError(f"no prefetched ids for a batch of {ids.shape[0]}: call prefetch(ids) first")
            return self._forward_static(ids, self._prefetched)
        if offsets is None and self.static and self.training:  # evaluation batches may be uneven: dynamic
            return self._forward_static(ids)
        if offsets is None and ids.dim() == 2 and any(n > 1 for n in self.bag_sizes):
            ids, offsets = self.bags(ids)
        values, bag, batch = self._bags(ids, offsets)
        f_count, counts = self.num_features, self.counts
        feature = bag.remainder(f_count)
        row = values.remainder(self.table_sizes[feature])
        replicated = None
        if self.replicas is not None:  # their bags stay here; the others go to their owners
            local = self.replicated_index[feature]
            mine = local >= 0
            replicated = self._replicated_bags(row[mine], bag[mine] // f_count, local[mine], batch)
            keep = ~mine
            bag, feature, row = bag[keep], feature[keep], row[keep]
        pos = torch.searchsorted(self.bound, self.table_start[feature] + row, right=True) - 1
        owner, local_shard = self.sorted_owner[pos], self.sorted_local[pos]
        # slot of each id in the send buffer of bag lengths: owner-major, then sample, then owner's local shard
        slot = (self.shards_before[owner] * batch + (bag // f_count) * self.shards_per_rank[owner] + local_shard)
        order = torch.argsort(slot, stable=True)
        lengths = torch.bincount(slot, minlength=batch * sum(counts))
        shard_ids = (row - self.sorted_lo[pos])[order]
        pooled_local, batches = self._lookup_remote(lengths, shard_ids, owner, batch)
        out = self._return(pooled_local, batches, batch)
        if self.pooling == "mean":
            bag_len = torch.bincount(bag, minlength=batch * f_count).view(batch, f_count)
            out = out / bag_len.clamp(min=1).unsqueeze(-1).to(out.dtype)
        if replicated is not None:
            out = out.index_copy(1, self.replicated_tables, replicated.to(out.dtype))
        return out

    def _replicated_bags(self, rows: Tensor, sample: Tensor, local: Tensor, batch: int) -> Tensor:
        """The replicated tables' bags of this rank's samples, as CSR (rows in bag order, each bag's sample and
        replicated table) -> (B, F_r, D) from :attr:`replicas` (empty bags zero)."""
        f_rep = self.replicated_tables.numel()
        lengths = torch.bincount(sample * f_rep + local, minlength=batch * f_rep)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        return self.replicas(rows, offsets)

    def _check_static_ids(self, ids: Tensor) -> Tensor:
        width = self.bags.width
        if ids.dim() != 2 or ids.shape[1] != width:
            raise ValueError(f"ids must be (B, {width}) without offsets, got {tuple(ids.shape)}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
        return ids

    def _exchange_ids(self, ids: Tensor) -> Tensor:
        """(B, S) raw ids -> (W*B, S_self): the rows of this rank's tables' columns for every rank's samples (one
        all_to_all with split sizes from the plan)."""
        batch, s_self = ids.shape[0], self._columns_of[self.rank]
        # (S, B): the tables' columns in exchange order (owner, local order), each id reduced to its row
        send = ids.new_empty((len(self._send_columns), batch), dtype=self._id_dtype)
        torch.remainder(ids.t()[self._send_columns], self._send_rows, out=send)
        if self.world == 1:
            return send.t()
        recv = send.new_empty(self.world * s_self * batch)
        dist.all_to_all_single(recv, send.reshape(-1), [s_self * batch] * self.world,
                               [c * batch for c in self._columns_of], group=self.group)
        return recv.view(self.world, s_self, batch).transpose(1, 2).reshape(self.world * batch, s_self)

    def _forward_static(self, ids: Tensor, local_ids: Tensor | None = None) -> Tensor:
        """(B, S) ids -> (B, F, D) with split sizes from the plan (``uniform_batch``): no host synchronization.
        ``local_ids``: their exchange's result, when :meth:`prefetch` made it."""
        self._check_static_ids(ids)
        batch = ids.shape[0]
        if local_ids is None:
            local_ids = self._exchange_ids(ids)
        if self.local is None:
            pooled = torch.zeros(self.world * batch, 0, self.dim, device=ids.device)
            pooled.requires_grad_(torch.is_grad_enabled() and self.training)
        elif self._local_bags is None:
            pooled = self.local(local_ids)
        else:
            pooled = self.local(*self._local_bags(local_ids))
            if self.pooling == "mean":  # every bag of local table k holds bag_sizes[k] ids
                pooled = pooled * self._mean_scale[:, None]
        replicated = pooled.new_zeros(batch, 0, self.dim)
        if self.replicas is not None:  # the replicated tables' columns (B, S_r), looked up here
            replicated = self.replicas(ids[:, self._replicated_columns])  # raw ids: the kernel folds them
        return self._return_static(pooled, batch, replicated)

    def _return_static(self, pooled: Tensor, batch: int, replicated: Tensor) -> Tensor:
        """(W*B, K, D) pooled rows of this rank's tables -> (B, F, D) of this rank's samples, in table order: one
        all_to_all (in ``comm_dtype``: the result stays in it) and one copy that puts the owners' blocks in table
        order (none with one rank holding the tables in order)."""
        dim, k_self = self.dim, self.counts[self.rank]
        if self.world == 1:
            if self._identity_order:
                return pooled
            flat = pooled.reshape(-1)
        else:
            flat = Exchange.apply(pooled.reshape(-1), [batch * k_self * dim] * self.world,
                                   [batch * c * dim for c in self.counts], self.group, self.grad_scale,
                                   self.comm_dtype)
        return TableOrder.apply(flat, batch, self._exchange_tables.split(self.counts), self._table_rows(batch),
                                 replicated, self.replicated_tables)

    def _table_rows(self, batch: int) -> Tensor:
        """(B, F): the row of (sample b, table f) in the received buffer viewed as rows of D, i.e. owner q's
        (B, K_q) block at ``B * shards_before[q]``, then ``b * K_q + k`` (memoized per B)."""
        index = self._row_index.get(batch)
        if index is None:
            index = (batch * self._block_start + torch.arange(batch, device=self._block_start.device)[:, None]
                     * self._block_width + self._local_index)
            self._row_index[batch] = index
        return index

    def _lookup_remote(self, lengths: Tensor, shard_ids: Tensor, owner: Tensor, batch: int
                       ) -> tuple[Tensor, list[int]]:
        """Send bag lengths and ids to their owners, pool this rank's shards: -> ((Bg, K, D), each rank's B)."""
        counts, k_self = self.counts, self.counts[self.rank]
        ids_per_owner = torch.bincount(owner, minlength=self.world)
        if self.world == 1:
            recv_lengths, recv_ids, batches = lengths, shard_ids, [batch]
        else:
            meta = torch.stack([torch.full_like(ids_per_owner, batch), ids_per_owner], dim=1)
            meta_in = torch.empty_like(meta)
            dist.all_to_all_single(meta_in, meta, group=self.group)
            batches, n_in = meta_in[:, 0].tolist(), meta_in[:, 1].tolist()
            len_parts = lengths.split([batch * c for c in counts])
            id_parts = shard_ids.split(ids_per_owner.tolist())
            send = torch.cat([x for pair in zip(len_parts, id_parts) for x in pair])
            send_splits = [batch * c + int(n) for c, n in zip(counts, ids_per_owner.tolist())]
            recv_splits = [b * k_self + n for b, n in zip(batches, n_in)]
            recv = send.new_empty(sum(recv_splits))
            dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)
            parts = recv.split([x for b, n in zip(batches, n_in) for x in (b * k_self, n)])
            recv_lengths, recv_ids = torch.cat(parts[0::2]), torch.cat(parts[1::2])
        total = sum(batches)
        if self.local is None:
            empty = torch.zeros(total, 0, self.dim, device=shard_ids.device)
            return empty.requires_grad_(torch.is_grad_enabled() and self.training), batches
        offsets = torch.cat([recv_lengths.new_zeros(1), recv_lengths.cumsum(0)])
        return self.local(recv_ids, offsets), batches

    def _return(self, pooled_local: Tensor, batches: list[int], batch: int) -> Tensor:
        """Send each rank its rows of the pooled shards; add the partial sums of each table -> (B, F, D)."""
        counts, dim = self.counts, self.dim
        if self.world == 1:
            received = pooled_local
        else:
            send_splits = [b * counts[self.rank] * dim for b in batches]
            recv_splits = [batch * c * dim for c in counts]
            flat = Exchange.apply(pooled_local.reshape(-1), send_splits, recv_splits, self.group, self.grad_scale,
                                   self.comm_dtype).to(pooled_local.dtype)
            received = torch.cat([p.view(batch, c, dim) for p, c in zip(flat.split(recv_splits), counts)], dim=1)
        out = torch.zeros(batch, self.num_features, dim, dtype=received.dtype, device=received.device)
        return out.index_add(1, self.shard_table, received)

    def shard_states(self) -> list[tuple[Shard, Tensor, Tensor | None]]:
        """(shard, weight rows (n, D), optimizer state rows or None) of each local shard: views into the local
        module's storage (writing them changes the module)."""
        if self.local is None:
            return []
        out = []
        local_state = self.local.state
        for s, start in zip(self.local_shards, self.local.row_offsets.tolist()):
            state = local_state[start: start + s.rows] if local_state.numel() else None
            out.append((s, self.local.weight.data[start: start + s.rows], state))
        return out

