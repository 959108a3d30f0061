"""RoPE scaling (``fuselab.core.rope_math``) against the installed transformers: every scaling type fuselab shares
with Hugging Face against ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (inverse frequencies and attention factor,
every element), the cos/sin tables against HF's rotary embedding module (dynamic NTK's per-length update included),
and the static NTK type against HF's dynamic formula at the length where the two agree. transformers 4.x runs these
in the subprocess of ``tests/test_hf.py::test_transformers_4x_in_a_subprocess``."""

from __future__ import annotations

import math

import pytest
import torch

import fuselab
from fuselab.core.rope_math import rope_frequencies
from fuselab.testing import assert_close
from hf_library import major, transformers

# fuselab's scaling dict (HF's keys; "original_max_position_embeddings" of "dynamic" is HF's
# config.max_position_embeddings), rotary_dim, base
CASES = {
    "default": ({"rope_type": "default"}, 64, 10000.0),
    "linear-2": ({"rope_type": "linear", "factor": 2.0}, 64, 10000.0),
    "linear-8-d16": ({"type": "linear", "factor": 8.0}, 16, 500000.0),
    "dynamic-2": ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}, 64, 10000.0),
    "dynamic-1.5-d16": ({"type": "dynamic", "factor": 1.5, "original_max_position_embeddings": 100}, 16, 500000.0),
    "dynamic-8-d128": ({"rope_type": "dynamic", "factor": 8.0, "original_max_position_embeddings": 48}, 128, 10000.0),
    "llama3-8": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}, 128, 500000.0),
    "llama3-32-d64": ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                       "original_max_position_embeddings": 64}, 64, 10000.0),
    "yarn-4": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 64, 10000.0),
    "yarn-16-mscale": ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
                        "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 16.0, "beta_slow": 2.0}, 128, 10000.0),
    "yarn-40-deepseek": ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                          "mscale": 1.0, "mscale_all_dim": 0.8}, 64, 10000.0),
    "yarn-2-attention": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                          "attention_factor": 1.3, "truncate": False}, 32, 500000.0),
}
DYNAMIC = [name for name in CASES if name.startswith("dynamic")]


def kind_of(scaling):
    return scaling.get("rope_type", scaling.get("type"))


def hf_config(library, scaling, rotary_dim, base):
    """A LlamaConfig holding ``scaling`` as HF reads it (``rope_parameters`` in 5.x, ``rope_scaling`` in 4.x). Its
    max_position_embeddings: dynamic's original maximum, factor times the original for llama3 and yarn (HF warns
    otherwise), else 256."""
    kind = kind_of(scaling)
    params = {"rope_type": kind, **{k: v for k, v in scaling.items() if k not in ("type", "rope_type", "seq_len")}}
    if kind == "dynamic":
        max_pos = params.pop("original_max_position_embeddings")
    elif kind in ("llama3", "yarn"):
        max_pos = int(params["factor"] * params["original_max_position_embeddings"])
    else:
        max_pos = 256
    common = {"hidden_size": 2 * rotary_dim, "num_attention_heads": 2, "head_dim": rotary_dim,
              "max_position_embeddings": max_pos}
    if major(library) >= 5:
        return library.LlamaConfig(**common, rope_parameters={**params, "rope_theta": base})
    return library.LlamaConfig(**common, rope_theta=base, rope_scaling=None if kind == "default" else params)


def hf_init(library, kind):
    """``ROPE_INIT_FUNCTIONS[kind]`` (5.x keeps "default" on the model's rotary embedding instead)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    if kind == "default" and kind not in ROPE_INIT_FUNCTIONS:
        return LlamaRotaryEmbedding.compute_default_rope_parameters
    return ROPE_INIT_FUNCTIONS[kind]


def inv_freq_rtol(base):
    """HF computes ``base ** (2i / d)`` in float32 from a rounded exponent (relative error up to ``ln(base)`` units
    of 2^-24), then a reciprocal, a division by the factor and (llama3, yarn) a blend: a few units more."""
    return (math.log(base) + 16) * 2.0**-24


def check_frequencies(library, scaling, rotary_dim, base, seq_len, what):
    config = hf_config(library, scaling, rotary_dim, base)
    want, want_att = hf_init(library, kind_of(scaling))(config, device="cpu", seq_len=seq_len)
    ours = scaling if seq_len is None else {**scaling, "seq_len": seq_len}
    got, att = rope_frequencies(rotary_dim, base, ours)
    assert want.dtype == torch.float32 and got.dtype == torch.float64
    assert_close(got, want.double(), atol=0.0, rtol=inv_freq_rtol(base), what=f"inv_freq, {what}")
    assert att == pytest.approx(float(want_att), rel=1e-12, abs=0.0), what


@pytest.mark.parametrize("name", list(CASES))
def test_frequencies_match_transformers(name):
    library = transformers()
    scaling, rotary_dim, base = CASES[name]
    check_frequencies(library, scaling, rotary_dim, base, None, name)


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_frequencies_match_transformers_at_each_length(name):
    """Unscaled up to the original maximum m (HF's seq_len None too), scaled from the length past it."""
    library = transformers()
    scaling, rotary_dim, base = CASES[name]
    m = scaling["original_max_position_embeddings"]
    unscaled = rope_frequencies(rotary_dim, base)[0]
    for seq_len in (1, m // 2, m - 1, m, m + 1, 2 * m, 3 * m + 5, 10 * m):
        check_frequencies(library, scaling, rotary_dim, base, seq_len, f"{name}, seq_len {seq_len}")
        got = rope_frequencies(rotary_dim, base, {**scaling, "seq_len": seq_len})[0]
        assert torch.equal(got, unscaled) == (seq_len <= m), f"seq_len {seq_len}: scaled only past {m}"
    assert torch.equal(rope_frequencies(rotary_dim, base, scaling)[0], unscaled)


def table_bound(inv_freq, mscale, seqlen, base):
    """Per element of a cos/sin table: HF's float32 angle (its inv_freq's error, the rounded product) and its
    float32 cos/sin and amplitude, against fuselab's float64 table."""
    angle = torch.arange(seqlen, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return mscale * (angle * (inv_freq_rtol(base) + 2.0**-23) + 2.0**-21)


def hf_tables(module, seqlen):
    """HF's rotary embedding forward for positions 0..seqlen-1: its (seqlen, rotary_dim // 2) cos and sin halves."""
    x = torch.zeros(1, 1, seqlen, module.inv_freq.shape[0] * 2)
    cos, sin = module(x, torch.arange(seqlen)[None])
    half = cos.shape[-1] // 2
    return cos[0, :, :half].double(), sin[0, :, :half].double()


def check_tables(library, module, scaling, rotary_dim, base, seqlen, what):
    ours = {**scaling, "seq_len": seqlen} if kind_of(scaling) == "dynamic" else scaling
    cos, sin = fuselab.rope_cos_sin(seqlen, rotary_dim, base=base, scaling=ours, dtype=torch.float64)
    want_cos, want_sin = hf_tables(module, seqlen)
    inv_freq, mscale = rope_frequencies(rotary_dim, base, ours)
    bound = table_bound(inv_freq, mscale, seqlen, base)
    assert_close(cos, want_cos, atol=bound, rtol=0.0, what=f"cos, {what}")
    assert_close(sin, want_sin, atol=bound, rtol=0.0, what=f"sin, {what}")


@pytest.mark.parametrize("name", list(CASES))
def test_tables_match_transformers_rotary_embedding(name):
    """``rope_cos_sin`` against a fresh HF rotary embedding module at a short and a long length (for "dynamic",
    with ``seq_len`` the table's length: the module's update past the original maximum)."""
    library = transformers()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    scaling, rotary_dim, base = CASES[name]
    for seqlen in (7, 301):
        module = LlamaRotaryEmbedding(hf_config(library, scaling, rotary_dim, base))
        check_tables(library, module, scaling, rotary_dim, base, seqlen, f"{name}, {seqlen} positions")


def test_dynamic_module_state_matches_transformers():
    """HF's module keeps the frequencies of the longest sequence since the last one shorter than the original
    maximum m (which resets it): fuselab's ``seq_len`` is that length, as docs/rope.md says."""
    library = transformers()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    scaling, rotary_dim, base = CASES["dynamic-2"]
    m = scaling["original_max_position_embeddings"]
    module = LlamaRotaryEmbedding(hf_config(library, scaling, rotary_dim, base))
    longest = m
    for seqlen in (m // 2, 3 * m, 2 * m, m, m // 2, 2 * m):
        longest = m if seqlen < m else max(longest, seqlen)
        want_cos, _ = hf_tables(module, seqlen)
        cos, _ = fuselab.rope_cos_sin(seqlen, rotary_dim, base=base, scaling={**scaling, "seq_len": longest},
                                      dtype=torch.float64)
        inv_freq, mscale = rope_frequencies(rotary_dim, base, {**scaling, "seq_len": longest})
        assert_close(cos, want_cos, atol=table_bound(inv_freq, mscale, seqlen, base), rtol=0.0,
                     what=f"cos of {seqlen} positions after the longest {longest}")


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_static_ntk_is_transformers_dynamic_at_one_length(factor):
    """Static NTK (no HF type of its own) is HF's dynamic NTK at the length L = m (2 f - 1) / f, where
    ``f L / m - (f - 1) = f``."""
    library = transformers()
    m = 64
    seq_len = round(m * (2 * factor - 1) / factor)
    assert factor * seq_len / m - (factor - 1) == factor
    config = hf_config(library, {"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": m},
                       64, 10000.0)
    want, _ = hf_init(library, "dynamic")(config, device="cpu", seq_len=seq_len)
    got, att = rope_frequencies(64, 10000.0, {"type": "ntk", "factor": factor})
    assert_close(got, want.double(), atol=0.0, rtol=inv_freq_rtol(10000.0), what=f"static NTK, factor {factor}")
    assert att == 1.0


@pytest.mark.parametrize("name,seqlen", [("dynamic-2", 150), ("yarn-16-mscale", 9)])
def test_in_kernel_angles_match_transformers(triton_backend, device, name, seqlen):
    """End to end: the kernel's in-kernel angles (``apply_rope`` with no tables) against HF's rotary embedding and
    ``apply_rotary_pos_emb``. Per element: both take float32 angles from their own float32 inv_freq, then round."""
    library = transformers()
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    scaling, rotary_dim, base = CASES[name]
    ours = {**scaling, "seq_len": seqlen} if kind_of(scaling) == "dynamic" else scaling
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, seqlen, 2, rotary_dim, generator=gen).to(device)
    k = torch.randn(1, seqlen, 1, rotary_dim, generator=gen).to(device)
    module = LlamaRotaryEmbedding(hf_config(library, scaling, rotary_dim, base)).to(device)
    cos, sin = module(q, torch.arange(seqlen, device=device)[None])
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    got_q, got_k = fuselab.apply_rope(q, k, None, None, layout="bshd", base=base, scaling=ours)
    inv_freq, mscale = rope_frequencies(rotary_dim, base, ours)
    angle = torch.arange(seqlen, dtype=torch.float64)[:, None, None] * inv_freq.to(torch.float64)
    per_angle = mscale * (angle * (inv_freq_rtol(base) + 2.0**-22) + 2.0**-20)  # (seq, 1, half)
    for got, want, x in ((got_q, want_q, q), (got_k, want_k, k)):
        half = x.shape[-1] // 2
        pair = (x[..., :half].abs() + x[..., half:].abs()).double().cpu()[0]
        bound = (pair * per_angle).repeat(1, 1, 2)
        assert_close(got[0].cpu(), want[0].double().cpu(), atol=bound, rtol=0.0, what=f"{name}, in-kernel angles")


@pytest.mark.parametrize("scaling,err,match", [
    ({"type": "ntk", "factor": 2.0, "original_max_position_embeddings": 16, "seq_len": 40}, ValueError,
     "takes no 'seq_len'.*use type 'dynamic'"),
    ({"type": "dynamic", "factor": 2.0}, ValueError, "needs the key 'original_max_position_embeddings'"),
    ({"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16, "seq_len": 0}, ValueError,
     r"scaling\['seq_len'\] must be an int >= 1"),
    ({"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16, "seq_len": 4.5}, ValueError,
     r"scaling\['seq_len'\] must be an int"),
    ({"type": "dynamic", "factor": -1.0, "original_max_position_embeddings": 16}, ValueError,
     r"scaling\['factor'\] must be > 0"),
    ({"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 0}, ValueError,
     r"scaling\['original_max_position_embeddings'\] must be > 0"),
    ({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "beta_fast": 0.0}, ValueError,
     r"scaling\['beta_fast'\] must be > 0"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 0.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, ValueError, r"scaling\['low_freq_factor'\] must be > 0"),
    ({"type": "linear", "rope_type": "yarn", "factor": 2.0}, ValueError, "disagree"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, ValueError,
     r"scaling\['rope_theta'\] \(500000.0\) differs from base \(10000.0\)"),
    ({"rope_type": "longrope", "factor": 2.0, "long_factor": [1.0, 2.0]}, TypeError,
     r"scaling\['long_factor'\] must be a number, a string or None, got list"),
    ({"rope_type": "longrope", "factor": 2.0}, ValueError, r"scaling\['type'\] must be one of"),
])
def test_bad_scaling(scaling, err, match):
    with pytest.raises(err, match=match):
        rope_frequencies(16, 10000.0, scaling)
    with pytest.raises(err, match=match):
        fuselab.rope_cos_sin(4, 16, scaling=scaling)


def test_rope_theta_equal_to_base_is_accepted():
    """HF 5.x's rope_parameters carry the base: the same value as ``base`` is fine."""
    params = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}
    got, _ = rope_frequencies(16, 500000.0, params)
    want, _ = rope_frequencies(16, 500000.0, {"type": "linear", "factor": 2.0})
    assert torch.equal(got, want)
