"""Compile a ``.cu`` source of this folder into a PyTorch extension, once per process.

torch caches the built library under ``TORCH_EXTENSIONS_DIR`` (keyed by the source
hash), so only the first use on a machine pays the nvcc time.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import torch

SOURCE_DIR = Path(__file__).resolve().parent
#: extension name -> the error of its failed build in this process
_FAILED: dict[str, str] = {}


@functools.cache
def load(name: str, source: str, cpp_declarations: str, functions: tuple[str, ...]) -> ModuleType:
    """Build (or load from torch's cache) extension ``name`` from ``SOURCE_DIR/source``.

    ``cpp_declarations`` declares the host functions defined in the ``.cu`` file;
    ``functions`` are bound to Python. Raises ``RuntimeError`` without a CUDA device.
    """
    if not torch.cuda.is_available():
        raise RuntimeError(f"the CUDA backend {name!r} needs a CUDA device; use the Triton or CPU path")
    if name in _FAILED:  # a failed build leaves no library behind: repeat its error, not an ImportError
        raise RuntimeError(_FAILED[name])
    from torch.utils.cpp_extension import load_inline

    try:
        return load_inline(
            name=name,
            cpp_sources=cpp_declarations,
            cuda_sources=(SOURCE_DIR / source).read_text(),
            functions=list(functions),
            extra_cuda_cflags=["-O3", "-lineinfo"],
            verbose=False,
        )
    except (RuntimeError, ImportError, OSError) as exc:
        _FAILED[name] = f"building the CUDA extension {name!r} from {source} failed: {exc}"
        raise RuntimeError(_FAILED[name]) from exc
