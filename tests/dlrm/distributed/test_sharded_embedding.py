"""ShardedEmbeddingCollection at 1, 2 and 4 ranks (gloo), with the torch and the fused local module, against a
float64 single-process reference written here: outputs of two steps and the updated rows and optimizer state,
multi-hot bags (empty ones too), raw ids taken modulo the table sizes, table-wise and row-wise shards."""

from __future__ import annotations

import pytest
import torch
from dist_workers import (
    DIM,
    SIZES,
    embedding_cases,
    make_bags,
    make_plan,
    static_vs_dynamic,
)

from fuselab.dlrm.distributed import ShardedEmbeddingCollection, init_rows, torch_factory
from fuselab.dlrm.distributed.launch import spawn_local

CASES = [{"optimizer": "adagrad", "pooling": "mean", "batch": 8},
         {"optimizer": "rowwise_adagrad", "pooling": "sum", "batch": 10},
         {"optimizer": "sgd", "pooling": "sum", "batch": 4},
         {"optimizer": "sgd", "pooling": "sum", "batch": 6, "comm_dtype": torch.bfloat16},
         {"optimizer": "sgd", "pooling": "sum", "batch": 6, "comm_dtype": torch.bfloat16, "grad_divisor": 4.0},
         # tables 1, 3 and 4 replicated (data-parallel) at 2 and 4 ranks
         {"optimizer": "adagrad", "pooling": "mean", "batch": 8, "replicate_batch": 64},
         {"optimizer": "rowwise_adagrad", "pooling": "sum", "batch": 8, "grad_divisor": 4.0, "replicate_batch": 64},
         {"optimizer": "sgd", "pooling": "sum", "batch": 6, "comm_dtype": torch.bfloat16, "replicate_batch": 64}]
#: per case: (atol, rtol) of outputs and rows; bf16 on the wire rounds outputs and gradients to 8 bits
TOLERANCE = {None: (1e-6, 1e-5), torch.bfloat16: (2e-2, 1e-2)}
#: half-precision tables: the initial rows rounded to the table's dtype, each update rounded stochastically (within
#: one unit in the last place: 2^-8 relative for bf16, 2^-11 for fp16, per update)
HALF_TOLERANCE = {"bf16": (1e-3, 2e-2), "fp16": (1e-4, 3e-3)}
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def reference(cfg: dict, world: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """(outputs of each step, final tables, final optimizer state) in float64, one loop per id; the gradient
    divided by ``grad_divisor`` when an exchange runs (``world`` > 1)."""
    divisor = cfg.get("grad_divisor", 1.0) if world > 1 else 1.0
    tables = [init_rows(5, t, n, 0, n, DIM).double() for t, n in enumerate(SIZES)]
    if cfg.get("table_dtype") in HALF_DTYPES:  # the sharded tables start rounded; replicated ones stay fp32
        plan = make_plan(world, global_batch=cfg.get("replicate_batch"))
        tables = [t if i in plan.replicated else t.to(HALF_DTYPES[cfg["table_dtype"]]).double()
                  for i, t in enumerate(tables)]
    rowwise = cfg["optimizer"] == "rowwise_adagrad"
    state = [torch.zeros(n, dtype=torch.float64) if rowwise else torch.zeros(n, DIM, dtype=torch.float64)
             for n in SIZES]
    gen = torch.Generator().manual_seed(11)
    outs, f_count, lr, eps = [], len(SIZES), 0.3, 1e-8
    for _ in range(2):
        ids, offsets = make_bags(gen, cfg["batch"], SIZES, 3)
        weight = torch.randn(cfg["batch"], f_count, DIM, generator=gen).double()
        out = torch.zeros(cfg["batch"], f_count, DIM, dtype=torch.float64)
        grads = [torch.zeros_like(t) for t in tables]
        for bag in range(cfg["batch"] * f_count):
            b, f = divmod(bag, f_count)
            rows = [int(v) % SIZES[f] for v in ids[int(offsets[bag]): int(offsets[bag + 1])]]
            scale = 1.0 / len(rows) if cfg["pooling"] == "mean" and rows else 1.0
            for row in rows:
                out[b, f] += tables[f][row] * scale
                grads[f][row] += weight[b, f] * scale / divisor
        outs.append(out)
        for t, g in enumerate(grads):
            if cfg["optimizer"] == "sgd":
                tables[t] -= lr * g
                continue
            state[t] += (g * g).mean(dim=1) if rowwise else g * g
            denom = state[t].sqrt()[:, None] + eps if rowwise else state[t].sqrt() + eps
            tables[t] -= lr * g / denom
    return outs, tables, state


def _compare(results: list[list[dict]], world: int, cases: list[dict] = CASES) -> None:
    for c, cfg in enumerate(cases):
        plan = make_plan(world, global_batch=cfg.get("replicate_batch"))
        if cfg.get("replicate_batch") and world > 1:
            assert plan.replicated == [1, 3, 4]
        ref_outs, ref_tables, ref_state = reference(cfg, world)
        half = cfg.get("table_dtype") in HALF_DTYPES
        atol, rtol = (HALF_TOLERANCE[cfg["table_dtype"]] if half else
                      TOLERANCE[cfg.get("comm_dtype") if world > 1 else None])
        for step in range(2):
            got = torch.cat([results[r][c]["outs"][step] for r in range(world)]).double()
            torch.testing.assert_close(got, ref_outs[step], atol=atol, rtol=rtol)
            if cfg.get("comm_dtype") is not None and world > 1:  # the wire's rounding shows, within its bounds
                assert not torch.allclose(got, ref_outs[step], atol=1e-6, rtol=1e-5)
        seen = 0
        for r in range(world):
            for table, lo, hi, w, m in results[r][c]["shards"]:
                assert any(s.rank == r and s.table == table and (s.row_start, s.row_end) == (lo, hi)
                           for s in plan.shards)
                assert w.dtype == (HALF_DTYPES[cfg["table_dtype"]] if half else torch.float32)
                torch.testing.assert_close(w.double(), ref_tables[table][lo:hi], atol=atol, rtol=rtol)
                if cfg["optimizer"] == "sgd":
                    assert m is None
                else:
                    torch.testing.assert_close(m.double(), ref_state[table][lo:hi], atol=1e-6, rtol=1e-5)
                seen += hi - lo
            replicas = results[r][c]["replicated"]  # every rank holds them whole, with the same state
            assert [t for t, _, _ in replicas] == plan.replicated
            for table, w, m in replicas:
                assert w.dtype == torch.float32
                torch.testing.assert_close(w.double(), ref_tables[table], atol=atol, rtol=rtol)
                if m is not None:
                    torch.testing.assert_close(m.double(), ref_state[table], atol=1e-6, rtol=1e-5)
                    assert torch.equal(m, results[0][c]["replicated"][plan.replicated.index(table)][2])
        assert seen == sum(n for t, n in enumerate(SIZES) if t not in plan.replicated)


def test_init_rows_independent_of_sharding():
    full = init_rows(3, 2, 10_000, 0, 10_000, 5, chunk_rows=777)
    for lo, hi in [(0, 1), (511, 513), (600, 9000), (9999, 10_000)]:
        assert torch.equal(init_rows(3, 2, 10_000, lo, hi, 5), full[lo:hi])
    bound = 10_000 ** -0.5
    assert full.abs().max() <= bound and abs(full.std() - bound / 3 ** 0.5) < 0.02 * bound  # U(-b, b)
    assert abs(float(full.mean())) < 0.02 * bound
    for other in (init_rows(3, 1, 10_000, 0, 10_000, 5), init_rows(4, 2, 10_000, 0, 10_000, 5)):
        assert not torch.isclose(other, full).any(dim=1).all()  # another table or seed: other values
    # neighbouring rows and columns are not correlated
    assert abs(float(torch.corrcoef(torch.stack([full[:-1, 0], full[1:, 0]]))[0, 1])) < 0.05
    assert abs(float(torch.corrcoef(torch.stack([full[:, 0], full[:, 1]]))[0, 1])) < 0.05
    with pytest.raises(ValueError, match="rows"):
        init_rows(3, 2, 10, 5, 11, 4)
    # written into a given tensor, chunk by chunk, rounded to its dtype
    into = torch.full((600, 5), float("nan"), dtype=torch.bfloat16)
    assert init_rows(3, 2, 10_000, 100, 700, 5, chunk_rows=64, out=into) is into
    assert torch.equal(into, full[100:700].to(torch.bfloat16))
    with pytest.raises(ValueError, match="out must be"):
        init_rows(3, 2, 10_000, 100, 700, 5, out=into[:10])


def test_one_rank_equals_reference():
    results = embedding_cases(CASES, ctx=_single())
    _compare([results], 1)


def _single():
    from fuselab.dlrm.distributed import ParallelContext

    return ParallelContext(0, 1, 0, torch.device("cpu"), "none")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_equals_reference(world):
    plan = make_plan(world)
    assert plan.kinds[2] == "row" and len(plan.shards_of_table(2)) == world
    results = spawn_local(world, embedding_cases, (CASES,))
    _compare(results, world)


def test_bad_inputs():
    emb = ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory)
    with pytest.raises(ValueError, match="ids must be"):
        emb(torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="offsets"):
        emb(torch.zeros(3, dtype=torch.int64), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="offsets must start"):
        emb(torch.zeros(3, dtype=torch.int64), torch.tensor([0, 1, 0, 2, 3, 3]))
    with pytest.raises(TypeError, match="ids must be an integer"):
        emb(torch.zeros(3, len(SIZES)))
    with pytest.raises(ValueError, match="rank"):
        ShardedEmbeddingCollection(make_plan(2), 2, factory=torch_factory)
    with pytest.raises(ValueError, match="pooling"):
        ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory, pooling="max")
    with pytest.raises(ValueError, match="comm_dtype"):
        ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory, comm_dtype=torch.int8)
    ids, offsets = make_bags(torch.Generator().manual_seed(0), 2, SIZES, 2)
    assert emb(ids, offsets).shape == (2, len(SIZES), DIM)


FUSED = [dict(case, factory="fused") for case in CASES]


def test_one_rank_fused_local_module_equals_reference():
    _compare([embedding_cases(FUSED, ctx=_single())], 1)


@pytest.mark.slow
def test_two_ranks_fused_local_module_equals_reference():
    _compare(spawn_local(2, embedding_cases, (FUSED,)), 2)


#: half-precision sharded tables (fused local module), the small tables replicated in fp32 at 2 ranks
HALF = [{"optimizer": "rowwise_adagrad", "pooling": "sum", "batch": 8, "factory": "fused", "table_dtype": "bf16"},
        {"optimizer": "sgd", "pooling": "mean", "batch": 6, "factory": "fused", "table_dtype": "fp16",
         "replicate_batch": 64}]


def test_half_tables_one_rank_equal_reference(monkeypatch):
    """Half-precision shards: the initial rows written into the weight in chunks (here of 3 rows) and rounded once,
    then the reference's outputs and updates within the dtype's rounding."""
    from fuselab.dlrm.distributed import local

    monkeypatch.setattr(local, "INIT_CHUNK_ROWS", 3)
    _compare([embedding_cases(HALF, ctx=_single())], 1, HALF)


@pytest.mark.slow
def test_half_tables_two_ranks_equal_reference():
    _compare(spawn_local(2, embedding_cases, (HALF,)), 2, HALF)


def test_prefetch_needs_the_static_exchange_and_a_prefetch():
    """Ids sent ahead (pipelining): forward(prefetched=True) equals the forward that exchanges them; without a
    prefetch of that batch size, in eval mode or without the static exchange: ValueError naming what is missing."""
    static = ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory, uniform_batch=True)
    ids = torch.randint(-50, 50, (5, len(SIZES)), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="call prefetch"):
        static(ids, prefetched=True)
    static.prefetch(ids)
    with torch.no_grad():
        torch.testing.assert_close(static(ids, prefetched=True), static(ids), rtol=0, atol=0)
    with pytest.raises(ValueError, match="call prefetch"):
        static(ids[:3], prefetched=True)
    static.eval()
    with pytest.raises(ValueError, match="training mode"):
        static(ids, prefetched=True)
    dynamic = ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory)
    with pytest.raises(ValueError, match="static exchange"):
        dynamic.prefetch(ids)


def test_half_tables_need_the_fused_module():
    with pytest.raises(ValueError, match="fp32 tables"):
        ShardedEmbeddingCollection(make_plan(1), 0, factory=torch_factory, table_dtype="bf16")


STATIC = [{"optimizer": "rowwise_adagrad", "batch": 6}, {"optimizer": "adagrad", "batch": 5},
          {"optimizer": "sgd", "batch": 4, "comm_dtype": torch.bfloat16},
          {"optimizer": "rowwise_adagrad", "batch": 6, "replicate_batch": 48}]  # small tables replicated


def _compare_static(results: list[list[dict]], world: int, cases: list[dict]) -> None:
    """The static exchange gives the dynamic path's outputs and updates (bf16 on the wire: within bf16 bounds)."""
    for c, cfg in enumerate(cases):
        atol, rtol = TOLERANCE[cfg.get("comm_dtype") if world > 1 else None]
        for r in range(world):
            static, dynamic = results[r][c]["static"], results[r][c]["dynamic"]
            assert static["taken"] and not dynamic["taken"]
            assert bool(static["replicated"]) == (bool(cfg.get("replicate_batch")) and world > 1)
            for a, b in zip(static["outs"], dynamic["outs"]):
                assert a.shape == b.shape == (cfg["batch"], len(SIZES), DIM)
                torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
            assert [t for t, _, _ in static["shards"]] == [t for t, _, _ in dynamic["shards"]]
            for (_, wa, ma), (_, wb, mb) in zip(static["shards"], dynamic["shards"]):
                torch.testing.assert_close(wa, wb, atol=atol, rtol=rtol)
                if ma is not None:
                    torch.testing.assert_close(ma, mb, atol=atol, rtol=rtol)


def test_static_exchange_one_rank():
    cases = [*STATIC, dict(STATIC[0], factory="fused")]
    _compare_static([static_vs_dynamic(cases, ctx=_single())], 1, cases)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_static_exchange_equals_dynamic(world):
    """One id per feature, whole tables, the same B on every rank: the exchange with split sizes from the plan
    (no host synchronization) equals the general one, through the backward's updates too."""
    _compare_static(spawn_local(world, static_vs_dynamic, (STATIC,)), world, STATIC)


MULTI_HOT = [{"optimizer": "rowwise_adagrad", "pooling": "sum", "batch": 5, "bags": True},
             {"optimizer": "adagrad", "pooling": "mean", "batch": 4, "bags": True},
             {"optimizer": "adagrad", "pooling": "mean", "batch": 4, "bags": True, "replicate_batch": 32}]


def test_static_exchange_of_fixed_bags_one_rank():
    cases = [*MULTI_HOT, dict(MULTI_HOT[1], factory="fused")]
    _compare_static([static_vs_dynamic(cases, ctx=_single())], 1, cases)


@pytest.mark.slow
def test_static_exchange_of_fixed_bags_two_ranks():
    """Fixed-size bags (MLPerf's multi-hot, ids (B, S)): the static exchange sends each table's bag columns to its
    owner and pools them there; the same outputs and updates as the general path given the same bags as
    (ids, offsets), sum and mean pooling."""
    _compare_static(spawn_local(2, static_vs_dynamic, (MULTI_HOT,)), 2, MULTI_HOT)


@pytest.mark.parametrize("replicated_tables", [[], [3, 6]])
@pytest.mark.parametrize("dtype, dim", [(torch.float32, 3), (torch.bfloat16, 16), (torch.float32, 4)])
def test_table_order_copies_every_row_both_ways(dtype, dim, replicated_tables):
    """TableOrder against a per-(sample, table) loop: owners' blocks and the replicated tables' rows (fp32, cast to
    the blocks' dtype) -> table order, and the gradient back; odd row widths (no 64-bit view) and word-sized rows,
    an owner without tables; every element compared (the expected gradient starts as NaN, so a row the reference
    misses fails too)."""
    from fuselab.dlrm.distributed.exchange import TableOrder

    gen = torch.Generator().manual_seed(3)
    batch, owners = 5, [[4, 0, 2], [], [1, 5]] if replicated_tables else [[4, 0, 2], [], [1, 5, 3, 6]]
    f_count = sum(len(t) for t in owners) + len(replicated_tables)
    flat = torch.randn(batch * (f_count - len(replicated_tables)) * dim, generator=gen).to(dtype).requires_grad_()
    replicated = torch.randn(batch, len(replicated_tables), dim, generator=gen).requires_grad_()
    where, start = {}, 0  # (b, f) -> row of flat viewed as (rows, dim)
    for tables in owners:
        for b in range(batch):
            for k, f in enumerate(tables):
                where[b, f] = start + b * len(tables) + k
        start += batch * len(tables)
    for b in range(batch):  # the replicated rows follow the flat ones
        for r, f in enumerate(replicated_tables):
            where[b, f] = start + b * len(replicated_tables) + r
    row_index = torch.tensor([[where[b, f] for f in range(f_count)] for b in range(batch)])
    owner_tables = [torch.tensor(t, dtype=torch.int64) for t in owners]
    out = TableOrder.apply(flat, batch, owner_tables, row_index, replicated,
                            torch.tensor(replicated_tables, dtype=torch.int64))
    rows = torch.cat([flat.detach().view(-1, dim), replicated.detach().to(dtype).reshape(-1, dim)])
    expected = torch.stack([torch.stack([rows[where[b, f]] for f in range(f_count)]) for b in range(batch)])
    assert out.dtype == dtype and torch.equal(out, expected)
    grad = torch.randn(batch, f_count, dim, generator=gen).to(dtype)
    out.backward(grad)
    grad_rows = torch.full((rows.shape[0], dim), float("nan"), dtype=dtype)
    for (b, f), r in where.items():
        grad_rows[r] = grad[b, f]
    flat_rows = flat.numel() // dim
    assert torch.equal(flat.grad.view(-1, dim), grad_rows[:flat_rows])
    assert replicated.grad.dtype == torch.float32
    assert torch.equal(replicated.grad.reshape(-1, dim), grad_rows[flat_rows:].float())
