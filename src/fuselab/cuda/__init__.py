"""CUDA C++ backends, compiled with ``torch.utils.cpp_extension.load_inline`` at first use.

Each op with a CUDA backend has a ``.cu`` source here and a private Python builder module (``_bias_act``...);
the public functions (``fuselab.cuda.bias_act``, ``square``, ``fused_linear``) resolve lazily, so importing
:mod:`fuselab.cuda` compiles nothing. The modules are private so that no submodule shares a public function's name
(importing a submodule sets the package attribute of its name: ``fuselab.cuda.bias_act`` turned into the module
after the first call).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers and "go to definition"
    from fuselab.cuda._bias_act import bias_act as bias_act
    from fuselab.cuda._fused_linear import fused_linear as fused_linear
    from fuselab.cuda._square import square as square

_API: dict[str, str] = {
    "square": "fuselab.cuda._square",
    "bias_act": "fuselab.cuda._bias_act",
    "fused_linear": "fuselab.cuda._fused_linear",
}


def __getattr__(name: str) -> Any:
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'fuselab.cuda' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
