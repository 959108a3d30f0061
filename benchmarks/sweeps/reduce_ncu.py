"""Two reductions of the same bytes under Nsight Compute: ``mean`` over all of 8192² bf16 (split plan, tickets) and
over ``dim=-1`` (one program per row, no tickets). Runs each once to compile, then once to be profiled:

    ncu --clock-control none -k regex:_rows_kernel --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/sweeps/reduce_ncu.py

(``probes/reduce_ncu.txt``; with ``--section WarpStateStats --section MemoryWorkloadAnalysis_Tables --page raw``
instead, every raw counter: stall reasons, DRAM and L2 sectors, ``probes/reduce_ncu_raw.txt``.)

Question: in a CUDA graph the all-element plan reads at 0.92 of copy bandwidth and the dim=-1 plan at 1.01, with the
same tile, warps and register cap (probes/reduce_split_ab.txt): where does the all-element kernel lose its time?
"""

from __future__ import annotations

import torch

import fuselab


def main() -> None:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # the first round compiles (skipped by --launch-skip 2), the second is profiled
        fuselab.mean(x)
        fuselab.mean(x, -1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
