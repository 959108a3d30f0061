"""Tuning knobs as data: each op's planner reads a frozen dataclass (``RopeTuning``, ``BiasActTuning``,
``ReduceTuning``, ``InteractionTuning``, defined beside its planner) through :func:`current`; a sweep overrides them
with :func:`override`.

The dataclasses compare by identity (``eq=False``): a plan cache keyed on the tuning object hashes it in
nanoseconds, and a frozen object's identity stands for its values.

Example (a sweep)::

    from fuselab.ops.tuning import override
    from fuselab.ops.bias_act.launch import BiasActTuning

    with override(BiasActTuning(fwd_tile_bytes=8192)):
        fuselab.bias_act(x, b)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

from .opdef import clear

T = TypeVar("T")

_ACTIVE: dict[type, object] = {}
_DEFAULTS: dict[type, object] = {}


def current(cls: type[T]) -> T:
    """The tuning of type ``cls`` in force: the innermost :func:`override`'s, else the default ``cls()``
    (one object per class, so that plan caches keyed on it hit)."""
    active = _ACTIVE.get(cls)
    if active is not None:
        return active
    default = _DEFAULTS.get(cls)
    if default is None:
        default = _DEFAULTS[cls] = cls()
    return default


@contextlib.contextmanager
def override(*tunings: object) -> Iterator[None]:
    """Use ``tunings`` (instances of the ops' tuning dataclasses) inside the block. Every launch cache and plan memo
    is emptied on entry and on exit (:func:`fuselab.ops.clear`), so no launch planned under other knobs is
    repeated. Not thread-safe: for sweeps, not for serving."""
    saved = dict(_ACTIVE)
    for tuning in tunings:
        if not hasattr(tuning, "__dataclass_fields__"):
            raise TypeError(f"override takes tuning dataclasses, got {type(tuning).__name__}")
        _ACTIVE[type(tuning)] = tuning
    clear()
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(saved)
        clear()
