"""Argument checks of :func:`fuselab.sum`/:func:`fuselab.mean` (see ``docs/reduce.md``): :func:`validate` turns their
arguments into a :class:`ReduceCall` or raises ``TypeError``/``ValueError`` naming the argument. The checks of ``x``,
``dim`` and ``dtype`` are the reference's (:mod:`fuselab.reference.reduce`: the CPU path raises the same errors)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from fuselab.core.reductions import REDUCTIONS
from fuselab.reference import reduce as ref


@dataclass(frozen=True, slots=True, eq=False)
class ReduceCall:
    """One validated reduction of ``x``: over the sorted axes ``dims``, ``reduction`` one of
    :data:`~fuselab.core.reductions.REDUCTIONS`, into ``out_dtype``. Derived by the checks: ``out_shape`` and
    ``acc_dtype`` (float32, float64 where x or the output is float64); ``signature`` (see :mod:`fuselab.ops.opdef`).
    The custom op's arguments after ``x`` (:meth:`arguments`): dims, keepdim, is_mean, out_dtype."""

    dims: tuple[int, ...]
    keepdim: bool
    reduction: str
    out_dtype: torch.dtype
    out_shape: tuple[int, ...]
    acc_dtype: torch.dtype
    signature: Hashable | None = None

    @property
    def is_mean(self) -> bool:
        return self.reduction == "mean"

    def arguments(self) -> tuple[list[int], bool, bool, torch.dtype]:
        return list(self.dims), self.keepdim, self.is_mean, self.out_dtype


def reduce_call(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool, reduction: str, out_dtype: torch.dtype,
                signature: Hashable | None = None) -> ReduceCall:
    """The call of checked arguments (``dims`` normalized): what the checks derive from them added."""
    return ReduceCall(dims, keepdim, reduction, out_dtype, ref.output_shape(x, dims, keepdim),
                      ref.accumulate_dtype(x.dtype, out_dtype), signature)


def validate(x, dim: ref.Dim, keepdim, dtype, reduction: str, signature: Hashable | None = None) -> ReduceCall:
    """All checks of :func:`fuselab.sum`/:func:`fuselab.mean` (``reduction``: which; ``signature``: the call's,
    which they compute)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    out_dtype = ref.result_dtype(x, dtype, reduction)
    dims = ref.normalize_dims(x, dim)
    if not isinstance(keepdim, bool):
        raise TypeError(f"keepdim must be a bool, got {type(keepdim).__name__}")
    return reduce_call(x, dims, keepdim, reduction, out_dtype, signature)
