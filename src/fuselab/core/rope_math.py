"""Rotary frequencies: base, scaling (linear, ntk, dynamic, llama3, yarn) -> inverse frequencies and amplitude.

The formulas follow Hugging Face transformers' rope utilities (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``),
written here from their published definitions. Everything is computed once per configuration in float64 on the
host and cached; kernels read a ``(rotary_dim // 2,)`` float32 ``inv_freq`` vector (never a cos/sin table) and
multiply cos/sin by ``mscale`` (YaRN's attention factor, 1.0 otherwise). ``d`` below is ``rotary_dim``.

``scaling`` is ``None`` or a dict with ``"type"`` (or HF's ``"rope_type"``; both must agree when both are given):

* ``{"type": "default"}``: no scaling (as ``None``).
* ``{"type": "linear", "factor": f}``: every frequency divided by ``f`` (position interpolation); HF's ``"linear"``.
* ``{"type": "ntk", "factor": f}``: static NTK-aware scaling, the base raised to ``base * f ** (d / (d - 2))`` at
  every position. Hugging Face has no such type (its NTK is ``"dynamic"``).
* ``{"type": "dynamic", "factor": f, "original_max_position_embeddings": m, "seq_len": L}``: HF's ``"dynamic"``
  (dynamic NTK): the base becomes ``base * (f * L' / m - (f - 1)) ** (d / (d - 2))`` with ``L' = max(L, m)``, so
  the frequencies are the unscaled ones up to ``m`` and scale only for longer sequences. ``m`` is what HF reads
  from ``config.max_position_embeddings``; ``L`` (optional, an int >= 1) is the sequence length the angles are for,
  HF's ``seq_len`` (its rotary embedding passes ``max(position_ids) + 1``); without it the frequencies are HF's
  for no sequence length, the unscaled ones.
* ``{"type": "llama3", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}``:
  Llama 3.1's wavelength-dependent smoothing; HF's ``"llama3"``.
* ``{"type": "yarn", "factor", "original_max_position_embeddings", "beta_fast"=32, "beta_slow"=1, "mscale",
  "mscale_all_dim", "attention_factor", "truncate"=True}``: YaRN ramp between interpolated and extrapolated
  frequencies; cos and sin are multiplied by the attention factor; HF's ``"yarn"``.

Other keys are ignored, but for ``"rope_theta"`` (in HF 5.x's ``config.rope_parameters``): fuselab takes the base
as its own argument, and a ``"rope_theta"`` that differs from it is a ``ValueError``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

SCALING_TYPES = ("default", "linear", "ntk", "dynamic", "llama3", "yarn")


def _freeze(scaling: Mapping[str, Any] | None) -> tuple | None:
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a dict with a 'type' key, got {type(scaling).__name__}")
    for key, value in scaling.items():
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"scaling[{key!r}] must be a number, a string or None, got {type(value).__name__}") \
                from None
    return tuple(sorted((str(k), v) for k, v in scaling.items()))


def _num(cfg: dict, key: str, kind: str, default: float | None = None, required: bool = True) -> float | None:
    """``cfg[key]`` as a float; ``default`` when absent (None) unless ``required`` with no default (ValueError)."""
    if key not in cfg or cfg[key] is None:
        if required and default is None:
            raise ValueError(f"scaling of type {kind!r} needs the key {key!r}")
        return default
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"scaling[{key!r}] must be a number, got {value!r}")
    return float(value)


def _positive(cfg: dict, key: str, kind: str, default: float | None = None) -> float:
    value = _num(cfg, key, kind, default)
    if not value > 0:  # also NaN
        raise ValueError(f"scaling[{key!r}] must be > 0, got {value}")
    return value


def _seq_len(cfg: dict) -> int | None:
    value = cfg.get("seq_len")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"scaling['seq_len'] must be an int >= 1 (the sequence length the angles are for), "
                         f"got {value!r}")
    return value


def _ntk_exponent(d: int, kind: str) -> float:
    if d <= 2:
        raise ValueError(f"scaling of type {kind!r} needs rotary_dim > 2, got {d}")
    return d / (d - 2)


def _yarn_mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


# Each rule: (unscaled inv_freq, exponents 2i/d, d, base, cfg, kind) -> (inv_freq, mscale); inv_freq float64 CPU.
def _linear(inv_freq, exponents, d, base, cfg, kind) -> tuple[torch.Tensor, float]:
    return inv_freq / _positive(cfg, "factor", kind), 1.0


def _ntk(inv_freq, exponents, d, base, cfg, kind) -> tuple[torch.Tensor, float]:
    if cfg.get("seq_len") is not None:
        raise ValueError("scaling of type 'ntk' (static NTK) takes no 'seq_len': for HF's dynamic NTK, which depends "
                         "on the sequence length, use type 'dynamic'")
    new_base = base * _positive(cfg, "factor", kind) ** _ntk_exponent(d, kind)
    return 1.0 / (new_base ** exponents), 1.0


def _dynamic(inv_freq, exponents, d, base, cfg, kind) -> tuple[torch.Tensor, float]:
    factor = _positive(cfg, "factor", kind)
    if cfg.get("original_max_position_embeddings") is None:
        raise ValueError("scaling of type 'dynamic' needs the key 'original_max_position_embeddings' (the length up "
                         "to which the frequencies stay unscaled: Hugging Face's config.max_position_embeddings)")
    orig = _positive(cfg, "original_max_position_embeddings", kind)
    exponent = _ntk_exponent(d, kind)
    seq_len = _seq_len(cfg)
    length = orig if seq_len is None else max(float(seq_len), orig)
    new_base = base * (factor * length / orig - (factor - 1)) ** exponent
    return 1.0 / (new_base ** exponents), 1.0


def _llama3(inv_freq, exponents, d, base, cfg, kind) -> tuple[torch.Tensor, float]:
    factor = _positive(cfg, "factor", kind)
    orig = _positive(cfg, "original_max_position_embeddings", kind)
    low = _positive(cfg, "low_freq_factor", kind)
    high = _positive(cfg, "high_freq_factor", kind)
    if high <= low:
        raise ValueError(f"scaling['high_freq_factor'] ({high}) must be > scaling['low_freq_factor'] ({low})")
    low_wavelen, high_wavelen = orig / low, orig / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


def _yarn(inv_freq, exponents, d, base, cfg, kind) -> tuple[torch.Tensor, float]:
    factor = _positive(cfg, "factor", kind)
    orig = _positive(cfg, "original_max_position_embeddings", kind)
    beta_fast = _positive(cfg, "beta_fast", kind, default=32.0)
    beta_slow = _positive(cfg, "beta_slow", kind, default=1.0)
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


_RULES: dict[str, Callable[..., tuple[torch.Tensor, float]]] = {
    "linear": _linear, "ntk": _ntk, "dynamic": _dynamic, "llama3": _llama3, "yarn": _yarn}


def _kind(cfg: dict) -> str:
    kinds = {cfg[key] for key in ("type", "rope_type") if cfg.get(key) is not None}
    if len(kinds) > 1:
        raise ValueError(f"scaling['type'] ({cfg['type']!r}) and scaling['rope_type'] ({cfg['rope_type']!r}) "
                         f"disagree")
    kind = kinds.pop() if kinds else None
    if kind not in SCALING_TYPES:
        raise ValueError(f"scaling['type'] must be one of {', '.join(SCALING_TYPES)}, got {kind!r}")
    return kind


@functools.lru_cache(maxsize=256)
def _inv_freq_cached(rotary_dim: int, base: float, frozen: tuple | None) -> tuple[torch.Tensor, float]:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim
    inv_freq = 1.0 / (base ** exponents)
    if frozen is None:
        return inv_freq, 1.0
    cfg = dict(frozen)
    kind = _kind(cfg)
    theta = _num(cfg, "rope_theta", kind, required=False)
    if theta is not None and theta != base:
        raise ValueError(f"scaling['rope_theta'] ({theta}) differs from base ({base}): pass base=scaling['rope_theta'] "
                         f"(fuselab takes the base as its own argument)")
    if kind == "default":
        return inv_freq, 1.0
    return _RULES[kind](inv_freq, exponents, rotary_dim, base, cfg, kind)


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
    the same dict :func:`fuselab.apply_rope` accepts for in-kernel angles (see this module), with the same angles:
    for ``"dynamic"`` the frequencies come from ``scaling["seq_len"]``, never from ``seqlen`` (pass
    ``"seq_len": seqlen`` for HF's angles of a sequence of that length). Raises
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
