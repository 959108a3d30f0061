"""GEMM family on one H100/H200 in about two minutes: first every variant against float64 references on the GPU (per
tensor), under the default plans and the Triton-only ones; then timings against cuBLAS and cuBLASLt at the DLRM MLP
shapes (M 65536), the MLPerf DCN shape, 8192³ and one QKV shape, forward and forward+backward. Prints a table
(TFLOP/s, fraction of the bf16 matmul rate measured in the same run, speed against cuBLAS), the failed checks last,
and writes ``$OUT/gemm_sweep.json`` when ``OUT`` is set. Exit status 1 when a check fails.

    python benchmarks/gpu_checks/gemm_sweep.py              # checks, then timings until --budget seconds (140)
    python benchmarks/gpu_checks/gemm_sweep.py --cpu-smoke  # tiny shapes on the CPU (interpreter): the script runs

Providers: ``cublas`` (F.linear + the epilogue as torch ops, autograd), ``cublaslt`` (torch._addmm_activation,
forward), ``fuselab`` (fuselab.gemm / dcn_cross / qkv_rope with the default plans), ``FusedLinear`` (the layer with
its shape rules), ``fuselab, fused bwd`` (GemmTuning(backward="fused"): every gradient GEMM in Triton),
``fuselab, fused fwd`` (qkv_forward="fused": RoPE in the GEMM's epilogue). Timings: each step captured once in a
CUDA graph and its replay timed by ``triton.testing.do_bench`` (median): the device's time, what a training step
captured in a graph sees. ``--eager`` times the steps as called instead: below about 1 ms of GPU work that is the
host's time for fuselab's ops (Python, autograd and launches: 0.9-1.1 ms per fwd+bwd on an H100 host, against
0.24-0.49 ms for cuBLAS + torch ops; ``benchmarks/notes/gemm.md``). The matmul rate is a bf16 8192³
``torch.matmul`` timed the same way.
"""

from __future__ import annotations

import argparse
import json
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

from fuselab.bench.timing import CudaTimer, TimingJob
from fuselab.nn import FusedLinear
from fuselab.ops.gemm import LoRA, dcn_cross, gemm, qkv_rope
from fuselab.ops.gemm.spec import GemmTuning, TileConfig
from fuselab.ops.rope import apply_rope
from fuselab.ops.tuning import override
from fuselab.reference import gemm as ref

#: (K, N) of the DLRM MLP layers timed at M 65536 (relu)
DLRM = ((13, 512), (512, 256), (256, 128), (479, 1024), (1024, 1024))
#: DLRM shapes that also time the Triton-only backward
FUSED_BWD = ((512, 256),)
#: DLRM shapes that also time other tile configs in the forward (65536x256x128 ran at 0.26x cuBLAS in
#: benchmarks/results/h200/gemm/gemm_sweep.json)
TILES = {(256, 128): {"128x64x64/4w4s": TileConfig(128, 64, 64, 4, 4), "64x128x64/4w4s": TileConfig(64, 128, 64, 4, 4)}}
FUSED = GemmTuning(backward="fused", qkv_forward="fused")
DT = torch.bfloat16


# ---------------------------------------------------------------------------------------------- timing
def timer(device: torch.device, eager: bool = False):
    """A function that times a step in ms: on CUDA the lab's timer (``triton.testing.do_bench`` median) of the step's
    replay from a CUDA graph, or with ``eager`` of the step as called; on the CPU one host-timed call."""
    if device.type == "cuda":
        cuda = CudaTimer(warmup_ms=5, rep_ms=25)
        return lambda fn: cuda.measure(TimingJob([fn], cuda_graph=not eager)).median_ms

    def host(fn) -> float:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return host


def matmul_rate(device: torch.device, bench) -> float:
    n = 8192 if device.type == "cuda" else 256
    a = torch.randn(n, n, device=device, dtype=DT if device.type == "cuda" else torch.float32)
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


class Checks:
    """The checks' records: per check the worst max-normalized error of each tensor against its limit."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, name: str, pairs: dict, limit: float = 2e-2, note: str = "") -> None:
        errors = {key: max_rel(got, want) for key, (got, want) in pairs.items()}
        failed = sorted(key for key, e in errors.items() if not e <= limit)
        self.rows.append({"check": name, "errors": errors, "limit": limit, "ok": not failed, "failed": failed,
                          "note": note})
        verdict = "ok" if not failed else f"FAIL {failed}"
        print(f"  check {name:44s} worst {max(errors.values()):.2e} (limit {limit:.0e}) {verdict}"
              + (f"  [{note}]" if note else ""), flush=True)


def _leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def check_linear(device, smoke: bool, checks: Checks) -> None:
    """relu (bits or y kept), gelu_tanh (z kept), dZ materialised, fp32, LoRA: the gradients of relu against float64
    products of the kernel's own mask (y > 0: a z within rounding of 0 cannot flip the reference; the count of such
    elements is noted), LoRA with T = s·x·Aᵀ rounded to bf16 as the kernel keeps it."""
    m, k, n = (48, 40, 24) if smoke else (8192, 1024, 512)
    x, w, b = torch.randn(m, k, device=device), torch.randn(n, k, device=device) / k**0.5, torch.randn(n, device=device)
    rank = 16
    la, lb = torch.randn(rank, k, device=device) / k**0.5, torch.randn(n, rank, device=device) / rank**0.5
    cases = [("relu keep=mask", "relu", "mask", None, DT, None), ("relu keep=output", "relu", "output", None, DT, None),
             ("gelu_tanh keep=pre", "gelu_tanh", "pre", None, DT, None),
             ("relu fp32 (ieee)", "relu", "mask", None, torch.float32, None),
             ("LoRA r16 relu", "relu", "output", (la, lb), DT, None),
             ("relu dZ materialised", "relu", "mask", None, DT, GemmTuning(materialize_dz=True, backward="fused"))]
    for label, act, keep, lora, dt, tuning in cases:
        for plan_name, plan in ((("fused bwd", tuning),) if tuning is not None else
                                (("default", GemmTuning()), ("fused bwd", FUSED))):
            with override(plan):
                _check_one_linear(checks, f"linear {label} [{plan_name}]", x, w, b, act, keep, lora, dt)


def _check_one_linear(checks: Checks, name: str, x, w, b, act, keep, lora, dt) -> None:
    ts = _leaves(*(t.to(dt) for t in (x, w, b, *(lora or ()))))
    y = gemm(*ts[:3], activation=act, keep=keep, lora=LoRA(ts[3], ts[4], 0.5) if lora else None)
    g = torch.randn_like(y)
    y.backward(g)
    x6, w6, b6 = (t.detach().double() for t in ts[:3])
    z6 = x6 @ w6.t() + b6
    t6 = None
    if lora:
        a6, bb6 = (t.detach().double() for t in ts[3:])
        t6 = (0.5 * (x6 @ a6.t())).to(dt).double()
        z6 = z6 + t6 @ bb6.t()
    y6 = ref.apply_activation(z6, act)
    own = (y > 0).double() if act == "relu" else None
    d6 = g.double() * (own if own is not None else _act_grad64(z6, act))
    pairs = {"y": (y, y6), "dx": (ts[0].grad, d6 @ w6), "dw": (ts[1].grad, d6.t() @ x6), "db": (ts[2].grad, d6.sum(0))}
    if lora:
        u6 = 0.5 * (d6 @ bb6)
        pairs["dx"] = (ts[0].grad, d6 @ w6 + u6 @ a6)
        pairs.update({"dA": (ts[3].grad, u6.t() @ x6), "dB": (ts[4].grad, d6.t() @ t6)})
    note = f"{int(((z6 > 0) != (y > 0)).sum())} signs of z differ from the exact z" if own is not None else ""
    checks.record(name, pairs, 1e-4 if dt == torch.float32 else 2e-2, note)


def _act_grad64(z: torch.Tensor, act: str) -> torch.Tensor:
    from fuselab.reference.bias_act import activation_grad

    return activation_grad(z, act)


def check_dcn(device, smoke: bool, checks: Checks) -> None:
    m, n, r = (48, 24, 8) if smoke else (8192, 512, 256)
    x0, xl = torch.randn(m, n, device=device).to(DT), torch.randn(m, n, device=device).to(DT)
    u, v = (torch.randn(n, r, device=device) / r**0.5).to(DT), (torch.randn(r, n, device=device) / n**0.5).to(DT)
    b = torch.randn(n, device=device).to(DT)
    for plan_name, plan in (("default", GemmTuning()), ("fused bwd", FUSED)):
        with override(plan):
            ts = _leaves(x0, xl, u, b, v)
            t6 = [t.detach().double().requires_grad_() for t in ts]
            y = dcn_cross(*ts[:4], weight_v=ts[4])
            y6 = ref.dcn_cross(*t6)
            g = torch.randn_like(y)
            y.backward(g)
            y6.backward(g.double())
            names = ("dx0", "dxl", "dw", "db", "dv")
            checks.record(f"DCN low rank [{plan_name}]", {"y": (y, y6), **{nm: (a.grad, c.grad)
                                                                           for nm, a, c in zip(names, ts, t6)}})


def check_qkv(device, smoke: bool, checks: Checks) -> None:
    batch, seq, hidden, hq, hkv, d = (2, 8, 64, 4, 2, 16) if smoke else (2, 512, 1024, 16, 4, 64)
    x = torch.randn(batch, seq, hidden, device=device).to(DT)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, device=device) / hidden**0.5).to(DT)
    angles = torch.arange(seq, device=device, dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    for interleaved, table in ((False, True), (True, False)):
        rope = dict(cos=angles.cos().float(), sin=angles.sin().float()) if table else {}
        for plan_name, plan in (("default", GemmTuning()), ("fused", FUSED)):
            with override(plan):
                xs, ws = _leaves(x, w)
                x6, w6 = x.double().requires_grad_(), w.double().requires_grad_()
                q, k_, v = qkv_rope(xs, ws, num_heads=hq, num_kv_heads=hkv, interleaved=interleaved, **rope)
                rope6 = {key: val.double() for key, val in rope.items()}
                q6, k6, v6 = ref.qkv_rope(x6, w6, None, hq, hkv, dict(interleaved=interleaved, **rope6))
                gs = [torch.randn_like(t, dtype=torch.float64) for t in (q6, k6, v6)]
                torch.autograd.backward((q, k_, v), [g.to(DT) for g in gs])
                torch.autograd.backward((q6, k6, v6), gs)
                kind = "interleaved angles" if interleaved else "neox table"
                pairs = {"q": (q, q6), "k": (k_, k6), "v": (v, v6), "dx": (xs.grad, x6.grad), "dw": (ws.grad, w6.grad)}
                checks.record(f"QKV+RoPE {kind} GQA [{plan_name}]", pairs)


def check_determinism(device, smoke: bool, checks: Checks) -> None:
    """The weight and bias gradients, three runs: bit-identical (error 0), both plans."""
    m, k, n = (256, 32, 16) if smoke else (65536, 256, 128)
    x = torch.randn(m, k, device=device).to(DT)
    w = (torch.randn(n, k, device=device) / 16).to(DT).requires_grad_()
    b = torch.randn(n, device=device).to(DT).requires_grad_()
    g = torch.randn(m, n, device=device).to(DT)
    for plan_name, plan in (("default", GemmTuning()), ("fused bwd", FUSED)):
        runs = []
        with override(plan):
            for _ in range(3):
                w.grad = b.grad = None
                gemm(x, w, b, activation="relu", keep="mask").backward(g)
                runs.append((w.grad.clone(), b.grad.clone()))
        pairs = {f"{nm} run {i + 2}": (a, c) for i, run in enumerate(runs[1:]) for nm, a, c in zip(("dw", "db"), run,
                                                                                                   runs[0])}
        checks.record(f"dW, db bit-identical over 3 runs [{plan_name}]", pairs, 0.0)


# ---------------------------------------------------------------------------------------------- timings
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
    print(f"  {case:24s} {mode:8s} {provider:30s} " + ("failed" if ms is None else
          f"{ms:9.4f} ms {tflops:7.1f} TFLOP/s {row['of_matmul']:5.2f} of matmul "
          f"{row['vs_cublas'] if row['vs_cublas'] else float('nan'):5.2f}x cuBLAS"), flush=True)
    return row


def _run_variants(bench, label, variants, leaves, grad, flops, rate, rows) -> None:
    """Time ``variants`` [(provider, fn, tuning, modes)] forward and forward+backward; the first is the baseline."""
    for mode, mult in (("fwd", 1), ("fwd+bwd", 3)):
        base = None
        for name, fn, tuning, modes in variants:
            if mode not in modes:
                continue
            ms = _time(bench, fn, leaves, grad, mode, tuning)
            base = ms if base is None and name == variants[0][0] else base
            rows.append(_row(label, mode, name, ms, mult * flops, rate, base))


def time_linear(device, bench, m, k, n, act, fused_bwd: bool, rows: list, rate: float) -> None:
    """cuBLAS (+ the epilogue as torch ops), cuBLASLt's epilogue (forward), fuselab.gemm, FusedLinear (its rules);
    with ``fused_bwd`` the Triton-only backward and the 128x256 tile too."""
    x = torch.randn(m, k, device=device).to(DT).requires_grad_()
    layer = FusedLinear(k, n, activation=act, device=device, dtype=DT)
    w, b = layer.weight, layer.bias
    g = torch.randn(m, n, device=device).to(DT)
    keep = "mask" if act == "relu" else "auto"

    def cublas():
        y = F.linear(x, w, b)
        return torch.relu(y) if act == "relu" else y

    both, fwd = ("fwd", "fwd+bwd"), ("fwd",)
    def lt():
        return torch._addmm_activation(b, x, w.t()) if act == "relu" else torch.addmm(b, x, w.t())

    variants = [("cublas", cublas, None, both), ("cublaslt", lt, None, fwd),
                ("fuselab", lambda: gemm(x, w, b, activation=act, keep=keep), None, both),
                ("FusedLinear", lambda: layer(x), None, both)]
    if fused_bwd:
        variants += [("fuselab, fused bwd", lambda: gemm(x, w, b, activation=act, keep=keep),
                      GemmTuning(backward="fused"), ("fwd+bwd",)),
                     ("fuselab 128x256x64/8w3s", lambda: gemm(x, w, b, activation=act, keep=keep),
                      GemmTuning(force=TileConfig(128, 256, 64, 8, 3)), fwd)]
    variants += [(f"fuselab {label}", lambda: gemm(x, w, b, activation=act, keep=keep), GemmTuning(force=cfg), fwd)
                 for label, cfg in TILES.get((k, n), {}).items()]
    _run_variants(bench, f"{m}x{k}x{n}-{act}", variants, (x, w, b), g, 2 * m * n * k, rate, rows)


def time_dcn(device, bench, smoke: bool, rows: list, rate: float) -> None:
    m, n, r = (128, 48, 8) if smoke else (65536, 3456, 512)
    x0, xl = torch.randn(m, n, device=device).to(DT), torch.randn(m, n, device=device).to(DT).requires_grad_()
    u = (torch.randn(n, r, device=device) / r**0.5).to(DT).requires_grad_()
    v = (torch.randn(r, n, device=device) / n**0.5).to(DT).requires_grad_()
    b = torch.randn(n, device=device).to(DT).requires_grad_()
    g = torch.randn(m, n, device=device).to(DT)
    both = ("fwd", "fwd+bwd")
    variants = [("cublas", lambda: x0 * F.linear(F.linear(xl, v), u, b) + xl, None, both),
                ("fuselab", lambda: dcn_cross(x0, xl, u, b, weight_v=v), None, both),
                ("fuselab, fused bwd", lambda: dcn_cross(x0, xl, u, b, weight_v=v), FUSED, ("fwd+bwd",))]
    _run_variants(bench, f"dcn-{m}x{n}-r{r}", variants, (xl, u, v, b), g, 4 * m * n * r, rate, rows)


def time_qkv(device, bench, smoke: bool, rows: list, rate: float) -> None:
    batch, seq, hidden, hq, hkv, d = (2, 16, 64, 4, 2, 16) if smoke else (4, 2048, 4096, 32, 8, 128)
    x = torch.randn(batch, seq, hidden, device=device).to(DT).requires_grad_()
    n = (hq + 2 * hkv) * d
    w = (torch.randn(n, hidden, device=device) / hidden**0.5).to(DT).requires_grad_()
    angles = torch.arange(seq, device=device, dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    cos, sin = angles.cos().float(), angles.sin().float()
    grads = tuple(torch.randn(batch, seq, h, d, device=device).to(DT) for h in (hq, hkv, hkv))

    def split(y):
        return y.view(batch, seq, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=-2)

    def gemm_rope():
        q, k, v = split(F.linear(x, w))
        q, k = apply_rope(q, k, cos, sin)
        return q, k, v

    def fused():
        return qkv_rope(x, w, num_heads=hq, num_kv_heads=hkv, cos=cos, sin=sin)

    q0, k0, _ = (t.detach().contiguous() for t in split(F.linear(x, w)))
    both = ("fwd", "fwd+bwd")
    variants = [("cublas QKV GEMM alone", lambda: split(F.linear(x, w)), None, both),
                ("cublas + fuselab RoPE", gemm_rope, None, both), ("fuselab qkv_rope", fused, None, both),
                ("fuselab qkv_rope, fused fwd", fused, GemmTuning(qkv_forward="fused"), both),
                ("fuselab qkv_rope, all fused", fused, FUSED, ("fwd+bwd",)),
                ("fuselab RoPE alone", lambda: apply_rope(q0, k0, cos, sin), None, ("fwd",))]
    _run_variants(bench, f"qkv-{batch * seq}x{hidden}-{hq}/{hkv}x{d}", variants, (x, w), grads,
                  2 * batch * seq * n * hidden, rate, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU under the interpreter")
    ap.add_argument("--budget", type=float, default=140.0, help="seconds after which no new timing job starts")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--eager", action="store_true", help="time the steps as called, not replayed from a CUDA graph")
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu-smoke for the tiny CPU run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    import triton

    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    print(f"{name}; torch {torch.__version__}, triton {triton.__version__}")
    torch.manual_seed(0)
    checks = Checks()
    if not args.skip_checks:
        for check in (check_linear, check_dcn, check_qkv, check_determinism):
            check(device, smoke, checks)
    print(f"checks done in {time.perf_counter() - start:.0f} s", flush=True)
    bench = timer(device, eager=args.eager)
    rate = matmul_rate(device, bench)
    print(f"  bf16 matmul rate (8192^3, this run): {rate:.1f} TFLOP/s")
    rows: list[dict] = []
    shapes = [(256, 48, 32, "relu")] if smoke else [(65536, k, n, "relu") for k, n in DLRM]
    jobs = [lambda c=c: time_linear(device, bench, *c, (c[1], c[2]) in FUSED_BWD or smoke, rows, rate)
            for c in shapes]
    jobs += [lambda: time_qkv(device, bench, smoke, rows, rate), lambda: time_dcn(device, bench, smoke, rows, rate),
             lambda: time_linear(device, bench, *((64, 64, 64) if smoke else (8192, 8192, 8192)), "none", True,
                                 rows, rate)]
    skipped = 0
    for job in jobs:
        if time.perf_counter() - start > args.budget:
            skipped += 1
            continue
        job()
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed:.0f} s" + (f"; {skipped} shapes skipped (budget {args.budget:.0f} s)" if skipped else ""))
    failed = [c for c in checks.rows if not c["ok"]]
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / "gemm_sweep.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        timing = "host" if device.type == "cpu" else "eager" if args.eager else "cuda_graph"
        path.write_text(json.dumps({"device": name, "torch": torch.__version__, "triton": triton.__version__,
                                    "timing": timing, "matmul_tflops": rate, "checks": checks.rows, "timings": rows,
                                    "elapsed_s": elapsed, "skipped_shapes": skipped}, indent=1))
        print(f"wrote {path}")
    print(f"{len(checks.rows) - len(failed)} of {len(checks.rows)} checks passed")
    for c in failed:
        worst = {k: f"{v:.2e}" for k, v in c["errors"].items() if k in c["failed"]}
        print(f"FAILED CHECK {c['check']}: {worst} > limit {c['limit']:.0e}" + (f" [{c['note']}]" if c["note"] else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
