"""Elementwise square ``x * x`` in CUDA C++ (``square.cu``), the lab's CUDA example.

Built with ``load_inline`` at first call (``fuselab.cuda._build.load``); torch caches the
library, so only the first use on a machine pays the nvcc time (about a minute).

Errors: ``TypeError`` for a non-tensor or a dtype other than float32/float16/bfloat16;
``ValueError`` for a non-CUDA or non-contiguous tensor, or a mismatched ``out``;
``RuntimeError`` when no CUDA device is present (from the builder).
"""

from __future__ import annotations

from types import ModuleType

import torch

from fuselab.cuda._build import load

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _extension() -> ModuleType:
    return load("fuselab_square", "void square_out(torch::Tensor x, torch::Tensor y, int64_t stream);", ("square_out",))


def _validate(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {x.stride()}); call .contiguous() first")


def square_out(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write ``x * x`` into ``out`` (same shape, dtype, device; contiguous). Read N, write N elements."""
    _validate(x)
    _validate(out, "out")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must match x: got {tuple(out.shape)} {out.dtype} {out.device}, "
                         f"expected {tuple(x.shape)} {x.dtype} {x.device}")
    ext = _extension()
    with torch.cuda.device(x.device):
        ext.square_out(x, out, torch.cuda.current_stream(x.device).cuda_stream)
    return out


def square(x: torch.Tensor) -> torch.Tensor:
    """``x * x`` computed in fp32 and rounded once (matches ``torch.square``). Forward only (no autograd)."""
    _validate(x)
    return square_out(x, torch.empty_like(x))
