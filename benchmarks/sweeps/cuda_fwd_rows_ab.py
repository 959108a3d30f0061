"""The CUDA backend's bf16/fp16 forward: rows per thread (kFwdRows16 in bias_act.cu) vs the Triton kernel, on the GPU.

    python3 benchmarks/sweeps/cuda_fwd_rows_ab.py

Question (session 19): on the H200 the CUDA forward ran at 0.74-0.87 of copy bandwidth in bf16 (Triton 0.97-1.03) and
at 1.0 in fp32. Packing the bf16 conversions (one instruction per pair, widening by shifts) changed nothing
(``results/h200/probes/bias_act_fwd_flat_shipped.txt``), so conversions were not the limit. Prediction: latency.
With 4 rows of 8 bf16 per thread (94 registers, 2 blocks of 256 per SM) each warp computes 32 elements between two
batches of loads, twice fp32's 16, with 16 warps per SM to hide it; 2 rows (or 1) per thread fit more blocks per SM
and halve the compute between loads: bf16 should reach the fp32 figure.

Builds the extension once per rows value (``load_inline`` of the shipped sources with the constant replaced, in
parallel) and times relu and gelu_tanh forward at the lab's shapes against ``fuselab.bias_act`` (Triton),
alternating in rounds, after a dirty flush (the graph column is not valid for the CUDA rows: the calls bake in the
stream they were made on, so the capture records nothing).

Measured (H200, ``results/h200/probes/cuda_fwd_rows_ab.txt``; the source then shipped 2 rows): 1 row 0.88-1.02 of copy
bandwidth, level with Triton (0.89-1.01); 2 rows 0.73-0.88; 4 rows 0.68-0.88. Shipped: 1 row for 16-bit types.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import torch
from _timing import ab_header, alternate, copy_gbps, spread  # benchmarks/sweeps/_timing.py
from torch.utils.cpp_extension import load_inline

import fuselab
from fuselab.cuda import _bias_act, _build
from fuselab.ops._bias_act_triton import ACT_IDS

ROWS = (1, 2, 4)
SHAPES = ((65536, 512), (16384, 4096), (262144, 1024))
ROUNDS = 3
ALPHA = 0.5
SHIPPED = "constexpr int kFwdRows32 = 4, kFwdRows16 = 1;"


def build(rows: int):
    sources = _build._sources("fuselab_bias_act")
    assert SHIPPED in sources[0], "bias_act.cu no longer defines the rows as this probe expects"
    sources[0] = sources[0].replace(SHIPPED, f"constexpr int kFwdRows32 = 4, kFwdRows16 = {rows};")
    return load_inline(name=f"fuselab_bias_act_rows{rows}", cpp_sources=_bias_act._DECLARATIONS, cuda_sources=sources,
                       functions=["bias_act_forward"], extra_cuda_cflags=["-O3", "-lineinfo", "--ftz=true"])


def main() -> None:
    with ThreadPoolExecutor(len(ROWS)) as pool:
        exts = dict(zip(ROWS, pool.map(build, ROWS), strict=True))
    copy = copy_gbps()
    ab_header(copy, ROUNDS)
    for m, n in SHAPES:
        for activation in ("relu", "gelu_tanh"):
            x, r = (torch.randn(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
            stream = torch.cuda.current_stream().cuda_stream
            calls = {"triton": functools.partial(fuselab.bias_act, x, b, residual=r, alpha=ALPHA,
                                                 activation=activation)}
            for rows, ext in exts.items():
                calls[f"cuda, {rows} rows"] = functools.partial(ext.bias_act_forward, x, b, r, ALPHA,
                                                                ACT_IDS[activation], False, None, stream)
            want = calls["triton"]()
            for name, fn in calls.items():
                out = fn()
                got = out[0] if isinstance(out, (list, tuple)) else out
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2, msg=lambda msg, name=name: f"{name}: {msg}")
            nbytes = (3 * m * n + n) * 2

            def fraction(ms: float, nbytes=nbytes) -> float:
                return nbytes / (ms * 1e-3) / 1e9 / copy

            out = alternate({name: (fn, fraction) for name, fn in calls.items()}, ROUNDS)
            print(f"\n{m}x{n} bfloat16 {activation}", flush=True)
            for name, (dirty, graph) in out.items():
                print(f"  {spread(dirty, graph)}  {name}", flush=True)


if __name__ == "__main__":
    main()
