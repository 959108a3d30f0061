"""Does the end of ``backward()`` make the caller's stream wait for a side stream's work that returns no gradient to
a leaf? A custom function (forward on the side stream, backward = a 50 ms sleep there, no gradient for its anchor
leaf) is run with and without the anchor's accumulator pinned to the caller's stream (SideStream.fork's views),
beside a leaf of the caller's stream. After ``backward()`` an event is recorded on the caller's stream: if it
completes while the side stream still sleeps, the caller did not wait.

    python3 benchmarks/gpu_checks/overlap_probe.py
"""

from __future__ import annotations

import time

import torch
from torch import nn


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(100_000_000)  # tens of ms on the stream of the forward
        return None, grad


def probe(variant: str) -> dict:
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    anchor = nn.Parameter(torch.empty(0, device="cuda"))
    dense = nn.Parameter(torch.randn(1000, device="cuda"))  # a leaf of the caller's stream
    x = torch.randn(1000, device="cuda")
    pins = [anchor.view_as(anchor)] if variant == "pinned" else []
    side.wait_stream(main)
    with torch.cuda.stream(side):
        y = _SlowBackward.apply(anchor, x)
    main.wait_stream(side)
    del pins
    (y * dense).sum().backward()
    after = torch.cuda.Event()
    after.record(main)
    time.sleep(0.005)
    result = {"variant": variant, "caller_done_while_side_busy": after.query() and not side.query()}
    torch.cuda.synchronize()
    return result


if __name__ == "__main__":
    print(torch.__version__)
    for v in ("plain", "pinned"):
        probe(v)  # warm
        print(probe(v))
