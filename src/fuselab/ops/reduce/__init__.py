"""Deterministic ``fuselab.sum`` / ``fuselab.mean``: ``kernels.py`` (Triton), ``launch.py`` (planner and out-param
launcher), ``op.py`` (the op and the public functions); argument checks live with the reference
(:mod:`fuselab.reference.reduce`), which shares them."""

from .op import mean, sum

__all__ = ["mean", "sum"]
