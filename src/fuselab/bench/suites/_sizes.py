"""Size sweeps shared by the elementwise suites: large on GPUs (fill the chip), small on CPUs."""

from __future__ import annotations

#: GPU sweep: 1 Mi .. 256 Mi elements (4 MiB .. 1 GiB in fp32), plus an odd size that exercises tails
GPU_SIZES: tuple[int, ...] = (2**20, 2**22, 2**24, 2**24 + 5, 2**26, 2**28)
GPU_QUICK: tuple[int, ...] = (2**24,)
#: CPU sweep: small (2 cores), with an odd size
CPU_SIZES: tuple[int, ...] = (2**12, 100_003, 2**20)
CPU_QUICK: tuple[int, ...] = (2**16,)
#: below this many bytes per call a case is marked ``l2_cold`` (rotating input sets, ``--l2-cold``)
L2_COLD_BELOW = 64 * 2**20


def sizes(device_type: str, quick: bool) -> tuple[int, ...]:
    """The element counts a 1-D elementwise suite sweeps on ``device_type``."""
    if device_type == "cuda":
        return GPU_QUICK if quick else GPU_SIZES
    return CPU_QUICK if quick else CPU_SIZES


def size_label(n: int) -> str:
    """``n=2^20`` for powers of two, ``n=100003`` otherwise (unique, used by ``fuselab profile --shape``)."""
    if n > 0 and n & (n - 1) == 0:
        return f"n=2^{n.bit_length() - 1}"
    return f"n={n}"
