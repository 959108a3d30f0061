"""bias_act forward: tile bytes and vectors per thread (so warps) vs torch.compile, interleaved, on the GPU machine.

    python3 benchmarks/sweeps/bias_act_fwd_tiles.py

Question: the Triton forward runs 1-3% behind torch.compile in fp32 (and ~1% in bf16); the masks are not the cause
(probes/bias_act_even.txt). Inductor's kernel is 1-D with small blocks (1024 elements, 4 warps) and one block per
program; ours uses 16 KiB tiles per tensor, 4 vectors per thread (8 warps). (A first run of this script swept
programs per SM, 256 or no cap, instead of vectors: probes/bias_act_fwd_tiles.txt.)
Timing as the lab's (do_bench median, its L2 flush), the best of two interleaved rounds.
"""

from __future__ import annotations

import functools

import torch
from triton.testing import do_bench

import fuselab
from fuselab.ops import _bias_act_triton as ba
from fuselab.ops import bias_act as bias_act_op

SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
TILES = (4096, 8192, 16384)
VECTORS = (1, 2, 4)  # 16-byte vectors per thread per tensor: sets num_warps (Inductor's 1024-element fp32 block: 2)
ROUNDS = 2


def eager(x, b, r):
    return torch.relu(x + r + b)


def set_knobs(tile: int, vectors: int) -> None:
    """Point the forward planner at ``tile``/``vectors`` and drop every plan and launch kept by earlier calls
    (``bias_act._FORWARDS`` keeps each call signature's launch: without clearing it, the first variant's plan
    answers for all; the session-18 H200 run before this fix printed the same figure for every variant)."""
    ba.FWD_TILE_BYTES, ba.FWD_VECTORS_PER_THREAD = tile, vectors
    ba.FWD_FLAT = False  # the 2-D tiles (contiguous operands take the flat kernel since session 19)
    ba._fwd_plan.cache_clear()
    bias_act_op._FORWARDS.clear()
    bias_act_op._PREPARED.clear()


def main() -> None:
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    c = torch.empty_like(a)
    copy = 2 * a.numel() * 4 / do_bench(functools.partial(c.copy_, a)) / 1e6
    del a, c
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  copy {copy:.0f} GB/s", flush=True)
    defaults = (ba.FWD_TILE_BYTES, ba.FWD_VECTORS_PER_THREAD)
    for dtype in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            torch._dynamo.reset()
            compiled = torch.compile(eager, dynamic=False)
            x, r = (torch.randn(m, n, dtype=dtype, device="cuda") for _ in range(2))
            b = torch.randn(n, dtype=dtype, device="cuda")
            nbytes = (3 * m * n + n) * dtype.itemsize
            ours = functools.partial(fuselab.bias_act, x, b, residual=r, activation="relu")
            variants = {"torch.compile": (None, functools.partial(compiled, x, b, r))}
            for tile in TILES:
                for vectors in VECTORS:
                    variants[f"{tile // 1024}K/v{vectors}"] = ((tile, vectors), ours)
            best = dict.fromkeys(variants, float("inf"))
            for _ in range(ROUNDS):
                for name, (knobs, fn) in variants.items():
                    if knobs is not None:
                        set_knobs(*knobs)
                    fn()  # plans (and compiles) before the timing
                    best[name] = min(best[name], do_bench(fn))
            row = "  ".join(f"{name} {nbytes / t / 1e6 / copy:.3f}" for name, t in best.items())
            print(f"{m}x{n} {str(dtype)[6:]:8s} {row}", flush=True)
            del x, r, b
    set_knobs(*defaults)


if __name__ == "__main__":
    main()
