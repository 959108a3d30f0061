"""Host and device time per RoPE decode call, every provider side by side, on the GPU machine.

    python3 benchmarks/sweeps/decode_host.py

The issue's decode case: B=64, S=1, 32 q heads and 8 k heads of 128, bf16, fp32 tables of 4096 rows, one
offset per sequence (an int tensor on the GPU; fuselab also with a Python int). Per provider:

* host: wall time of back-to-back calls without synchronizing (the GPU never falls behind: ~2 µs of work per
  call), least of 5 means over 1000 calls: the host is shared, and noise only ever adds time;
* device: 10 calls captured in a CUDA graph, replay time / 10 after a clean L2 flush (no host in it).

Providers are the lab's own (``fuselab.bench.suites.rope``): eager HF formula and torch.compile of it (per-token
tables gathered once, outside the timed calls, as HF's rotary module does once per step), Liger (given those
tables), fuselab, plus an empty Triton launch of 4 arguments as the floor of any Triton op.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch
import triton
import triton.language as tl
from _timing import graph_ms, host_us  # benchmarks/sweeps/_timing.py

import fuselab
from fuselab.bench.suites import rope as suite


def device_us(fn) -> float:
    """Device µs per call: calls captured in a CUDA graph, replay time over their number (no host in it)."""
    return graph_ms(fn) * 1e3




@triton.jit
def _empty4(a, b, n, m, BLOCK: tl.constexpr):
    pass


def main() -> None:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), "?")
    print(f"{torch.cuda.get_device_name()}; cpu {cpu}; python {platform.python_version()}; torch {torch.__version__}; "
          f"triton {triton.__version__}")
    b, hq, hk, d, rows = 64, 32, 8, 128, 4096
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(rows, d, device="cuda")
    offsets = torch.randint(0, rows - 1, (b,), device="cuda", dtype=torch.int32)
    args = (q, k, cos, sin, "bshd", offsets, None, None)
    x = torch.empty(16, device="cuda")
    providers = {
        "empty Triton launch (4 args)": lambda: _empty4[(1,)](x, x, 16, 16, BLOCK=16),
        "eager (HF formula)": lambda: suite._hf_provider(suite.hf_formula)(*args),
        "torch.compile": (lambda fn: lambda: fn(*args))(suite._build_compiled(None)),
        "fuselab, tensor offsets": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets),
        "fuselab, int offset": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=1000),
        "fuselab in place, tensor offsets": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets,
                                                                       inplace=True),
    }
    try:
        liger = suite._build_liger(None)
        providers["liger (per-token tables given)"] = lambda: liger(*args)
    except ImportError as exc:
        print(f"liger: not installed ({exc})")
    # fuselab first, before torch.compile and Liger have run in this process, and again after them: the lab runs
    # every provider in one process, so whatever the others leave behind (launch hooks) would count there too
    order = ["empty Triton launch (4 args)", "fuselab, tensor offsets", "fuselab, int offset",
             "fuselab in place, tensor offsets"]
    order += [name for name in providers if name not in order] + order
    print(f"{'provider':36s} {'host us/call':>13s} {'device us/call':>15s}")
    for i, name in enumerate(order):
        fn = providers[name]
        host = host_us(fn, n=1000)
        try:
            dev = f"{device_us(fn):15.2f}"
        except Exception as exc:  # a provider that cannot be captured (host syncs) still gets its host time
            dev = f"{'n/a':>15s}  ({type(exc).__name__})"
        again = " (again)" if name in order[:i] else ""
        print(f"{name + again:36s} {host:13.1f} {dev}  launch hooks: {_hooks()}", flush=True)


def _hooks() -> str:
    """Triton's launch enter/exit hooks (a profiler's): with any, every launch builds its metadata first."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return "n/a"
    return ",".join(str(len(getattr(h, "calls", [h] if h else []))) for h in (runtime.launch_enter_hook,
                                                                              runtime.launch_exit_hook))


if __name__ == "__main__":
    main()
