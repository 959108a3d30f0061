"""The low-overhead Triton launch shared by every launcher (:func:`launch`, :func:`relaunch`), and the keys of repeated
launches are :mod:`fuselab.ops.opdef`'s (:func:`~fuselab.ops.opdef.operand`, :func:`~fuselab.ops.opdef.layout`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

import torch

try:  # host-built TMA descriptors (Triton >= 3.3); kernels read through them only where tma_capable() says so
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

from .opdef import LaunchCache, scalar_class

#: compiled kernels by (kernel, caller key, device, argument signature)
_COMPILED = LaunchCache("compiled kernels", limit=8192)


@functools.cache
def _runtime_knobs():
    """Triton's runtime knobs (launch hooks: read on every launch), or None on versions without ``triton.knobs``."""
    import triton

    return getattr(getattr(triton, "knobs", None), "runtime", None)


def _active(hook):
    """``hook``, or None when it is an empty ``HookChain`` (Triton always installs one): the launcher then
    skips building launch metadata and calling hooks, as it would with no hook at all."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


def _arg_class(t) -> tuple:
    """What Triton specializes a pointer argument on (dtype, 16-byte alignment), or a TMA descriptor on (its
    tensor's dtype, block shape)."""
    if isinstance(t, torch.Tensor):
        return t.dtype, t.data_ptr() & 15 == 0
    return t.base.dtype, tuple(t.block_shape)


def launch(kernel, key: Hashable, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple,
           constexprs: dict[str, Any] | Callable[[], dict[str, Any]], *, dynamic: int = 0) -> tuple | None:
    """``kernel[grid](*tensors, *scalars, **constexprs)`` with less host time per call on GPUs.

    ``JITFunction.run`` binds and specializes every argument on every call (17-29 µs per launch on the
    H100 machine's host, where a torch kernel launch costs 6-10 µs). The first call of each signature
    goes through it and compiles; later calls with the same signature call the cached
    ``CompiledKernel``'s launcher directly. The signature covers everything Triton specializes on:
    ``key`` (the caller's identity for ``constexprs``: block sizes, flags, warps), each tensor's dtype
    and 16-byte alignment (a TMA descriptor's dtype and block shape), the current device, and the
    scalars: the first ``dynamic`` of them (values that change from call to call, e.g. a decoding
    offset or a scale) by Triton's class (int: 1, a multiple of 16, int32 or wider; others: their
    type), the rest (sizes and strides) by value, a single C-level tuple instead of one Python step per
    argument (the per-argument signature was 20 µs of a 26 µs launch with 24 arguments on that host).
    ``tensors`` are the kernel's leading parameters, then ``scalars`` in order; ``constexprs`` name all
    the remaining ones (plus options such as ``num_warps``); it may be a function returning them,
    called only when a signature is first seen (building the dict on every call is host time wasted
    on a cache hit). Launch hooks (profilers) are honoured as ``JITFunction.run`` does.
    ``tensors[0]`` must be a tensor (its device picks the path); later entries may be TMA descriptors
    (``triton.tools.tensor_descriptor.TensorDescriptor``). Under the interpreter, or on a Triton
    without ``triton.knobs``, it is the plain launch.

    Returns the signature's entry for :func:`relaunch` (a plain launch again under the interpreter).
    """
    knobs = _runtime_knobs()
    if not tensors[0].is_cuda or knobs is None:
        if callable(constexprs):
            constexprs = constexprs()
        kernel[grid](*tensors, *scalars, **constexprs)
        return kernel, tuple(constexprs.items()), None  # hashable, as the compiled entries
    device = torch.cuda.current_device()
    signature = (id(kernel), key, device, tuple([_arg_class(t) for t in tensors]),
                 tuple([scalar_class(a) for a in scalars[:dynamic]]) if dynamic else None,
                 scalars[dynamic:] if dynamic else scalars)
    hit = _COMPILED.get(signature)
    if hit is None:
        if callable(constexprs):
            constexprs = constexprs()
        compiled = kernel[grid](*tensors, *scalars, **constexprs)
        tail = tuple(constexprs[name] for name in kernel.arg_names[len(tensors) + len(scalars):])
        hit = (compiled, tail, device)
        _COMPILED.keep(signature, hit)
        return hit
    _run(hit, grid, tensors, scalars, knobs)
    return hit


def relaunch(entry: tuple, grid: tuple[int, ...], tensors: tuple[torch.Tensor, ...], scalars: tuple) -> None:
    """Launch again what :func:`launch` returned ``entry`` for, skipping its signature: the caller guarantees
    the same signature (tensor dtypes and 16-byte alignment, the non-dynamic scalars' values, the device).
    For launches prepared once and repeated in a hot path (a backward that runs on the autograd engine's
    thread, where every Python step costs several times its main-thread time)."""
    if entry[2] is None:  # interpreter, or a Triton without knobs: the plain launch
        entry[0][grid](*tensors, *scalars, **dict(entry[1]))
        return
    _run(entry, grid, tensors, scalars, _runtime_knobs())


def _run(entry: tuple, grid: tuple[int, ...], tensors: tuple, scalars: tuple, knobs) -> None:
    compiled, tail, device = entry
    stream = torch._C._cuda_getCurrentRawStream(device)
    grid_y = grid[1] if len(grid) > 1 else 1
    grid_z = grid[2] if len(grid) > 2 else 1
    enter, leave = _active(knobs.launch_enter_hook), _active(knobs.launch_exit_hook)
    metadata = compiled.launch_metadata(grid, stream, *tensors, *scalars, *tail) if enter is not None else None
    compiled.run(grid[0], grid_y, grid_z, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave,
                 *tensors, *scalars, *tail)
