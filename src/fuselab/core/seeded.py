"""Seeded initial values that do not depend on where a module is built: every random fill draws on its generator's
device (the CPU's for a seeded ``torch.Generator()``) and lands on the tensor's device, also under a
``with torch.device(...)`` context or ``torch.set_default_device``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def seeded_fill_(t: torch.Tensor, generator: torch.Generator | None, fill: Callable[[torch.Tensor], object]) -> None:
    """``fill(t)`` (an in-place random fill such as ``lambda u: u.normal_(0, 1, generator=generator)``), drawn on
    ``generator``'s device and copied into ``t`` when ``t`` lives elsewhere; without a generator, ``fill(t)``."""
    with torch.no_grad():
        if generator is None or generator.device == t.device:
            fill(t)
            return
        drawn = torch.empty(t.shape, dtype=t.dtype, device=generator.device)
        fill(drawn)
        t.copy_(drawn)


#: tables of more elements than this draw on their own device: a CPU draw of MLPerf DCNv2's 26G elements would take
#: many minutes and a host copy of every table
DEVICE_DRAW_ELEMENTS = 1 << 28


def uniform_tables_(weight: torch.Tensor, table_sizes: Sequence[int], generator: torch.Generator | None) -> None:
    """Rows of table ``t`` (the ``table_sizes[t]`` rows after the tables before it) drawn U(-1/sqrt(n_t),
    1/sqrt(n_t)), in table order (facebookresearch/dlrm's and torchrec's initialisation), by :func:`seeded_fill_`.

    A weight of more than :data:`DEVICE_DRAW_ELEMENTS` elements on another device than ``generator``'s draws on
    its own device, from a generator there seeded by ``generator`` (the same values for the same seed and device;
    other values than a draw on ``generator``'s device)."""
    if (generator is not None and weight.numel() > DEVICE_DRAW_ELEMENTS and weight.device != generator.device
            and weight.device.type != "meta"):
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        generator = torch.Generator(device=weight.device).manual_seed(seed)
    start = 0
    for n in table_sizes:
        bound = 1.0 / math.sqrt(n)
        seeded_fill_(weight[start: start + n], generator, lambda u, b=bound: u.uniform_(-b, b, generator=generator))
        start += n
