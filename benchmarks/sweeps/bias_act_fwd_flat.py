"""bias_act forward on the GPU: the flat kernel (contiguous operands), the 2-D tiles, torch.compile, the CUDA backend.

    python3 benchmarks/sweeps/bias_act_fwd_flat.py [--proto | --knobs]

Question (session 19): the forward trailed torch.compile by 0.5-2.7% at every case of the H200's tile sweep
(``results/h200/probes/bias_act_fwd_vectors.txt``), and no tile, vector count, grid cap or mask closed it. Its
small-tile variants (4 KiB, Inductor's 1024 fp32 elements) were never Inductor's kernel: with 256 programs per SM
they loop over up to 8 tiles per program. Inductor's is 1-D (contiguous rows flattened), one block per program, the
bias indexed by ``offset % N``. Prediction: a 1-D block per program (no loop, no 2-D address math) reaches
torch.compile's figure. ``--proto`` times the prototype kernel below against the shipped 2-D tiles (first H200 run:
``results/h200/probes/bias_act_fwd_flat.txt``: level with torch.compile, 0.5-1.5% ahead of the tiles); without it,
the shipped kernels: ``flat`` (``fuselab.bias_act``, contiguous operands), ``tiles`` (the same call with
``FWD_FLAT = False``), and the CUDA C++ backend, whose bf16 forward ran 13-32% behind Triton on the H200
(session 19 widens bf16 by shifts and narrows pairs in one instruction: see ``bias_act.cu``).

``--knobs`` (session 20, for the H100, where the fp32 forward trailed torch.compile by 0.4-1.9%): the shipped flat
kernel over its run length (``FWD_FLAT_TILE_BYTES``, 2-16 KiB) x 16-byte vectors per thread (1-4), fp32 relu. No
setting closed the gap (``results/h100/probes/bias_act_fwd_flat_knobs.txt``). Nor did finding each element's bias
column without a division per element (Inductor's N is a compile-time constant; commit 1524a0a had a ``--bias-index``
mode here for that A/B, ``probes/bias_act_bias_index_ab.txt``: no difference beyond noise; reverted).

Cases: the lab's forward (x, residual with alpha 0.5, bias), relu and gelu_tanh (--proto: relu), alternating in rounds,
after a dirty flush (the lab's method) and per call of a CUDA graph.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import triton
import triton.language as tl
from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py

import fuselab
from fuselab.ops import _bias_act_triton as ba
from fuselab.ops import bias_act as bias_act_op

SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
SHIPPED_FLAT_KNOBS = (ba.FWD_FLAT_TILE_BYTES, ba.FWD_FLAT_VECTORS_PER_THREAD)
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
    _forget()


def set_flat(flat: bool) -> None:
    ba.FWD_FLAT = flat
    _forget()


def _forget() -> None:
    """Drop the plans and the launches kept by earlier calls (they would answer for the next variant)."""
    ba._fwd_plan.cache_clear()
    bias_act_op._FORWARDS.clear()
    bias_act_op._PREPARED.clear()


def knob(fn, setter, value, current):
    """``fn`` run with ``setter(value)`` in effect (``current()`` reads the knob)."""
    def call():
        if current() != value:
            setter(value)
        return fn()
    return call


def proto_variants(x, b, r, y, ours) -> dict:
    shipped_cap = ba.FWD_PROGRAMS_PER_SM
    cap = lambda: ba.FWD_PROGRAMS_PER_SM
    variants = {"shipped": knob(ours, set_cap, shipped_cap, cap), "2-D nocap": knob(ours, set_cap, 1 << 24, cap)}
    for tile, vectors in ((4096, 2), (8192, 2), (16384, 4)):
        variants[f"flat {tile // 1024}K v{vectors}"] = flat(x, b, r, y, tile, vectors, False)
    variants["flat 4K v2 N const"] = flat(x, b, r, y, 4096, 2, True)
    return variants


def set_flat_knobs(tile_bytes: int, vectors: int) -> None:
    ba.FWD_FLAT_TILE_BYTES, ba.FWD_FLAT_VECTORS_PER_THREAD = tile_bytes, vectors
    _forget()


def knob_variants(ours) -> dict:
    shipped = (ba.FWD_FLAT_TILE_BYTES, ba.FWD_FLAT_VECTORS_PER_THREAD)
    current = lambda: (ba.FWD_FLAT_TILE_BYTES, ba.FWD_FLAT_VECTORS_PER_THREAD)
    variants = {"shipped": knob(ours, lambda v: set_flat_knobs(*v), shipped, current)}
    for tile, vectors in itertools.product((2048, 4096, 8192, 16384), (1, 2, 4)):
        if (tile, vectors) != shipped and tile // (32 * 16 * vectors) >= 1:
            variants[f"flat {tile // 1024} KiB, {vectors} vectors/thread"] = knob(
                ours, lambda v: set_flat_knobs(*v), (tile, vectors), current)
    return variants


def shipped_variants(x, b, r, activation, ours) -> dict:
    from fuselab.cuda import bias_act as cuda_bias_act

    flat_on = lambda: ba.FWD_FLAT
    return {"flat": knob(ours, set_flat, True, flat_on), "tiles": knob(ours, set_flat, False, flat_on),
            "cuda": functools.partial(cuda_bias_act, x, b, residual=r, alpha=ALPHA, activation=activation)}


def case(m: int, n: int, dtype: torch.dtype, activation: str, copy: float, mode: str) -> None:
    torch._dynamo.reset()
    act = torch.relu if activation == "relu" else functools.partial(torch.nn.functional.gelu, approximate="tanh")
    compiled = torch.compile(lambda x, b, r: act(x + ALPHA * r + b), dynamic=False)
    x, r = (torch.randn(m, n, dtype=dtype, device="cuda") for _ in range(2))
    b = torch.randn(n, dtype=dtype, device="cuda")
    y = torch.empty_like(x)
    nbytes = (3 * m * n + n) * dtype.itemsize
    ours = functools.partial(fuselab.bias_act, x, b, residual=r, alpha=ALPHA, activation=activation)
    variants = {"torch.compile": functools.partial(compiled, x, b, r)}
    if mode == "proto":
        variants |= proto_variants(x, b, r, y, ours)
    elif mode == "knobs":
        variants |= knob_variants(ours)
    else:
        variants |= shipped_variants(x, b, r, activation, ours)
    ref = act(x.double() + ALPHA * r.double() + b.double())
    for name, fn in variants.items():
        y.fill_(float("nan"))
        out = fn()
        out = out if isinstance(out, torch.Tensor) else y  # the prototype's launches write y
        torch.testing.assert_close(out, ref.to(dtype), msg=lambda m, name=name: f"{name}: {m}")

    def fraction(ms: float) -> float:
        return nbytes / (ms * 1e-3) / 1e9 / copy

    out = alternate({name: (fn, fraction) for name, fn in variants.items()}, ROUNDS)
    set_flat(True)
    if mode == "knobs":
        set_flat_knobs(*SHIPPED_FLAT_KNOBS)
    print(f"\n{m}x{n} {str(dtype)[6:]} {activation}", flush=True)
    for name, (dirty, graph) in out.items():
        print(f"  {spread(dirty, graph)}  {name}", flush=True)


def main() -> None:
    modes = [m for m in ("proto", "knobs") if f"--{m}" in sys.argv[1:]]
    mode = modes[0] if modes else "shipped"
    copy = copy_gbps()
    ab_header(copy, ROUNDS)
    for dtype in (torch.float32,) if mode == "knobs" else (torch.float32, torch.bfloat16):
        for m, n in SHAPES:
            for activation in ("relu",) if mode != "shipped" else ("relu", "gelu_tanh"):
                case(m, n, dtype, activation, copy, mode)


if __name__ == "__main__":
    main()
