"""Races and determinism on the GPU: each op launched many times with many programs in flight.

Every launch must give the same bits as the first, and the per-stream ticket counters (the last-to-arrive
protocol of the split reductions and the bias gradient) must be zero after each launch. The interpreter runs
programs one at a time in grid order, so none of this can fail on CPU: all tests here are GPU-only.
"""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab.nn import FusedLinear
from fuselab.ops import _tickets

pytestmark = pytest.mark.gpu

REPEATS = 20


def counters_zero(device: torch.device) -> bool:
    torch.cuda.synchronize(device)
    return int(_tickets.ticket_counters(device, 4096).abs().sum()) == 0


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def repeat(fn, device: torch.device) -> None:
    """Run ``fn`` (returning a tuple of tensors) REPEATS times: identical bits every time, counters left at zero."""
    first = [t.clone() for t in fn()]
    assert counters_zero(device)
    for i in range(REPEATS):
        again = fn()
        for j, (a, b) in enumerate(zip(first, again)):
            assert same_bits(a, b), f"launch {i + 1}: output {j} differs from the first launch"
        assert counters_zero(device), f"launch {i + 1} left ticket counters non-zero"


@pytest.mark.parametrize("shape,dim", [((2**24 + 3,), None), ((8192, 8192), 0), ((8192, 8192), -1),
                                       ((65536, 513), 0), ((37, 300_001), -1), ((64, 1024, 33), 1)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reduce_stress(device, shape, dim, dtype):
    x = torch.randn(shape, device=device, dtype=dtype)
    repeat(lambda: (fuselab.sum(x, dim), fuselab.mean(x, dim)), device)


@pytest.mark.parametrize("m,n", [(65536, 512), (4096, 4099), (300_000, 48)])
@pytest.mark.parametrize("activation", ["gelu_tanh", "relu"])
def test_bias_act_stress(device, m, n, activation):
    x = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    bias = torch.randn(n, device=device, dtype=torch.bfloat16)
    res = torch.randn(m, n, device=device, dtype=torch.bfloat16)
    g = torch.randn(m, n, device=device, dtype=torch.bfloat16)

    def run():
        leaves = [t.clone().requires_grad_(True) for t in (x, bias, res)]
        y = fuselab.bias_act(leaves[0], leaves[1], residual=leaves[2], alpha=0.5, activation=activation)
        y.backward(g)
        return (y.detach(), *(t.grad for t in leaves))

    repeat(run, device)


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_rope_stress(device, layout):
    b, s, hq, hk, d = 16, 1024, 32, 8, 128
    cos, sin = fuselab.rope_cos_sin(s + 16, d, device=device)
    if layout == "thd":
        lens = torch.randint(1, s, (b,))
        cu = torch.zeros(b + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        total = int(cu[-1])
        q = torch.randn(total, hq, d, device=device, dtype=torch.bfloat16)
        k = torch.randn(total, hk, d, device=device, dtype=torch.bfloat16)
        kw = {"layout": "thd", "cu_seqlens": cu.to(device), "seqlen_offsets": torch.randint(0, 16, (b,), device=device)}
    else:
        q = torch.randn(b, s, hq, d, device=device, dtype=torch.bfloat16)
        k = torch.randn(b, s, hk, d, device=device, dtype=torch.bfloat16)
        kw = {"seqlen_offsets": 7}
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def run():
        qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        qo, ko = fuselab.apply_rope(qq, kk, cos, sin, **kw)
        torch.autograd.backward((qo, ko), (gq, gk))
        return qo.detach(), ko.detach(), qq.grad, kk.grad

    repeat(run, device)


def test_fused_linear_stress(device):
    torch.manual_seed(0)
    layer = FusedLinear(1024, 4096, activation="gelu_tanh", device=device, dtype=torch.bfloat16)
    x = torch.randn(8192, 1024, device=device, dtype=torch.bfloat16)
    g = torch.randn(8192, 4096, device=device, dtype=torch.bfloat16)

    def run():
        layer.zero_grad(set_to_none=True)
        xx = x.clone().requires_grad_(True)
        y = layer(xx)
        y.backward(g)
        return y.detach(), xx.grad, layer.weight.grad, layer.bias.grad

    repeat(run, device)


def test_interleaved_streams_keep_counters_apart(device):
    """Split reductions on two streams at once: each stream's counters stay its own and end at zero."""
    x = torch.randn(8192, 8192, device=device)
    want = fuselab.sum(x, 0).clone()
    streams = [torch.cuda.Stream(device) for _ in range(2)]
    outs: list[list[torch.Tensor]] = [[], []]
    for _ in range(REPEATS):
        for i, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                outs[i].append(fuselab.sum(x, 0))
    torch.cuda.synchronize(device)
    for i, stream in enumerate(streams):
        assert all(same_bits(o, want) for o in outs[i]), f"stream {i}: a result differs"
        with torch.cuda.stream(stream):
            assert counters_zero(device)
