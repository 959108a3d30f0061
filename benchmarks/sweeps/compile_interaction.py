"""Does running torch.compile in the same process change fuselab's reduction kernels? (GPU)

    python3 benchmarks/sweeps/compile_interaction.py

In the lab, ``mean`` over all of a 10000x10000 fp32 tensor took 161-166 µs when torch.compile's provider had run
before it, and 146-147 µs in a run without torch.compile. This times one fuselab kernel before torch.compile has
run, after it (same compiled kernel), and after recompiling it, and prints what Triton state Inductor changed.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton.testing import do_bench

import fuselab
from fuselab.ops import _launch, _reduce_triton

CASES = (((10000, 10000), torch.float32, None), ((8192, 8192), torch.bfloat16, None),
         ((65536, 512), torch.bfloat16, 0))


def us(fn) -> float:
    return do_bench(fn, return_mode="median") * 1e3


def knob_state() -> dict[str, str]:
    """Triton knobs and environment variables that could change code generation or launches."""
    state = {k: v for k, v in os.environ.items() if k.startswith(("TRITON", "TORCHINDUCTOR"))}
    knobs = getattr(triton, "knobs", None)
    for group in ("compilation", "runtime", "nvidia", "language"):
        obj = getattr(knobs, group, None)
        for name in dir(obj) if obj is not None else ():
            if not name.startswith("_"):
                try:
                    state[f"{group}.{name}"] = repr(getattr(obj, name))[:80]
                except Exception as e:  # a knob that cannot be read is reported, not fatal
                    state[f"{group}.{name}"] = f"<{type(e).__name__}>"
    return state


def forget_compiled() -> None:
    """Make fuselab's reduction kernels compile again on their next call (Triton's in-memory cache and ours)."""
    _launch._COMPILED.clear()
    for kernel in (_reduce_triton._rows_kernel, _reduce_triton._cols_kernel):
        for caches in getattr(kernel, "device_caches", {}).values():
            for cache in caches[:2]:  # (kernel cache, key cache, ...): their layout differs between versions
                if isinstance(cache, dict):
                    cache.clear()


def main() -> None:
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    inputs = [(torch.randn(shape, device="cuda").add_(1.0).to(dtype), dim) for shape, dtype, dim in CASES]

    def each(f) -> list[float]:
        return [us(functools.partial(f, x, dim)) for x, dim in inputs]

    def torch_mean(x, dim):
        return torch.mean(x) if dim is None else torch.mean(x, dim)

    def fuselab_mean(x, dim):
        return fuselab.mean(x) if dim is None else fuselab.mean(x, dim)

    before, torch_before = each(fuselab_mean), each(torch_mean)
    knobs_before = knob_state()
    compiled_us = each(torch.compile(torch_mean))
    after = each(fuselab_mean)
    forget_compiled()
    recompiled, torch_after = each(fuselab_mean), each(torch_mean)
    for (shape, dtype, dim), *t in zip(CASES, before, after, recompiled, torch_before, torch_after, compiled_us):
        print(f"mean {'all' if dim is None else dim} {shape} {str(dtype)[6:]:8s} fuselab before compile {t[0]:6.1f} "
              f"after {t[1]:6.1f} recompiled {t[2]:6.1f} | torch before {t[3]:6.1f} after {t[4]:6.1f} | "
              f"torch.compile {t[5]:6.1f} us")
    knobs_after = knob_state()
    changed = sorted(k for k in knobs_before.keys() | knobs_after.keys() if knobs_before.get(k) != knobs_after.get(k))
    print("changed by torch.compile:", *(f"  {k}: {knobs_before.get(k)} -> {knobs_after.get(k)}" for k in changed),
          sep="\n")


if __name__ == "__main__":
    main()
