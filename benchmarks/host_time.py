"""Host time per call of fuselab's eager fast paths (CUDA): median microseconds of ``time.perf_counter`` around one
call, after a warm-up, with the device synchronized between calls (outside the timed region) so that the launch
queue never fills and only host time is measured.

Cases: RoPE decode (B=64, bshd, one token, 32 q heads / 8 k heads, head_dim 128, bf16, fp32 cos/sin tables of
4096 rows) in place and out of place, with an int offset (changing every call, as in decoding) and with a tensor
offset; ``bias_act`` forward, relu, bf16, 16384x4096 and 256x4096, with a bias; the DLRM's ops at B=2048 (Kaggle's
F=26, D=16): ``dot_interaction`` forward (bf16, padded to 8) without and with its backward, and the embedding
collection's lookup and its training call (forward, then the backward that runs the fused row-wise Adagrad update);
``train``: forward + backward (``torch.autograd.backward``, whose backward runs on the autograd engine's device thread)
of RoPE decode (tensor offsets), ``bias_act`` gelu_tanh with a residual (256x4096 bf16: it keeps the pre-activation)
and a 4-layer ``fused_linear`` ReLU MLP (13-512-256-64-16, B=2048, bf16), every output given a gradient, as the lab's
``fwd+bwd`` mode does.

``--trace`` prints, per case, the Python and C calls of one steady-state call (``sys.setprofile``): run it against
both trees and diff the two outputs to see what one of them does more.

Run it against two trees alternately, each installed in turn (``pip install -e <tree>``) or selected with
``PYTHONPATH=<tree>/src``; it prints which ``fuselab`` it imported::

    python benchmarks/host_time.py --calls 5000 --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import threading
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


def dlrm_cases() -> dict[str, Callable[[int], object]]:
    from fuselab.ops.embedding import embedding_bag_collection

    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, features, dim = 2048, 26, 16
    dense = torch.randn(batch, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    emb = torch.randn(batch, features, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    dense_g = dense.clone().requires_grad_()
    emb_g = emb.clone().requires_grad_()
    width = fuselab.dot_interaction(dense, emb, pad_to=8).shape[1]
    grad_out = torch.randn(batch, width, device="cuda", dtype=torch.bfloat16, generator=gen)

    sizes = [1000 + 37 * f for f in range(features)]
    table_sizes = torch.tensor(sizes, dtype=torch.int64, device="cuda")
    row_offsets = torch.cumsum(table_sizes, 0) - table_sizes
    weight = torch.randn(sum(sizes), dim, device="cuda", generator=gen)
    momentum = torch.zeros(sum(sizes), device="cuda")
    lr = torch.tensor(0.01, device="cuda")
    ids = torch.randint(0, 10**6, (batch, features), device="cuda", generator=gen)
    anchor = torch.empty(0, device="cuda", requires_grad=True)
    grad_emb = torch.randn(batch, features, dim, device="cuda", generator=gen)

    def interaction_train(i: int) -> None:
        fuselab.dot_interaction(dense_g, emb_g, pad_to=8).backward(grad_out)

    def embedding_train(i: int) -> None:
        embedding_bag_collection(weight, momentum, lr, ids, table_sizes, row_offsets, anchor=anchor).backward(grad_emb)

    return {
        "dot_interaction fwd, B2048 F26 D16 bf16": lambda i: fuselab.dot_interaction(dense, emb, pad_to=8),
        "dot_interaction fwd+bwd, B2048 F26 D16 bf16": interaction_train,
        "embedding lookup, B2048 F26 D16": lambda i: embedding_bag_collection(weight, momentum, lr, ids, table_sizes,
                                                                              row_offsets),
        "embedding fwd+bwd (row-wise Adagrad), B2048": embedding_train,
    }


def train_cases() -> dict[str, Callable[[int], object]]:
    from fuselab.nn import fused_linear

    gen = torch.Generator(device="cuda").manual_seed(0)
    bf16 = torch.bfloat16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=bf16, generator=gen)

    q, k = randn(64, 1, 32, 128).requires_grad_(), randn(64, 1, 8, 128).requires_grad_()
    cos, sin = fuselab.rope_cos_sin(4096, 128, device="cuda")
    offsets = torch.full((64,), 100, dtype=torch.int32, device="cuda")
    rope_grads = (randn(64, 1, 32, 128), randn(64, 1, 8, 128))
    x, r, b = randn(256, 4096).requires_grad_(), randn(256, 4096).requires_grad_(), randn(4096).requires_grad_()
    g = randn(256, 4096)
    dims = (13, 512, 256, 64, 16)
    params = [t for i, o in itertools.pairwise(dims) for t in (randn(o, i).requires_grad_(), randn(o).requires_grad_())]
    h0 = randn(2048, 13).requires_grad_()
    mlp_grads = [randn(2048, o) for o in dims[1:]]

    def rope_train(i: int) -> None:
        torch.autograd.backward(fuselab.apply_rope(q, k, cos, sin, seqlen_offsets=offsets), rope_grads)

    def bias_act_train(i: int) -> None:
        torch.autograd.backward([fuselab.bias_act(x, b, residual=r, alpha=0.5, activation="gelu_tanh")], [g])

    def mlp_train(i: int) -> None:
        h, outs = h0, []
        for w, bias in zip(params[::2], params[1::2]):
            h = fused_linear(h, w, bias, "relu")
            outs.append(h)
        torch.autograd.backward(outs, mlp_grads)

    return {
        "rope decode fwd+bwd, tensor offset": rope_train,
        "bias_act fwd+bwd, gelu_tanh+residual, 256x4096": bias_act_train,
        "fused_linear MLP fwd+bwd, B2048 bf16": mlp_train,
    }


def trace_call(fn: Callable[[int], object], i: int) -> list[str]:
    """The Python and C calls (``file:function`` / ``C name``) made by one call of ``fn(i)``, in order."""
    events: list[str] = []

    def record(frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            events.append(f"{'/'.join(code.co_filename.split('/')[-2:])}:{code.co_name}")
        elif event == "c_call":
            events.append(f"C {getattr(arg, '__qualname__', repr(arg))}")

    set_all = getattr(threading, "setprofile_all_threads", None)  # the autograd engine's thread too (3.12+)
    (set_all or sys.setprofile)(record)
    try:
        fn(i)
    finally:
        (set_all or sys.setprofile)(None)
    return events[:-1]  # the last is the setprofile call itself


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per case (default 3000)")
    parser.add_argument("--warmup", type=int, default=300, help="untimed calls first (default 300)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--trace", action="store_true",
                        help="print the calls of one steady-state call per case instead of timing")
    parser.add_argument("--cases", nargs="*", default=["rope", "bias_act", "dlrm", "train"],
                        help="case groups: rope bias_act dlrm train (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_time.py measures CUDA launches: no CUDA device here")
    print(f"fuselab {fuselab.__version__} from {fuselab.__file__}; torch {torch.__version__}; "
          f"{torch.cuda.get_device_name()}")
    groups = {"rope": rope_cases, "bias_act": bias_act_cases, "dlrm": dlrm_cases, "train": train_cases}
    cases = {name: fn for group in args.cases for name, fn in groups[group]().items()}
    results = {}
    # grad mode on, as a user calls
    for name, fn in cases.items():
        if args.trace:
            for i in range(args.warmup):
                fn(i)
            torch.cuda.synchronize()
            events = trace_call(fn, args.warmup)
            print(f"## {name}: {len(events)} calls")
            print("\n".join(events))
            continue
        results[name] = host_us(fn, args.calls, args.warmup)
        print(f"{name:45s} {results[name]:8.2f} µs/call (median of {args.calls})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"fuselab": fuselab.__file__, "calls": args.calls, "host_us": results}, f, indent=2)


if __name__ == "__main__":
    main()
