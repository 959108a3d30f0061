"""Seeded initial values that do not depend on where the model is built: every random fill draws on its generator's
device (the CPU's for a seeded ``torch.Generator()``) and lands on the tensor's device, also under a
``with torch.device(...)`` context or ``torch.set_default_device``."""

from __future__ import annotations

from collections.abc import Callable

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
