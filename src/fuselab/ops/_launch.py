"""Launch heuristics shared by the Triton launchers: block sizes, SM count, 64-bit offsets."""

from __future__ import annotations

import functools

import torch

INT32_MAX = 2**31 - 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a small stand-in (4) for CPU under the interpreter."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def max_element_offset(t: torch.Tensor) -> int:
    """Largest element offset a kernel can reach through ``t``'s strides (storage offset included)."""
    if t.numel() == 0:
        return 0
    return t.storage_offset() + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def needs_int64(*tensors: torch.Tensor | None) -> bool:
    """True when any tensor's reachable offsets pass 2^31-1: launch with 64-bit index math."""
    return any(t is not None and max_element_offset(t) > INT32_MAX for t in tensors)
