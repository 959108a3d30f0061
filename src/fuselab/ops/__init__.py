"""Fused ops: one module per op (Triton kernels, launchers, torch.library registration, autograd)."""
