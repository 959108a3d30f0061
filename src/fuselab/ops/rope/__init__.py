"""Rotary position embedding (``fuselab.apply_rope``): ``kernels.py`` (Triton), ``launch.py`` (tuning, plan,
out-param launcher), ``op.py`` (the ops and the public function), ``checks.py`` (argument checks). The angle math
(:func:`rope_frequencies`, :func:`rope_cos_sin`) is :mod:`fuselab.core.rope_math`, shared with the reference."""

from fuselab.core.rope_math import rope_cos_sin, rope_frequencies

from .launch import LAYOUTS
from .op import apply_rope

__all__ = ["LAYOUTS", "apply_rope", "rope_cos_sin", "rope_frequencies"]
