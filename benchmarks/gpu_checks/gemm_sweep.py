"""GEMM family on one H100/H200: correctness of every variant against torch (float64 / fp32), then timings of cuBLAS,
cuBLASLt's epilogue and fuselab's kernel (its default plan and a few tile configs) at the DLRM MLP shapes, a DCN
shape and two LLM shapes, forward and forward+backward. Prints a table (TFLOP/s, fraction of the bf16 matmul rate
measured in the same run, speed against cuBLAS) and writes ``$OUT/gemm_sweep.json`` when ``OUT`` is set.

    python benchmarks/gpu_checks/gemm_sweep.py              # ~4 minutes with Triton's compiles
    python benchmarks/gpu_checks/gemm_sweep.py --quick      # three linear shapes, DCN, QKV; default plans only
    python benchmarks/gpu_checks/gemm_sweep.py --cpu-smoke  # tiny shapes on the CPU (interpreter): the script runs

Timings: ``triton.testing.do_bench`` medians (L2 not flushed between calls, as in a training step); the matmul rate is
a bf16 8192³ ``torch.matmul`` timed the same way. The budget (``--budget``, seconds) stops starting new shapes when
spent; compiles dominate it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

if "--cpu-smoke" in sys.argv:  # the interpreter must be set before Triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("FUSELAB_BACKEND", "triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from fuselab.ops.gemm import LoRA, dcn_cross, gemm, qkv_rope
from fuselab.ops.gemm.spec import GemmTuning, TileConfig
from fuselab.ops.rope import apply_rope
from fuselab.ops.tuning import override
from fuselab.reference import gemm as ref

#: (K, N) of the DLRM MLP layers at M 65536 (timed with the default plans)
DLRM = ((13, 512), (512, 256), (256, 128), (479, 1024), (367, 512), (1024, 1024), (1024, 512), (256, 1))
#: (M, K, N, activation) of the shapes that also time the variants: tile configs, keep=output, no TMA, dZ materialised
DETAIL = ((65536, 512, 256, "relu"), (8192, 8192, 8192, "none"))
#: a few tile configs timed beside the default plan (block_p, block_q, block_r, warps, stages)
CONFIGS = {"128x128x64/8w3s": TileConfig(128, 128, 64, 8, 3), "128x256x64/8w3s": TileConfig(128, 256, 64, 8, 3),
           "128x64x64/4w4s": TileConfig(128, 64, 64, 4, 4)}


# ---------------------------------------------------------------------------------------------- timing
def timer(device: torch.device):
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=40, return_mode="median")

    def host(fn) -> float:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return host


def matmul_rate(device: torch.device, bench) -> float:
    n = 8192 if device.type == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    return 2 * n**3 / (bench(lambda: a @ a) * 1e-3) / 1e12


def fwd_bwd(fn, inputs, grad):
    """A step that runs ``fn`` forward and backward (gradients into the inputs that require them)."""
    def step():
        for t in inputs:
            t.grad = None
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, grad if isinstance(grad, tuple) else (grad,))
    return step


# ---------------------------------------------------------------------------------------------- checks
def max_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (the GEMM errors scale with the operands, not each element)."""
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def check_variants(device: torch.device, smoke: bool) -> list[dict]:
    """Every variant on GPU against the float64 reference: output and every gradient, max-normalized error."""
    m, k, n = (48, 40, 24) if smoke else (8192, 1024, 512)
    out = []
    dt = torch.bfloat16

    def leaves(*ts):
        return [t.detach().clone().requires_grad_() for t in ts]

    def record(name, pairs, limit):
        worst = max(max_rel(a, b) for a, b in pairs)
        out.append({"check": name, "max_rel_error": worst, "limit": limit, "ok": worst <= limit})
        print(f"  check {name:38s} max rel error {worst:.2e} (limit {limit:.0e}) {'ok' if worst <= limit else 'FAIL'}")

    x, w, b = torch.randn(m, k, device=device), torch.randn(n, k, device=device) / k**0.5, torch.randn(n, device=device)
    for act, keep in (("relu", "mask"), ("relu", "output"), ("gelu_tanh", "pre")):
        xs, ws, bs = leaves(x.to(dt), w.to(dt), b.to(dt))
        x6, w6, b6 = leaves(*(t.double() for t in (xs, ws, bs)))
        y = gemm(xs, ws, bs, activation=act, keep=keep)
        y6 = ref.linear(x6, w6, b6, activation=act)
        g = torch.randn_like(y)
        y.backward(g)
        y6.backward(g.double())
        record(f"linear {act} keep={keep} bf16", [(y, y6), (xs.grad, x6.grad), (ws.grad, w6.grad),
                                                  (bs.grad, b6.grad)], 2e-2)
    with override(GemmTuning(materialize_dz=True)):
        xs, ws, bs = leaves(x.to(dt), w.to(dt), b.to(dt))
        x6, w6, b6 = leaves(*(t.double() for t in (xs, ws, bs)))
        y = gemm(xs, ws, bs, activation="relu", keep="mask")
        y6 = ref.linear(x6, w6, b6, activation="relu")
        g = torch.randn_like(y)
        y.backward(g)
        y6.backward(g.double())
        record("linear relu dZ materialised", [(xs.grad, x6.grad), (ws.grad, w6.grad), (bs.grad, b6.grad)], 2e-2)
    xs, ws, bs = leaves(x, w, b)
    x6, w6, b6 = leaves(*(t.double() for t in (xs, ws, bs)))
    y = gemm(xs, ws, bs, activation="relu")
    y6 = ref.linear(x6, w6, b6, activation="relu")
    g = torch.randn_like(y)
    y.backward(g)
    y6.backward(g.double())
    record("linear relu fp32 (ieee)", [(y, y6), (xs.grad, x6.grad), (ws.grad, w6.grad), (bs.grad, b6.grad)], 1e-4)
    rank = 16
    la, lb = torch.randn(rank, k, device=device) / k**0.5, torch.randn(n, rank, device=device) / rank**0.5
    xs, ws, bs, as_, bb = leaves(*(t.to(dt) for t in (x, w, b, la, lb)))
    x6, w6, b6, a6, bb6 = leaves(*(t.double() for t in (xs, ws, bs, as_, bb)))
    y = gemm(xs, ws, bs, lora=LoRA(as_, bb, 0.5), activation="relu")
    y6 = ref.linear(x6, w6, b6, lora=LoRA(a6, bb6, 0.5), activation="relu")
    g = torch.randn_like(y)
    y.backward(g)
    y6.backward(g.double())
    record("LoRA r16 relu bf16", [(y, y6), (xs.grad, x6.grad), (ws.grad, w6.grad), (as_.grad, a6.grad),
                                  (bb.grad, bb6.grad)], 2e-2)
    r = 8 if smoke else 256
    x0, xl = torch.randn(m, n, device=device).to(dt), torch.randn(m, n, device=device).to(dt)
    u, v = (torch.randn(n, r, device=device) / r**0.5).to(dt), (torch.randn(r, n, device=device) / n**0.5).to(dt)
    ts = leaves(x0, xl, u, b.to(dt), v)
    t6 = leaves(*(t.double() for t in ts))
    y = dcn_cross(*ts[:4], weight_v=ts[4])
    y6 = ref.dcn_cross(*t6)
    g = torch.randn_like(y)
    y.backward(g)
    y6.backward(g.double())
    record("DCN low rank bf16", [(y, y6), *((a.grad, c.grad) for a, c in zip(ts, t6))], 2e-2)
    check_qkv(device, smoke, record)
    check_determinism(device, smoke, record)
    return out


def check_qkv(device: torch.device, smoke: bool, record) -> None:
    batch, seq, hidden, hq, hkv, d = (2, 8, 64, 4, 2, 16) if smoke else (2, 512, 1024, 16, 4, 64)
    x = torch.randn(batch, seq, hidden, device=device).to(torch.bfloat16)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, device=device) / hidden**0.5).to(torch.bfloat16)
    angles = torch.arange(seq, device=device, dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    for interleaved, table in ((False, True), (True, False)):
        rope = dict(cos=angles.cos().float(), sin=angles.sin().float()) if table else {}
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        x6, w6 = x.double().requires_grad_(), w.double().requires_grad_()
        q, k_, v = qkv_rope(xs, ws, num_heads=hq, num_kv_heads=hkv, interleaved=interleaved, **rope)
        rope6 = {key: val.double() for key, val in rope.items()}
        q6, k6, v6 = ref.qkv_rope(x6, w6, None, hq, hkv, dict(interleaved=interleaved, **rope6))
        gs = [torch.randn_like(t, dtype=torch.float64) for t in (q6, k6, v6)]
        torch.autograd.backward((q, k_, v), [g.to(torch.bfloat16) for g in gs])
        torch.autograd.backward((q6, k6, v6), gs)
        record(f"QKV+RoPE {'interleaved angles' if interleaved else 'neox table'} GQA bf16",
               [(q, q6), (k_, k6), (v, v6), (xs.grad, x6.grad), (ws.grad, w6.grad)], 2e-2)


def check_determinism(device: torch.device, smoke: bool, record) -> None:
    """The weight and bias gradients of a split reduction, three runs: bit-identical (error 0)."""
    m, k, n = (256, 32, 16) if smoke else (65536, 256, 128)
    x = torch.randn(m, k, device=device).to(torch.bfloat16)
    w = (torch.randn(n, k, device=device) / 16).to(torch.bfloat16).requires_grad_()
    b = torch.randn(n, device=device).to(torch.bfloat16).requires_grad_()
    g = torch.randn(m, n, device=device).to(torch.bfloat16)
    runs = []
    for _ in range(3):
        w.grad = b.grad = None
        gemm(x, w, b, activation="relu", keep="mask").backward(g)
        runs.append((w.grad.clone(), b.grad.clone()))
    record("dW, db bit-identical over 3 runs", [(a, c) for run in runs[1:] for a, c in zip(run, runs[0])], 0.0)


# ---------------------------------------------------------------------------------------------- timings
def linear_cases(smoke: bool, quick: bool) -> list[tuple[int, int, int, str]]:
    if smoke:
        return [(256, 48, 32, "relu"), (64, 64, 64, "none")]
    shapes = ((512, 256), (479, 1024)) if quick else DLRM
    return [*((65536, k, n, "relu") for k, n in shapes), (8192, 8192, 8192, "none")]


def time_linear(device, bench, m, k, n, act, detail: bool, rows: list, rate: float) -> None:
    """cuBLAS, cuBLASLt and fuselab's default plan at one shape; with ``detail`` the variants instead (the tile configs
    of :data:`CONFIGS`, keep=output, no TMA, dZ materialised)."""
    dt = torch.bfloat16
    x = torch.randn(m, k, device=device).to(dt).requires_grad_()
    w = (torch.randn(n, k, device=device) / k**0.5).to(dt).requires_grad_()
    pad = -k % 8  # unaligned rows: the variant reading x and W from buffers whose rows are padded to 16 bytes
    xp = torch.zeros(m, k + pad, device=device, dtype=dt)[:, :k].copy_(x.detach()).requires_grad_() if pad else None
    wp = torch.zeros(n, k + pad, device=device, dtype=dt)[:, :k].copy_(w.detach()).requires_grad_() if pad else None
    b = torch.randn(n, device=device).to(dt).requires_grad_()
    g = torch.randn(m, n, device=device).to(dt)
    flops = 2 * m * n * k
    label = f"{m}x{k}x{n}-{act}"

    def cublas():
        y = F.linear(x, w, b)
        return torch.relu(y) if act == "relu" else y

    def lt():
        return torch._addmm_activation(b, x, w.t()) if act == "relu" else torch.addmm(b, x, w.t())

    def fuse(keep):
        return lambda: gemm(x, w, b, activation=act, keep=keep)

    keep = "mask" if act == "relu" else "auto"
    variants = [("cublas", cublas, None), ("cublaslt", lt, None), ("fuselab", fuse(keep), None)]
    if pad and k > 16:
        variants.append(("fuselab, rows padded to 16 B", lambda: gemm(xp, wp, b, activation=act, keep=keep), None))
    if detail:
        variants = variants[:1]
        if act == "relu":
            variants.append(("fuselab keep=output", fuse("output"), None))
        variants += [(f"fuselab {name}", fuse(keep), GemmTuning(force=cfg)) for name, cfg in CONFIGS.items()]
        variants.append(("fuselab no-TMA", fuse(keep), GemmTuning(tma=False)))
        variants.append(("fuselab dZ materialised", fuse(keep), GemmTuning(materialize_dz=True)))
    for mode, mult in (("fwd", 1), ("fwd+bwd", 3)):
        base = None
        for name, fn, tuning in variants:
            if mode == "fwd" and name == "fuselab dZ materialised":
                continue
            if mode == "fwd+bwd" and name == "cublaslt":
                continue  # torch has no derivative of _addmm_activation
            leaves = (xp, wp, b) if "padded" in name else (x, w, b)
            ms = _time(bench, fn, leaves, g, mode, tuning)
            base = ms if name == "cublas" else base
            rows.append(_row(label, mode, name, ms, mult * flops, rate, base))


def _time(bench, fn, inputs, grad, mode: str, tuning) -> float | None:
    try:
        with override(tuning or GemmTuning()):
            if mode == "fwd":
                with torch.no_grad():
                    return bench(fn)
            return bench(fwd_bwd(fn, inputs, grad))
    except Exception as e:  # a config that does not compile or run: reported, the sweep goes on
        print(f"    {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        return None


def _row(case: str, mode: str, provider: str, ms: float | None, flops: int, rate: float, base: float | None) -> dict:
    tflops = None if ms is None else flops / (ms * 1e-3) / 1e12
    row = {"case": case, "mode": mode, "provider": provider, "ms": ms, "tflops": tflops,
           "of_matmul": None if tflops is None else tflops / rate,
           "vs_cublas": None if ms is None or base is None else base / ms}
    print(f"  {case:24s} {mode:8s} {provider:28s} " + ("failed" if ms is None else
          f"{ms:9.4f} ms {tflops:7.1f} TFLOP/s {row['of_matmul']:5.2f} of matmul "
          f"{row['vs_cublas'] if row['vs_cublas'] else float('nan'):5.2f}x cuBLAS"), flush=True)
    return row


def time_dcn(device, bench, smoke: bool, rows: list, rate: float) -> None:
    m, n, r = (128, 48, 8) if smoke else (65536, 3456, 512)
    dt = torch.bfloat16
    x0, xl = torch.randn(m, n, device=device).to(dt), torch.randn(m, n, device=device).to(dt).requires_grad_()
    u = (torch.randn(n, r, device=device) / r**0.5).to(dt).requires_grad_()
    v = (torch.randn(r, n, device=device) / n**0.5).to(dt).requires_grad_()
    b = torch.randn(n, device=device).to(dt).requires_grad_()
    g = torch.randn(m, n, device=device).to(dt)
    label = f"dcn-{m}x{n}-r{r}"
    fns = [("cublas", lambda: x0 * F.linear(F.linear(xl, v), u, b) + xl),
           ("fuselab", lambda: dcn_cross(x0, xl, u, b, weight_v=v))]
    for mode, mult in (("fwd", 1), ("fwd+bwd", 3)):
        base = None
        for name, fn in fns:
            ms = _time(bench, fn, (xl, u, v, b), g, mode, None)
            base = ms if name == "cublas" else base
            rows.append(_row(label, mode, name, ms, mult * 4 * m * n * r, rate, base))


def time_qkv(device, bench, smoke: bool, rows: list, rate: float) -> None:
    batch, seq, hidden, hq, hkv, d = (2, 16, 64, 4, 2, 16) if smoke else (4, 2048, 4096, 32, 8, 128)
    dt = torch.bfloat16
    x = torch.randn(batch, seq, hidden, device=device).to(dt).requires_grad_()
    n = (hq + 2 * hkv) * d
    w = (torch.randn(n, hidden, device=device) / hidden**0.5).to(dt).requires_grad_()
    angles = torch.arange(seq, device=device, dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    cos, sin = angles.cos().float(), angles.sin().float()
    label = f"qkv-{batch * seq}x{hidden}-{hq}/{hkv}x{d}"
    grads = tuple(torch.randn(batch, seq, h, d, device=device).to(dt) for h in (hq, hkv, hkv))

    def split(y):
        return y.view(batch, seq, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=-2)

    def gemm_rope():
        q, k, v = split(F.linear(x, w))
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v

    q0, k0, _ = (t.detach().contiguous() for t in split(F.linear(x, w)))
    fns = [("cublas QKV GEMM alone", lambda: split(F.linear(x, w))), ("cublas + fuselab RoPE", gemm_rope),
           ("fuselab qkv_rope", lambda: qkv_rope(x, w, num_heads=hq, num_kv_heads=hkv, cos=cos, sin=sin)),
           ("fuselab RoPE alone", lambda: apply_rope(q0, k0, cos, sin))]
    for mode, mult in (("fwd", 1), ("fwd+bwd", 3)):
        base = None
        for name, fn in fns:
            if mode != "fwd" and name == "fuselab RoPE alone":
                continue
            ms = _time(bench, fn, (x, w), grads, mode, None)
            base = ms if name.startswith("cublas QKV") else base
            rows.append(_row(label, mode, name, ms, mult * 2 * batch * seq * n * hidden, rate, base))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three linear shapes, DCN and QKV, default plans only")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU under the interpreter")
    ap.add_argument("--budget", type=float, default=230.0, help="seconds after which no new shape starts")
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke for the tiny CPU run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    import triton

    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    print(f"{name}; torch {torch.__version__}, triton {triton.__version__}")
    torch.manual_seed(0)
    checks = [] if args.skip_checks else check_variants(device, args.cpu_smoke)
    bench = timer(device)
    rate = matmul_rate(device, bench)
    print(f"  bf16 matmul rate (8192^3, this run): {rate:.1f} TFLOP/s")
    rows: list[dict] = []
    jobs = [lambda c=c: time_linear(device, bench, *c, False, rows, rate) for c in linear_cases(args.cpu_smoke,
                                                                                                args.quick)]
    jobs += [lambda: time_dcn(device, bench, args.cpu_smoke, rows, rate),
             lambda: time_qkv(device, bench, args.cpu_smoke, rows, rate)]
    if not args.quick:  # the variants last: the budget trims them first
        detail = linear_cases(True, False) if args.cpu_smoke else DETAIL
        jobs += [lambda c=c: time_linear(device, bench, *c, True, rows, rate) for c in detail]
    skipped = 0
    for job in jobs:
        if time.perf_counter() - start > args.budget:
            skipped += 1
            continue
        job()
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed:.0f} s" + (f"; {skipped} shapes skipped (budget {args.budget:.0f} s)" if skipped else ""))
    failed = [c["check"] for c in checks if not c["ok"]]
    if failed:
        print(f"FAILED checks: {', '.join(failed)}")
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / "gemm_sweep.json"
        path.write_text(json.dumps({"device": name, "torch": torch.__version__, "triton": triton.__version__,
                                    "matmul_tflops": rate, "checks": checks, "timings": rows,
                                    "elapsed_s": elapsed, "skipped_shapes": skipped},
                                   indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else o))
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
