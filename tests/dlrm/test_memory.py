"""The memory plan printed before training: exact table and state bytes, an estimate of the activations, and a
clear error naming the ways out when a run does not fit."""

from __future__ import annotations

import pytest

from fuselab.dlrm.config import load_config
from fuselab.dlrm.memory import GIB, RESERVE_BYTES, DoesNotFit, data_bytes, non_table_bytes, plan, run_shape, ways_out


def _mlperf(table_dtype="fp32", batch=65536):
    cfg = load_config("mlperf-v2", overrides=[f"embedding_dtype={table_dtype}", "optimizer=rowwise_adagrad"])
    rows = [min(n, cfg.max_rows_per_table) for n in cfg.cardinalities]
    return cfg, rows, run_shape(cfg, rows, batch)


def test_tables_and_state_are_counted_exactly():
    cfg, rows, shape = _mlperf()
    p = plan(shape, None, "test")
    assert cfg.optimizer == "rowwise_adagrad"
    by_name = {item.name: item.bytes for item in p.items}
    assert by_name["embedding tables"] == sum(rows) * 128 * 4
    assert by_name["optimizer state"] == sum(rows) * 4  # row-wise Adagrad: one fp32 per row
    assert shape.ids_per_sample == sum(cfg.multi_hot_sizes) == 214
    assert 97 < by_name["embedding tables"] / GIB < 98  # 204.2M rows x 128 x 4 bytes
    assert p.fits()


def test_what_a_rank_needs_besides_its_tables():
    """A sharding plan's budget: the plan's total less the tables and their state (dense, activations, data)."""
    cfg, rows, shape = _mlperf(batch=32768)
    by_name = {item.name: item.bytes for item in plan(shape, None, "t").items}
    assert non_table_bytes(shape) == by_name["dense parameters"] + by_name["activations"] > 0
    on_device = load_config("mlperf-v2", data_on_device=True)
    assert data_bytes(cfg, 214, 1000) == 0 and data_bytes(on_device, 214, 1000) == 1000 * (52 + 856 + 4)
    with_data = run_shape(on_device, rows, 32768, data_bytes(on_device, 214, 1000))
    assert non_table_bytes(with_data) == non_table_bytes(run_shape(on_device, rows, 32768)) + 1000 * 912


def test_half_precision_tables_halve_the_tables():
    _, rows, shape = _mlperf("fp16")
    assert {i.name: i.bytes for i in plan(shape, None, "t").items}["embedding tables"] == sum(rows) * 128 * 2


def test_a_run_that_does_not_fit_names_the_ways_out():
    _, _, shape = _mlperf()
    h100 = 79 * GIB
    p = plan(shape, h100, "NVIDIA H100 80GB HBM3")
    assert not p.fits()
    with pytest.raises(DoesNotFit) as err:
        p.check(ways_out(shape))
    text = str(err.value)
    assert "does NOT fit" in text and "--set embedding_dtype=fp16" in text and "--nproc N" in text
    assert "max_rows_per_table=10000000" in text and "NVIDIA H100" in text
    _, _, half = _mlperf("fp16")
    assert plan(half, h100, "h100").fits()  # 48.7 GiB of tables: the way out it names works


def test_the_reserve_counts():
    _, _, shape = _mlperf("fp16", batch=1024)
    total = plan(shape, None, "t").total
    assert plan(shape, total + RESERVE_BYTES, "t").fits()
    assert not plan(shape, total + RESERVE_BYTES - 1, "t").fits()


def test_lines_mark_estimates():
    _, _, shape = _mlperf()
    lines = plan(shape, 140 * GIB, "NVIDIA H200").lines()
    assert lines[0] == "memory plan on NVIDIA H200:"
    assert any(line.strip().startswith("activations") and "~" in line for line in lines)
    assert lines[-1].strip().startswith("total") and lines[-1].endswith("fits")
