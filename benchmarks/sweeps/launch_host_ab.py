"""Host time per call of the launch path, step by step, and an A/B of how ``_launch._run`` hands pointers to Triton.

    python3 benchmarks/sweeps/launch_host_ab.py

Question (session 19): the RoPE decode call (B=64, S=1, 32/8 heads of 128, bf16, tensor offsets) takes 23-34 µs of
host time out of place on the H200 machine against an issue target of 20 µs. Given a tensor, Triton's launcher
calls its ``data_ptr()`` and then ``cuPointerGetAttribute`` (a driver call) for every pointer argument on every
launch: RoPE passes 10. Given an int, it takes the value as is. Prediction: ints save about one driver call per
pointer, ~0.3-0.5 µs each on a slow host, so 3-5 µs per RoPE launch, ~1-2 µs per bias_act launch.

Rows: the pieces of a decode call (call key, allocation, launch), then whole calls (RoPE decode out of place and in
place, bias_act forward without grad, the FusedLinear MLP step at batch 256) with ``_run`` passing tensors (the
session-18 code, ``tensors``) or ints (``ints``), alternating in rounds; least of each round's means (host noise only
ever adds time), then the median over rounds.

Session 19 on the H200 (``results/h200/probes/launch_host_ab.txt``): the prediction was wrong. The driver's check is
cheap; ints saved 0.16 µs per 10-pointer launch once ``data_ptr()`` is called in Python instead (7.18 -> 7.02 µs),
0.4 µs per decode call, within the host's noise. ``_launch`` keeps handing tensors over.
"""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl
from _timing import host_us  # benchmarks/sweeps/_timing.py
from mlp_host import step_fn  # benchmarks/sweeps/mlp_host.py

import fuselab
from fuselab.bench.suites.mlp import mlp_cuda, mlp_eager, mlp_fuselab
from fuselab.ops import _launch
from fuselab.ops import rope as rope_op
from fuselab.ops.rope_kernel import _tensors

ROUNDS = 5
SHIPPED_RUN = _launch._run  # tensors handed to Triton's launcher


def ints_run(entry, grid, tensors, scalars, knobs) -> None:
    """``_launch._run`` with the pointers handed over as ints (measured in session 19: not kept)."""
    compiled, tail, device = entry
    stream = torch._C._cuda_getCurrentRawStream(device)
    grid_y = grid[1] if len(grid) > 1 else 1
    grid_z = grid[2] if len(grid) > 2 else 1
    enter, leave = _launch._active(knobs.launch_enter_hook), _launch._active(knobs.launch_exit_hook)
    metadata = compiled.launch_metadata(grid, stream, *tensors, *scalars, *tail) if enter is not None else None
    compiled.run(grid[0], grid_y, grid_z, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave,
                 *[t.data_ptr() for t in tensors], *scalars, *tail)


@triton.jit
def _empty4(a, b, n, m, BLOCK: tl.constexpr):
    pass


def main() -> None:
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}", flush=True)
    b, hq, hk, d, rows = 64, 32, 8, 128, 4096
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, 1, hk, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(rows, d, device="cuda")
    offsets = torch.randint(0, rows - 1, (b,), device="cuda", dtype=torch.int32)
    fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets)
    key_args = (q, k, cos, sin, "bshd", False, False, None, offsets, None, None, 10000.0, None, None, False)
    key = rope_op._call_key(*key_args)
    record = rope_op._CALLS[key][-1]
    entry, grid, ints = record
    compiled, tail, device = entry
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    tensors = _tensors(q, k, q_out, k_out, cos, sin, None, None, offsets, None)
    scalars = (0, 1.0, *ints)
    stream = torch._C._cuda_getCurrentRawStream(device)
    ptrs = [t.data_ptr() for t in tensors]
    gy = grid[1] if len(grid) > 1 else 1

    def run_with(args):
        return lambda: compiled.run(grid[0], gy, 1, stream, compiled.function, compiled.packed_metadata, None, None,
                                    None, *args, *scalars, *tail)

    x16 = torch.empty(16, device="cuda")
    empty = _empty4[(1,)](x16, x16, 16, 16, BLOCK=16)
    ptr16 = x16.data_ptr()
    xb = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    fixed = {
        "empty Triton launch (JIT, 2 tensors)": lambda: _empty4[(1,)](x16, x16, 16, 16, BLOCK=16),
        "empty kernel, compiled.run, 2 tensors": lambda: empty.run(1, 1, 1, stream, empty.function,
                                                                   empty.packed_metadata, None, None, None, x16, x16,
                                                                   16, 16, 16),
        "empty kernel, compiled.run, 2 ints": lambda: empty.run(1, 1, 1, stream, empty.function,
                                                                empty.packed_metadata, None, None, None, ptr16, ptr16,
                                                                16, 16, 16),
        "rope: _call_key": lambda: rope_op._call_key(*key_args),
        "rope: torch.empty_like(q)": lambda: torch.empty_like(q),
        "rope: compiled.run, 10 tensors": run_with(tensors),
        "rope: compiled.run, 10 ints (precomputed)": run_with(ptrs),
        "rope: compiled.run, 10 ints (data_ptr per call)": lambda: run_with([t.data_ptr() for t in tensors])(),
    }
    print(f"\n{'step':52s} {'host us/call':>12s}")
    for name, fn in fixed.items():
        print(f"{name:52s} {host_us(fn, n=2000):12.2f}", flush=True)

    calls = {
        "rope decode, tensor offsets": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets),
        "rope decode, int offset": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=1000),
        "rope decode in place, tensor offsets": lambda: fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets,
                                                                           inplace=True),
        "bias_act 256x512 bf16 gelu_tanh, no grad": lambda: fuselab.bias_act(xb, bias, activation="gelu_tanh"),
        "sum 256x512 bf16 dim=0": lambda: fuselab.sum(xb, 0),
    }
    steps = {name: step_fn(mlp, 256, torch.bfloat16)[0]
             for name, mlp in (("mlp step B=256: eager", mlp_eager), ("mlp step B=256: fuselab", mlp_fuselab),
                               ("mlp step B=256: cuda", mlp_cuda))}
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for variant, run in (("tensors", SHIPPED_RUN), ("ints", ints_run)):
            _launch._run = run
            for name, fn in calls.items():
                results.setdefault((name, variant), []).append(host_us(fn, n=1000, repeats=3))
            for name, fn in steps.items():
                if name.endswith("fuselab") or variant == "ints":  # eager and cuda do not launch through _run
                    results.setdefault((name, variant), []).append(host_us(fn, n=100, repeats=3))
    _launch._run = SHIPPED_RUN
    print(f"\n{'call (median over ' + str(ROUNDS) + ' alternating rounds)':52s} {'tensors':>9s} {'ints':>9s}  "
          "[min-max of ints]")
    for name in [*calls, *steps]:
        old = results.get((name, "tensors"))
        new = results[(name, "ints")]
        old_s = f"{statistics.median(old):9.1f}" if old else f"{'-':>9s}"
        print(f"{name:52s} {old_s} {statistics.median(new):9.1f}  [{min(new):.1f}-{max(new):.1f}]", flush=True)


if __name__ == "__main__":
    main()
