"""The GEMM ops' launch sequences, imported on first use: Triton must not load before ``TRITON_INTERPRET`` is set,
so importing :mod:`fuselab.ops.gemm` does not import it."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def steps() -> ModuleType:
    """:mod:`fuselab.ops.gemm.steps`."""
    from fuselab.ops.gemm import steps as module

    return module


@functools.cache
def launchers() -> ModuleType:
    """:mod:`fuselab.ops.gemm.launch`."""
    from fuselab.ops.gemm import launch as module

    return module
