"""The learning-rate schedule: linear warm-up from 0, constant, then polynomial decay to 0.

NVIDIA's DLRM and MLPerf's DLRM recipe, as a pure function of the step, so that a run resumed at step ``k`` uses
exactly the rates of an uninterrupted run (the step counter is in the checkpoint). The update of step ``s``
(0-based: the first update is ``s = 0``) uses ``base * factor(s)`` with

* ``factor(s) = (s + 1) / warmup_steps`` while ``s < warmup_steps`` (linear from 0, reaching 1 at the last
  warm-up step);
* ``factor(s) = ((decay_end - s) / decay_steps) ** decay_power`` for ``decay_start_step <= s < decay_end``
  (``decay_end = decay_start_step + decay_steps``), and 0 from ``decay_end`` on;
* 1 otherwise (also always when ``decay_steps == 0`` and ``warmup_steps == 0``).

Each parameter group (the MLPs, the embedding tables) has its own base rate and the same factor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LRSchedule"]


@dataclass(frozen=True)
class LRSchedule:
    """Learning rates per step of both parameter groups; see the module docstring for the formula.

    Raises ``ValueError`` (naming the field) for negative step counts or rates, a non-positive ``decay_power``,
    or a decay that starts inside the warm-up.
    """

    lr_dense: float
    lr_sparse: float
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0

    def __post_init__(self) -> None:
        for key in ("lr_dense", "lr_sparse", "warmup_steps", "decay_start_step", "decay_steps"):
            if getattr(self, key) < 0:
                raise ValueError(f"learning-rate schedule: {key} must be >= 0, got {getattr(self, key)}")
        if not self.decay_power > 0:
            raise ValueError(f"learning-rate schedule: decay_power must be positive, got {self.decay_power}")
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            raise ValueError(f"learning-rate schedule: decay_start_step ({self.decay_start_step}) comes before the "
                             f"end of the warm-up ({self.warmup_steps})")

    @classmethod
    def from_config(cls, cfg: Any) -> LRSchedule:
        """The schedule of a :class:`~fuselab.dlrm.config.DLRMConfig` (its lr and schedule fields)."""
        return cls(float(cfg.lr_dense), float(cfg.lr_sparse), int(cfg.warmup_steps), int(cfg.decay_start_step),
                   int(cfg.decay_steps), float(cfg.decay_power))

    @property
    def decay_end(self) -> int:
        return self.decay_start_step + self.decay_steps

    def factor(self, step: int) -> float:
        """Multiplier of the base rates for the update of (0-based) ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay_steps:
            if step >= self.decay_end:
                return 0.0
            if step >= self.decay_start_step:
                return ((self.decay_end - step) / self.decay_steps) ** self.decay_power
        return 1.0

    def __call__(self, step: int) -> tuple[float, float]:
        """``(lr_dense, lr_sparse)`` for the update of ``step``."""
        f = self.factor(step)
        return self.lr_dense * f, self.lr_sparse * f

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
