"""Host time per call of fuselab's eager fast paths (CUDA): median microseconds of ``time.perf_counter`` around one
call, after a warm-up, with the device synchronized between calls (outside the timed region) so that the launch
queue never fills and only host time is measured.

Cases: RoPE decode (B=64, bshd, one token, 32 q heads / 8 k heads, head_dim 128, bf16, fp32 cos/sin tables of
4096 rows) in place and out of place, with an int offset (changing every call, as in decoding) and with a tensor
offset; ``bias_act`` forward, relu, bf16, 16384x4096 and 256x4096, with a bias.

Run it against two trees alternately, each installed in turn (``pip install -e <tree>``) or selected with
``PYTHONPATH=<tree>/src``; it prints which ``fuselab`` it imported::

    python benchmarks/host_time.py --calls 5000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

import fuselab


def host_us(fn: Callable[[int], object], calls: int, warmup: int) -> float:
    """Median host time of ``fn(i)`` in microseconds."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def rope_cases() -> dict[str, Callable[[int], object]]:
    q = torch.randn(64, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = fuselab.rope_cos_sin(4096, 128, device="cuda")
    offsets = torch.full((64,), 100, dtype=torch.int32, device="cuda")
    apply = fuselab.apply_rope
    return {
        "rope decode, out of place, int offset": lambda i: apply(q, k, cos, sin, seqlen_offsets=100 + i % 3000),
        "rope decode, out of place, tensor offset": lambda i: apply(q, k, cos, sin, seqlen_offsets=offsets),
        "rope decode, in place, int offset": lambda i: apply(q, k, cos, sin, seqlen_offsets=100 + i % 3000,
                                                             inplace=True),
        "rope decode, in place, tensor offset": lambda i: apply(q, k, cos, sin, seqlen_offsets=offsets, inplace=True),
    }


def bias_act_cases() -> dict[str, Callable[[int], object]]:
    cases = {}
    for rows in (16384, 256):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        cases[f"bias_act forward, relu, {rows}x4096 bf16"] = lambda i, x=x, b=b: fuselab.bias_act(x, b)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per case (default 3000)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed calls first (default 300)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_time.py measures CUDA launches: no CUDA device here")
    print(f"fuselab {fuselab.__version__} from {fuselab.__file__}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name()}")
    results = {}
    # grad mode on, as a user calls (no tensor needs grad)
    for name, fn in {**rope_cases(), **bias_act_cases()}.items():
        results[name] = host_us(fn, args.calls, args.warmup)
        print(f"{name:45s} {results[name]:8.2f} µs/call (median of {args.calls})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"fuselab": fuselab.__file__, "calls": args.calls, "host_us": results}, f, indent=2)


if __name__ == "__main__":
    main()
