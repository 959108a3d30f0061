"""The GEMM family with fused epilogues and prologues (``docs/gemm.md``): ``kernels.py`` (the one Triton kernel),
``launch.py`` (tuning, specs, plans, the launcher), ``steps.py`` (each op's launch sequences), ``checks.py`` (typed,
validated calls), ``op.py`` (the linear op and :func:`gemm`). Importing this package does not import Triton (the
launchers load on first use)."""

from fuselab.reference.gemm import LoRA

from .checks import KEEP_CHOICES, GemmCall
from .op import gemm

__all__ = ["KEEP_CHOICES", "GemmCall", "LoRA", "gemm"]
