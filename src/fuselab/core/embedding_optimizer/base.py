"""The protocol of an embedding optimizer: a frozen, typed choice of the tables' optimizer.

Shapes: ``R`` rows of all tables, ``D`` embedding dim, ``U`` rows one update touches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from torch import Tensor


def check_eps(eps: object) -> float:
    """``eps`` as a float; TypeError for a non-number, ValueError unless finite and > 0 (both naming ``eps``)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    return float(eps)


@dataclass(frozen=True)
class EmbeddingOptimizer:
    """An optimizer of embedding tables: its kind (:attr:`name`), its hyper-parameters (the dataclass fields), the
    shape of its state (:meth:`state_shape`) and its reference update (:meth:`update_`, any float dtype, float64
    included: the oracle of the fused kernels and the update of the torch paths). The learning rate is not a
    hyper-parameter: it is a 0-dim tensor the caller owns (a schedule writes it in place).

    The DLRM names one optimizer for the tables and the MLPs: :meth:`dense_states` and :meth:`dense_update_` are the
    element-wise rule it applies to the MLP parameters (row-wise Adagrad: element-wise Adagrad).
    """

    #: the kind, as configs and the CLI spell it
    name: ClassVar[str] = ""
    #: False for a kind without state (its state is an empty ``(0,)`` tensor)
    has_state: ClassVar[bool] = True

    def state_shape(self, rows: int, dim: int) -> tuple[int, ...]:
        """Shape of the state of ``rows`` table rows of width ``dim`` (``(0,)`` without state)."""
        raise NotImplementedError

    def state_floats_per_row(self, dim: int) -> int:
        """State values per table row of width ``dim`` (memory plans)."""
        return math.prod(self.state_shape(1, dim)) if self.has_state else 0

    def update_(self, weight: Tensor, state: Tensor, grad: Tensor, lr: Tensor, rows: Tensor | None = None) -> None:
        """One step on ``weight`` (R, D) and ``state`` in place: ``rows`` (U,) int64 the rows and ``grad`` (U, D)
        their summed gradients (a row may repeat when every repeat carries the same gradient: each writes the same
        value), or ``rows`` None and ``grad`` (R, D) for every row. ``lr`` a 0-dim tensor. Call it under no_grad."""
        raise NotImplementedError

    def dense_states(self, params: Sequence[Tensor]) -> list[Tensor]:
        """Zero state of the element-wise rule for each dense parameter (``[]`` for a rule without state)."""
        raise NotImplementedError

    def dense_update_(self, params: Sequence[Tensor], grads: Sequence[Tensor], states: Sequence[Tensor],
                      lr: Tensor) -> None:
        """The element-wise rule on dense parameters in place, as multi-tensor (``torch._foreach_*``) ops: no host
        synchronization, so a CUDA graph can hold it. ``lr``: a 0-dim tensor on the parameters' device."""
        raise NotImplementedError

    def __str__(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items())
        return f"{self.name}({options})" if options else self.name
