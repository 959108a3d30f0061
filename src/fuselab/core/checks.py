"""Argument checks shared by every op, the references and the CUDA backends. Each raises TypeError/ValueError
naming the argument."""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_float(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """``t`` is a tensor of one of ``dtypes`` (float64 is accepted for gradcheck on CPU)."""
    require_tensor(name, t)
    allowed = (*dtypes, torch.float64)
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have a floating dtype ({_dtype_names(dtypes)}), got {t.dtype}")


def require_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) are on one device; returns it."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {k: v.device for k, v in present.items()}
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {first}; all tensors must share a device")
    return first


def require_ndim(name: str, t: torch.Tensor, ndim: int, layout_hint: str) -> None:
    """ValueError naming ``name`` unless ``t`` has ``ndim`` dims (``layout_hint`` shows the expected shape)."""
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {layout_hint}, got shape {tuple(t.shape)}")
