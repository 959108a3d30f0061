"""Adagrad, element-wise and row-wise: ``s += g²`` (or its row mean), ``w -= lr * g / (sqrt(s) + eps)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .base import EmbeddingOptimizer, check_eps

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Adagrad(EmbeddingOptimizer):
    """Element-wise Adagrad, as ``torch.optim.Adagrad`` (``lr_decay=0``, ``weight_decay=0``, state starting at zero):
    ``s += g*g``; ``w -= lr * g / (sqrt(s) + eps)``; state ``(R, D)``. Raises TypeError/ValueError naming ``eps``."""

    name: ClassVar[str] = "adagrad"
    eps: float = 1e-8

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", check_eps(self.eps))

    def state_shape(self, rows: int, dim: int) -> tuple[int, ...]:
        return (rows, dim)

    def _square(self, grad: Tensor) -> Tensor:
        """What one step adds to the state of each row (element-wise here)."""
        return grad * grad

    def _denominator(self, state: Tensor) -> Tensor:
        """``sqrt(s) + eps``, broadcastable against the rows' gradients."""
        return state.sqrt() + self.eps

    def update_(self, weight: Tensor, state: Tensor, grad: Tensor, lr: Tensor, rows: Tensor | None = None) -> None:
        lr = lr.to(weight.dtype)
        if rows is None:
            state.add_(self._square(grad))
            weight.sub_(lr * (grad / self._denominator(state)))
            return
        new = state[rows] + self._square(grad)
        state.index_put_((rows,), new)
        weight.index_put_((rows,), weight[rows] - lr * (grad / self._denominator(new)))

    def dense_states(self, params: Sequence[Tensor]) -> list[Tensor]:
        return [p.new_zeros(p.shape) for p in params]

    def dense_update_(self, params: Sequence[Tensor], grads: Sequence[Tensor], states: Sequence[Tensor],
                      lr: Tensor) -> None:
        import torch  # first use (torch is loaded whenever tensors exist): the CLI reads these names without it

        torch._foreach_addcmul_(states, grads, grads)
        std = torch._foreach_sqrt(states)
        torch._foreach_add_(std, self.eps)
        update = torch._foreach_div(grads, std)
        torch._foreach_mul_(update, lr)
        torch._foreach_sub_(params, update)


@dataclass(frozen=True)
class RowwiseAdagrad(Adagrad):
    """Row-wise Adagrad (FBGEMM's and torchrec's ``ROWWISE_ADAGRAD``): one state value per row, ``s += mean_D(g*g)``;
    ``w -= lr * g / (sqrt(s) + eps)``; state ``(R,)``. On dense parameters it is element-wise Adagrad (row-wise state
    only pays off for embedding rows)."""

    name: ClassVar[str] = "rowwise_adagrad"

    def state_shape(self, rows: int, dim: int) -> tuple[int, ...]:
        return (rows,)

    def _square(self, grad: Tensor) -> Tensor:
        return (grad * grad).mean(dim=1)

    def _denominator(self, state: Tensor) -> Tensor:
        return (state.sqrt() + self.eps)[:, None]
