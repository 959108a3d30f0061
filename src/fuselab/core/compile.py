"""``torch.compile`` as fuselab calls it: without the deprecation notices torch prints on its own account."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

#: the first ``torch.compile`` of a process imports Inductor, which imports ``torch.utils.mkldnn``, whose modules
#: use ``torch.jit.script_method``: 14 DeprecationWarnings about torch's code that no caller can act on
TORCH_NOTICE = r"`torch\.jit\.script_method` is deprecated"


def compile_quietly(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    """``torch.compile(fn, **options)``, with :data:`TORCH_NOTICE` dropped (other warnings pass); the same
    errors as ``torch.compile``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", TORCH_NOTICE, DeprecationWarning)
        return torch.compile(fn, **options)
