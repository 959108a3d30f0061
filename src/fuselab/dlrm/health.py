"""Divergence: a loss or a weight that is no longer finite, found where the run reads its losses anyway.

The trainer keeps each step's loss on the device and reads it back only at a few points: the progress line
(every half second), the periodic evaluation and checkpoint, the end of the run. Each of those points checks every
loss since the previous one in the same host read (:func:`latest_and_first_bad`, :func:`first_non_finite`), so a
step captured in a CUDA graph gets no extra synchronization; before a checkpoint the weights are checked too
(:func:`non_finite_parameters`), so that no checkpoint ever holds non-finite weights and the last good one is never
replaced by one that does. A run that diverged stops with :class:`TrainingDiverged` (exit status
:data:`DIVERGED_EXIT` in the CLI), naming the first step whose loss was not finite and the learning rates of that
step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

#: exit status of ``fuselab dlrm train`` when the loss or the weights stop being finite
DIVERGED_EXIT = 3


class TrainingDiverged(Exception):
    """The loss (or, ``names``, the weights) stopped being finite at ``step``; nothing was checkpointed after.

    ``lr``: the (dense, sparse) learning rates of that step; ``last_good``: the last checkpoint written, as (path,
    step), or None. ``exit_code`` is :data:`DIVERGED_EXIT`."""

    exit_code = DIVERGED_EXIT

    def __init__(self, step: int, lr: tuple[float, float], names: Sequence[str] = (),
                 last_good: tuple[Path, int] | None = None):
        self.step, self.lr, self.names, self.last_good = step, lr, list(names), last_good
        what = (f"the weights are not finite after step {step} ({', '.join(self.names[:3])}"
                f"{', ...' if len(self.names) > 3 else ''})" if self.names
                else f"the loss is not finite (nan or inf) at step {step}")
        saved = (f"the last checkpoint, {last_good[0]} (step {last_good[1]}), holds finite weights"
                 if last_good is not None else "no checkpoint of this run holds its weights")
        super().__init__(
            f"training diverged: {what}, with learning rates {lr[0]:.3g} (dense) and {lr[1]:.3g} (sparse). A "
            "learning rate too high for this model and batch is the likely cause: lower --lr-dense / --lr-sparse "
            "(or raise warmup_steps) and train again (a resumed run keeps its checkpoint's learning rates). "
            f"Nothing was checkpointed after the divergence; {saved}")


def first_non_finite(losses: Sequence[Tensor]) -> int | None:
    """Index of the first loss of ``losses`` (0-dim tensors) that is nan or inf; None when all are finite. One
    host read."""
    if not losses:
        return None
    return latest_and_first_bad(losses)[1]


def latest_and_first_bad(losses: Sequence[Tensor]) -> tuple[float, int | None]:
    """(the last loss of ``losses``, the index of the first that is not finite or None), in one host read."""
    values = torch.stack([t.reshape(()) for t in losses]).float()
    n = values.numel()
    bad = torch.where(torch.isfinite(values), n, torch.arange(n, device=values.device)).min()
    last, first_bad = torch.stack([values[-1], bad.to(values.dtype)]).tolist()
    index = int(first_bad)
    return last, (index if index < n else None)


#: elements per piece of a finiteness check: a whole MLPerf table's flags would take as many bytes as its elements
FINITE_PIECE = 1 << 26


def _all_finite(t: Tensor) -> Tensor:
    """0-dim bool: every element of ``t`` is finite (checked in pieces of :data:`FINITE_PIECE` elements)."""
    flat = t.detach().reshape(-1)
    if flat.numel() <= FINITE_PIECE:
        return torch.isfinite(flat).all()
    return torch.stack([torch.isfinite(piece).all() for piece in flat.split(FINITE_PIECE)]).all()


def non_finite_parameters(module: nn.Module) -> list[str]:
    """Names of ``module``'s floating-point parameters and buffers that hold a nan or an inf (one host read when
    all are finite)."""
    named = [(name, t) for name, t in (*module.named_parameters(), *module.named_buffers())
             if t.is_floating_point() and t.numel()]
    if not named:
        return []
    flags = torch.stack([_all_finite(t) for _, t in named])
    if bool(flags.all()):
        return []
    return [name for (name, _), ok in zip(named, flags.tolist()) if not ok]


class FiniteWatch:
    """How far a run's losses are known to be finite (``checked``: the first ``checked`` losses of the run's list),
    and the step whose weights were last found finite (``weights_at``)."""

    def __init__(self) -> None:
        self.checked = 0
        self.weights_at = -1

    def first_bad(self, losses: Sequence[Tensor], first_step: int, model: nn.Module | None = None,
                  step: int = 0) -> tuple[int | None, list[str]]:
        """(the first step since the last check whose loss is not finite, else with ``model`` the current ``step``
        when a weight is not, else None; the names of those weights). ``losses[i]`` is step ``first_step + i + 1``'s.
        """
        bad = first_non_finite(losses[self.checked:])
        if bad is not None:
            return first_step + self.checked + bad + 1, []
        if model is not None and self.weights_at != step:
            names = non_finite_parameters(model)
            if names:
                return step, names
        return None, []

    def latest(self, losses: Sequence[Tensor], first_step: int) -> tuple[float, int | None]:
        """(the latest loss, the first step since the last check whose loss is not finite or None): one host read."""
        current, bad = latest_and_first_bad(losses[self.checked:])
        return current, None if bad is None else first_step + self.checked + bad + 1

    def passed(self, count: int, weights_step: int | None = None) -> None:
        """The first ``count`` losses (and, given, the weights at ``weights_step``) are finite."""
        self.checked = count
        if weights_step is not None:
            self.weights_at = weights_step
