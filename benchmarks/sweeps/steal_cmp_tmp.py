"""Prototype vs production stealing kernels, same case (all of 8192² bf16), registers and times."""
import statistics, sys

import torch, triton
import _timing as timing
import reduce_steal_proto as proto
import fuselab
from fuselab.ops import _reduce_plan as P, _reduce_triton as K, _launch

copy = timing.copy_gbps()
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
nbytes = x.numel() * 2
def regs_of(kernel):
    return [getattr(c, "n_regs", None) for c in kernel.device_caches[0][0].values()] if hasattr(kernel, "device_caches") else None

variants = {}
for cap in (64, 40):
    run = proto.steal(x, 65536, 3)
    n = x.numel(); chunk = 32768; nch = n // chunk
    def mk(cap=cap, run=run):
        parts = torch.empty(nch, dtype=torch.float32, device="cuda"); out = torch.empty(1, dtype=torch.float32, device="cuda")
        from fuselab.ops._tickets import ticket_counters
        c = ticket_counters(x.device, 2)
        grid = (3 * 132,)
        def f():
            proto._steal_kernel[grid](x.view(-1), out, parts, c[0:1], c[1:2], n, nch, 1.0 / n, CHUNK=chunk, BLOCK=4096,
                                      FINAL=2048, EVICT="evict_first", num_warps=16, maxnreg=cap)
            return out
        return f
    variants[f"prototype maxnreg {cap}"] = mk()
from reduce_split_probe import _variant
dims = (0, 1)
_, prod = _variant(x, dims, STEAL={"rows": "split", "cols": None})
variants["production (cap 40)"] = prod
orig = K.steal_maxnreg
def prod64():
    K.steal_maxnreg = lambda plan, sms: 64
    try:
        return prod()
    finally:
        K.steal_maxnreg = orig
variants["production, cap 64"] = prod64
_, static = _variant(x, dims, STEAL={"rows": None, "cols": None})
variants["static"] = static
ref = x.double().mean().item()
for name, f in variants.items():
    got = f().double().item()
    print(name, "err", abs(got - ref))
# restore steal for production variants: plans are cached per call key in reduce._PLANNED
print("compiled entries:")
for key, (compiled, tail, dev) in _launch._COMPILED.items():
    print("  ", compiled.name if hasattr(compiled, "name") else "?", "regs", getattr(compiled, "n_regs", None), "spills", getattr(compiled, "n_spills", None))
print("proto cache:")
for c in proto._steal_kernel.device_caches[0][0].values():
    print("  regs", c.n_regs, "spills", c.n_spills)
res = {n: [] for n in variants}
for _ in range(3):
    for name, f in variants.items():
        res[name].append(nbytes / timing.events_ms(f, timing.dirty_flush) / 1e6 / copy)
for name, v in res.items():
    print(f"{statistics.median(v):.3f}  {name}")
import os
out = os.environ.get("OUT", "/tmp")
for i, (key, (compiled, tail, dev)) in enumerate(_launch._COMPILED.items()):
    open(f"{out}/prod{i}_{compiled.n_regs}.ptx", "w").write(compiled.asm["ptx"])
    open(f"{out}/prod{i}_{compiled.n_regs}.cubin", "wb").write(compiled.asm["cubin"])
for i, c in enumerate(proto._steal_kernel.device_caches[0][0].values()):
    open(f"{out}/proto{i}_{c.n_regs}.ptx", "w").write(c.asm["ptx"])
    open(f"{out}/proto{i}_{c.n_regs}.cubin", "wb").write(c.asm["cubin"])
