"""The rows kernel's step per row (``ROW_TILE_BYTES``) and warps (``ROW_WARPS``), alternating in rounds.

    python3 benchmarks/sweeps/reduce_rowtile_ab.py [--rounds 3] [--cases dim=-1 all]

On the H200 (session 18) the lab's ``dim=-1`` mean of 8192² bf16 ran at 0.80 of copy bandwidth against
torch.compile's 0.87, and the planner sweep (``results/h200/reduce_sweep.txt``) put 4 KiB steps (2048 bf16
elements, 16 warps: Inductor's own choice for this reduction, ``notes/reduce.md`` session 10) first at 0.863 against
0.838 for the shipped 8 KiB, one timing each. RoPE's tiles on that GPU wanted the same (smaller steps than on the
H100). This times the candidates alternately on both GPUs before any of them becomes a rule (it became
``FAST_MEMORY_ROW_TILE_BYTES``; the runs that decided it had no such knob, so "shipped" there is "8 KiB steps").
"""

from __future__ import annotations

from reduce_steal_ab import run  # benchmarks/sweeps/reduce_steal_ab.py

KNOBS = ("ROW_TILE_BYTES", "FAST_MEMORY_ROW_TILE_BYTES", "ROW_WARPS")
EVERY_DEVICE = dict(FAST_MEMORY_ROW_TILE_BYTES={})  # the step below for every dtype on every GPU
VARIANTS = {  # name: knobs over the shipped ones
    "shipped": {},
    "8 KiB steps": dict(ROW_TILE_BYTES=8192, **EVERY_DEVICE),
    "4 KiB steps": dict(ROW_TILE_BYTES=4096, **EVERY_DEVICE),
    "4 KiB steps, 8 warps": dict(ROW_TILE_BYTES=4096, ROW_WARPS=8, **EVERY_DEVICE),
    "8 KiB steps, 8 warps": dict(ROW_TILE_BYTES=8192, ROW_WARPS=8, **EVERY_DEVICE),
    "16 KiB steps": dict(ROW_TILE_BYTES=16384, **EVERY_DEVICE),
}

if __name__ == "__main__":
    run(KNOBS, VARIANTS, width=24)
