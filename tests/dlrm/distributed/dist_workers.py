"""Functions run in every rank of the distributed tests (importable by spawned processes), and the data and tiny
models they share with the single-process references."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

from fuselab.core.embedding_optimizer import RowwiseAdagrad, embedding_optimizer
from fuselab.dlrm.config import DLRMConfig
from fuselab.dlrm.distributed import (
    DistributedDLRM,
    ShardedEmbeddingCollection,
    fused_factory,
    init_from_env,
    local_slice,
    plan_sharding,
    shutdown,
    slice_bags,
    torch_factory,
)
from fuselab.dlrm.distributed.hybrid import build_hybrid
from fuselab.dlrm.interaction import DCNConfig, DCNInteraction

SIZES = [50, 7, 300, 13, 1]  # table 2 is split row-wise (row_wise_share below)
DIM = 4
BATCH = 16
TIMEOUT_S = 60.0


def make_bags(gen: torch.Generator, batch: int, sizes: list[int], max_bag: int) -> tuple[Tensor, Tensor]:
    """Random bags (0..max_bag ids, some empty), raw ids in [-1000, 1000) (the modulus picks the row)."""
    lengths = torch.randint(0, max_bag + 1, (batch * len(sizes),), generator=gen)
    ids = torch.randint(-1000, 1000, (int(lengths.sum()),), generator=gen)
    return ids, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


def make_plan(world: int, sizes: list[int] = SIZES, global_batch: int | None = None):
    """Table 2 split row-wise; with ``global_batch``, the small tables replicated (data-parallel)."""
    return plan_sharding(sizes, DIM, world, pooling_factors=[2.0] * len(sizes), row_wise_share=0.5,
                         global_batch=global_batch)


def _context(timeout_s: float = TIMEOUT_S):
    ctx = init_from_env(backend="gloo", timeout_s=timeout_s)  # CPU processes, also on a GPU machine
    torch.set_num_threads(1)
    return ctx


def embedding_cases(cfgs: list[dict], ctx=None) -> list[dict]:
    """:func:`embedding_steps` for each config, in one process group."""
    ctx = ctx or _context()
    results = [embedding_steps(cfg, ctx) for cfg in cfgs]
    if ctx.world_size > 1:
        shutdown()
    return results


def embedding_steps(cfg: dict, ctx) -> dict:
    """Two forward/backward steps of the sharded collection on this rank's slice of fixed global batches; returns
    the outputs of each step and the final local shard rows."""
    plan = make_plan(ctx.world_size, global_batch=cfg.get("replicate_batch"))
    factory = fused_factory if cfg.get("factory") == "fused" else torch_factory
    emb = ShardedEmbeddingCollection(plan, ctx.rank, factory=factory, optimizer=embedding_optimizer(cfg["optimizer"]),
                                     lr=0.3, pooling=cfg["pooling"], seed=5, grad_divisor=cfg.get("grad_divisor", 1.0),
                                     group=ctx.embedding_group, comm_dtype=cfg.get("comm_dtype"),
                                     table_dtype=cfg.get("table_dtype", "fp32"))
    gen = torch.Generator().manual_seed(11)
    outs = []
    for _ in range(2):
        ids, offsets = make_bags(gen, cfg["batch"], SIZES, 3)
        weight = torch.randn(cfg["batch"], len(SIZES), DIM, generator=gen)
        ids_r, off_r = slice_bags(ids, offsets, len(SIZES), ctx.rank, ctx.world_size)
        out = emb(ids_r, off_r)
        (out * weight[local_slice(cfg["batch"], ctx.rank, ctx.world_size)]).sum().backward()
        outs.append(out.detach())
    shards = [(s.table, s.row_start, s.row_end, w.clone(), None if m is None else m.clone())
              for s, w, m in emb.shard_states()]
    replicated = [] if emb.replicas is None else [(t, w.clone(), None if m is None else m.clone())
                                                  for t, w, m in emb.replicas.table_states()]
    return {"outs": outs, "shards": shards, "replicated": replicated}


class TinyDense(nn.Module):
    """Bottom MLP 13 -> 8 -> D, interaction (``dot``: dense + lower-triangle dot products; ``dcn``: DCNv2 rank 3,
    2 layers), top MLP -> 8 -> 1: forward(dense (B, 13), emb (B, F, D)) -> logits (B,)."""

    def __init__(self, num_sparse: int, interaction: str, seed: int):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.bottom = nn.Sequential(nn.Linear(13, 8), nn.ReLU(), nn.Linear(8, DIM), nn.ReLU())
        if interaction == "dcn":
            self.inter = DCNInteraction(DCNConfig(layers=2, low_rank=3), num_sparse=num_sparse, dim=DIM, dense_dim=DIM,
                                        generator=gen)
            width = self.inter.out_features
        else:
            self.inter = None
            n = num_sparse + 1
            self.register_buffer("rows", torch.tril_indices(n, n, -1)[0], persistent=False)
            self.register_buffer("cols", torch.tril_indices(n, n, -1)[1], persistent=False)
            width = DIM + n * (n - 1) // 2
        self.top = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))
        with torch.no_grad():
            for p in [*self.bottom.parameters(), *self.top.parameters()]:
                p.normal_(0.0, 0.3, generator=gen)

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        x = self.bottom(dense)
        if self.inter is not None:
            z = self.inter(x, emb)
        else:
            v = torch.cat([x.unsqueeze(1), emb], dim=1)
            z = torch.cat([x, torch.bmm(v, v.transpose(1, 2))[:, self.rows, self.cols]], dim=1)
        return self.top(z).squeeze(1)


def global_batch(step: int, batch: int, seed: int = 3) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The global batch of a step: dense (B, 13), ids (N,), offsets (B*F + 1,), labels (B,), from (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    dense = torch.rand(batch, 13, generator=gen)
    ids, offsets = make_bags(gen, batch, SIZES, 3)
    labels = (dense[:, 0] + 0.3 * torch.rand(batch, generator=gen) < 0.5).float()  # learnable
    return dense, ids, offsets, labels


def build(ctx, cfg: dict) -> tuple[DistributedDLRM, torch.optim.Optimizer]:
    plan = make_plan(ctx.world_size)
    sparse = ShardedEmbeddingCollection(plan, ctx.rank, factory=torch_factory, optimizer=RowwiseAdagrad(),
                                        lr=0.1, seed=7, group=ctx.embedding_group)
    model = DistributedDLRM(sparse, TinyDense(len(SIZES), cfg.get("interaction", "dot"), seed=1))
    opt = torch.optim.SGD(model.dense_parameters(), lr=0.3, momentum=0.5)
    return model, opt


def train_steps(ctx, model, opt, first: int, last: int, batch: int, die_at: int | None = None) -> list[float]:
    """Steps ``[first, last)`` on this rank's slice; returns the global mean loss of each step."""
    losses = []
    for step in range(first, last):
        dense, ids, offsets, labels = global_batch(step, batch)
        part = local_slice(batch, ctx.rank, ctx.world_size)
        ids_r, off_r = slice_bags(ids, offsets, len(SIZES), ctx.rank, ctx.world_size)
        if die_at == step and ctx.rank == ctx.world_size - 1:
            os._exit(17)  # a rank dies mid-step: after the others entered the step's first exchange
        logits = model(dense[part], ids_r, off_r)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels[part])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach() * (part.stop - part.start) / batch
        if ctx.world_size > 1:
            dist.all_reduce(total, group=ctx.embedding_group)
        losses.append(float(total))
    return losses


def train(cfg: dict, ctx=None) -> list[float]:
    ctx = ctx or _context()
    model, opt = build(ctx, cfg)
    losses = train_steps(ctx, model, opt, 0, cfg["steps"], cfg["batch"])
    if ctx.world_size > 1:
        shutdown()
    return losses


def train_and_checkpoint(cfg: dict, ctx=None) -> list[float]:
    """Train steps [0, cfg['save_at']), save a checkpoint, go on to cfg['steps'] (dying at cfg['die_at'])."""
    from fuselab.dlrm.distributed.checkpoint import save_checkpoint

    ctx = ctx or _context()
    model, opt = build(ctx, cfg)
    losses = train_steps(ctx, model, opt, 0, cfg["save_at"], cfg["batch"])
    save_checkpoint(cfg["root"], cfg["save_at"], model.sparse, model.dense_module, opt, extra={"note": "test"})
    losses += train_steps(ctx, model, opt, cfg["save_at"], cfg["steps"], cfg["batch"], cfg.get("die_at"))
    if ctx.world_size > 1:
        shutdown()
    return losses


def resume(cfg: dict, ctx=None) -> list[float]:
    """Load the latest checkpoint under cfg['root'] at this world size and train to cfg['steps']."""
    from fuselab.dlrm.distributed.checkpoint import load_checkpoint

    ctx = ctx or _context()
    model, opt = build(ctx, cfg)
    meta = load_checkpoint(cfg["root"], model.sparse, model.dense_module, opt)
    losses = train_steps(ctx, model, opt, meta["step"], cfg["steps"], cfg["batch"])
    if ctx.world_size > 1:
        shutdown()
    return losses


def hang_in_exchange(cfg: dict) -> None:
    """The last rank stalls (never reaches the step's exchange); the others must fail on the process group's
    timeout instead of waiting forever."""
    import time

    ctx = _context(timeout_s=cfg["timeout_s"])
    model, opt = build(ctx, cfg)
    train_steps(ctx, model, opt, 0, 1, cfg["batch"])
    if ctx.rank == ctx.world_size - 1:
        time.sleep(cfg["stall_s"])
        os._exit(0)
    train_steps(ctx, model, opt, 1, 2, cfg["batch"])


#: fixed bag sizes of the tables of SIZES (multi-hot): table 1 one id, others several
BAG_SIZES = [2, 1, 3, 2, 4]


def static_vs_dynamic(cfgs: list[dict], ctx=None) -> list[dict]:
    """For each config: two collections over a plan of whole tables, one with the static exchange
    (``uniform_batch=True``), one without; two steps on the same 2-D batches (the same B on every rank): one id
    per table, or with ``cfg["bags"]`` fixed-size bags of :data:`BAG_SIZES` (the general path gets them as flat
    ids + offsets). Returns both paths' outputs of each step and final shard rows and state, and whether the
    static path was taken."""
    from fuselab.dlrm.bags import FixedBags

    ctx = ctx or _context()
    results = []
    for cfg in cfgs:
        plan = plan_sharding(SIZES, DIM, ctx.world_size, row_wise_share=float("inf"),
                             global_batch=cfg.get("replicate_batch"))
        factory = fused_factory if cfg.get("factory") == "fused" else torch_factory
        sizes = BAG_SIZES if cfg.get("bags") else None
        bags = FixedBags(sizes or [1] * len(SIZES))
        paths = {}
        for name, uniform in (("static", True), ("dynamic", False)):
            emb = ShardedEmbeddingCollection(plan, ctx.rank, factory=factory,
                                             optimizer=embedding_optimizer(cfg["optimizer"]), lr=0.3, seed=5,
                                             grad_divisor=1.0, group=ctx.embedding_group,
                                             comm_dtype=cfg.get("comm_dtype"), pooling=cfg.get("pooling", "sum"),
                                             uniform_batch=uniform, multi_hot_sizes=sizes)
            gen = torch.Generator().manual_seed(13)
            outs = []
            for _ in range(2):
                ids = torch.randint(-1000, 1000, (cfg["batch"] * ctx.world_size, bags.width), generator=gen)
                weight = torch.randn(cfg["batch"] * ctx.world_size, len(SIZES), DIM, generator=gen)
                part = local_slice(cfg["batch"] * ctx.world_size, ctx.rank, ctx.world_size)
                out = emb(ids[part]) if uniform or sizes is None else emb(*bags(ids[part]))
                (out.float() * weight[part]).sum().backward()
                outs.append(out.detach().float())
            replicas = [] if emb.replicas is None else emb.replicas.table_states()
            paths[name] = {"outs": outs, "taken": emb.static, "replicated": list(plan.replicated),
                           "shards": [(s.table, w.clone(), None if m is None else m.clone())
                                      for s, w, m in emb.shard_states()]
                           + [(t, w.clone(), None if m is None else m.clone()) for t, w, m in replicas]}
        results.append(paths)
    if ctx.world_size > 1:
        shutdown()
    return results


def _hybrid_conf(ctx, batch: int, precision: str) -> DLRMConfig:
    return DLRMConfig(name="test", embedding_dim=DIM, bottom_mlp=[8, DIM], top_mlp=[6, 1], seed=3,
                      precision=precision, optimizer="rowwise_adagrad", lr_dense=0.3, lr_sparse=0.2,
                      batch_size=batch * ctx.world_size).validate()


def _rank_batches(ctx, batch: int, steps: int, seed: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """This rank's slice of ``steps`` seeded global batches (one raw id per table)."""
    part, total = local_slice(batch * ctx.world_size, ctx.rank, ctx.world_size), batch * ctx.world_size
    out = []
    for k in range(steps):
        gen = torch.Generator().manual_seed(seed + k)
        dense = torch.rand(total, 13, generator=gen)
        ids = torch.randint(-1000, 1000, (total, len(SIZES)), generator=gen)
        labels = (dense[:, 0] + 0.3 * torch.rand(total, generator=gen) < 0.5).float()
        out.append((dense[part], ids[part], labels[part]))
    return out


def _final_state(model, losses: list[float]) -> dict:
    replicas = [] if model.sparse.replicas is None else model.sparse.replicas.table_states()
    return {"losses": losses, "dense": [p.detach().clone() for p in model.dense_parameters()],
            "shards": [w.clone() for _, w, _ in [*model.sparse.shard_states(), *replicas]]}


def overlap_vs_plain(cfg: dict, ctx=None) -> dict:
    """:func:`~fuselab.dlrm.distributed.hybrid.build_hybrid`'s eager step with overlap (split forward around the
    lookup, one flat all-reduce of the dense gradients) and without it (DDP), ``cfg["steps"]`` steps each on this
    rank's slice of the same global batches (one id per table, whole tables but the replicated 1-row one: the
    static exchange, rows sent as int32, pooled rows in bf16 under ``cfg["precision"] == "bf16"``). Returns each
    variant's losses, dense parameters and shard rows."""
    ctx = ctx or _context()
    conf = _hybrid_conf(ctx, cfg["batch"], cfg["precision"])
    batches = _rank_batches(ctx, cfg["batch"], cfg["steps"], 1000)
    results = {}
    for overlap in (False, True):
        model, _, step, plan = build_hybrid(conf, SIZES, ctx, kernels="torch", mode="eager", overlap=overlap,
                                            replicate=True)
        assert model.ddp != overlap and plan.replicated == [4]  # the 1-row table: data-parallel
        results[overlap] = _final_state(model, [float(step(*batch)) for batch in batches])
        model.unwrap()
    if ctx.world_size > 1:
        shutdown()
    return results


def _counted(counts: dict, name: str, method):
    def call(*args):
        counts[name] += 1
        return method(*args)
    return call


def pipelined_vs_plain(cfg: dict, ctx=None) -> dict:
    """build_hybrid's eager step with overlap (one flat all-reduce), ``cfg["steps"]`` steps on this rank's slice of
    the same global batches, without and with ``pipeline`` (each call names the next batch's ids, sent after its
    updates; at step ``cfg["break_at"]`` none is named, so the next call exchanges its own). Returns each variant's
    losses, dense parameters, shard rows and how often ids were exchanged (``counts``)."""
    ctx = ctx or _context()
    conf = _hybrid_conf(ctx, cfg["batch"], "fp32")
    batches = _rank_batches(ctx, cfg["batch"], cfg["steps"], 2000)
    results = {}
    for pipeline in (False, True):
        model, _, step, _ = build_hybrid(conf, SIZES, ctx, kernels=cfg["kernels"], mode="eager", overlap=True,
                                         replicate=True, pipeline=pipeline)
        counts = {"prefetch": 0, "exchange": 0}
        sparse = model.sparse
        sparse.prefetch = _counted(counts, "prefetch", sparse.prefetch)
        sparse._exchange_ids = _counted(counts, "exchange", sparse._exchange_ids)
        losses = []
        for k, batch in enumerate(batches):
            ahead = {}
            if pipeline and k + 1 < len(batches) and k != cfg["break_at"]:
                ahead["next_sparse"] = batches[k + 1][1]
            losses.append(float(step(*batch, **ahead)))
        results[pipeline] = {**_final_state(model, losses), "counts": counts}
    if ctx.world_size > 1:
        shutdown()
    return results
