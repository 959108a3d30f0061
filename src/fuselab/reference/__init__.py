"""Pure-PyTorch reference of every op: the CPU path of the public API and the tests' oracle.

One module per op (``fuselab.reference.rope``, ``.bias_act``, ``.reduce``); each function
has exactly the semantics of the fused op and is differentiable by autograd, so the lab
and the tests call it on float64 copies of the inputs.
"""
