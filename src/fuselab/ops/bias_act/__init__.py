"""Fused bias + scaled residual + activation (``fuselab.bias_act``): ``kernels.py`` (Triton), ``checks.py``
(``validate`` -> ``BiasActCall``), ``launch.py`` (tuning, ``plan``, ``forward`` and the backward's), ``op.py`` (the
ops and the public function)."""

from .checks import check_activation
from .op import ACTIVATIONS, bias_act

__all__ = ["ACTIVATIONS", "bias_act", "check_activation"]
