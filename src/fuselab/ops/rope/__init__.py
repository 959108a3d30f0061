"""Rotary position embedding (``fuselab.apply_rope``): ``kernels.py`` (Triton), ``checks.py`` (validation: the
``RopeCall``), ``launch.py`` (tuning, plan, launch), ``op.py`` (the ops and the public function). The layouts are
:mod:`fuselab.core.rope_layouts`'s and the angle math (:func:`rope_frequencies`, :func:`rope_cos_sin`)
:mod:`fuselab.core.rope_math`'s, shared with the reference."""

from fuselab.core.rope_layouts import LAYOUTS
from fuselab.core.rope_math import rope_cos_sin, rope_frequencies

from .op import apply_rope

__all__ = ["LAYOUTS", "apply_rope", "rope_cos_sin", "rope_frequencies"]
