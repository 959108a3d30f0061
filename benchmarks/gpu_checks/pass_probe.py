"""What the GEMM family's elementwise pass costs per variant (``fuselab.ops.gemm.steps.elementwise``), device time of
one launch replayed from a CUDA graph, as GB/s of its bytes: a plain copy, act' of the kept output, the ReLU bits,
the DCN multiplier, each with and without the column sums; beside two stand-alone kernels that apply the bits (one
byte load per element as the pass does, and a [BM, BN/8] words tile unpacked by a reshape), to tell where the bits'
variant loses. ``rope``: the QKV rotation in place (8192 tokens, 32 + 8 rotated heads of 128, 8 passing), by cos/sin
table and by in-kernel angles, at several row-block heights, beside ``fuselab.apply_rope`` on the same q and k.
``dcn``: the DCN backward's pass (gx = g ⊙ x0 with its column sums, dx0 = g ⊙ u, the copy of g) at 65536 x 3456, at
several row-block heights. ``python3 benchmarks/gpu_checks/pass_probe.py [rope] [dcn]``
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import triton
import triton.language as tl

import fuselab
from fuselab.ops.gemm.checks import activation_id
from fuselab.ops.gemm.launch import pass_, pass_plan
from fuselab.ops.gemm.spec import PassSpec, RopeArgs, RopeSpec
from fuselab.ops.gemm.steps import elementwise
from fuselab.reference.gemm import pack_bits

REPS = 20


@triton.jit
def _bits_bytewise(OUT, A, S, M, N, s_sm, BM: tl.constexpr, BN: tl.constexpr):
    # OUT, A: [M, N] bf16; S: [M, N / 8] uint8 bits. Reads A and S, writes OUT.
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    a = tl.load(A + rows[:, None] * N + cols[None, :])
    w = tl.load(S + rows[:, None] * s_sm + (cols // 8)[None, :])
    bit = (w.to(tl.int32) >> (cols % 8)[None, :]) & 1
    tl.store(OUT + rows[:, None] * N + cols[None, :], tl.where(bit != 0, a, 0.0).to(OUT.dtype.element_ty))


@triton.jit
def _bits_words(OUT, A, S, M, N, s_sm, BM: tl.constexpr, BN: tl.constexpr):
    # as _bits_bytewise, the bits loaded as one [BM, BN / 8] tile and unpacked by a reshape
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    words = tl.program_id(1) * (BN // 8) + tl.arange(0, BN // 8)
    a = tl.load(A + rows[:, None] * N + cols[None, :])
    w = tl.load(S + rows[:, None] * s_sm + words[None, :]).to(tl.int32)
    bit = tl.reshape((w[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1, (BM, BN))
    tl.store(OUT + rows[:, None] * N + cols[None, :], tl.where(bit != 0, a, 0.0).to(OUT.dtype.element_ty))


def _replay_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * REPS)


def _shape(m: int, n: int, dev: torch.device) -> None:
    g = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    y = torch.relu(torch.randn(m, n, device=dev, dtype=torch.bfloat16))
    bits = pack_bits(y > 0)
    out = torch.empty_like(g)
    db = torch.empty(n, device=dev, dtype=torch.float32)
    e = m * n * 2
    cases = {
        "copy": (lambda: elementwise(g, out), 2 * e),
        "copy + col sums": (lambda: elementwise(g, out, db=db), 2 * e),
        "relu' of y": (lambda: elementwise(g, out, s=y, pro={"pro_act": activation_id("relu")}), 3 * e),
        "relu' of y + col sums": (lambda: elementwise(g, out, s=y, pro={"pro_act": activation_id("relu")},
                                                      db=db), 3 * e),
        "bits": (lambda: elementwise(g, out, s=bits, pro={"pro_mask": True}), 2 * e + bits.numel()),
        "bits + col sums": (lambda: elementwise(g, out, s=bits, pro={"pro_mask": True}, db=db),
                            2 * e + bits.numel()),
        "x0 + col sums": (lambda: elementwise(g, out, g0=y, db=db), 3 * e),
        "torch threshold_backward": (lambda: torch.ops.aten.threshold_backward(g, y, 0), 3 * e),
        "torch column sum": (lambda: g.sum(0, dtype=torch.float32), e),
    }
    for name, kernel in (("bytewise", _bits_bytewise), ("words", _bits_words)):
        cases[f"stand-alone bits, {name}"] = (
            lambda k=kernel: k[(m // 64, n // 128)](out, g, bits, m, n, bits.stride(0), BM=64, BN=128,
                                                   num_warps=8), 2 * e + bits.numel())
    for name, (fn, nbytes) in cases.items():
        us = _replay_us(fn)
        print(f"{m}x{n} {name:28s} {us:8.1f} us  {nbytes / us / 1e3:6.0f} GB/s")


def _rope(dev: torch.device, batch: int = 4, seq: int = 2048, hq: int = 32, hkv: int = 8, d: int = 128) -> None:
    m, n, rot = batch * seq, (hq + 2 * hkv) * d, (hq + hkv) * d
    y = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
    angles = torch.arange(seq, device=dev, dtype=torch.float32)[:, None] * freq
    cos, sin = angles.cos(), angles.sin()
    nbytes = 2 * m * n * 2  # read and written in place (v too: the pass walks every column)
    for table in (True, False):
        spec = PassSpec(m=m, n=n, dtype=y.dtype, device=dev, rope=RopeSpec(d // 2, d // 2, d, rot, table), conj=False)
        args = RopeArgs(cos=cos if table else None, sin=sin if table else None, freq=None if table else freq,
                        div_b=seq, mod_b=batch, div_s=1, mod_s=seq)
        plan = pass_plan(spec)
        for bm in (64, 32, 16):
            p = dataclasses.replace(plan, constexprs=tuple((k, bm if k == "BM" else v) for k, v in plan.constexprs))
            us = _replay_us(lambda p=p, a=args: pass_(p, y, rope=a))
            print(f"rope pass {'table ' if table else 'angles'} BM={bm:3d} {us:8.1f} us  {nbytes / us / 1e3:6.0f} GB/s")
    q, k, _ = y.view(batch, seq, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=-2)
    us = _replay_us(lambda: fuselab.apply_rope(q, k, cos, sin))
    print(f"apply_rope (q, k: new tensors) {us:8.1f} us  {2 * m * rot * 2 / us / 1e3:6.0f} GB/s of q and k")
    us = _replay_us(lambda: fuselab.apply_rope(q, k, cos, sin, inplace=True))
    print(f"apply_rope in place            {us:8.1f} us  {2 * m * rot * 2 / us / 1e3:6.0f} GB/s of q and k")


def _dcn(dev: torch.device, m: int = 65536, n: int = 3456) -> None:
    g, x0, u = (torch.randn(m, n, device=dev, dtype=torch.bfloat16) for _ in range(3))
    gx, dx0, copy = (torch.empty_like(g) for _ in range(3))
    db = torch.empty(n, device=dev, dtype=torch.float32)
    for acc in (False, True):  # dx0 written, or added to (a cross network's later layers: dx0 read as well)
        spec = PassSpec(m=m, n=n, dtype=g.dtype, device=dev, pro_x0=True, col_sum=True, dx0=True, dx0_acc=acc,
                        copy=True)
        plan = pass_plan(spec)
        nbytes = (6 + acc) * m * n * 2  # g, x0, u (dx0) read; gx, dx0, the copy written
        for bm in (64, 32, 16):
            p = dataclasses.replace(plan, constexprs=tuple((k, bm if k == "BM" else v) for k, v in plan.constexprs))
            us = _replay_us(lambda p=p: pass_(p, g, gx, s=u, g0=x0, db=db, dx0=dx0, copy=copy))
            print(f"dcn pass{' dx0 += ' if acc else ' '}BM={bm:3d} {us:8.1f} us  {nbytes / us / 1e3:6.0f} GB/s "
                  f"(plan: BM={dict(plan.constexprs)['BM']})")
    us = _replay_us(lambda: elementwise(g, gx, g0=x0, db=db))
    print(f"dcn pass gx + col sums alone {us:8.1f} us  {3 * m * n * 2 / us / 1e3:6.0f} GB/s")


def main() -> None:
    dev = torch.device("cuda")
    copy = torch.empty(1 << 28, device=dev, dtype=torch.uint8)
    copy_us = _replay_us(lambda: copy.clone())
    print(f"copy bandwidth: {2 * copy.numel() / copy_us / 1e3:.0f} GB/s")
    if "rope" in sys.argv[1:]:
        _rope(dev)
    if "dcn" in sys.argv[1:]:
        _dcn(dev)
    if {"rope", "dcn"} & set(sys.argv[1:]):
        return
    for m, n in ((65536, 256), (65536, 512), (65536, 1024), (65536, 3456)):
        _shape(m, n, dev)


if __name__ == "__main__":
    main()
