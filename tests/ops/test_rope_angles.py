"""Scaled rotary frequencies (HF formulas) and in-kernel angles vs the table path."""

from __future__ import annotations

import math

import pytest
import torch

import fuselab
from fuselab.core.rope_math import rope_frequencies
from fuselab.testing import assert_close

SCALINGS = {
    "none": None,
    "linear": {"type": "linear", "factor": 4.0},
    "ntk": {"type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16, "seq_len": 40},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn_mscale": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.707,
                    "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2},
}


def hf_style(dim, base, scaling):
    """The HF rope-utils formulas, written independently in HF's float32 style: (inv_freq, attention factor)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling is None:
        return inv, 1.0
    kind = scaling.get("type", scaling.get("rope_type"))
    f = scaling["factor"]
    if kind == "linear":
        return inv / f, 1.0
    if kind in ("ntk", "dynamic"):
        if "seq_len" in scaling:
            m = scaling["original_max_position_embeddings"]
            b2 = base * ((f * max(scaling["seq_len"], m) / m) - (f - 1)) ** (dim / (dim - 2))
        else:
            b2 = base * f ** (dim / (dim - 2))
        return 1.0 / (b2 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)), 1.0
    old = scaling["original_max_position_embeddings"]
    if kind == "llama3":
        lo_w, hi_w = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
        wl = 2 * math.pi / inv
        out = torch.where(wl > lo_w, inv / f, inv)
        sm = (old / wl - scaling["low_freq_factor"]) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])
        smoothed = (1 - sm) * out / f + sm * out
        is_medium = ~(wl < hi_w) & ~(wl > lo_w)
        return torch.where(is_medium, smoothed, out), 1.0

    def get_mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        att = get_mscale(f, scaling["mscale"]) / get_mscale(f, scaling["mscale_all_dim"])
    else:
        att = get_mscale(f)
    bf, bs = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

    def corr(n):
        return (dim * math.log(old / (n * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    return (1.0 / (f * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra, att


@pytest.mark.parametrize("name", list(SCALINGS))
def test_frequencies_match_hf_formulas(name):
    inv, att = rope_frequencies(64, 10000.0, SCALINGS[name])
    want, want_att = hf_style(64, 10000.0, SCALINGS[name])
    torch.testing.assert_close(inv.float(), want, rtol=2e-6, atol=0)
    assert att == pytest.approx(want_att, rel=1e-12)
    cos, sin = fuselab.rope_cos_sin(5, 64, scaling=SCALINGS[name], dtype=torch.float64)
    assert cos.shape == (5, 32) and cos.dtype == torch.float64
    torch.testing.assert_close(cos[3], (3 * inv).cos() * att)
    torch.testing.assert_close(sin[3], (3 * inv).sin() * att)


def test_scaling_effects():
    base = rope_frequencies(64)[0]
    llama = rope_frequencies(64, 10000.0, SCALINGS["llama3"])[0]
    assert llama[0] == base[0] and torch.allclose(llama[-1], base[-1] / 8)  # high freq kept, low freq / factor
    yarn, att = rope_frequencies(64, 10000.0, SCALINGS["yarn"])
    assert yarn[0] == base[0] and torch.allclose(yarn[-1], base[-1] / 4) and att == pytest.approx(0.1 * math.log(4) + 1)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_in_kernel_angles_match_tables(triton_backend, device, name):
    scaling = SCALINGS[name]
    q, k = torch.randn(2, 9, 3, 16, device=device), torch.randn(2, 9, 1, 16, device=device)
    pos = torch.randint(0, 40, (2, 9), device=device)
    interleaved = name in ("ntk", "yarn")
    rdim = 12 if name == "llama3" else 16
    cos, sin = fuselab.rope_cos_sin(40, rdim, base=500.0, scaling=scaling, device=device)
    want = fuselab.apply_rope(q, k, cos, sin, positions=pos, interleaved=interleaved)
    got = fuselab.apply_rope(q, k, None, None, positions=pos, interleaved=interleaved, base=500.0, scaling=scaling,
                             rotary_dim=rdim)
    assert_close(got[0], want[0].double(), torch.float32, f"q, in-kernel angles ({name})")
    assert_close(got[1], want[1].double(), torch.float32, f"k, in-kernel angles ({name})")


def test_in_kernel_angles_grads_and_cpu_path(request, device):
    """Angles path: kernel vs the reference (CPU) path, forward and gradients, thd with tensor offsets."""
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    offsets = torch.tensor([3, 100], device=device)
    results = []
    for backend in ("triton_backend", "torch_backend"):
        request.getfixturevalue(backend)
        q = torch.randn(12, 2, 16, generator=torch.Generator().manual_seed(3)).to(device).requires_grad_(True)
        qo, _ = fuselab.apply_rope(q, None, None, None, layout="thd", cu_seqlens=cu, seqlen_offsets=offsets,
                                   scaling=SCALINGS["yarn"])
        qo.backward(torch.ones_like(qo))
        results.append((qo.detach(), q.grad))
    assert_close(results[0][0], results[1][0].double(), torch.float32, "angles fwd")
    assert_close(results[0][1], results[1][1].double(), torch.float32, "angles grad", chained=True)


def test_cos_sin_tables_follow_the_default_device():
    """``rope_cos_sin`` without a device places its tables as torch's factory functions do: on the default device
    (a ``with torch.device(...)`` context's), the angles computed on the CPU all the same; an explicit device wins."""
    want_cos, want_sin = fuselab.rope_cos_sin(8, 16)
    with torch.device("meta"):
        cos, sin = fuselab.rope_cos_sin(8, 16)
        explicit, _ = fuselab.rope_cos_sin(8, 16, device="cpu")
    assert cos.device.type == sin.device.type == "meta" and cos.shape == want_cos.shape == (8, 8)
    assert explicit.device.type == "cpu" and torch.equal(explicit, want_cos) and want_sin.device.type == "cpu"
