"""Compile every launch of the GEMM family offline for sm_90, without a GPU: the ops run on CPU tensors at the GPU
shapes of ``gemm_sweep.py`` and of the GPU tests with the launcher intercepted (nothing executes; the cuBLAS products
of the default plans are shape-only stand-ins), under both plans (``GemmTuning()`` and ``backward="fused",
qkv_forward="fused"``), and each distinct launch signature is compiled with the installed Triton for
``GPUTarget("cuda", 90, 32)`` as the JIT would specialize it (pointers 16-byte aligned, ints equal to 1 constant,
ints divisible by 16 marked so). Prints per launch: wgmma (``warp_group_dot`` in the TTGIR), software pipelining
(async copies or TMA stages), TMA (``cp.async.bulk.tensor``), shared memory, registers / spill stores from
``ptxas -v``, and the two pipelining hazards of Triton 3.6 it can see in the TTGIR: an asynchronous wgmma whose A
operand is in registers left pending across steps (triton-lang/triton#9433: the next step overwrites them), and a
pipelined tile with no more buffers than loads in flight while an asynchronous wgmma still reads it. Fails when a
launch does not compile, needs more than 227 KiB of shared memory or shows a hazard.

    python benchmarks/gpu_checks/gemm_compile.py [dlrm] [variants] [dcn] [qkv] [tests] [cast]   # all by default

Needs a Triton with the NVIDIA backend (its bundled ptxas) and torch (CPU is enough); ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import fuselab.ops.gemm.cast as cast_op
import fuselab.ops.gemm.dcn as dcn_op
import fuselab.ops.gemm.dcn_net as dcn_net_op
import fuselab.ops.gemm.launch as launch
import fuselab.ops.gemm.op as linear_op
import fuselab.ops.gemm.qkv as qkv_op
import fuselab.ops.gemm.steps as steps
from fuselab.ops.gemm import LoRA, cast_update_, dcn_cross, dcn_cross_net, gemm, qkv_rope
from fuselab.ops.gemm.spec import GemmSpec, GemmTuning, TileConfig
from fuselab.ops.tuning import override

SMEM_LIMIT = 227 * 1024
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
         torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
LABEL = ("BP", "BQ", "BR", "SPLIT", "A_DESC", "B_DESC", "PRO_ACT", "PRO_MASK", "PRO_X0", "PRO_ROPE", "N_ALONG_P",
         "ROW_SUM", "WRITE_A", "LORA", "HAS_RES", "EPI_X0", "EPI_ROPE", "KEEP", "ACT", "ADAGRAD", "LR_TENSOR",
         "SYNC_DOT", "BM", "BN", "ROPE", "CONJ", "COL_SUM", "WRITE", "DX0_OUT", "DX0_ACC", "DX0_PLUS_A", "COPY_OUT")
#: both plans of the ops
PLANS = (GemmTuning(), GemmTuning(backward="fused", qkv_forward="fused"))
RECORDS: dict = {}


def _pretend_gpu() -> None:
    """The ops take the Triton path on CPU tensors and plan as on a 132-SM Hopper; launches are recorded."""
    for module in (linear_op, dcn_op, dcn_net_op, qkv_op, cast_op):
        module.use_triton = lambda device: True
    linear_op.triton_for = lambda t: True
    launch.tma_capable = lambda device: True
    launch.sm_count = lambda device: 132
    dot_types = launch._dot_types
    launch._dot_types = lambda spec: dot_types(GemmSpec(**{**spec.__dict__, "device": torch.device("cuda")}))

    def record(kernel, key, grid, tensors, scalars, constexprs, dynamic=0):
        cx = constexprs() if callable(constexprs) else constexprs
        args = tuple((t.dtype, t.data_ptr() % 16 == 0) if isinstance(t, torch.Tensor) else
                     ("desc", t.base.dtype, tuple(t.block_shape)) for t in tensors)
        ints = tuple(("f",) if isinstance(a, float) else (a == 1 and i >= dynamic, a % 16 == 0 and i >= dynamic)
                     for i, a in enumerate(scalars))
        RECORDS.setdefault((kernel.__name__, args, ints, tuple(cx.items())), (kernel, tensors, scalars, cx, dynamic))

    launch.launch_kernel = record
    steps.torch = _ShapesOnly()


class _ShapesOnly:
    """``torch`` for the launch sequences, but ``mm`` / ``addmm`` (cuBLAS's products) give uninitialized results of
    the right shape: nothing is computed on CPU at GPU shapes."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def mm(a, b, *, out=None):
        return a.new_empty((a.shape[0], b.shape[1])) if out is None else out

    @staticmethod
    def addmm(c, a, b, *, out=None):
        return a.new_empty((a.shape[0], b.shape[1])) if out is None else out


def hazards(ttgir: str) -> list[str]:
    """The Triton 3.6 pipelining hazards visible in a TTGIR (see the module doc)."""
    lines = ttgir.splitlines()
    allocs, view_of, found = {}, {}, []
    for i, ln in enumerate(lines):
        m = re.search(r"(%[\w]+) = ttg.local_alloc : \(\) -> !ttg.memdesc<(\d+)x([\dx]+)x(\w+),", ln)
        if m:
            allocs[m.group(1)] = (int(m.group(2)), m.group(4), i)
        m = re.search(r"(%[\w]+) = ttg\.(?:memdesc_index|memdesc_trans|memdesc_subslice|memdesc_reinterpret) "
                      r"(%[\w]+)\b", ln)
        if m:
            view_of[m.group(1)] = m.group(2) if m.group(2) in allocs else view_of.get(m.group(2))
    dots = [i for i, ln in enumerate(lines) if "warp_group_dot " in ln and "isAsync = true" in ln]
    if not dots:
        return found
    loop = max(i for i, ln in enumerate(lines[:dots[0]]) if "scf.for" in ln)
    indent = len(lines[loop]) - len(lines[loop].lstrip())
    end = next(i for i in range(loop + 1, len(lines)) if lines[i].startswith(" " * indent + "}"))
    in_loop = [i for i in dots if i < end]
    pendings = set(re.findall(r"pendings = (\d+)", "\n".join(lines[loop:end])))
    if any(re.search(r"isAsync = true\} : tensor<[^*]*dot_op", lines[i]) for i in in_loop) and pendings - {"0"}:
        found.append("async register-operand wgmma left pending")
    operands = [re.search(r"warp_group_dot (%[\w]+), (%[\w]+),", lines[i]).groups() for i in dots]
    readers = {view_of.get(v) for pair in operands for v in pair}
    for name, (buffers, dtype, line) in allocs.items():
        if buffers < 2 or dtype == "i64" or line > loop or name not in readers:
            continue
        issued = sum(1 for ln in lines[line:loop]
                     if (m := re.search(r"async_tma_copy_global_to_local %\w+\[[^\]]*\] (%[\w]+),", ln)
                         or re.search(r"async_copy_global_to_local %[\w]+, (%[\w]+)", ln))
                     and view_of.get(m.group(1)) == name)
        if issued >= buffers:
            found.append(f"{buffers} buffers for {issued} loads in flight read by an async wgmma")
    return found


def _signature(kernel, tensors, scalars, cx, dynamic) -> ASTSource:
    names = kernel.arg_names
    sig, attrs, consts = {}, {}, {}
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            sig[names[i]] = "*" + TYPES[t.dtype]
            if t.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[names[i]] = f"tensordesc<{TYPES[t.base.dtype]}{list(t.block_shape)}>"
    for j, a in enumerate(scalars, start=len(tensors)):
        if isinstance(a, float):
            sig[names[j]] = "fp32"
        elif a == 1 and j - len(tensors) >= dynamic:
            sig[names[j]], consts[(j,)] = "constexpr", 1
        else:
            sig[names[j]] = "i32" if -(2**31) <= a < 2**31 else "i64"
            if a % 16 == 0 and j - len(tensors) >= dynamic:
                attrs[(j,)] = [["tt.divisibility", 16]]
    for name, value in cx.items():
        if name in names:
            sig[name], consts[(names.index(name),)] = "constexpr", value
    return ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)


def _linear(m, k, n, act="relu", keep="mask", tuning=None, x_grad=True, lora=None, dtype=torch.bfloat16,
            residual=False) -> None:
    x = torch.empty(m, k, dtype=dtype).requires_grad_(x_grad)
    w = torch.empty(n, k, dtype=dtype).requires_grad_()
    b = torch.empty(n, dtype=dtype).requires_grad_()
    r = torch.empty(m, n, dtype=dtype).requires_grad_() if residual else None
    for plan in (tuning,) if tuning is not None else PLANS:
        with override(plan):
            y = gemm(x, w, b, residual=r, activation=act, keep=keep if act == "relu" else "auto", lora=lora)
            y.backward(torch.empty_like(y))


def _dcn(m, n, r, dtype=torch.bfloat16) -> None:
    x0, xl = (torch.empty(m, n, dtype=dtype, requires_grad=True) for _ in range(2))
    w, b, v = (torch.empty(s, dtype=dtype, requires_grad=True) for s in ((n, r), (n,), (r, n)))
    for plan in PLANS:
        with override(plan):
            y = dcn_cross(x0, xl, w, b, weight_v=v)
            y.backward(torch.empty_like(y))
            y = dcn_cross(x0, xl, torch.empty(n, n, dtype=dtype, requires_grad=True), b)
            y.backward(torch.empty_like(y))
            net = (torch.empty(3, *s, dtype=dtype, requires_grad=True) for s in ((n, r), (n,), (r, n)))
            y = dcn_cross_net(x0, *net)
            y.backward(torch.empty_like(y))


def _qkv(x, w, bias=None, **kw) -> None:
    for plan in PLANS:
        with override(plan):
            outs = qkv_rope(x, w, bias, **kw)
            torch.autograd.backward(outs, [torch.zeros_like(t) for t in outs])


def run_ops(sets: set[str]) -> None:
    bf = torch.bfloat16
    if "dlrm" in sets:
        for k, n in ((13, 512), (512, 256), (256, 128), (479, 1024), (1024, 1024), (1024, 512), (256, 1),
                     (367, 512), (3456, 1024), (64, 16)):
            _linear(65536, k, n, x_grad=k != 13)
    if "variants" in sets:
        _linear(65536, 512, 256, keep="output")
        _linear(65536, 512, 256, act="gelu_tanh")
        _linear(8192, 1024, 512, keep="output")
        for cfg in (TileConfig(128, 128, 64, 8, 3), TileConfig(128, 256, 64, 8, 3), TileConfig(128, 64, 64, 4, 4)):
            _linear(65536, 512, 256, tuning=GemmTuning(force=cfg, backward="fused"))
            _linear(8192, 8192, 8192, act="none", tuning=GemmTuning(force=cfg, backward="fused"))
        _linear(65536, 512, 256, tuning=GemmTuning(tma=False, backward="fused"))
        _linear(65536, 512, 256, tuning=GemmTuning(materialize_dz=True, backward="fused"))
        _linear(8192, 8192, 8192, act="none")
        _linear(8192, 4096, 4096, act="gelu_tanh")
        _linear(4096, 1024, 512, dtype=torch.float32)
        for rank, act in ((16, "none"), (16, "relu")):
            lora = LoRA(torch.empty(rank, 4096, dtype=bf, requires_grad=True),
                        torch.empty(4096, rank, dtype=bf, requires_grad=True), 2.0)
            _linear(8192, 4096, 4096, act=act, keep="output", lora=lora)
    if "dcn" in sets:
        _dcn(65536, 3456, 512)
        _dcn(8192, 512, 256)
    if "qkv" in sets:
        x = torch.empty(4, 2048, 4096, dtype=bf, requires_grad=True)
        w = torch.empty(6144, 4096, dtype=bf, requires_grad=True)
        cos, sin = torch.rand(2048, 64), torch.rand(2048, 64)
        for kw in (dict(cos=cos, sin=sin), dict(interleaved=True), dict(cos=cos[:, :32], sin=sin[:, :32])):
            _qkv(x, w, num_heads=32, num_kv_heads=8, **kw)
        xt = torch.empty(4096, 4096, dtype=bf, requires_grad=True)
        cu = torch.tensor([0, 1000, 4096], dtype=torch.int32)
        _qkv(xt, w, torch.empty(6144, dtype=bf, requires_grad=True), num_heads=32, num_kv_heads=8, layout="thd",
             cu_seqlens=cu, max_seqlen=3096)
        xs = torch.empty(2, 512, 1024, dtype=bf, requires_grad=True)
        ws = torch.empty(24 * 64, 1024, dtype=bf, requires_grad=True)
        _qkv(xs, ws, num_heads=16, num_kv_heads=4, interleaved=True)
        _qkv(xs, ws, num_heads=16, num_kv_heads=4, cos=cos[:512, :32], sin=sin[:512, :32])
    if "tests" in sets:  # shapes of tests/ops/test_gemm*.py that reach kernels the sets above do not
        for dtype in (torch.float32, torch.float16):
            for act in ("relu", "gelu_tanh", "none"):
                _linear(21, 35, 19, act=act, dtype=dtype, residual=act == "none")
        for act in ("relu", "silu", "gelu_tanh", "none", "sigmoid"):
            _linear(37, 29, 45, act=act, keep="auto", residual=True)
        _linear(5, 7, 6, act="silu", dtype=torch.float64, residual=True)
        _linear(200, 24, 20, dtype=torch.float32, tuning=GemmTuning(programs_per_sm=64, min_split_steps=1,
                weight_grad=TileConfig(32, 32, 16, 4, 2), backward="fused"))
        lora = LoRA(torch.empty(4, 40, dtype=bf, requires_grad=True), torch.empty(24, 4, dtype=bf, requires_grad=True),
                    0.5)
        _linear(19, 40, 24, lora=lora)
        _linear(64, 48, 40, act="none", lora=LoRA(torch.empty(4, 48, dtype=bf, requires_grad=True),
                                                   torch.empty(40, 4, dtype=bf, requires_grad=True), 2.0))
        _dcn(37, 24, 8)
        _dcn(37, 24, 8, dtype=torch.float32)
    if "cast" in sets:
        n = 1 << 20
        master = torch.zeros(n)
        cast_update_(master, torch.zeros(n, dtype=bf), torch.empty(n, dtype=bf), lr=0.1)
        cast_update_(master, torch.zeros(n, dtype=bf), torch.empty(n, dtype=bf), lr=torch.tensor(0.1),
                     optimizer="adagrad", state=torch.zeros(n))


def _report(k, kernel, label: str, ptxas: Path, tmp: str) -> int:
    """Print one compiled launch's line; returns its failures (shared memory over the limit, hazards)."""
    ptx = Path(tmp) / "k.ptx"
    ptx.write_text(k.asm["ptx"])
    out = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx), "-o", "/dev/null"],
                         capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", out)
    spills = re.findall(r"(\d+) bytes spill stores", out)
    ttgir = k.asm["ttgir"]
    piped = "async_copy_global_to_local" in ttgir or "async_tma_copy" in ttgir
    over = k.metadata.shared > SMEM_LIMIT
    found = hazards(ttgir)
    loads = re.findall(r"^\s*(?:@%p\d+ )?ld\.global[\w.]*", k.asm["ptx"], flags=re.M)
    widths = {w: sum(1 for ld in loads if (f".{w}." in ld) == (w != "v1") and (w != "v1" or not
                                                                              re.search(r"\.v[248]\.", ld)))
              for w in ("v4", "v2", "v1")}
    copies = re.findall(r"cp\.async\.c[ag]\.shared\.global(?:\.L2::\w+)? \[[^\]]+\], \[[^\]]+\], (\d+)", k.asm["ptx"])
    sizes = " ".join(f"{c}x{b}B" for b, c in sorted({b: copies.count(b) for b in copies}.items()))
    print(f"{'SMEM OVER 227 KiB ' if over else ''}{''.join(f'HAZARD ({h}) ' for h in found)}{kernel.__name__} "
          f"wgmma={'warp_group_dot' in ttgir} pipelined={piped} tma={'cp.async.bulk.tensor' in k.asm['ptx']} "
          f"smem={k.metadata.shared} regs={regs[0] if regs else '?'} spill={spills[0] if spills else '?'} "
          f"ld.global v4/v2/scalar={widths['v4']}/{widths['v2']}/{widths['v1']} cp.async {sizes or '-'} | {label}",
          flush=True)
    return int(over) + len(found)


def main() -> int:
    sets = set(sys.argv[1:]) or {"dlrm", "variants", "dcn", "qkv", "tests", "cast"}
    _pretend_gpu()
    start = time.perf_counter()
    run_ops(sets)
    print(f"triton {triton.__version__}: {len(RECORDS)} distinct launch signatures", flush=True)
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for kernel, tensors, scalars, cx, dynamic in RECORDS.values():
            label = " ".join(f"{n}={v}" for n, v in cx.items() if n in LABEL and v not in (False, 0))
            try:
                k = triton.compile(_signature(kernel, tensors, scalars, cx, dynamic), target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": cx.get("num_warps", 4), "num_stages": cx.get("num_stages", 3)})
            except Exception as e:  # a plan that does not compile: reported, counted
                failures += 1
                print(f"FAIL {kernel.__name__} | {label}\n   {str(e).strip().splitlines()[-1][:200]}", flush=True)
                continue
            failures += _report(k, kernel, label, ptxas, tmp)
    print(f"{failures} failures of {len(RECORDS)} in {time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
