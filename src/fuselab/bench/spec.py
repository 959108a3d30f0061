"""The contract between the lab and each op's benchmark suite.

An op's suite (``fuselab.bench.suites.<op>``) defines one :class:`OpSpec`:

* ``cases(query)`` lists :class:`BenchCase` objects (shape, dtype, mode, and the
  bytes/flops model: the minimum each input read once, each output written once);
* ``make_inputs(case, device)`` builds fresh random, non-zero inputs (a tuple of
  positional arguments, tensors or plain values) every time it is called;
* ``reference(*args)`` is a pure PyTorch function, differentiable by autograd, that the
  harness calls on float64 copies of the inputs: the oracle for every provider;
* ``providers`` is the registry of implementations: each :class:`Provider` builds, once
  per case, a callable with the reference's signature and outputs.

Modes: ``fwd`` times ``fn(*args)`` under ``torch.no_grad()``; ``bwd`` runs the forward once
and times ``torch.autograd.backward(outputs, grad_outputs)``; ``fwd+bwd`` times both.
``grad_args(case)`` names the positional arguments that receive gradients. ``step`` is a whole training step that
the provider runs itself (forward, loss, backward, update: the DLRM suite): the harness calls ``fn(*args)`` as it is
and compares what it returns (the loss) with the reference's; each call trains, so the check sees the first step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

MODES: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd", "step")
#: modes whose gradients the harness computes and checks (``fwd`` has none; a ``step`` provider runs its own backward)
GRAD_MODES: tuple[str, ...] = ("bwd", "fwd+bwd")
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class BenchCase:
    """One op × shape × dtype × mode, with its cost model.

    ``bytes`` is the minimum traffic for *this mode* (each input read once, each output
    written once; for ``bwd``: grad_outputs and saved tensors read, grad_inputs written).
    ``numel`` is the size used on the x-axis of plots. ``params`` carries op-specific
    settings (shape tuple, activation, layout, ...) read by ``make_inputs`` and providers.
    ``read_bytes``: how many of ``bytes`` are read (the rest are written), for the stream bound
    (:mod:`fuselab.bench.stream`); None for cases that are not memory-bound (no bound measured).
    ``samples``: what one call processes, for a throughput figure (a training step's batch: samples/s); None for ops
    measured in bytes. ``group``: cases of one group are the points of one curve of the plots (over ``numel``).
    ``opt_in``: run only when named (``--case LABEL``): a case too large or too long for a default run.
    """

    op: str
    label: str
    dtype: torch.dtype
    mode: str
    bytes: int
    flops: int
    numel: int
    params: Mapping[str, Any] = field(default_factory=dict)
    l2_cold: bool = False  # small inputs: time with rotating input sets so L2 starts cold
    read_bytes: int | None = None
    samples: int | None = None
    group: str = ""
    opt_in: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.read_bytes is not None and not 0 < self.read_bytes <= self.bytes:
            raise ValueError(f"read_bytes must be in (0, bytes={self.bytes}], got {self.read_bytes}")
        if self.samples is not None and self.samples <= 0:
            raise ValueError(f"samples must be positive or None, got {self.samples}")

    @property
    def key(self) -> str:
        return f"{self.op}/{self.label}/{dtype_name(self.dtype)}/{self.mode}"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, flops per byte."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass(frozen=True)
class CaseQuery:
    """What the user asked for: the suite returns the matching cases."""

    device_type: str  # "cuda" or "cpu": CPU runs use small shapes
    quick: bool = False
    dtypes: tuple[torch.dtype, ...] | None = None  # None: the suite's defaults
    modes: tuple[str, ...] | None = None  # None: the suite's defaults

    def wants(self, dtype: torch.dtype, mode: str) -> bool:
        return (self.dtypes is None or dtype in self.dtypes) and (self.modes is None or mode in self.modes)

    def combinations(self, dtypes: Sequence[torch.dtype], modes: Sequence[str]) -> list[tuple[torch.dtype, str]]:
        """The (dtype, mode) pairs a suite runs: the asked ones, else the suite's ``dtypes`` and ``modes``, dtypes
        the lab knows (:data:`DTYPES`) only, in order."""
        return [(dtype, mode) for dtype in self.dtypes or dtypes if dtype in DTYPES.values()
                for mode in self.modes or modes if self.wants(dtype, mode)]


def select_cases(cases: Sequence[BenchCase], names: Sequence[str] | None) -> list[BenchCase]:
    """The cases a run takes: without ``names`` every case but the opt-in ones; with them, the cases whose label
    contains one of ``names``, and the opt-in cases whose label is one of them."""
    if not names:
        return [c for c in cases if not c.opt_in]
    return [c for c in cases if c.label in names or (not c.opt_in and any(n in c.label for n in names))]


Fn = Callable[..., Any]


@dataclass(frozen=True)
class Provider:
    """One implementation of an op.

    ``build(case)`` returns ``fn(*args)`` (compilation happens here or on first call).
    ``requires`` lists modules that must import; when one does not, the report says
    "not installed". ``supports(case)`` returns ``None`` or a reason the case is skipped.
    ``triton=True`` marks providers that launch Triton kernels: on a CPU machine they run
    once under the interpreter, for correctness only. ``cuda_only`` providers are skipped
    on CPU. ``inplace`` providers write into their inputs: the harness hands them clones.
    """

    name: str
    build: Callable[[BenchCase], Fn]
    requires: tuple[str, ...] = ()
    modes: tuple[str, ...] = MODES
    triton: bool = False
    cuda_only: bool = False
    inplace: bool = False
    supports: Callable[[BenchCase], str | None] | None = None
    description: str = ""

    def missing(self) -> str | None:
        """Name of the first required module that cannot be imported, if any."""
        for module in self.requires:
            try:
                if importlib.util.find_spec(module) is None:
                    return module
            except (ImportError, ValueError):
                return module
        return None

    def skip_reason(self, case: BenchCase) -> str | None:
        if case.mode not in self.modes:
            return f"no {case.mode} mode"
        return self.supports(case) if self.supports is not None else None


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    cases: Callable[[CaseQuery], list[BenchCase]]
    make_inputs: Callable[[BenchCase, torch.device], tuple[Any, ...]]
    reference: Fn
    providers: Sequence[Provider]
    grad_args: Callable[[BenchCase], tuple[int, ...]] = lambda case: (0,)
    baseline: str = "eager"  # provider that speedups are measured against
    #: judge providers against the rounding of ``reference`` itself run in the case dtype: the tolerance becomes
    #: ``max(dtype tolerance, 2 × that error)``. For compositions of matmuls (the MLP step), whose float64
    #: distance grows with depth and width (relu masks flip where low precision moves a pre-activation across 0)
    #: beyond any per-dtype constant; a provider must stay within twice the error of the same code in eager
    tolerance_vs_eager: bool = False

    def provider(self, name: str) -> Provider:
        for p in self.providers:
            if p.name == name:
                return p
        raise ValueError(
            f"unknown provider {name!r} for op {self.name!r}; valid: {', '.join(p.name for p in self.providers)}"
        )
