"""Compile every launch of the GEMM family offline for sm_90, without a GPU: the ops run on CPU tensors at the GPU
shapes of ``gemm_sweep.py`` with the launcher intercepted (nothing executes), and each distinct launch signature is
compiled with the installed Triton for ``GPUTarget("cuda", 90, 32)`` as the JIT would specialize it (pointers
16-byte aligned, ints equal to 1 constant, ints divisible by 16 marked so). Prints per launch: wgmma
(``warp_group_dot`` in the TTGIR), software pipelining (async copies or TMA stages), TMA (``cp.async.bulk.tensor``),
shared memory, and registers / spill stores from ``ptxas -v``; fails when a plan needs more than 227 KiB of shared
memory or does not compile.

    python benchmarks/gpu_checks/gemm_compile.py [dlrm] [variants] [dcn] [qkv] [cast]   # all sets by default

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
import fuselab.ops.gemm.launch as launch
import fuselab.ops.gemm.op as linear_op
import fuselab.ops.gemm.qkv as qkv_op
from fuselab.ops.gemm import LoRA, cast_update_, dcn_cross, gemm, qkv_rope
from fuselab.ops.gemm.spec import GemmSpec, GemmTuning, TileConfig
from fuselab.ops.tuning import override

SMEM_LIMIT = 227 * 1024
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
         torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64"}
LABEL = ("BP", "BQ", "BR", "SPLIT", "A_DESC", "B_DESC", "PRO_ACT", "PRO_MASK", "PRO_X0", "PRO_ROPE", "N_ALONG_P",
         "ROW_SUM", "WRITE_A", "LORA", "HAS_RES", "EPI_X0", "EPI_ROPE", "KEEP", "ACT", "ADAGRAD", "LR_TENSOR")
RECORDS: dict = {}


def _pretend_gpu() -> None:
    """The ops take the Triton path on CPU tensors and plan as on a 132-SM Hopper; launches are recorded."""
    for module in (linear_op, dcn_op, qkv_op, cast_op):
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


def _linear(m, k, n, act="relu", keep="mask", tuning=None, x_grad=True, lora=None, dtype=torch.bfloat16) -> None:
    x = torch.empty(m, k, dtype=dtype).requires_grad_(x_grad)
    w = torch.empty(n, k, dtype=dtype).requires_grad_()
    b = torch.empty(n, dtype=dtype).requires_grad_()
    with override(tuning or GemmTuning()):
        y = gemm(x, w, b, activation=act, keep=keep if act == "relu" else "auto", lora=lora)
        y.backward(torch.empty_like(y))


def run_ops(sets: set[str]) -> None:
    bf = torch.bfloat16
    if "dlrm" in sets:
        for k, n in ((13, 512), (512, 256), (256, 128), (479, 1024), (1024, 1024), (1024, 512), (256, 1),
                     (367, 512), (3456, 1024), (64, 16)):
            _linear(65536, k, n, x_grad=k != 13)
    if "variants" in sets:
        _linear(65536, 512, 256, keep="output")
        _linear(65536, 512, 256, act="gelu_tanh")
        for cfg in (TileConfig(128, 128, 64, 8, 3), TileConfig(128, 256, 64, 8, 3), TileConfig(128, 64, 64, 4, 4)):
            _linear(65536, 512, 256, tuning=GemmTuning(force=cfg))
            _linear(8192, 8192, 8192, act="none", tuning=GemmTuning(force=cfg))
        _linear(65536, 512, 256, tuning=GemmTuning(tma=False))
        _linear(65536, 512, 256, tuning=GemmTuning(materialize_dz=True))
        _linear(8192, 8192, 8192, act="none")
        _linear(8192, 4096, 4096, act="gelu_tanh")
        _linear(4096, 1024, 512, dtype=torch.float32)
        lora = LoRA(torch.empty(16, 4096, dtype=bf, requires_grad=True),
                    torch.empty(4096, 16, dtype=bf, requires_grad=True), 2.0)
        _linear(8192, 4096, 4096, act="none", lora=lora)
    if "dcn" in sets:
        m, n, r = 65536, 3456, 512
        x0, xl = torch.empty(m, n, dtype=bf), torch.empty(m, n, dtype=bf, requires_grad=True)
        w, b, v = (torch.empty(s, dtype=bf, requires_grad=True) for s in ((n, r), (n,), (r, n)))
        y = dcn_cross(x0, xl, w, b, weight_v=v)
        y.backward(torch.empty_like(y))
    if "qkv" in sets:
        x = torch.empty(4, 2048, 4096, dtype=bf, requires_grad=True)
        w = torch.empty(6144, 4096, dtype=bf, requires_grad=True)
        cos, sin = torch.rand(2048, 64), torch.rand(2048, 64)
        for kw in (dict(cos=cos, sin=sin), dict(interleaved=True), dict(cos=cos[:, :32], sin=sin[:, :32])):
            outs = qkv_rope(x, w, num_heads=32, num_kv_heads=8, **kw)
            torch.autograd.backward(outs, [torch.zeros_like(t) for t in outs])
        xt = torch.empty(4096, 4096, dtype=bf, requires_grad=True)
        cu = torch.tensor([0, 1000, 4096], dtype=torch.int32)
        outs = qkv_rope(xt, w, num_heads=32, num_kv_heads=8, layout="thd", cu_seqlens=cu, max_seqlen=3096)
        torch.autograd.backward(outs, [torch.zeros_like(t) for t in outs])
    if "cast" in sets:
        n = 1 << 20
        master = torch.zeros(n)
        cast_update_(master, torch.zeros(n, dtype=bf), torch.empty(n, dtype=bf), lr=0.1)
        cast_update_(master, torch.zeros(n, dtype=bf), torch.empty(n, dtype=bf), lr=torch.tensor(0.1),
                     optimizer="adagrad", state=torch.zeros(n))


def main() -> int:
    sets = set(sys.argv[1:]) or {"dlrm", "variants", "dcn", "qkv", "cast"}
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
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(k.asm["ptx"])
            out = subprocess.run([str(ptxas), "-v", "--gpu-name=sm_90a", str(ptx), "-o", "/dev/null"],
                                 capture_output=True, text=True).stderr
            regs = re.findall(r"Used (\d+) registers", out)
            spills = re.findall(r"(\d+) bytes spill stores", out)
            ttgir = k.asm["ttgir"]
            piped = "async_copy_global_to_local" in ttgir or "async_tma_copy" in ttgir
            over = k.metadata.shared > SMEM_LIMIT
            failures += over
            print(f"{'SMEM OVER 227 KiB ' if over else ''}{kernel.__name__} wgmma={'warp_group_dot' in ttgir} "
                  f"pipelined={piped} tma={'cp.async.bulk.tensor' in k.asm['ptx']} smem={k.metadata.shared} "
                  f"regs={regs[0] if regs else '?'} spill={spills[0] if spills else '?'} | {label}", flush=True)
    print(f"{failures} failures of {len(RECORDS)} in {time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
