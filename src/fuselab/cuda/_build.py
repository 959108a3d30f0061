"""Compile the ``.cu`` sources of this folder into PyTorch extensions, once per process.

torch caches a built library under ``TORCH_EXTENSIONS_DIR`` (keyed by the source hash), so only the
first use on a machine pays the nvcc time. :data:`EXTENSIONS` lists which sources form which extension;
``load_inline`` compiles an extension's sources as one translation unit (concatenated), and
``python -m fuselab.cuda._build DIR`` writes exactly those units to ``DIR`` for CI's nvcc check.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import ModuleType

import torch

SOURCE_DIR = Path(__file__).resolve().parent
#: extension name -> its sources in SOURCE_DIR, in the order they are concatenated
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "fuselab_square": ("square.cu",),
    "fuselab_bias_act": ("bias_act.cu", "fused_linear.cu"),
}
#: what load_inline puts before the CUDA sources
_CUDA_PRELUDE = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
#: extension name -> the error of its failed build in this process
_FAILED: dict[str, str] = {}


def _sources(name: str) -> list[str]:
    return [(SOURCE_DIR / source).read_text() for source in EXTENSIONS[name]]


def translation_unit(name: str) -> str:
    """The CUDA source load_inline compiles for extension ``name``."""
    return "\n".join([*_CUDA_PRELUDE, *_sources(name)])


@functools.cache
def load(name: str, cpp_declarations: str, functions: tuple[str, ...]) -> ModuleType:
    """Build (or load from torch's cache) extension ``name`` from its :data:`EXTENSIONS` sources.

    ``cpp_declarations`` declares the host functions defined in the sources; ``functions`` are bound to
    Python. Raises ``RuntimeError`` without a CUDA device, or when the build fails (the same error again
    on later calls in the process).
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
            cuda_sources=_sources(name),
            functions=list(functions),
            extra_cuda_cflags=["-O3", "-lineinfo", "--ftz=true"],  # ftz: no denormal fix-ups around ex2/rcp
            verbose=False,
        )
    except (RuntimeError, ImportError, OSError) as exc:
        _FAILED[name] = f"building the CUDA extension {name!r} from {', '.join(EXTENSIONS[name])} failed: {exc}"
        raise RuntimeError(_FAILED[name]) from exc


def main(argv: list[str]) -> int:
    """Write ``<name>.cu``, each extension's translation unit, into the folder ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m fuselab.cuda._build OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in EXTENSIONS:
        (out / f"{name}.cu").write_text(translation_unit(name))
        print(out / f"{name}.cu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
