"""Pure-PyTorch ``sum`` and ``mean``: the CPU path of :func:`fuselab.sum`/:func:`fuselab.mean` and the oracle.

Semantics shared with the Triton kernels (``fuselab.ops.reduce``):

* inputs are read in their own dtype and accumulated in float32 (float64 inputs, or
  ``dtype=torch.float64``, accumulate in float64); the result is cast to the output dtype;
* the output dtype is the input dtype (torch's rule for floating inputs) unless ``dtype`` is given;
* integer/bool inputs need ``dtype`` (they are converted to it first, as torch does);
* ``dim=None`` or ``dim=()`` reduces every element (torch's convention).

The argument checks live here too so both paths raise the same errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fuselab.core.checks import require_tensor

#: dtypes the result (and the ``dtype`` argument) may have
OUTPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: input dtypes read directly by the kernels (others need ``dtype`` and are converted first)
INPUT_DTYPES = OUTPUT_DTYPES

Dim = int | Sequence[int] | None


def normalize_dims(x: torch.Tensor, dim: Dim) -> tuple[int, ...]:
    """``dim`` as a sorted tuple of non-negative axes of ``x`` (every axis for ``None`` or ``()``).

    Raises ``TypeError`` for a non-int entry and ``ValueError`` for an out-of-range or duplicate axis.
    """
    ndim = x.dim()
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, bool) or not isinstance(dim, (int, Sequence)) or isinstance(dim, str):
        raise TypeError(f"dim must be None, an int or a tuple of ints, got {type(dim).__name__}")
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if len(dims) == 0:
        return tuple(range(ndim))
    rank = max(ndim, 1)  # a 0-dim tensor accepts dim 0 and -1, like torch
    seen: list[int] = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"dim entries must be ints, got {type(d).__name__} in dim={dim!r}")
        if not -rank <= d < rank:
            raise ValueError(f"dim={d} is out of range for a tensor with {ndim} dims (expected {-rank}..{rank - 1})")
        d = d % rank
        if d in seen:
            raise ValueError(f"dim={dim!r} names axis {d} more than once")
        seen.append(d)
    if ndim == 0:
        return ()
    return tuple(sorted(seen))


def result_dtype(x: torch.Tensor, dtype: torch.dtype | None, op: str) -> torch.dtype:
    """The output dtype of ``op`` (``"sum"``/``"mean"``) for input ``x`` and the ``dtype`` argument."""
    require_tensor("x", x)
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {type(dtype).__name__}")
        if dtype not in OUTPUT_DTYPES:
            raise TypeError(f"dtype must be one of float32, bfloat16, float16, float64, got {dtype}")
        if x.dtype.is_complex:
            raise TypeError(f"x must be a real tensor, got {x.dtype}")
        return dtype
    if x.dtype in INPUT_DTYPES:
        return x.dtype
    if x.dtype.is_complex:
        raise TypeError(f"x must be a real tensor, got {x.dtype}")
    raise TypeError(
        f"{op}(): x has dtype {x.dtype}; integer and bool inputs need an explicit floating dtype= argument "
        "(float32, bfloat16, float16)"
    )


def output_shape(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    return tuple(s for i, s in enumerate(x.shape) if i not in dims)


def accumulate_dtype(x_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in (x_dtype, out_dtype) else torch.float32


def _reduce(x: torch.Tensor, dim: Dim, keepdim: bool, dtype: torch.dtype | None, op: str) -> torch.Tensor:
    out_dtype = result_dtype(x, dtype, op)
    dims = normalize_dims(x, dim)
    if not x.is_floating_point():
        x = x.to(out_dtype)
    acc = x.to(accumulate_dtype(x.dtype, out_dtype))
    fn = torch.sum if op == "sum" else torch.mean
    if x.dim() == 0:
        return acc.to(out_dtype)
    return fn(acc, dim=dims, keepdim=keepdim).to(out_dtype)


def sum(x: torch.Tensor, dim: Dim = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum of ``x`` over ``dim`` accumulated in float32 (float64 for float64); see the module docstring."""
    return _reduce(x, dim, keepdim, dtype, "sum")


def mean(x: torch.Tensor, dim: Dim = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``dim`` accumulated in float32 (float64 for float64); NaN over an empty axis."""
    return _reduce(x, dim, keepdim, dtype, "mean")
