"""Which implementation runs an op: the Triton kernels or the pure-PyTorch reference.

Decided per call from the tensors' device and one documented switch, the
environment variable ``FUSELAB_BACKEND``, read at call time (never at import):

========== ==================================================================
``auto``   (default) Triton kernels for CUDA tensors, the PyTorch reference
           path for every other device.
``triton`` Triton kernels always. CPU tensors need ``TRITON_INTERPRET=1`` set
           before Triton is first imported; this is how CI runs the kernels.
``torch``  The pure-PyTorch reference path always (debugging, bisecting).
========== ==================================================================
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

BACKENDS = ("auto", "triton", "torch")
ENV_VAR = "FUSELAB_BACKEND"


def selected_backend() -> str:
    """The value of ``FUSELAB_BACKEND`` (``auto`` when unset), validated."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={value!r} is not valid; expected one of {', '.join(BACKENDS)}")
    return value


def interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(device: torch.device | str) -> bool:
    """Whether an op whose tensors live on ``device`` should run the Triton kernels.

    Raises ``RuntimeError`` when ``FUSELAB_BACKEND=triton`` asks for Triton on a
    non-CUDA device without ``TRITON_INTERPRET=1``.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == "cuda" and os.environ.get(ENV_VAR) is None:
        return True  # the default on GPUs, checked first: this runs on every op call
    backend = selected_backend()
    if backend == "torch":
        return False
    if device.type == "cuda":
        return True
    if backend == "triton":
        if device.type == "cpu" and interpreter_enabled():
            return True
        raise RuntimeError(
            f"{ENV_VAR}=triton with tensors on {device.type!r} needs TRITON_INTERPRET=1 "
            "(set before triton is imported) to run the kernels under the interpreter"
        )
    return False


def triton_for(t: torch.Tensor) -> bool:
    """:func:`use_triton` for the device of tensor ``t``, the common case (a CUDA tensor, ``FUSELAB_BACKEND``
    unset) decided first without building a ``torch.device``: ops call it on every eager call."""
    if t.is_cuda and os.environ.get(ENV_VAR) is None:
        return True
    return use_triton(t.device)


@contextlib.contextmanager
def forced(backend: str) -> Iterator[None]:
    """Temporarily set ``FUSELAB_BACKEND`` (the lab uses it to pin a provider's path)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = backend
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old
