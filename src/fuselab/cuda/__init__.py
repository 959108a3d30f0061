"""CUDA C++ backends, compiled with ``torch.utils.cpp_extension.load_inline`` at first use.

Each op with a CUDA backend has a ``.cu`` source here and a Python builder module; the
public names resolve lazily, so importing :mod:`fuselab.cuda` compiles nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_API: dict[str, str] = {
    "square": "fuselab.cuda.square",
    "bias_act": "fuselab.cuda.bias_act",
    "fused_linear": "fuselab.cuda.fused_linear",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fuselab.cuda' has no attribute {name!r}")
