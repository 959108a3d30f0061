"""Teaching baselines: deliberately simple kernels kept to show what the fused ops improve on.

They live inside the package (not in ``benchmarks/``) so the lab imports them without depending on
the working directory. They are benchmark providers only, not public API.
"""
