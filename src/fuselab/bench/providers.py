"""Factories for the providers every op has: eager, torch.compile, torchscript, fuselab.

Op suites build their registries from these plus op-specific peers (Liger, flash-attn,
Transformer Engine, Thunder) declared with ``requires=(module,)``, so a peer that is not
installed is reported as such and never crashes a run.

The harness, not the provider, pins ``FUSELAB_BACKEND=triton`` around ``triton=True``
providers on CPU machines (interpreter, correctness only); on CUDA they run as users call them.
"""

from __future__ import annotations

import warnings

import torch

from fuselab.core.compile import compile_quietly

from .spec import MODES, BenchCase, Fn, Provider


def eager(fn: Fn, name: str = "eager", description: str = "PyTorch eager", **kw) -> Provider:
    return Provider(name=name, build=lambda case: fn, description=description, **kw)


def compiled(fn: Fn, name: str = "torch.compile", description: str = "torch.compile (Inductor) of the eager code",
             **kw) -> Provider:
    def build(case: BenchCase) -> Fn:
        # a fresh Dynamo cache per case: otherwise many shapes of one function hit the
        # recompile limit and silently fall back to eager
        torch._dynamo.reset()
        return compile_quietly(fn, dynamic=False)

    return Provider(name=name, build=build, description=description, **kw)


def scripted(fn: Fn, name: str = "torchscript", description: str = "torch.jit.script of the eager code",
             **kw) -> Provider:
    return Provider(name=name, build=lambda case: _script(fn), description=description, **kw)


def _script(fn: Fn) -> Fn:
    """``torch.jit.script(fn)`` without its deprecation notice: TorchScript is a baseline users still pick."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"`torch\.jit\.script(_method)?` is deprecated", DeprecationWarning)
        return torch.jit.script(fn)


def fuselab(fn: Fn, name: str = "fuselab", description: str = "fuselab Triton kernels", modes=MODES,
            **kw) -> Provider:
    return Provider(name=name, build=lambda case: fn, description=description, modes=modes, triton=True, **kw)
