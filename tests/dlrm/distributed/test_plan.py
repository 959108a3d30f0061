"""The sharding planner: every table placed, exact row cover, budgets, balance, JSON round trip, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fuselab.core.embedding_optimizer import SGD, Adagrad, RowwiseAdagrad
from fuselab.dlrm.distributed.plan import Shard, ShardingPlan, plan_sharding, replicates, row_bytes


def _check_cover(plan: ShardingPlan) -> None:
    """Independent check: count the owners of every row of every table."""
    for t, n in enumerate(plan.table_sizes):
        owners = [0] * n
        for s in plan.shards:
            if s.table == t:
                for r in range(s.row_start, s.row_end):
                    owners[r] += 1
        assert owners == [1] * n, f"table {t}"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_plans_cover_every_row_once(world, seed):
    rng = random.Random(seed)
    sizes = [rng.choice([1, 3, 17, 100, 999, 4000]) for _ in range(rng.randint(1, 12))]
    pf = [rng.choice([0.0, 1.0, 3.0, 27.0]) for _ in sizes]
    plan = plan_sharding(sizes, 8, world, pooling_factors=pf, optimizer=Adagrad())
    _check_cover(plan)
    assert {s.table for s in plan.shards} == set(range(len(sizes)))
    assert all(0 <= s.rank < world for s in plan.shards)
    assert sum(plan.rank_bytes()) == sum(sizes) * row_bytes(8, Adagrad()) == sum(sizes) * (8 * 4 + 8 * 4)
    assert sum(plan.rank_lookups()) == pytest.approx(sum(pf))


def test_large_table_is_row_wise_and_budget_respected():
    sizes = [1000, 10, 20, 30, 40]
    per_row = row_bytes(4, RowwiseAdagrad())  # 4*4 + 4
    assert per_row == 20 and row_bytes(4, SGD()) == 16
    budget = 400 * per_row  # the 1000-row table fits no rank whole
    plan = plan_sharding(sizes, 4, 4, budget_bytes=budget)
    assert plan.kinds[0] == "row" and len(plan.shards_of_table(0)) == 4
    assert all(k == "table" for k in plan.kinds[1:])
    assert max(plan.rank_bytes()) <= budget
    _check_cover(plan)


def test_balance_by_lookups():
    # equal bytes, lookups 100 vs 1: the two heavy tables go to different ranks
    plan = plan_sharding([10, 10, 10, 10], 4, 2, pooling_factors=[100, 100, 1, 1])
    owner = {s.table: s.rank for s in plan.shards}
    assert owner[0] != owner[1]
    assert plan.rank_lookups() == [101.0, 101.0]


def test_balance_by_bytes():
    plan = plan_sharding([100, 60, 40, 50, 50], 4, 2, row_wise_share=10.0)
    assert sorted(plan.rank_bytes()) == [150 * 20, 150 * 20]


def test_impossible_budget_is_a_clear_error():
    from fuselab.dlrm.distributed.plan import PlanDoesNotFit

    with pytest.raises(PlanDoesNotFit, match="budgets total"):
        plan_sharding([100, 100], 4, 2, budget_bytes=50 * 20)
    # half-precision elements: 4 x 2 bytes + 4 of state per row, the same tables fit
    assert plan_sharding([100, 100], 4, 2, budget_bytes=12 * 100, element_bytes=2).rank_bytes() == [1200, 1200]
    # total fits, but the split leaves a table that fits no rank's remainder
    with pytest.raises(PlanDoesNotFit, match="fits no rank"):
        plan_sharding([60, 60, 60], 4, 2, budget_bytes=[95 * 20, 95 * 20], row_wise_share=10.0)


def test_json_round_trip_and_table():
    plan = plan_sharding([1000, 10, 20, 7], 8, 3, pooling_factors=[2, 1, 1, 5])
    text = json.dumps(plan.to_dict())
    back = ShardingPlan.from_dict(json.loads(text))
    assert back == plan
    table = plan.format_table()
    assert "3 ranks" in table and len(table.splitlines()) == 5
    for s in plan.shards:
        assert f"t{s.table}" in table


@pytest.mark.parametrize("bad", [
    [Shard(0, 0, 0, 5), Shard(0, 1, 4, 10)],  # row 4 twice
    [Shard(0, 0, 0, 5), Shard(0, 1, 6, 10)],  # row 5 missing
    [Shard(0, 0, 0, 9)],  # row 9 missing
    [Shard(0, 2, 0, 10)],  # no rank 2
])
def test_validate_rejects_bad_covers(bad):
    plan = ShardingPlan(2, 4, [10], bad, 20, [1.0])
    with pytest.raises(ValueError, match="plan"):
        plan.validate()


def test_argument_errors():
    with pytest.raises(ValueError, match="table_sizes"):
        plan_sharding([0, 3], 4, 2)
    with pytest.raises(ValueError, match="pooling_factors"):
        plan_sharding([3, 3], 4, 2, pooling_factors=[1.0])
    with pytest.raises(TypeError, match="optimizer must be an EmbeddingOptimizer"):
        plan_sharding([3], 4, 1, optimizer="adagrad")
    with pytest.raises(ValueError, match="budget_bytes"):
        plan_sharding([3], 4, 2, budget_bytes=[100])


def test_mlperf_v2_tables_on_8_ranks():
    cards = json.loads((Path(__file__).parents[3] / "src/fuselab/dlrm/configs/mlperf-v2.json").read_text())
    sizes, bags = cards["cardinalities"], cards["multi_hot_sizes"]
    plan = plan_sharding(sizes, 128, 8, pooling_factors=bags, budget_bytes=40 * 2**30)
    assert [t for t, k in enumerate(plan.kinds) if k == "row"] == [0, 9, 19, 20, 21]  # the 40M-row tables
    used = plan.rank_bytes()
    assert max(used) <= 40 * 2**30 and max(used) / min(used) < 1.15
    looks = plan.rank_lookups()
    assert max(looks) / (sum(bags) / 8) < 1.5
    with pytest.raises(ValueError, match="budgets total"):
        plan_sharding(sizes, 128, 8, budget_bytes=10 * 2**30)


def test_replicates_counts_the_bytes_each_way():
    """Data-parallel when the ring all-reduce of the fp32 gradient, 2 (W - 1) x rows x D x 4 bytes over all ranks,
    is below the exchange of (W - 1) / W of the samples' ids (int32) and pooled rows and their gradients."""
    # W = 2, B = 1024, D = 8, bf16 wire, one id: exchange 0.5 * 1024 * (2*8*2 + 4) = 18432; all-reduce 64 * rows
    assert plan_replicates(287) and not plan_replicates(288)
    assert not replicates(1, 8, 1, 1024)  # one rank: nothing to save
    # a bag of 100 ids per sample sends 400 bytes of ids: larger tables are worth replicating
    assert replicates(3000, 8, 2, 1024, pooling_factor=100.0, wire_bytes=2) and not plan_replicates(3000)


def plan_replicates(rows: int) -> bool:
    return replicates(rows, 8, 2, 1024, wire_bytes=2)


def test_kaggle_small_tables_are_replicated_on_two_ranks():
    from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES

    sizes = list(KAGGLE_CARDINALITIES)
    plan = plan_sharding(sizes, 16, 2, global_batch=131072, wire_bytes=2)
    assert plan.replicated == [t for t, n in enumerate(sizes) if n < 34816]  # 131072 * 68 / 256
    assert len(plan.replicated) == 18
    assert {s.table for s in plan.shards} == set(range(26)) - set(plan.replicated)
    assert all(plan.kinds[t] == "replicated" for t in plan.replicated)
    replica_bytes = sum(sizes[t] for t in plan.replicated) * plan.bytes_per_row
    assert sum(plan.rank_bytes()) == sum(n for t, n in enumerate(sizes) if t not in plan.replicated) \
        * plan.bytes_per_row + 2 * replica_bytes
    assert ShardingPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert "every rank (data-parallel" in plan.format_table() and "t8" in plan.format_table().splitlines()[-1]
    assert plan_sharding(sizes, 16, 1, global_batch=131072).replicated == []  # one rank: whole tables
    assert plan_sharding(sizes, 16, 2).replicated == []  # no batch given: no replication


def test_replicated_plans_are_validated():
    with pytest.raises(ValueError, match="replicated table"):
        ShardingPlan(2, 4, [10, 3], [Shard(0, 0, 0, 10), Shard(1, 1, 0, 3)], 20, [1.0, 1.0], replicated=[1]).validate()
    with pytest.raises(ValueError, match="ascending"):
        ShardingPlan(2, 4, [10, 3, 2], [Shard(0, 0, 0, 10)], 20, [1.0] * 3, replicated=[2, 1]).validate()
    with pytest.raises(ValueError, match="ascending"):
        ShardingPlan(2, 4, [10], [Shard(0, 0, 0, 10)], 20, [1.0], replicated=[3]).validate()
    ShardingPlan(2, 4, [10, 3], [Shard(0, 1, 0, 10)], 20, [1.0, 1.0], replicated=[1]).validate()
    with pytest.raises(ValueError, match="global_batch"):
        plan_sharding([3], 4, 2, global_batch=0)
