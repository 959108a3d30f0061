"""Deterministic ``fuselab.sum`` / ``fuselab.mean``: ``kernels.py`` (Triton), ``checks.py`` (``validate`` ->
``ReduceCall``; the argument checks are the reference's, :mod:`fuselab.reference.reduce`, which the CPU path shares),
``plan.py`` (the schedule: kernel, tiles, split), ``launch.py`` (``plan``, ``forward``), ``op.py`` (the op and the
public functions)."""

from .op import mean, sum

__all__ = ["mean", "sum"]
