"""Fused bias + scaled residual + activation (``fuselab.bias_act``): ``kernels.py`` (Triton), ``launch.py`` (tuning,
plans, out-param launchers), ``op.py`` (the ops and the public function), ``checks.py`` (argument checks).
Importing this package does not import Triton (the launchers load on first use)."""

from .checks import check_activation
from .op import ACTIVATIONS, bias_act

__all__ = ["ACTIVATIONS", "bias_act", "check_activation"]
