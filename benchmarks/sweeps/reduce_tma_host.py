"""Host time of a ``mean(dim=0)`` call read through TMA vs through pointers (fp32), and where it goes.

    python3 benchmarks/sweeps/reduce_tma_host.py

Question (session 21): on the H200, ``dim=0`` of 2048x10000 fp32 (82 MB, ~20 µs of reading) ran at 0.42 of copy
bandwidth under the dirty flush through TMA against 0.56 through pointers, while ahead in a CUDA graph (0.81 vs
0.72): the TMA call must cost more host time than the flush leaves (``probes/reduce_tma_ab.txt``). A host-built
descriptor is validated in Python (``TensorDescriptor.__post_init__``) and encoded into a ``CUtensorMap`` by
Triton's launcher on every call. Timed on a 16 MiB input (the GPU never falls behind), then profiled.
"""

from __future__ import annotations

import torch
from _timing import host_us, print_profile  # benchmarks/sweeps/_timing.py
from triton.tools.tensor_descriptor import TensorDescriptor

import fuselab
from fuselab.ops import _launch
from fuselab.ops import _reduce_plan as P
from fuselab.ops import reduce as R


def fresh(tma: bool) -> None:
    P.COLS_TMA = {4: (16384, 2, 4, 3)} if tma else {}
    P.COLS_TMA_MIN_BYTES = 0
    P._plan.cache_clear()
    R._PLANNED.clear()


def main() -> None:
    x = torch.randn(1024, 4096, device="cuda")
    for tma in (False, True, False, True):
        fresh(tma)
        fuselab.mean(x, 0)
        print(f"{'TMA' if tma else 'pointers'}: fuselab.mean(x, 0) {host_us(lambda: fuselab.mean(x, 0)):.1f} µs",
              flush=True)
    print(f"TensorDescriptor(...) alone: {host_us(lambda: TensorDescriptor(x, [1024, 4096], [4096, 1], [16, 256])):.1f}"
          " µs", flush=True)
    print(f"torch.mean(x, 0): {host_us(lambda: torch.mean(x, 0)):.1f} µs", flush=True)
    fresh(True)
    print_profile("TMA mean(x, 0)", lambda: fuselab.mean(x, 0))
    print(f"compiled entries: {len(_launch._COMPILED)}")


if __name__ == "__main__":
    main()
