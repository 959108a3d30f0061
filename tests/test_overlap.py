"""The memory-overlap checks of ops that write in place (:mod:`fuselab.core.checks`): exact for views of one storage
(random strided views against the set of addresses they reach), named errors for overlapping operands."""

from __future__ import annotations

import random

import pytest
import torch

from fuselab.core.checks import overlapping, require_disjoint, require_distinct_elements, self_overlapping


def _addresses(t: torch.Tensor) -> list[int]:
    index = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    return torch.as_strided(index, t.shape, t.stride(), t.storage_offset()).flatten().tolist()


def _random_view(storage: torch.Tensor, rng: random.Random) -> torch.Tensor:
    shape = [rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
    stride = [rng.randint(0, 9) for _ in shape]
    reach = sum((n - 1) * s for n, s in zip(shape, stride))
    return storage.as_strided(shape, stride, rng.randint(0, storage.numel() - 1 - reach))


def test_exact_against_the_addresses():
    rng, storage = random.Random(0), torch.zeros(200)
    for _ in range(500):
        a, b = _random_view(storage, rng), _random_view(storage, rng)
        assert overlapping(a, b) == bool(set(_addresses(a)) & set(_addresses(b))), (a.stride(), b.stride())
        addresses = _addresses(a)
        assert self_overlapping(a) == (len(set(addresses)) != len(addresses)), (a.shape, a.stride())


def test_packed_views():
    qkv = torch.randn(2, 5, 6, 16)
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:5], qkv[:, :, 5:]
    assert not overlapping(q, k) and not overlapping(k, v) and overlapping(q, qkv[:, :, 3:5])
    x = torch.randn(4, 4)
    assert overlapping(x, x.t()) and not overlapping(x[::2], x[1::2]) and not overlapping(x, torch.randn(4, 4))
    assert self_overlapping(torch.tensor(1.0).expand(3, 4)) and not self_overlapping(x.t())


def test_errors_name_the_operands():
    x, table = torch.randn(3, 8), torch.randn(3, 8)
    require_disjoint({"q": x, "k": torch.randn(3, 8)}, {"cos": table, "sin": None})
    with pytest.raises(ValueError, match="q and k overlap in memory"):
        require_disjoint({"q": x, "k": x[1:]}, {})
    with pytest.raises(ValueError, match="k and cos overlap in memory"):
        require_disjoint({"q": x, "k": table[:, :4]}, {"cos": table})
    with pytest.raises(ValueError, match="q is written in place but some of its elements share memory"):
        require_distinct_elements("q", torch.tensor(1.0).expand(2, 3))
