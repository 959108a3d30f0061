"""Rotary frequencies: base, scaling (linear, ntk, llama3, yarn) -> inverse frequencies and amplitude.

The formulas follow Hugging Face transformers' rope utilities (``modeling_rope_utils``), written
here from their published definitions. Everything is computed once per configuration in float64
on the host and cached; kernels read a ``(rotary_dim // 2,)`` float32 ``inv_freq`` vector (never a
cos/sin table) and multiply cos/sin by ``mscale`` (YaRN's attention factor, 1.0 otherwise).

``scaling`` is ``None`` or a dict with ``"type"`` (or HF's ``"rope_type"``):

* ``{"type": "linear", "factor": f}``: every frequency divided by ``f`` (position interpolation).
* ``{"type": "ntk", "factor": f}``: NTK-aware base change ``base * f ** (d / (d - 2))``.
  With ``"original_max_position_embeddings": m`` and ``"seq_len": L`` it is HF's ``"dynamic"``
  formula ``base * (f * max(L, m) / m - (f - 1)) ** (d / (d - 2))`` (``"dynamic"`` is an alias).
* ``{"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
  "original_max_position_embeddings"}``: Llama 3.1's wavelength-dependent smoothing.
* ``{"type": "yarn", "factor", "original_max_position_embeddings", "beta_fast"=32, "beta_slow"=1,
  "mscale", "mscale_all_dim", "attention_factor", "truncate"=True}``: YaRN ramp between interpolated
  and extrapolated frequencies; cos and sin are multiplied by the attention factor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import torch

SCALING_TYPES = ("default", "linear", "ntk", "dynamic", "llama3", "yarn")


def _freeze(scaling: Mapping[str, Any] | None) -> tuple | None:
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a dict with a 'type' key, got {type(scaling).__name__}")
    return tuple(sorted((str(k), v) for k, v in scaling.items()))


def _num(cfg: dict, key: str, kind: str, default: Any = None, required: bool = True) -> float:
    if key not in cfg or cfg[key] is None:
        if required and default is None:
            raise ValueError(f"scaling of type {kind!r} needs the key {key!r}")
        return default
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"scaling[{key!r}] must be a number, got {value!r}")
    return float(value)


def _yarn_mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


@functools.lru_cache(maxsize=256)
def _inv_freq_cached(rotary_dim: int, base: float, frozen: tuple | None) -> tuple[torch.Tensor, float]:
    d = rotary_dim
    exponents = torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d
    inv_freq = 1.0 / (base ** exponents)
    if frozen is None:
        return inv_freq, 1.0
    cfg = dict(frozen)
    kind = cfg.get("type", cfg.get("rope_type"))
    if kind not in SCALING_TYPES:
        raise ValueError(f"scaling['type'] must be one of {', '.join(SCALING_TYPES)}, got {kind!r}")
    if kind == "default":
        return inv_freq, 1.0
    factor = _num(cfg, "factor", kind)
    if factor <= 0:
        raise ValueError(f"scaling['factor'] must be > 0, got {factor}")
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind in ("ntk", "dynamic"):
        if d <= 2:
            raise ValueError(f"scaling of type {kind!r} needs rotary_dim > 2, got {d}")
        orig = _num(cfg, "original_max_position_embeddings", kind, required=False)
        seq_len = _num(cfg, "seq_len", kind, required=False)
        ratio = factor if orig is None or seq_len is None else factor * max(seq_len, orig) / orig - (factor - 1)
        new_base = base * ratio ** (d / (d - 2))
        return 1.0 / (new_base ** exponents), 1.0
    orig = _num(cfg, "original_max_position_embeddings", kind)
    if kind == "llama3":
        low = _num(cfg, "low_freq_factor", kind)
        high = _num(cfg, "high_freq_factor", kind)
        if high <= low:
            raise ValueError(f"scaling['high_freq_factor'] ({high}) must be > scaling['low_freq_factor'] ({low})")
        low_wavelen, high_wavelen = orig / low, orig / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    # yarn
    beta_fast = _num(cfg, "beta_fast", kind, default=32.0)
    beta_slow = _num(cfg, "beta_slow", kind, default=1.0)
    attention = _num(cfg, "attention_factor", kind, required=False)
    if attention is None:
        m, m_all = cfg.get("mscale"), cfg.get("mscale_all_dim")
        if m and m_all:
            attention = _yarn_mscale(factor, float(m)) / _yarn_mscale(factor, float(m_all))
        else:
            attention = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    if cfg.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64, device="cpu") - lo) / (hi - lo)).clamp(0, 1)
    extrapolation = 1.0 - ramp
    inv_freq = (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation
    return inv_freq, float(attention)


def rope_frequencies(rotary_dim: int, base: float = 10000.0,
                     scaling: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, float]:
    """``(inv_freq, mscale)``: float64 CPU tensor of shape ``(rotary_dim // 2,)`` and the cos/sin amplitude."""
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    return _inv_freq_cached(rotary_dim, float(base), _freeze(scaling))


@functools.lru_cache(maxsize=256)
def _inv_freq_device(rotary_dim: int, base: float, frozen: tuple | None, device: torch.device) -> torch.Tensor:
    inv_freq, _ = _inv_freq_cached(rotary_dim, base, frozen)
    return inv_freq.to(device=device, dtype=torch.float32)


def inv_freq_on(device: torch.device, rotary_dim: int, base: float,
                scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """The float32 ``inv_freq`` vector on ``device``, cached per configuration. The arguments must have been
    validated by :func:`rope_frequencies` (which also gives ``mscale``)."""
    return _inv_freq_device(rotary_dim, float(base), _freeze(scaling), torch.device(device))


def rope_cos_sin(seqlen: int, rotary_dim: int, *, base: float = 10000.0, scaling: Mapping[str, Any] | None = None,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for :func:`fuselab.apply_rope`, each of shape ``(seqlen, rotary_dim // 2)``.

    Row ``p`` holds ``mscale * cos(p * inv_freq)`` (likewise sin), computed in float64 and rounded
    once to ``dtype``, on ``device`` (default: the default device, as for torch's factory functions). ``scaling`` is
    the same dict :func:`fuselab.apply_rope` accepts for in-kernel angles (see this module). Raises
    ``ValueError``/``TypeError`` for a non-positive ``seqlen``, an odd ``rotary_dim``, ``base <= 1`` or a malformed
    ``scaling``.
    """
    if isinstance(seqlen, bool) or not isinstance(seqlen, int) or seqlen <= 0:
        raise ValueError(f"seqlen must be a positive int, got {seqlen!r}")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    inv_freq, mscale = rope_frequencies(rotary_dim, base, scaling)
    # on inv_freq's device (the CPU) whatever default device a caller's context sets
    angles = torch.arange(seqlen, dtype=torch.float64, device=inv_freq.device)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos() * mscale, angles.sin() * mscale
    device = torch.get_default_device() if device is None else device  # as a factory function places its tensor
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)
