"""What a plain streaming kernel of the same bytes reaches, next to the op, at the cases below their targets.

    python3 benchmarks/sweeps/stream_bound.py [--check]

Question (session 20): the cases still below target move 64-200 MB per call: bias_act's forward at 65536x512 bf16
(read x and the residual, write y: 201 MB; target 0.92 of the 1 GiB copy's bandwidth) and the bf16 reductions of
65536x512 and 8192x8192 (read 67 / 134 MB; target 0.92). Sessions 9-19 traced them to costs per call that do not
shrink with the bytes (the L2 write-back that do_bench's zero-fill leaves behind, the launch's ramp-up and tail).
If that is right, a kernel that does nothing but stream the same bytes, with the best of several tilings, sits at
the same fraction as the op: the op is then at the device's limit under the lab's method, not short of it.

Bounds timed next to the op, in alternating rounds, dirty flush (the lab's method) and CUDA graph:
* read 2, write 1 (bias_act): ``torch.add(x, r, alpha=0.5, out=y)`` and a flat Triton ``y = x + 0.5 r`` over
  2-16 KiB per program;
* read only (reductions): ``torch.sum`` and a flat Triton read of 16-64 KiB chunks per program (one fp32 partial
  each, no final sum: less work than any reduction), with and without ``evict_first``.
Controls at sizes that meet the target (bias_act 16384x4096 bf16, ``mean`` of 10000x10000 fp32) show the method.
``--check`` runs the prototypes once against torch on small inputs (CPU under TRITON_INTERPRET=1 works).
"""

from __future__ import annotations

import functools
import sys

import torch
import triton
import triton.language as tl

import fuselab

ROUNDS = 3
ALPHA = 0.5
ADD_TILES = ((2048, 2), (4096, 2), (4096, 4), (8192, 4), (8192, 8), (16384, 8))  # (bytes per program, warps)
READ_TILES = ((16384, 4096, 8), (32768, 8192, 8), (32768, 8192, 16), (65536, 8192, 16))  # (chunk, step, warps)


@triton.jit
def _add_kernel(X, R, Y, alpha, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    # X, R, Y: (n,) contiguous. bytes: read 2n, write n elements
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        y = tl.load(X + offs).to(tl.float32) + alpha * tl.load(R + offs).to(tl.float32)
        tl.store(Y + offs, y.to(Y.dtype.element_ty))
    else:
        m = offs < n
        y = tl.load(X + offs, mask=m, other=0.0).to(tl.float32) + alpha * tl.load(R + offs, mask=m, other=0.0).to(
            tl.float32)
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=m)


@triton.jit
def _read_kernel(X, P, n, CHUNK: tl.constexpr, STEP: tl.constexpr, EVICT: tl.constexpr, EVEN: tl.constexpr):
    # X: (n,) contiguous, read once; P: (programs,) fp32, each program's sum of its CHUNK elements.
    # bytes: read n elements, write 4 bytes per program
    start = tl.program_id(0).to(tl.int64) * CHUNK
    acc = tl.zeros([STEP], dtype=tl.float32)
    for i in tl.static_range(0, CHUNK, STEP):
        offs = start + i + tl.arange(0, STEP)
        if EVEN:
            acc += tl.load(X + offs, eviction_policy=EVICT).to(tl.float32)
        else:
            acc += tl.load(X + offs, mask=offs < n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(P + tl.program_id(0), tl.sum(acc, axis=0))


def add_launch(x, r, y, tile_bytes: int, warps: int):
    n = x.numel()
    block = tile_bytes // x.element_size()
    grid = (triton.cdiv(n, block),)
    return functools.partial(_add_kernel[grid], x, r, y, ALPHA, n, BLOCK=block, EVEN=n % block == 0, num_warps=warps)


def read_launch(x, chunk_bytes: int, step_bytes: int, warps: int, evict: str):
    n = x.numel()
    chunk, step = chunk_bytes // x.element_size(), step_bytes // x.element_size()
    partials = torch.empty(triton.cdiv(n, chunk), dtype=torch.float32, device=x.device)
    fn = functools.partial(_read_kernel[(partials.numel(),)], x, partials, n, CHUNK=chunk, STEP=step, EVICT=evict,
                           EVEN=n % chunk == 0, num_warps=warps)
    return partials, fn


def check() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, r = torch.randn(3000, device=device), torch.randn(3000, device=device)
    y = torch.full_like(x, float("nan"))
    add_launch(x, r, y, 1024, 1)()
    torch.testing.assert_close(y, x + ALPHA * r)
    partials, fn = read_launch(x, 4096, 1024, 1, "")
    fn()
    torch.testing.assert_close(partials.sum(), x.sum(), rtol=1e-5, atol=1e-3)
    print("check: prototypes == torch")


def bias_act_case(m: int, n: int, dtype: torch.dtype, bw: float, alternate, spread) -> None:
    x, r = torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(m, n, device="cuda", dtype=dtype)
    b, y = torch.randn(n, device="cuda", dtype=dtype), torch.empty(m, n, device="cuda", dtype=dtype)
    nbytes = 3 * x.numel() * x.element_size()  # the lab's count: read x, residual; write y

    def fraction(ms: float) -> float:
        return nbytes / ms / 1e6 / bw

    calls = {f"fuselab.bias_act {act}": (functools.partial(fuselab.bias_act, x, b, residual=r, alpha=ALPHA,
                                                           activation=act), fraction)
             for act in ("relu", "gelu_tanh")}
    calls["torch.add(out=)"] = (lambda: torch.add(x, r, alpha=ALPHA, out=y), fraction)
    for tile, warps in ADD_TILES:
        fn = add_launch(x, r, y, tile, warps)
        fn()
        torch.testing.assert_close(y.float(), x.float() + ALPHA * r.float(), rtol=1e-2, atol=1e-2)
        calls[f"flat x + a*r, {tile} B per program, {warps} warps"] = (fn, fraction)
    _print(f"bias_act forward {m}x{n} {str(dtype)[6:]} (read 2, write 1: {nbytes / 1e6:.0f} MB)", calls,
           alternate, spread)


def reduce_case(shape: tuple[int, ...], dtype: torch.dtype, bw: float, alternate, spread) -> None:
    x = torch.randn(shape, device="cuda", dtype=dtype)
    nbytes = x.numel() * x.element_size()

    def fraction(ms: float) -> float:
        return nbytes / ms / 1e6 / bw

    calls = {f"fuselab.mean dim={dim}": (functools.partial(fuselab.mean, x, dim), fraction) for dim in (None, -1, 0)}
    calls["torch.sum (all)"] = (lambda: torch.sum(x), fraction)
    want = x.float().sum()
    for (chunk, step, warps), evict in ((t, e) for t in READ_TILES for e in ("", "evict_first")):
        partials, fn = read_launch(x.view(-1), chunk, step, warps, evict)
        fn()
        torch.testing.assert_close(partials.sum(), want, rtol=1e-3, atol=1.0)
        calls[f"flat read, {chunk // 1024} KiB chunks of {step // 1024} KiB steps, {warps} warps, "
              f"{evict or 'default'}"] = (fn, fraction)
    _print(f"read {'x'.join(map(str, shape))} {str(dtype)[6:]} ({nbytes / 1e6:.0f} MB)", calls, alternate, spread)


def _print(title: str, calls: dict, alternate, spread) -> None:
    print(f"\n{title}", flush=True)
    for name, (dirty, graph) in alternate(calls, ROUNDS).items():
        print(f"  {spread(dirty, graph)}  {name}", flush=True)
    torch.cuda.empty_cache()


def main() -> None:
    from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py

    check()
    bw = copy_gbps()
    ab_header(bw, ROUNDS)
    for m, n in ((65536, 512), (16384, 4096)):
        bias_act_case(m, n, torch.bfloat16, bw, alternate, spread)
    for shape, dtype in (((65536, 512), torch.bfloat16), ((8192, 8192), torch.bfloat16),
                         ((10000, 10000), torch.float32)):
        reduce_case(shape, dtype, bw, alternate, spread)


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()
