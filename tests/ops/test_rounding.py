"""Low-precision stores round to nearest even under the interpreter as on GPUs (``fuselab.ops._rounding``): the
kernels' bf16/fp16 outputs equal torch's rounding of the same float32 result, bit for bit."""

from __future__ import annotations

import pytest
import torch

import fuselab
from fuselab.ops.bias_act.launch import BiasActTuning
from fuselab.ops.tuning import override

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the interpreter's stores; on GPUs the fp32 math may contract into FMAs")

LOW = (torch.bfloat16, torch.float16)


def _same_bits(out: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bits wherever the result is a number (NaN payloads are not compared), naming the first difference."""
    assert out.dtype == want.dtype and out.shape == want.shape
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    a, b = out[~nan].view(torch.int16), want[~nan].view(torch.int16)
    bad = (a != b).nonzero()
    assert bad.numel() == 0, (f"{bad.numel()} of {a.numel()} elements differ, first: {out[~nan][bad[0]].item()} "
                              f"vs {want[~nan][bad[0]].item()}")


def _truncated(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) cast to bf16 by dropping the low 16 bits: what the interpreter's plain cast does."""
    return (x.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("flat", [True, False], ids=["flat", "tiles"])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_bias_act_rounds_to_nearest_even(triton_backend, dtype, flat, activation):
    """y = act(x + 0.5 r + b) in fp32 (each step exact in the same order as torch), stored as bf16/fp16: equal to
    torch's cast of the fp32 result; also the saved pre-activation and both gradients of the backward."""
    x = torch.randn(48, 80).to(dtype).requires_grad_(True)
    r = torch.randn(48, 80).to(dtype).requires_grad_(True)
    b = torch.randn(80)  # fp32 bias: sums that bf16/fp16 cannot hold
    with override(BiasActTuning(fwd_flat=flat)):
        y = fuselab.bias_act(x, b, residual=r, alpha=0.5, activation=activation)
        z = x.detach().float() + 0.5 * r.detach().float() + b
        want = z if activation == "none" else torch.relu(z)
        _same_bits(y.detach(), want.to(dtype))
        if dtype == torch.bfloat16:  # the test can fail: plain truncation gives other bits here
            assert not torch.equal(_truncated(want).view(torch.int16), want.to(dtype).view(torch.int16))
        g = torch.randn(48, 80).to(dtype)
        y.backward(g)
    dz = g.float() if activation == "none" else g.float() * (z > 0)
    _same_bits(x.grad, dz.to(dtype))
    _same_bits(r.grad, (0.5 * dz).to(dtype))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_rounds_to_nearest_even(triton_backend, dtype, interleaved):
    """q_out = (x1 c - x2 s, x2 c + x1 s) in fp32 from fp32 tables, stored as bf16/fp16: torch's cast of the same
    fp32 values, for q and k."""
    q, k = torch.randn(2, 5, 3, 32).to(dtype), torch.randn(2, 5, 1, 32).to(dtype)
    cos, sin = fuselab.rope_cos_sin(5, 32)
    q_out, k_out = fuselab.apply_rope(q, k, cos, sin, interleaved=interleaved)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    for t, out in ((q, q_out), (k, k_out)):
        t32 = t.float()
        x1, x2 = (t32[..., 0::2], t32[..., 1::2]) if interleaved else (t32[..., :16], t32[..., 16:])
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        want = torch.stack((o1, o2), -1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)
        _same_bits(out, want.to(dtype))
