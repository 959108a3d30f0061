"""Host time of ``fuselab.mean`` per call on the GPU machine, next to torch and torch.compile, and where it goes.

    python3 benchmarks/sweeps/reduce_host.py

Question (session 20): the H200 lab measured ``mean(dim=0)`` of 65536x512 bf16 at 52 µs (p20 44 µs) per call, where
the same plan launched directly (``reduce_cols_wide.py``) takes 26 µs and torch.compile 28 µs: under do_bench the
host enqueues each call while the GPU runs the 256 MB flush (~55 µs on the H200), so a call is timed longer than its
kernel only if its host time exceeds that. Is fuselab's host time per call that long on this host, and where?
Prints host µs per call (least of 5 means of 200 calls, ``_timing.host_us``) and a cProfile of the fuselab call.
First answer (``results/h200/probes/reduce_host.txt``): 29-33 µs, under the flush's slack, yet the call measures 35-52
µs and the direct launch 26. ``--layers`` times, after the dirty flush and in alternating rounds, the layers of the
call from the outside in: ``fuselab.mean``, ``_run_planned`` (allocation, scratch partials), ``reduce_into`` with the
scratch buffer, and ``reduce_into`` with a buffer of its own (``reduce_cols_wide.py``'s call), to find which adds the
time.
"""

from __future__ import annotations

import functools
import sys

import torch
from _timing import ab_header, alternate, copy_gbps, host_us, print_profile, spread  # benchmarks/sweeps/_timing.py
from reduce_sweep import plan_call

import fuselab
from fuselab.ops import _reduce_plan as P
from fuselab.ops import _reduce_triton as K
from fuselab.ops import reduce as R
from fuselab.ops._tickets import scratch

SHAPES = ((65536, 512), (8192, 8192))


def host_row(x: torch.Tensor, dim: int | None) -> str:
    compiled = torch.compile(lambda t: torch.mean(t, dim), dynamic=False)
    calls = {"fuselab.mean": lambda: fuselab.mean(x, dim), "torch.mean": lambda: torch.mean(x, dim),
             "torch.compile": lambda: compiled(x), "empty": lambda: torch.empty(512, device="cuda")}
    return "  ".join(f"{name} {host_us(fn, n=200):6.1f}" for name, fn in calls.items())


def main() -> None:
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for dim in (0, -1, None):
            print(f"{'x'.join(map(str, shape))} dim={dim}: host µs per call  {host_row(x, dim)}", flush=True)
    x = torch.randn(SHAPES[0], device="cuda", dtype=torch.bfloat16)
    print_profile("fuselab.mean(x, 0), 65536x512 bf16", lambda: fuselab.mean(x, 0))


def layer_calls(x: torch.Tensor, dim: int | None) -> tuple[dict, P.ReducePlan]:
    """The call's layers, outside in, on ``x``."""
    dims = tuple(range(x.dim())) if dim is None else (dim % x.dim(),)
    src, planned = R._plan_call(x, dims, False, x.dtype)
    plan = planned[2]
    n = P.workspace_numel(plan)
    out, own_partials = plan_call(src, dims, plan)
    return {
        "fuselab.mean": lambda: fuselab.mean(x, dim),
        "_run_planned": lambda: R._run_planned(src, dims, planned, True),
        "reduce_into, scratch partials": lambda: K.reduce_into(
            src, dims, out, scratch(x.device, (n,), torch.float32) if n else None, plan=plan, is_mean=True),
        "reduce_into, own partials": own_partials,
    }, plan


def layers() -> None:
    bw = copy_gbps()
    ab_header(bw, 3)
    for shape, dim in (((65536, 512), 0), ((65536, 512), None), ((65536, 512), -1), ((8192, 8192), 0)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        calls, plan = layer_calls(x, dim)
        nbytes = x.numel() * x.element_size()
        fraction = functools.partial(lambda ms, n: n / ms / 1e6 / bw, n=nbytes)
        print(f"\n{'x'.join(map(str, shape))} bf16 dim={dim}: split {plan.split}, steal {plan.steal}", flush=True)
        for name, (dirty, graph) in alternate({k: (v, fraction) for k, v in calls.items()}, 3).items():
            print(f"  {spread(dirty, graph)}  {name}", flush=True)


if __name__ == "__main__":
    layers() if "--layers" in sys.argv[1:] else main()
