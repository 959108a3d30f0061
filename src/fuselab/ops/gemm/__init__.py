"""The GEMM family with fused epilogues and prologues (``docs/gemm.md``): ``kernels.py`` (the Triton kernels),
``spec.py`` (tuning, specs and plans as records), ``launch.py`` (the planner and the launchers), ``steps.py`` (each
op's launch sequences), ``checks.py`` (typed, validated calls), and the ops: ``op.py`` (:func:`gemm`, the fused
linear layer with LoRA), ``dcn.py`` (:func:`dcn_cross`), ``dcn_net.py`` (:func:`dcn_cross_net`), ``qkv.py``
(:func:`qkv_rope`), ``cast.py``
(:func:`cast_update_`). Importing this package does not import Triton (the launchers load on first use)."""

from fuselab.reference.gemm import LoRA

from .cast import cast_update_
from .checks import KEEP_CHOICES, GemmCall
from .dcn import dcn_cross
from .dcn_net import dcn_cross_net
from .op import gemm
from .qkv import qkv_rope

__all__ = ["KEEP_CHOICES", "GemmCall", "LoRA", "cast_update_", "dcn_cross", "dcn_cross_net", "gemm", "qkv_rope"]
