"""Where the GEMM family's fwd+bwd time goes at the DLRM shapes: per step, the eager device time (CUDA events), the
host time of submitting the loop, the replay time of one step captured in a CUDA graph, and the kernels of one step
(``ab_probe._measure``), for fuselab.gemm (relu, keep="mask") beside cuBLAS + torch.relu, the DCN cross layer, and
the QKV projection with RoPE. ``dcn``: the DCN cross layer's forward alone and its fwd+bwd under the planner's
variants (flatten, warp specialization, the ``large`` tile's shapes, stages and warps), to find where its epilogue
GEMM (K = 512, every tile a short main loop and a three-operand epilogue) loses to the plain product.
``python3 benchmarks/gpu_checks/gemm_probe.py [dcn [all]]``
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from ab_probe import _measure

import fuselab
from fuselab.ops.gemm import dcn_cross, gemm, qkv_rope
from fuselab.ops.gemm.spec import GemmTuning, TileConfig
from fuselab.ops.tuning import override

#: the DCN probe's planner variants
DCN_VARIANTS = {
    "default": GemmTuning(),
    "large 128x128x64 w8 s4": GemmTuning(large=TileConfig(128, 128, 64, 8, 4)),
    "2/SM 128x128x64 w4 s3": GemmTuning(programs_per_sm=2, large=TileConfig(128, 128, 64, 4, 3)),
    "2/SM 128x128x64 w4 s2": GemmTuning(programs_per_sm=2, large=TileConfig(128, 128, 64, 4, 2)),
    "2/SM 128x128x64 w8 s2": GemmTuning(programs_per_sm=2, large=TileConfig(128, 128, 64, 8, 2)),
    "2/SM 64x128x64 w4 s4": GemmTuning(programs_per_sm=2, large=TileConfig(64, 128, 64, 4, 4)),
    "3/SM 128x128x64 w4 s2": GemmTuning(programs_per_sm=3, large=TileConfig(128, 128, 64, 4, 2)),
    "3/SM 64x128x64 w4 s3": GemmTuning(programs_per_sm=3, large=TileConfig(64, 128, 64, 4, 3)),
    "flatten": GemmTuning(flatten=True),
    "warp_specialize": GemmTuning(warp_specialize=True),
    "large 128x128x64 w4 s3": GemmTuning(large=TileConfig(128, 128, 64, 4, 3)),
    "large 128x256x64 w8 s3": GemmTuning(large=TileConfig(128, 256, 64, 8, 3)),
    "large 256x128x64 w8 s3": GemmTuning(large=TileConfig(256, 128, 64, 8, 3)),
    "large 128x128x128 w8 s2": GemmTuning(large=TileConfig(128, 128, 128, 8, 2)),
}
#: the variants a ``dcn`` run times (the rest: ``dcn all``)
DCN_FIRST = 8

DT = torch.bfloat16


def _linear(m: int, k: int, n: int, fused: bool, dev: torch.device):
    x = torch.randn(m, k, device=dev, dtype=DT, requires_grad=True)
    w = (torch.randn(n, k, device=dev) / k**0.5).to(DT).requires_grad_()
    b = torch.randn(n, device=dev, dtype=DT, requires_grad=True)
    g = torch.randn(m, n, device=dev, dtype=DT)

    def step():
        y = gemm(x, w, b, activation="relu", keep="mask") if fused else torch.relu(F.linear(x, w, b))
        torch.autograd.backward(y, g)
    # fwd reads x, W, writes y; bwd reads g, x, W, y (or bits), writes dx, dW (dZ once more for the pass)
    return step, 2 * (3 * m * k + 3 * m * n), (x, w, b)


def _dcn(fused: bool, dev: torch.device, m: int = 65536, n: int = 3456, r: int = 512):
    x0 = torch.randn(m, n, device=dev, dtype=DT)
    xl = torch.randn(m, n, device=dev, dtype=DT, requires_grad=True)
    u = (torch.randn(n, r, device=dev) / r**0.5).to(DT).requires_grad_()
    v = (torch.randn(r, n, device=dev) / n**0.5).to(DT).requires_grad_()
    b = torch.randn(n, device=dev, dtype=DT, requires_grad=True)
    g = torch.randn(m, n, device=dev, dtype=DT)

    def step():
        y = dcn_cross(x0, xl, u, b, weight_v=v) if fused else x0 * F.linear(F.linear(xl, v), u, b) + xl
        torch.autograd.backward(y, g)
    return step, 2 * 8 * m * n, (xl, u, v, b)


def _qkv(fused: bool, dev: torch.device, batch: int = 4, seq: int = 2048, hidden: int = 4096, hq: int = 32,
         hkv: int = 8, d: int = 128):
    x = torch.randn(batch, seq, hidden, device=dev, dtype=DT, requires_grad=True)
    w = (torch.randn((hq + 2 * hkv) * d, hidden, device=dev) / hidden**0.5).to(DT).requires_grad_()
    angles = torch.arange(seq, device=dev, dtype=torch.float64)[:, None] / (
        10000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d))
    cos, sin = angles.cos().float(), angles.sin().float()
    grads = tuple(torch.randn(batch, seq, h, d, device=dev, dtype=DT) for h in (hq, hkv, hkv))

    def step():
        if fused:
            out = qkv_rope(x, w, num_heads=hq, num_kv_heads=hkv, cos=cos, sin=sin)
        else:
            q, k, v = F.linear(x, w).view(batch, seq, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=-2)
            out = (*fuselab.apply_rope(q, k, cos, sin), v)
        torch.autograd.backward(out, grads)
    tokens = batch * seq
    return step, 2 * 3 * tokens * (hidden + (hq + 2 * hkv) * d), (x, w)


def _dcn_variants(dev: torch.device) -> None:
    m, n, r = 65536, 3456, 512
    x0, xl = (torch.randn(m, n, device=dev, dtype=DT) for _ in range(2))
    u = (torch.randn(n, r, device=dev) / r**0.5).to(DT)
    v = (torch.randn(r, n, device=dev) / n**0.5).to(DT)
    b = torch.randn(n, device=dev, dtype=DT)
    names = list(DCN_VARIANTS) if "all" in sys.argv[1:] else list(DCN_VARIANTS)[:DCN_FIRST]
    for name in names:
        tuning = DCN_VARIANTS[name]
        try:
            with override(tuning):
                _measure(name, "dcn fwd", lambda: dcn_cross(x0, xl, u, b, weight_v=v), 4 * m * n * 2, ())
                _measure(name, "dcn fwd+bwd", *_dcn(True, dev))
        except Exception as error:  # the probe reports and goes on
            print(f"{name}: {type(error).__name__}: {error}"[:300])


def main() -> None:
    dev = torch.device("cuda")
    if "dcn" in sys.argv[1:]:
        _dcn_variants(dev)
        return
    for m, k, n in ((65536, 512, 256), (65536, 13, 512), (65536, 1024, 1024)):
        for fused in (False, True):
            _measure("fuselab" if fused else "cublas", f"linear {m}x{k}x{n}", *_linear(m, k, n, fused, dev))
    for fused in (False, True):
        _measure("fuselab" if fused else "cublas", "dcn 65536x3456 r512", *_dcn(fused, dev))
    for fused in (False, True):
        try:
            _measure("fuselab" if fused else "cublas+rope", "qkv 4x2048x4096 32/8x128", *_qkv(fused, dev))
        except Exception as error:  # the probe reports and goes on
            print(f"qkv fused={fused}: {type(error).__name__}: {error}"[:300])


if __name__ == "__main__":
    main()
