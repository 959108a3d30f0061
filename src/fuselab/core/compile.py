"""``torch.compile`` as fuselab calls it: without the deprecation notices torch prints on its own account."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

#: Inductor imports ``torch.utils.mkldnn``, whose modules use ``torch.jit.script_method``: 14 DeprecationWarnings
#: about torch's code that no caller can act on, at ``torch.compile`` or at the compiled function's first call
TORCH_NOTICE = r"`torch\.jit\.script_method` is deprecated"


def compile_quietly(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``torch.compile(fn, **options)``, with :data:`TORCH_NOTICE` dropped (other warnings pass): the module that
    prints it is imported here, under the filter, before Inductor would import it at the first call. The same
    errors as ``torch.compile``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", TORCH_NOTICE, DeprecationWarning)
        importlib.import_module("torch.utils.mkldnn")  # the notice's source; a no-op once imported
        return torch.compile(fn, **options)
