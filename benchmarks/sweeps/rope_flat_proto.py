"""RoPE forward: a flat prototype (one run of head rows per program, no loop) vs the shipped kernel and a copy.

    python3 benchmarks/sweeps/rope_flat_proto.py [--check]

Question (session 20): on the H200 the shipped forward reads and writes the four large bshd shapes at 0.90-0.95 of
the 1 GiB copy bandwidth, against 0.93-0.98 for ``copy_`` of the same q and k (``results/h200/probes/rope_small.txt``).
Each shipped program takes BLOCK_T tokens and loops over all their q heads, then all their k heads, in tiles of 2048
elements (4 iterations per program at 4x4096x32/32x128). bias_act's forward gained 0.4-2.4% on the H200 when each
program became one fixed run of the flat tensor with no loop (Inductor's shape of pointwise kernel, session 19).
Prediction: the same here, since a contiguous bshd q is a flat array of ``tokens*heads`` head rows; each program
rotates ROWS head rows (q's rows first, then k's: one launch), each row's cos/sin row found from its token
(``row // heads``), read from L2. Expected +1-3%, toward the copy.

``--check`` compares the prototype with ``fuselab.apply_rope`` on small shapes (CPU under TRITON_INTERPRET=1 works).
"""

from __future__ import annotations

import functools
import sys

import torch
import triton
import triton.language as tl

import fuselab

SHAPES = ((8, 4096, 32, 8, 128), (4, 4096, 32, 32, 128), (1, 16384, 64, 8, 128), (16, 2048, 16, 16, 64))
ROUNDS = 3


@triton.jit
def _rotate_rows(X, O, C, S, first_row, n_rows, heads, seqlen, stride_c,
                 ROWS: tl.constexpr, HALF: tl.constexpr, EVEN: tl.constexpr):
    # X, O: (n_rows, 2*HALF) contiguous head rows of one tensor; C, S: (seqlen, HALF) fp32 tables.
    # bytes: read ROWS*2*HALF elements of X, write as many of O; ROWS*2*HALF fp32 table values (L2)
    rows = first_row + tl.arange(0, ROWS)
    jj = tl.arange(0, HALF)
    pos = (rows // heads) % seqlen  # bshd: token = row // heads, position = its seq index
    t = pos[:, None] * stride_c + jj[None, :]
    offs = rows[:, None] * (2 * HALF) + jj[None, :]
    if EVEN:
        c = tl.load(C + t)
        s = tl.load(S + t)
        x1 = tl.load(X + offs).to(tl.float32)
        x2 = tl.load(X + offs + HALF).to(tl.float32)
        tl.store(O + offs, (x1 * c - x2 * s).to(O.dtype.element_ty))
        tl.store(O + offs + HALF, (x2 * c + x1 * s).to(O.dtype.element_ty))
    else:
        m = (rows < n_rows)[:, None]
        c = tl.load(C + t, mask=m, other=0.0)
        s = tl.load(S + t, mask=m, other=0.0)
        x1 = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(X + offs + HALF, mask=m, other=0.0).to(tl.float32)
        tl.store(O + offs, (x1 * c - x2 * s).to(O.dtype.element_ty), mask=m)
        tl.store(O + offs + HALF, (x2 * c + x1 * s).to(O.dtype.element_ty), mask=m)


@triton.jit
def _rope_flat(Q, K, QO, KO, C, S, q_rows, k_rows, hq, hk, seqlen, stride_c, q_programs,
               ROWS: tl.constexpr, HALF: tl.constexpr, EVEN: tl.constexpr):
    # Q, QO: (B*S*HQ, 2*HALF); K, KO: (B*S*HK, 2*HALF), contiguous bshd; programs [0, q_programs) rotate q
    pid = tl.program_id(0)
    if pid < q_programs:
        _rotate_rows(Q, QO, C, S, pid * ROWS, q_rows, hq, seqlen, stride_c, ROWS, HALF, EVEN)
    else:
        _rotate_rows(K, KO, C, S, (pid - q_programs) * ROWS, k_rows, hk, seqlen, stride_c, ROWS, HALF, EVEN)


def flat(q, k, cos, sin, qo, ko, rows: int, warps: int):
    """The prototype's launch on contiguous bshd q, k (full rotary, positions 0..S-1), ``rows`` head rows each."""
    b, s, hq, d = q.shape
    hk = k.shape[2]
    q_rows, k_rows = b * s * hq, b * s * hk
    q_programs = triton.cdiv(q_rows, rows)
    grid = (q_programs + triton.cdiv(k_rows, rows),)
    even = q_rows % rows == 0 and k_rows % rows == 0
    return functools.partial(_rope_flat[grid], q, k, qo, ko, cos, sin, q_rows, k_rows, hq, hk, s, cos.stride(0),
                             q_programs, ROWS=rows, HALF=d // 2, EVEN=even, num_warps=warps)


def variants(d: int) -> list[tuple[int, int]]:
    """(rows, warps): 2048-8192 elements per program, 2-8 warps."""
    out = []
    for elements in (2048, 4096, 8192):
        for warps in (2, 4, 8):
            if elements * 2 // (warps * 32) >= 16:  # at least one 16-byte vector per thread and half
                out.append((elements // d, warps))
    return out


def inputs(shape, device, dtype):
    b, s, hq, hk, d = shape
    q = torch.randn(b, s, hq, d, device=device, dtype=dtype)
    k = torch.randn(b, s, hk, d, device=device, dtype=dtype)
    cos, sin = fuselab.rope_cos_sin(s, d, device=device)
    return q, k, cos, sin


def check() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for shape in ((2, 5, 3, 1, 8), (1, 7, 4, 4, 16)):
        q, k, cos, sin = inputs(shape, device, torch.float32)
        want_q, want_k = fuselab.apply_rope(q, k, cos, sin)
        for rows, warps in ((2, 1), (4, 2), (16, 4)):
            qo, ko = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
            flat(q, k, cos, sin, qo, ko, rows, warps)()
            torch.testing.assert_close(qo, want_q, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ko, want_k, rtol=1e-5, atol=1e-5)
    print("check: prototype == fuselab.apply_rope")


def run_shape(shape, bw: float, alternate, spread) -> None:
    """copy_, the shipped op and every prototype variant on one shape, alternating."""
    q, k, cos, sin = inputs(shape, "cuda", torch.bfloat16)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()

    def fraction(ms: float) -> float:
        return nbytes / ms / 1e6 / bw

    want_q, want_k = fuselab.apply_rope(q, k, cos, sin)
    calls = {
        "copy_ of q, k": (lambda: (qo.copy_(q), ko.copy_(k)), fraction),
        "shipped": (lambda: fuselab.apply_rope(q, k, cos, sin), fraction),
    }
    for rows, warps in variants(shape[-1]):
        fn = flat(q, k, cos, sin, qo, ko, rows, warps)
        fn()
        torch.testing.assert_close(qo, want_q, rtol=1e-2, atol=1e-2)  # the bf16 row of the tolerance table
        torch.testing.assert_close(ko, want_k, rtol=1e-2, atol=1e-2)
        calls[f"flat {rows} rows x {shape[-1]}, {warps} warps"] = (fn, fraction)
    print(f"\n{'x'.join(map(str, shape[:3]))}/{shape[3]}x{shape[4]} ({nbytes / 1e6:.0f} MB)", flush=True)
    for name, (dirty, graph) in alternate(calls, ROUNDS).items():
        print(f"  {spread(dirty, graph)}  {name}", flush=True)


def main() -> None:
    from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py

    check()
    bw = copy_gbps()
    ab_header(bw, ROUNDS)
    for shape in SHAPES:
        run_shape(shape, bw, alternate, spread)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    check() if "--check" in sys.argv else main()
