"""Seeded table initialisation: U(-1/sqrt(n), 1/sqrt(n)) per table in table order, drawn on the generator's device,
and on the tables' own device for tables too large to draw on the host."""

from __future__ import annotations

import math

import pytest
import torch

from fuselab.core import seeded


def test_each_table_in_its_range_and_seeded():
    sizes = [4, 100, 9]
    a, b = torch.empty(sum(sizes), 8), torch.empty(sum(sizes), 8)
    seeded.uniform_tables_(a, sizes, torch.Generator().manual_seed(3))
    seeded.uniform_tables_(b, sizes, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    for table, n in zip(a.split(sizes), sizes):
        bound = 1 / math.sqrt(n)
        assert table.abs().max() <= bound and table.abs().max() > 0.5 * bound


@pytest.mark.gpu
@pytest.mark.big_memory
def test_a_table_too_large_for_the_host_draws_on_its_device(monkeypatch):
    """Over the limit, the draw happens on the GPU from a generator the CPU one seeds: same seed, same values; in
    range; not the CPU draw's values."""
    monkeypatch.setattr(seeded, "DEVICE_DRAW_ELEMENTS", 1 << 16)
    sizes = [1 << 12, 1 << 13]
    draws = []
    for _ in range(2):
        w = torch.empty(sum(sizes), 32, device="cuda")
        seeded.uniform_tables_(w, sizes, torch.Generator().manual_seed(7))
        draws.append(w)
    assert torch.equal(draws[0], draws[1])
    for table, n in zip(draws[0].split(sizes), sizes):
        assert table.abs().max().item() <= 1 / math.sqrt(n)
    host = torch.empty(sum(sizes), 32)
    monkeypatch.setattr(seeded, "DEVICE_DRAW_ELEMENTS", 1 << 40)
    seeded.uniform_tables_(host, sizes, torch.Generator().manual_seed(7))
    assert not torch.equal(host, draws[0].cpu())
