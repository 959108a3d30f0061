"""bias_act forward: the shipped 2-D tiles against Inductor's shape of kernel (1-D blocks, one per program), on the GPU.

    python3 benchmarks/sweeps/bias_act_fwd_flat.py

Question (session 19): the forward trails torch.compile by 0.5-2.7% at every case of the H200's tile sweep
(``results/h200/probes/bias_act_fwd_vectors.txt``), and no tile, vector count, grid cap or mask closed it. Its
small-tile variants (4 KiB, Inductor's 1024 fp32 elements) were never Inductor's kernel: with 256 programs per SM
they loop over up to 8 tiles per program. Inductor's is 1-D (contiguous rows flattened), one block per program, the
bias indexed by ``offset % N``. Prediction: a 1-D block per program (no loop, no 2-D address math) reaches
torch.compile's figure; if the gap is the loop, the 2-D kernel with no program cap does as well.

Variants (relu, alpha 0.5, residual, bias: the lab's forward case), alternating in rounds, dirty flush and CUDA graph:
``shipped`` (fuselab.bias_act), ``2-D nocap`` (the shipped kernel, every tile its own program), ``flat`` kernels of
4, 8 and 16 KiB per tensor per program (2, 2 and 4 vectors per thread), ``N const`` (the row length a constexpr, as
Inductor's static shapes make it).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py

import fuselab
from fuselab.ops import _bias_act_triton as ba
from fuselab.ops import bias_act as bias_act_op

SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
ROUNDS = 3
ALPHA = 0.5


@triton.jit
def _flat_fwd(X, R, B, Y, alpha, total, N, BLOCK: tl.constexpr, EVEN: tl.constexpr, N_CONST: tl.constexpr):
    # X, R, Y: (M*N,) contiguous; B: (N,). bytes: read 2·M·N + N, write M·N
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = N_CONST if N_CONST > 0 else N
    if EVEN:
        x = tl.load(X + offs).to(tl.float32)
        r = tl.load(R + offs).to(tl.float32)
        b = tl.load(B + offs % n, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y + offs, tl.maximum(x + alpha * r + b, 0.0).to(Y.dtype.element_ty))
    else:
        mask = offs < total
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + offs % n, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y + offs, tl.maximum(x + alpha * r + b, 0.0).to(Y.dtype.element_ty), mask=mask)


def flat(x, b, r, y, tile_bytes: int, vectors: int, n_const: bool):
    total, n = x.numel(), x.shape[-1]
    block = tile_bytes // x.element_size()
    warps = max(1, block * x.element_size() // (32 * 16 * vectors))
    grid = (triton.cdiv(total, block),)
    return functools.partial(_flat_fwd[grid], x, r, b, y, ALPHA, total, n, BLOCK=block, EVEN=total % block == 0,
                             N_CONST=n if n_const else 0, num_warps=warps)


def set_cap(per_sm: int) -> None:
    ba.FWD_PROGRAMS_PER_SM = per_sm
    ba._fwd_plan.cache_clear()
    bias_act_op._FORWARDS.clear()
    bias_act_op._PREPARED.clear()


def capped(fn, per_sm: int):
    """``fn`` run with the forward planner capped at ``per_sm`` programs per SM."""
    def call():
        if per_sm != ba.FWD_PROGRAMS_PER_SM:
            set_cap(per_sm)
        fn()
    return call


def case(m: int, n: int, dtype: torch.dtype, copy: float, shipped_cap: int) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b, r: torch.relu(x + ALPHA * r + b), dynamic=False)
    x, r = (torch.randn(m, n, dtype=dtype, device="cuda") for _ in range(2))
    b = torch.randn(n, dtype=dtype, device="cuda")
    y = torch.empty_like(x)
    nbytes = (3 * m * n + n) * dtype.itemsize
    ours = functools.partial(fuselab.bias_act, x, b, residual=r, alpha=ALPHA, activation="relu")
    variants = {"torch.compile": functools.partial(compiled, x, b, r), "shipped": capped(ours, shipped_cap),
                "2-D nocap": capped(ours, 1 << 24)}
    for tile, vectors in ((4096, 2), (8192, 2), (16384, 4)):
        variants[f"flat {tile // 1024}K v{vectors}"] = flat(x, b, r, y, tile, vectors, False)
    variants["flat 4K v2 N const"] = flat(x, b, r, y, 4096, 2, True)
    ref = torch.relu(x.float() + ALPHA * r.float() + b.float()).to(dtype)
    for name, fn in variants.items():
        if name.startswith("flat"):
            y.fill_(float("nan"))
            fn()
            torch.testing.assert_close(y, ref)

    def fraction(ms: float) -> float:
        return nbytes / (ms * 1e-3) / 1e9 / copy

    out = alternate({name: (fn, fraction) for name, fn in variants.items()}, ROUNDS)
    set_cap(shipped_cap)
    print(f"\n{m}x{n} {str(dtype)[6:]}", flush=True)
    for name, (dirty, graph) in out.items():
        print(f"  {spread(dirty, graph)}  {name}", flush=True)


def main() -> None:
    copy = copy_gbps()
    ab_header(copy, ROUNDS)
    shipped_cap = ba.FWD_PROGRAMS_PER_SM
    for dtype in (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            case(m, n, dtype, copy, shipped_cap)


if __name__ == "__main__":
    main()
