"""Correctness before timing: run a provider and the float64 reference on the same inputs.

Used by the harness (every provider, every case, before it is timed) and by the op
suites' tests. Gradients are checked in the ``bwd`` and ``fwd+bwd`` modes.

A reference whose result jumps where rounding can move an input across a branch (relu: a pre-activation within
rounding of zero switches the mask, and the weight gradients by a full row) may take a keyword-only argument
``follow``: it is then called a second time with the provider's outputs (detached), and takes the provider's
branch wherever the branch is within rounding of the boundary (its own branch everywhere else). The error is
then measured where it is defined, and a provider whose branch is wrong away from the boundary still fails.
Outputs that do not require grad (detached intermediate results a provider exposes for this) are compared in
the forward only, and get no upstream gradient.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fuselab.core.device import max_element_offset
from fuselab.testing import rel_error, tolerance

from .spec import GRAD_MODES, BenchCase, Fn, OpSpec


@dataclass(frozen=True)
class CheckResult:
    error: float  # worst norm-relative error over outputs and gradients
    output_error: float
    grad_error: float | None  # None in fwd mode
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


def as_tuple(result: Any) -> tuple[torch.Tensor | None, ...]:
    if result is None:
        return ()
    if isinstance(result, torch.Tensor):
        return (result,)
    return tuple(result)


def clone_strided(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same sizes *and* strides (gaps in the storage included)."""
    if t.numel() == 0:
        return t.clone()
    extent = max_element_offset(t) - t.storage_offset() + 1
    buf = torch.empty(extent, dtype=t.dtype, device=t.device)
    out = buf.as_strided(t.shape, t.stride())
    out.copy_(t)
    return out


def prepare_args(
    args: Sequence[Any], grad_args: Sequence[int], needs_grad: bool, dtype: torch.dtype | None = None
) -> tuple[Any, ...]:
    """Fresh copies of the tensor arguments (strides kept); leaves with grad where asked.

    ``dtype`` (float64 for the reference) converts every floating tensor.
    """
    out = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            a = clone_strided(a.detach())
            if dtype is not None and a.is_floating_point():
                a = a.to(dtype)
            if needs_grad and i in grad_args:
                a = a.detach().requires_grad_(True)
        out.append(a)
    return tuple(out)


def run(fn: Fn, args: Sequence[Any], mode: str, grad_args: Sequence[int],
        grad_outputs: Sequence[torch.Tensor | None]) -> tuple[tuple, tuple]:
    """Call ``fn`` once in ``mode``: returns (outputs, gradients of ``grad_args``; none in ``fwd`` and ``step``)."""
    if mode == "fwd":
        with torch.no_grad():
            return as_tuple(fn(*args)), ()
    if mode not in GRAD_MODES:  # a whole step: the provider runs its own backward and update
        return tuple(None if o is None else o.detach() for o in as_tuple(fn(*args))), ()
    outputs = as_tuple(fn(*args))
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
             if o is not None and g is not None and o.requires_grad]
    if not pairs:
        raise RuntimeError("no output of the provider requires grad in a backward mode")
    torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])
    return outputs, tuple(args[i].grad for i in grad_args)


def make_grad_outputs(outputs: Sequence[torch.Tensor | None], dtype: torch.dtype) -> tuple:
    """Fresh random upstream gradients shaped like ``outputs``."""
    return tuple(None if o is None else torch.randn(o.shape, dtype=dtype, device=o.device) for o in outputs)


def follows(reference: Fn) -> bool:
    """Whether ``reference`` takes the keyword-only ``follow`` argument (see the module docstring)."""
    try:
        param = inspect.signature(reference).parameters.get("follow")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind == inspect.Parameter.KEYWORD_ONLY


def reference_run(spec: OpSpec, case: BenchCase, args: Sequence[Any], grad_outputs: tuple | None = None,
                  follow: tuple | None = None) -> tuple[tuple, tuple, tuple]:
    """The float64 reference: (outputs, gradients, grad_outputs in the case dtype).

    ``grad_outputs``: the upstream gradients to use (fresh random ones when None). ``follow``: the provider's
    outputs, passed to a reference that :func:`follows` them."""
    needs_grad = case.mode in GRAD_MODES
    grad_args = spec.grad_args(case)
    ref_args = prepare_args(args, grad_args, needs_grad, dtype=torch.float64)
    reference = spec.reference if follow is None else functools.partial(spec.reference, follow=follow)
    if not needs_grad:
        return (*run(reference, ref_args, case.mode, grad_args, ()), ())
    if grad_outputs is None:
        with torch.no_grad():
            shapes = as_tuple(reference(*ref_args))
        grad_outputs = make_grad_outputs(shapes, case.dtype)
    ref_grad_outputs = tuple(None if g is None else g.to(torch.float64) for g in grad_outputs)
    outputs, grads = run(reference, ref_args, case.mode, grad_args, ref_grad_outputs)
    return outputs, grads, grad_outputs


def _worst(pairs) -> float:
    worst = 0.0
    for out, ref in pairs:
        if ref is None:
            continue
        if out is None:
            return float("inf")
        worst = max(worst, rel_error(out, ref))
    return worst


def _errors(fn: Fn, args: Sequence[Any], case: BenchCase, grad_args: Sequence[int], grad_outputs: tuple,
            ref_out: tuple, ref_grads: tuple, spec: OpSpec | None = None) -> tuple[float, float | None]:
    """(output error, gradient error or None in fwd mode) of ``fn`` run on fresh copies of ``args``.

    With ``spec`` whose reference :func:`follows` the provider, the reference is recomputed on the provider's
    outputs first (``ref_out`` / ``ref_grads`` are then not used)."""
    outputs, grads = run(fn, prepare_args(args, grad_args, case.mode in GRAD_MODES), case.mode, grad_args,
                         grad_outputs)
    if spec is not None and follows(spec.reference):
        follow = tuple(None if o is None else o.detach() for o in outputs)
        ref_out, ref_grads, _ = reference_run(spec, case, args, grad_outputs, follow)
    out_err = float("inf") if len(outputs) != len(ref_out) else _worst(zip(outputs, ref_out))
    grad_err = _worst(zip(grads, ref_grads)) if case.mode in GRAD_MODES else None
    return out_err, grad_err


def check(spec: OpSpec, case: BenchCase, fn: Fn, args: Sequence[Any] | None = None,
          device: torch.device | str = "cpu") -> CheckResult:
    """Run ``fn`` and the float64 reference on the same fresh inputs; compare all outputs
    and (in backward modes) all gradients."""
    device = torch.device(device)
    if args is None:
        args = spec.make_inputs(case, device)
    ref_out, ref_grads, grad_outputs = reference_run(spec, case, args)
    grad_args = spec.grad_args(case)
    out_err, grad_err = _errors(fn, args, case, grad_args, grad_outputs, ref_out, ref_grads, spec)
    error = max(out_err, grad_err or 0.0)
    tol = tolerance(case.dtype)
    if spec.tolerance_vs_eager and case.dtype != torch.float64:  # the same code's own rounding sets the bar
        eager_out_err, eager_grad_err = _errors(spec.reference, args, case, grad_args, grad_outputs, ref_out,
                                                ref_grads)
        tol = max(tol, 2 * max(eager_out_err, eager_grad_err or 0.0))
    return CheckResult(error=error, output_error=out_err, grad_error=grad_err, tolerance=tol)
