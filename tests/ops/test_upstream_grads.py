"""Every op's backward against float64 with upstream gradients of every layout a loss hands it: contiguous, expanded
(``(out.sum() * 2).backward()``: one value, every stride 0), transposed, sliced (padded rows) and broadcast rows, on
the first call and on a repeat of its signature (the cached plans), through the fast launcher and its fallback.

GPU tests: on an H200, RoPE's gradient for an expanded upstream gradient was reported wrong in about half of its
elements while the interpreter was right (issue 41, item 9); ``benchmarks/gpu_checks/rope_expanded_grad.py`` prints
the pattern of a failure."""

from __future__ import annotations

import pytest
import torch
from op_runs import OPS, UPSTREAMS, reference, run

import fuselab
from fuselab.ops import _launch
from fuselab.reference import rope as ref_rope
from fuselab.testing import assert_close

pytestmark = pytest.mark.gpu

#: per op, the dtype its outputs are compared in (the embedding tables: fp32 state updated in place)
_DTYPE = torch.float32


@pytest.mark.parametrize("launcher", ["fast", "plain"])
@pytest.mark.parametrize("kind", list(UPSTREAMS))
@pytest.mark.parametrize("name", OPS)
def test_backward_with_upstream_layouts_gpu(triton_backend, device, name, kind, launcher):
    fuselab.ops.clear()
    want = reference(name, device, UPSTREAMS[kind])
    for call in ("first", "repeat"):
        if launcher == "plain":
            with _launch.plain_launches():
                got = run(name, device, UPSTREAMS[kind])
        else:
            got = run(name, device, UPSTREAMS[kind])
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, _DTYPE, f"{name} {kind} {launcher} {call}: result {i}", chained=True)


def _rope_case(layout, dtype, rotary, transposed, device):
    b, s, h, d = 2, 5, 3, 16
    phys = (b, s, h, d) if layout == "bshd" else (s, b, h, d)
    if transposed:
        x = torch.randn(phys[2], phys[0], phys[1], d, device=device).to(dtype).permute(1, 2, 0, 3)
    else:
        x = torch.randn(phys, device=device).to(dtype)
    cos, sin = fuselab.rope_cos_sin(16, rotary or d, device=device)
    return x, cos, sin, torch.randint(0, 16, (b, s), device=device)


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
@pytest.mark.parametrize("rotary", [None, 8], ids=["full", "partial"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_rope_positions_summed_loss_gpu(triton_backend, device, layout, dtype, rotary, transposed):
    """The reported case: (batch, seq) positions, ``(out.sum() * 2).backward()``; first call and repeats."""
    fuselab.ops.clear()
    x, cos, sin, pos = _rope_case(layout, dtype, rotary, transposed, device)
    t64 = x.detach().double().requires_grad_(True)
    out64, _ = ref_rope.apply_rope(t64, None, cos.double(), sin.double(), layout=layout, positions=pos)
    (out64.sum() * 2).backward()
    for call in range(3):
        t = x.detach().clone().requires_grad_(True)
        out, _ = fuselab.apply_rope(t, None, cos, sin, layout=layout, positions=pos)
        (out.sum() * 2).backward()
        assert_close(t.grad, t64.grad, dtype, f"rope grad, {layout}, call {call}", chained=True)
