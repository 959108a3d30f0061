"""RoPE decode: device time per call of the launch plan's head split and warps, against Liger, on the GPU.

    python3 benchmarks/sweeps/decode_tiles.py

The decode case (B=64, S=1, 32/8 heads of 128, bf16, fp32 tables, tensor offsets) moves ~1.3 MB: its device time
is launch latency and one chain of dependent loads, not bandwidth. ``decode_host.py`` measured 2.5 µs per call
for fuselab and 2.0 µs for Liger (given per-token tables) in a CUDA graph. The planner spreads the 64 tokens over
~2 programs per SM by splitting the heads (4 splits of 8 q heads, 2 warps). This times head splits x warps, each
as 10 calls in a CUDA graph (replay time / 10), with the shipped plan and Liger in the same run.
"""

from __future__ import annotations

import itertools

import torch
import triton
from decode_host import device_us  # benchmarks/sweeps/decode_host.py
from rope_tiles import forget_launches  # benchmarks/sweeps/rope_tiles.py

import fuselab
from fuselab.bench.suites import rope as suite
from fuselab.ops import rope_kernel
from fuselab.ops._launch import cdiv, next_power_of_2

_ORIGINAL = rope_kernel._config


def _forced(splits: int, warps: int):
    def config(*args):  # _config's arguments
        _ORIGINAL.cache_clear()
        cfg = list(_ORIGINAL(*args))
        hq, hk = args[1], args[2]
        block_hq = next_power_of_2(cdiv(hq, splits))
        block_hk = next_power_of_2(cdiv(max(hk, 1), splits))
        cfg[0] = 1  # one token per program
        cfg[1], cfg[2], cfg[5] = block_hq, block_hk, splits
        cfg[6] = cdiv(cdiv(hq, splits), block_hq) * block_hq
        cfg[7] = cdiv(cdiv(max(hk, 1), splits), block_hk) * block_hk
        cfg[8] = warps
        return tuple(cfg)

    return config


def main() -> None:
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    b, hq, hk, d, rows = 64, 32, 8, 128, 4096
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(rows, d, device="cuda")
    offsets = torch.randint(0, rows - 1, (b,), device="cuda", dtype=torch.int32)

    def ours() -> None:
        fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets)

    forget_launches()
    device = torch.device("cuda")
    shipped = _ORIGINAL(b, hq, hk, d // 2, 0, rope_kernel.sm_count(device), False, rope_kernel.tile_elements(device))
    print(f"shipped plan (BLOCK_T, BLOCK_HQ, BLOCK_HK, ..., splits, q chunk, k chunk, warps): {shipped}")
    rows_out = [("shipped", device_us(ours))]
    try:
        liger = suite._build_liger(None)
        args = (q, k, cos, sin, "bshd", offsets, None, None)
        rows_out.append(("liger (per-token tables given)", device_us(lambda: liger(*args))))
    except ImportError as exc:
        print(f"liger: not installed ({exc})")
    for splits, warps in itertools.product((1, 2, 4, 8), (1, 2, 4, 8)):
        rope_kernel._config = _forced(splits, warps)
        forget_launches()
        rows_out.append((f"splits {splits} warps {warps}", device_us(ours)))
    rope_kernel._config = _ORIGINAL
    forget_launches()
    for name, us in rows_out:
        print(f"{name:32s} {us:6.2f} us/call", flush=True)


if __name__ == "__main__":
    main()
