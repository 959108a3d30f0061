"""Argument checks shared by every op, the references and the CUDA backends. Each raises TypeError/ValueError
naming the argument."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_float(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """``t`` is a tensor of one of ``dtypes`` (float64 is accepted for gradcheck on CPU)."""
    require_tensor(name, t)
    allowed = (*dtypes, torch.float64)
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have a floating dtype ({_dtype_names(dtypes)}), got {t.dtype}")


def require_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) are on one device; returns it."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {k: v.device for k, v in present.items()}
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {first}; all tensors must share a device")
    return first


def require_ndim(name: str, t: torch.Tensor, ndim: int, layout_hint: str) -> None:
    """ValueError naming ``name`` unless ``t`` has ``ndim`` dims (``layout_hint`` shows the expected shape)."""
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {layout_hint}, got shape {tuple(t.shape)}")


# ---------------------------------------------------------------------------------------------- memory overlap
#: nodes the overlap search may visit before it answers "overlapping" (layouts no ordinary view produces)
_OVERLAP_BUDGET = 4096


def storage_base(t: torch.Tensor) -> int:
    """Address of element 0 of ``t``'s storage: equal for two tensors exactly when they share a storage."""
    return t.data_ptr() - t.storage_offset() * t.element_size()


def _solvable(terms: list[tuple[int, int, int]], target: int) -> bool:
    """Whether ``sum(c * x) == target`` has an integer solution with ``lo <= x <= hi`` for each term ``(c, lo, hi)``
    (True also when the search needs more than :data:`_OVERLAP_BUDGET` steps). Terms with equal ``|c|`` merge
    exactly (their sums fill the summed range); the search then fixes the largest coefficient first, where the rest
    can reach only a narrow window."""
    merged: dict[int, list[int]] = {}
    for c, lo, hi in terms:
        if c == 0:
            continue
        if c < 0:
            c, lo, hi = -c, -hi, -lo
        bounds = merged.setdefault(c, [0, 0])
        bounds[0] += lo
        bounds[1] += hi
    items = sorted(merged.items(), reverse=True)
    rest_lo, rest_hi = [0] * (len(items) + 1), [0] * (len(items) + 1)
    for i in range(len(items) - 1, -1, -1):
        c, (lo, hi) = items[i]
        rest_lo[i], rest_hi[i] = rest_lo[i + 1] + c * lo, rest_hi[i + 1] + c * hi
    budget = [_OVERLAP_BUDGET]

    def search(i: int, remaining: int) -> bool:
        if i == len(items):
            return remaining == 0
        budget[0] -= 1
        if budget[0] < 0:
            return True
        c, (lo, hi) = items[i]
        first = max(lo, -((rest_hi[i + 1] - remaining) // c))  # ceil((remaining - rest_hi) / c)
        last = min(hi, (remaining - rest_lo[i + 1]) // c)
        return any(search(i + 1, remaining - c * x) for x in range(first, last + 1))

    return search(0, target)


def overlapping(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of ``a`` and some element of ``b`` share memory: exact for views of one storage with one
    element size (two slices of a packed QKV tensor do not overlap; ``x`` and ``x.t()`` do), by address ranges for
    views of other element sizes; tensors of different storages never overlap."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device or storage_base(a) != storage_base(b):
        return False
    size = a.element_size()
    if b.element_size() != size:
        def span(t: torch.Tensor) -> tuple[int, int]:
            lo = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
            hi = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
            return t.data_ptr() + lo * t.element_size(), t.data_ptr() + (hi + 1) * t.element_size()
        (a0, a1), (b0, b1) = span(a), span(b)
        return a0 < b1 and b0 < a1
    terms = [(s, 0, n - 1) for n, s in zip(a.shape, a.stride()) if n > 1]
    terms += [(-s, 0, n - 1) for n, s in zip(b.shape, b.stride()) if n > 1]
    return _solvable(terms, b.storage_offset() - a.storage_offset())


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (an expanded tensor, ``as_strided`` views that repeat addresses):
    what an op writing ``t`` in place must refuse."""
    dims = sorted((abs(s), n) for n, s in zip(t.shape, t.stride()) if n > 1)
    if any(s == 0 for s, _ in dims) or any(dims[i][0] == dims[i + 1][0] for i in range(len(dims) - 1)):
        return True
    # two index vectors differ by u != 0 with sum(u * stride) == 0; its first non-zero entry taken positive
    return any(_solvable([(s, 0, 0) for s, _ in dims[:i]] + [(dims[i][0], 1, dims[i][1] - 1)]
                         + [(s, 1 - n, n - 1) for s, n in dims[i + 1:]], 0) for i in range(len(dims)))


def require_distinct_elements(name: str, t: torch.Tensor, remedy: str = "or inplace=False") -> None:
    """``ValueError`` naming ``name`` when elements of ``t``, which an op writes in place, share memory (a function of
    shape and strides: a call's signature holds it, so its validation checks it once). ``remedy``: as
    :func:`require_disjoint`'s."""
    if self_overlapping(t):
        raise ValueError(f"{name} is written in place but some of its elements share memory (e.g. an expanded "
                         f"tensor); pass a tensor whose elements are distinct{', ' + remedy if remedy else ''}")


def require_disjoint(written: dict[str, torch.Tensor | None], read: dict[str, torch.Tensor | None],
                     remedy: str = "or inplace=False") -> None:
    """``ValueError`` naming both when a tensor an op writes in place (``written``) overlaps another operand it writes
    or reads: for every call (the actual tensors decide). Storages are compared first (three pointer reads per
    tensor); only views of one storage take the exact check (:func:`overlapping`). ``remedy``: the message's way out
    besides distinct tensors (empty: none)."""
    seen: list[tuple[str, torch.Tensor, int]] = []  # the written tensors so far
    for name, t in written.items():
        if t is not None:
            base = t.data_ptr() - t.storage_offset() * t.element_size()
            for other_name, other, other_base in seen:
                if other_base == base and overlapping(other, t):
                    _overlap_error(other_name, name, remedy)
            seen.append((name, t, base))
    for name, t in read.items():
        if t is not None:
            base = t.data_ptr() - t.storage_offset() * t.element_size()
            for other_name, other, other_base in seen:
                if other_base == base and overlapping(other, t):
                    _overlap_error(other_name, name, remedy)


def _overlap_error(written: str, other: str, remedy: str) -> None:
    raise ValueError(f"{written} and {other} overlap in memory, and {written} is written in place; pass tensors "
                     f"that do not share elements{', ' + remedy if remedy else ''}")


def rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[M, N]`` view (strides kept), M the product of the leading dims (named, not inferred: an
    empty ``t`` has no single M). Leading dims that cannot be merged without a copy (exotic >2-D strides) fall
    back to ``reshape``, i.e. a copy: documented limit."""
    if t.dim() == 2:
        return t
    shape = (math.prod(t.shape[:-1]), t.shape[-1])
    try:
        return t.view(shape)
    except RuntimeError:
        return t.reshape(shape)
