"""Facts of a device that the launch planners read (SM count, DRAM bandwidth per SM, TMA), and element offsets.

Off CUDA (the Triton interpreter) each answers a fixed stand-in, so plans under the interpreter do not depend on
the machine. Cached per device index (:func:`fuselab.ops.clear` does not empty them: they do not change).
"""

from __future__ import annotations

import functools

import torch

INT32_MAX = 2**31 - 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def device_index(device: torch.device) -> int:
    """The CUDA device index of ``device`` (the current device when it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; a small stand-in (4) for CPU under the interpreter."""
    if device.type != "cuda":
        return 4
    return _sm_count(device_index(device))


@functools.cache
def _dram_gbps_per_sm(index: int) -> float:
    from triton.testing import get_dram_gbps  # peak: memory clock x bus width x 2 (DDR), from the driver

    try:
        return get_dram_gbps(index) / _sm_count(index)
    except Exception:  # a driver that does not report its memory: plan as for the H100
        return INTERPRETER_DRAM_GBPS_PER_SM


#: what :func:`dram_gbps_per_sm` answers off CUDA (the interpreter), or where the driver does not say: an H100 SXM's
#: 3352 GB/s over 132 SMs
INTERPRETER_DRAM_GBPS_PER_SM = 25.4


def dram_gbps_per_sm(device: torch.device) -> float:
    """Peak DRAM bandwidth per multiprocessor of a CUDA device, in GB/s (H100 SXM: 25.4, H200: ~37); off CUDA a
    fixed H100-like stand-in, so that plans under the interpreter do not depend on the machine."""
    if device.type != "cuda":
        return INTERPRETER_DRAM_GBPS_PER_SM
    return _dram_gbps_per_sm(device_index(device))


#: DRAM GB/s per SM from which a device counts as fast-memory (H200: ~37; H100 SXM: 25.4). There the planners of
#: RoPE and of one-row reductions take smaller steps per program, which measured faster on the H200 and slower on the
#: H100 (benchmarks/notes/rope.md, benchmarks/notes/reduce.md#planner-knobs)
FAST_MEMORY_GBPS_PER_SM = 30.0


def fast_memory(device: torch.device) -> bool:
    """True for a device whose DRAM bandwidth per SM is at least :data:`FAST_MEMORY_GBPS_PER_SM`."""
    return dram_gbps_per_sm(device) >= FAST_MEMORY_GBPS_PER_SM


@functools.cache
def _tma_capable(index: int) -> bool:
    try:  # host-built TMA descriptors need Triton >= 3.3
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def tma_capable(device: torch.device) -> bool:
    """Whether kernels on ``device`` may read through TMA descriptors built on the host (Hopper and later, with a
    Triton that has ``triton.tools.tensor_descriptor``). False off CUDA: the interpreter runs descriptor loads too,
    and the tests switch them on there by replacing this function."""
    return device.type == "cuda" and _tma_capable(device_index(device))


def max_element_offset(t: torch.Tensor) -> int:
    """Largest element offset a kernel can reach through ``t``'s strides (storage offset included)."""
    if t.is_contiguous():  # the common case, without a Python loop over the dims
        return t.storage_offset() + max(t.numel() - 1, 0)
    if t.numel() == 0:
        return 0
    return t.storage_offset() + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def needs_int64(*tensors: torch.Tensor | None) -> bool:
    """True when any tensor's reachable offsets pass 2^31-1: launch with 64-bit index math."""
    return any(t is not None and max_element_offset(t) > INT32_MAX for t in tensors)
