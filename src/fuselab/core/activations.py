"""The activation vocabulary of the fused epilogue (:func:`fuselab.bias_act`, :class:`fuselab.nn.FusedLinear`, the
CUDA C++ backend), defined once.

* :data:`ACTIVATIONS`: the names, in the order of their codes.
* :data:`ACTIVATION_CODES`: name -> the integer the Triton kernels take as their ``ACTIVATION`` constexpr and the
  CUDA sources as their ``kNone``... enum (``cuda/bias_act.cu``): its index in :data:`ACTIVATIONS`.
* :data:`SAVED`: what a backward needs per activation: ``"nothing"``, ``"output"`` (y) or ``"pre"`` (the
  pre-activation z = x + alpha * residual + bias).
"""

from __future__ import annotations

ACTIVATIONS: tuple[str, ...] = ("none", "relu", "relu2", "sigmoid", "silu", "gelu", "gelu_tanh")

ACTIVATION_CODES: dict[str, int] = {name: code for code, name in enumerate(ACTIVATIONS)}

SAVED: dict[str, str] = {
    "none": "nothing",
    "relu": "output",
    "relu2": "output",
    "sigmoid": "output",
    "silu": "pre",
    "gelu": "pre",
    "gelu_tanh": "pre",
}
