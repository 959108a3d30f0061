"""fuselab.core.device: the device facts the launch planners read: DRAM bandwidth per SM and the fast-memory switch."""

from __future__ import annotations

import pytest
import torch
import triton.testing

from fuselab.core import device as facts
from fuselab.core.precision import float32_matmul_precision


def test_cpu_stands_in_for_an_h100():
    """Off CUDA (the interpreter) plans are those of an H100, whatever the machine."""
    assert facts.dram_gbps_per_sm(torch.device("cpu")) == facts.INTERPRETER_DRAM_GBPS_PER_SM
    assert not facts.fast_memory(torch.device("cpu"))


def test_driver_without_memory_facts(monkeypatch):
    """A driver that cannot report its memory clock or bus width gets the H100 plan, not an exception."""
    def no_facts(device=None):
        raise RuntimeError("no memory clock")

    monkeypatch.setattr(triton.testing, "get_dram_gbps", no_facts)
    monkeypatch.setattr(facts, "_sm_count", lambda index: 132)
    assert facts._dram_gbps_per_sm.__wrapped__(0) == facts.INTERPRETER_DRAM_GBPS_PER_SM


@pytest.mark.parametrize("gbps_per_sm,fast", [(25.4, False), (29.9, False), (30.0, True), (36.5, True)])
def test_fast_memory_threshold(monkeypatch, gbps_per_sm, fast):
    """H100 SXM (25.4 GB/s per SM) plans as before; H200 (36.5) takes the fast-memory plans."""
    monkeypatch.setattr(facts, "dram_gbps_per_sm", lambda device: gbps_per_sm)
    assert facts.fast_memory(torch.device("cpu")) is fast


def test_float32_matmul_precision_is_restored_after_the_block_and_after_an_error():
    before = torch.get_float32_matmul_precision()
    other = "medium" if before != "medium" else "high"
    with float32_matmul_precision(other):
        assert torch.get_float32_matmul_precision() == other
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(RuntimeError, match="inside"), float32_matmul_precision(other):
        raise RuntimeError("inside")
    assert torch.get_float32_matmul_precision() == before
