"""fuselab: fused GPU kernels written from Python, and a lab that proves them.

The public functional API lives here. Names resolve lazily, so ``import fuselab``
stays cheap (the CLI starts fast) and Triton is imported only when a kernel is used.

Backend choice is made per call, never at import time: tensors on CUDA take the
Triton kernels, other tensors the pure-PyTorch reference path. The environment
variable ``FUSELAB_BACKEND`` (read at call time, see :mod:`fuselab.backend`)
overrides this; ``FUSELAB_BACKEND=triton`` with ``TRITON_INTERPRET=1`` runs the
Triton kernels on CPU tensors under the interpreter, which is how CI tests them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers and "go to definition"
    from fuselab import backend as backend
    from fuselab import bench as bench
    from fuselab import cuda as cuda
    from fuselab import dlrm as dlrm
    from fuselab import hf as hf
    from fuselab import nn as nn
    from fuselab import ops as ops
    from fuselab import reference as reference
    from fuselab import testing as testing
    from fuselab.ops.bias_act import ACTIVATIONS as ACTIVATIONS
    from fuselab.ops.bias_act import bias_act as bias_act
    from fuselab.ops.gemm import gemm as gemm
    from fuselab.ops.interaction import dot_interaction as dot_interaction
    from fuselab.ops.reduce import mean as mean
    from fuselab.ops.reduce import sum as sum
    from fuselab.ops.rope import apply_rope as apply_rope
    from fuselab.ops.rope import rope_cos_sin as rope_cos_sin

__version__ = "0.1.0"

# public name -> module that defines it
_API: dict[str, str] = {
    "apply_rope": "fuselab.ops.rope",
    "rope_cos_sin": "fuselab.ops.rope",
    "bias_act": "fuselab.ops.bias_act",
    "ACTIVATIONS": "fuselab.ops.bias_act",
    "sum": "fuselab.ops.reduce",
    "mean": "fuselab.ops.reduce",
    "dot_interaction": "fuselab.ops.interaction",
    "gemm": "fuselab.ops.gemm",
}
_SUBMODULES = ("backend", "bench", "cuda", "dlrm", "hf", "nn", "ops", "reference", "testing")

__all__ = sorted([*_API, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"fuselab.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'fuselab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_SUBMODULES])
