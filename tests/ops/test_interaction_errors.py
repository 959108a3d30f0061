"""Every bad input to dot_interaction raises TypeError/ValueError naming the argument, on both backends, on a first
call and after good calls planned their signatures (a repeat takes the cached path: its signature holds everything
the checks read, ``pad_to`` by type and value); the backward op called directly checks its gradient the same way."""

from __future__ import annotations

import pytest
import torch

import fuselab.ops
from fuselab.backend import forced
from fuselab.ops.interaction import dot_interaction


@pytest.fixture
def backend(backend):
    """The shared ``backend`` fixture, with the op caches emptied before and after the test."""
    fuselab.ops.clear()
    yield backend
    fuselab.ops.clear()


def _bad_cases(device):
    t = lambda *s, dtype=torch.float32: torch.randn(*s, device=device).to(dtype)
    return [
        ((t(3, 4).cpu().numpy(), t(3, 2, 4)), {}, TypeError, "dense must be a torch.Tensor"),
        ((t(3, 4), t(3, 2, 4, dtype=torch.bfloat16)), {}, TypeError, "same dtype"),
        ((t(3, 4).int(), t(3, 2, 4).int()), {}, TypeError, "dense must be float32"),
        ((t(3, 1, 4), t(3, 2, 4)), {}, ValueError, r"dense must have 2 dims \(B, D\)"),
        ((t(3, 4), t(3, 8)), {}, ValueError, r"emb must have 3 dims \(B, F, D\)"),
        ((t(3, 4), t(2, 2, 4)), {}, ValueError, "dense has 3 rows but emb has 2"),
        ((t(3, 5), t(3, 2, 4)), {}, ValueError, "dense's width D=5 must equal"),
        ((t(3, 4), t(3, 129, 4)), {}, ValueError, "1 <= F <= 128"),
        ((t(3, 4), t(3, 0, 4)), {}, ValueError, "1 <= F <= 128"),
        ((t(3, 257), t(3, 2, 257)), {}, ValueError, r"D must be in \[1, 256\]"),
        ((t(3, 4), t(3, 2, 4)), {"pad_to": 0}, ValueError, "pad_to must be >= 1"),
        ((t(3, 4), t(3, 2, 4)), {"pad_to": 8.0}, TypeError, "pad_to must be an int"),
        ((t(3, 4), t(3, 2, 4).to("meta")), {}, ValueError, "dense is on .* but emb is on meta"),
        ((t(3, 4), t(3, 2, 4)), {"pad_to": True}, TypeError, "pad_to must be an int"),  # hashes as 1
    ]


def _good_calls(device) -> None:
    """Plan the signatures next to the bad cases' (fp32 and bf16, pad_to 1 and 8), forward and backward, twice."""
    for dtype in (torch.float32, torch.bfloat16):
        for pad_to in (1, 8):
            for _ in range(2):
                dense = torch.randn(3, 4, device=device, dtype=dtype, requires_grad=True)
                emb = torch.randn(3, 2, 4, device=device, dtype=dtype, requires_grad=True)
                dot_interaction(dense, emb, pad_to=pad_to).sum().backward()


@pytest.mark.parametrize("when", ["first", "cached"])
@pytest.mark.parametrize("index", range(14))
def test_bad_inputs(backend, device, when, index):
    if when == "cached":
        _good_calls(device)
    args, kwargs, exc, match = _bad_cases(device)[index]
    with pytest.raises(exc, match=match):
        dot_interaction(*args, **kwargs)


@pytest.mark.parametrize("when", ["first", "cached"])
def test_backward_op_checks_its_gradient(device, when):
    """fuselab::dot_interaction_bwd called directly: a gradient narrower than D + P, of another batch or not
    floating raises naming it; after a good call of the op too. A gradient of another float dtype is
    cast to the inputs' (the same values as the cast given)."""
    dense, emb = torch.randn(3, 4, device=device), torch.randn(3, 2, 4, device=device)
    bwd = torch.ops.fuselab.dot_interaction_bwd
    with forced("triton"):
        fuselab.ops.clear()
        grad = torch.randn(3, 7, device=device)
        if when == "cached":
            for _ in range(2):
                want = bwd(grad, dense, emb, False)
        for bad, exc, match in ((torch.randn(3, 6, device=device), ValueError, r"grad must be \(B=3, W >= 7\)"),
                                (torch.randn(2, 7, device=device), ValueError, r"grad must be \(B=3, W >= 7\)"),
                                (torch.ones(3, 7, device=device, dtype=torch.int64), TypeError, "grad must have a "
                                 "floating dtype")):
            with pytest.raises(exc, match=match):
                bwd(bad, dense, emb, False)
        got = bwd(grad.double(), dense, emb, False)
        for a, b in zip(got, bwd(grad, dense, emb, False)):
            assert a.dtype == torch.float32 and torch.equal(a, b)
        if when == "cached":
            for a, b in zip(got, want):
                assert torch.equal(a, b)
        fuselab.ops.clear()
