"""tmp: bisect prototype vs production stealing: kernel vs launch path (all of 8192² bf16)."""
import statistics

import _timing as timing
import reduce_steal_proto as proto
import torch
import triton.language as tl
from reduce_split_probe import _variant

from fuselab.ops import _launch
from fuselab.ops import _reduce_triton as K
from fuselab.ops._tickets import ticket_counters

copy = timing.copy_gbps()
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
n = x.numel()
nbytes = n * 2
chunk, nch = 32768, n // 32768
grid = (396,)
c = ticket_counters(x.device, 2)
parts = torch.empty(nch, dtype=torch.float32, device="cuda")
out32 = torch.empty(1, dtype=torch.float32, device="cuda")
out16 = torch.empty(1, dtype=torch.bfloat16, device="cuda")
pc = dict(CHUNK=chunk, BLOCK=4096, FINAL=2048, EVICT="evict_first", num_warps=16, maxnreg=40)
rc = dict(ROWS=1, BLOCK_R=4096, HAS_I=False, R_CONTIG=True, SPLIT_R=True, HAS_TAIL=False, ACC=tl.float32, BLOCK_S=2048,
          IS_MEAN=True, OUT_BF16=True, INT64=False, EVICT="evict_first", INTERLEAVE=False, STEAL=True, num_warps=16,
          maxnreg=40)
rargs = (1, 1, n, 0, 0, 1, chunk, n, 1, nch)
variants = {
    "proto, JIT launch": lambda: proto._steal_kernel[grid](x, out32, parts, c[0:1], c[1:2], n, nch, 1.0 / n, **pc),
    "proto, fast launch": lambda: _launch.launch(proto._steal_kernel, "p", grid, (x, out32, parts, c[0:1], c[1:2]),
                                                 (n, nch, 1.0 / n), pc),
    "production kernel, JIT launch": lambda: K._rows_kernel[(396, 1)](x, out16, parts, c, *rargs, **rc),
    "production kernel, fast launch": lambda: _launch.launch(K._rows_kernel, "r", (396, 1), (x, out16, parts, c), rargs,
                                                             rc),
}
rc64 = {**rc, "INT64": True}
variants["production kernel, INT64"] = lambda: K._rows_kernel[(396, 1)](x, out16, parts, c, *rargs, **rc64)
variants["production kernel, maxnreg 64, 2/SM"] = lambda: K._rows_kernel[(264, 1)](x, out16, parts, c, *rargs,
                                                                                    **{**rc, "maxnreg": 64})
variants["production kernel, INT64, maxnreg 64, 2/SM"] = lambda: K._rows_kernel[(264, 1)](
    x, out16, parts, c, *rargs, **{**rc64, "maxnreg": 64})
variants["proto, maxnreg 64, 2/SM"] = lambda: proto._steal_kernel[(264,)](x, out32, parts, c[0:1], c[1:2], n, nch,
                                                                          1.0 / n, **{**pc, "maxnreg": 64})
_, variants["fuselab.mean plan (steal)"] = _variant(x, (0, 1), STEAL={"rows": "split", "cols": None})
_, variants["static plan"] = _variant(x, (0, 1), STEAL={"rows": None, "cols": None})
ref = x.double().mean().item()
for name, f in variants.items():
    f()
    f()
    torch.cuda.synchronize()
    got = (out32 if "proto" in name else out16).double().item() if "plan" not in name else f().double().item()
    print(f"{name}: error {abs(got - ref):.2e}")
res = {name: ([], []) for name in variants}
for _ in range(4):
    for name, f in variants.items():
        res[name][0].append(nbytes / timing.events_ms(f, timing.dirty_flush) / 1e6 / copy)
        res[name][1].append(nbytes / timing.graph_ms(f) / 1e6 / copy)
for name, (d, g) in res.items():
    regs = None
    print(f"{statistics.median(d):.3f} [{min(d):.3f}-{max(d):.3f}] | {statistics.median(g):.3f}  {name}")
for kern in (proto._steal_kernel, K._rows_kernel):
    for cache in kern.device_caches.values():
        for key, ck in cache[0].items():
            print(kern.__name__ if hasattr(kern, "__name__") else kern.fn.__name__, "regs", ck.n_regs, "spills", ck.n_spills,
                  "maxnreg", ck.metadata.maxnreg, "INT64" in str(key) and str(key)[-200:])
