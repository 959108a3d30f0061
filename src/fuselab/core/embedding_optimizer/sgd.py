"""SGD: ``w -= lr * g``, no state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import EmbeddingOptimizer

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class SGD(EmbeddingOptimizer):
    """Plain SGD on the rows the batch touched: ``w -= lr * g`` (torch.optim.SGD without momentum); state ``(0,)``."""

    name: ClassVar[str] = "sgd"
    has_state: ClassVar[bool] = False

    def state_shape(self, rows: int, dim: int) -> tuple[int, ...]:
        return (0,)

    def update_(self, weight: Tensor, state: Tensor, grad: Tensor, lr: Tensor, rows: Tensor | None = None) -> None:
        lr = lr.to(weight.dtype)
        if rows is None:
            weight.sub_(lr * grad)
        else:
            weight.index_put_((rows,), weight[rows] - lr * grad)

    def dense_states(self, params: Sequence[Tensor]) -> list[Tensor]:
        return []

    def dense_update_(self, params: Sequence[Tensor], grads: Sequence[Tensor], states: Sequence[Tensor],
                      lr: Tensor) -> None:
        import torch  # first use (torch is loaded whenever tensors exist): the CLI reads these names without it

        torch._foreach_sub_(params, torch._foreach_mul(grads, lr))
