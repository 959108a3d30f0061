"""The one seam of every Triton launch of the ops: the plain launch ``kernel[grid](*args, **constexprs)``, or a fast
path that calls the compiled kernel's own launcher.

Why a fast path: ``JITFunction.run`` binds and specializes every argument on every call, 17-29 µs of host time per
launch on the H100 machine (a torch kernel launch costs 6-10 µs), and eager decoding and backwards on the autograd
thread pay it on every op. The fast path specializes once per planned launch, then calls the ``CompiledKernel``'s
launcher with the current stream: Triton's private API (``CompiledKernel.run``, ``function``, ``packed_metadata``,
``launch_metadata``) and ``torch._C._cuda_getCurrentRawStream``. A Triton upgrade may cost host time, never
correctness. Which path runs is decided per launch:

* plain for tensors off CUDA (the Triton interpreter), inside :func:`plain_launches` (tests: every launch inside),
  and for the launches first made while ``FUSELAB_LAUNCHER=plain``: the variable is read when a planned launch (or
  a launch signature of :func:`launch`) first runs, not on every launch, where it would cost host time; plans made
  later (e.g. after :func:`fuselab.ops.clear`) read it again;
* else fast, once a probe at its first use has found ``triton.knobs`` and the stream getter. A compiled kernel
  without the attributes the fast path calls, or a fast launch that raises ``AttributeError``/``TypeError`` (what a
  changed private API raises before launching), switches the fast path off for the process with one warning; that
  launch and every later one are plain.

The fast path reuses one specialization: a planned launch must be given tensors of the dtypes and 16-byte alignment,
and per-call scalars of the Triton specialization class (:func:`~fuselab.ops.opdef.scalar_class`), of its first
launch. The ops guarantee it by keying their plans with signatures that hold exactly these
(:func:`~fuselab.ops.opdef.tensor_signature`).

:class:`Launch` is one planned launch (what the plans of ported ops hold); :func:`launch`/:func:`relaunch` are the
same seam for the ops that still keep launch records (a :class:`Compiled` each).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import torch

try:  # host-built TMA descriptors (Triton >= 3.3); kernels read through them only where tma_capable() says so
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

from .opdef import LaunchCache, scalar_class

ENV_VAR = "FUSELAB_LAUNCHER"
LAUNCHERS = ("fast", "plain")

#: launches by path since import (tests read it to see which path ran)
counts: dict[str, int] = {"fast": 0, "plain": 0}

_plain_depth = 0  # nesting of plain_launches()
_fast_ok: bool | None = None  # the probe's answer; None until the first fast launch asks


@contextlib.contextmanager
def plain_launches() -> Iterator[None]:
    """Every launch inside (on every thread, the autograd engine's included) takes the plain path."""
    global _plain_depth
    _plain_depth += 1
    try:
        yield
    finally:
        _plain_depth -= 1


def fast_path(t: torch.Tensor) -> bool:
    """Whether a launch whose first tensor is ``t`` may take the fast path now: a CUDA tensor, outside
    :func:`plain_launches`, the private API found (see the module doc)."""
    if not t.is_cuda or _plain_depth:
        return False
    ok = _fast_ok
    return _probe() if ok is None else ok


def launcher_choice() -> str:
    """``FUSELAB_LAUNCHER``: ``fast`` (also when unset or empty) or ``plain``; ``ValueError`` naming it otherwise."""
    choice = os.environ.get(ENV_VAR, "").strip().lower() or "fast"
    if choice not in LAUNCHERS:
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r} is not valid; expected one of {', '.join(LAUNCHERS)}")
    return choice


def _probe() -> bool:
    global _fast_ok
    _fast_ok = _runtime_knobs() is not None and hasattr(torch._C, "_cuda_getCurrentRawStream")
    return _fast_ok


def _give_up(reason: object) -> None:
    """Switch the fast path off for the process (one warning)."""
    global _fast_ok
    if _fast_ok is not False:
        warnings.warn(f"fuselab: Triton's compiled-kernel launcher is not usable ({reason}); kernels launch through "
                      f"kernel[grid](...) from now on (more host time per launch, same results)", RuntimeWarning,
                      stacklevel=3)
    _fast_ok = False


@functools.cache
def _runtime_knobs():
    """Triton's runtime knobs (launch hooks: read on every launch), or None on versions without ``triton.knobs``."""
    import triton

    return getattr(getattr(triton, "knobs", None), "runtime", None)


def _active(hook):
    """``hook``, or None when it is an empty ``HookChain`` (Triton always installs one): the launcher then
    skips building launch metadata and calling hooks, as it would with no hook at all."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


_FAST_ATTRIBUTES = ("run", "function", "packed_metadata", "launch_metadata")


class Compiled:
    """A kernel specialized for one launch signature: the JIT function and the constexprs it was called with (the
    plain path launches them), and, when it came from the fast path, the ``CompiledKernel`` (None otherwise), the
    values of the kernel's parameters after the ones passed positionally, and the device it was compiled for."""

    __slots__ = ("compiled", "constexprs", "device", "jit", "tail")

    def __init__(self, jit, constexprs: Mapping[str, Any], compiled=None, tail: tuple = (), device: int = -1) -> None:
        self.jit, self.constexprs, self.compiled, self.tail, self.device = jit, constexprs, compiled, tail, device

    def plain(self, grid: tuple[int, ...], args: tuple) -> None:
        counts["plain"] += 1
        self.jit[grid](*args, **self.constexprs)

    def fast(self, grid: tuple[int, ...], args: tuple) -> bool:
        """Launch through the compiled kernel's launcher; False (nothing launched, the fast path now off) when the
        private API raised."""
        compiled = self.compiled
        knobs = _runtime_knobs()
        try:
            stream = torch._C._cuda_getCurrentRawStream(self.device)
            enter, leave = _active(knobs.launch_enter_hook), _active(knobs.launch_exit_hook)
            metadata = compiled.launch_metadata(grid, stream, *args, *self.tail) if enter is not None else None
            compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                         compiled.function, compiled.packed_metadata, metadata, enter, leave, *args, *self.tail)
        except (AttributeError, TypeError) as error:
            _give_up(error)
            return False
        counts["fast"] += 1
        return True


def _compile(jit, grid: tuple[int, ...], args: tuple, constexprs: Mapping[str, Any]) -> Compiled:
    """Launch through ``jit[grid]`` (compiling on a first signature) and keep what the fast path needs (nothing
    when ``FUSELAB_LAUNCHER=plain``: the launch stays plain)."""
    choice = launcher_choice()  # raises on a bad value before anything runs
    counts["plain"] += 1
    compiled = jit[grid](*args, **constexprs)
    if choice == "plain":
        return Compiled(jit, constexprs)
    missing = [name for name in _FAST_ATTRIBUTES if not hasattr(compiled, name)]
    if missing:
        _give_up(f"CompiledKernel has no {', '.join(missing)}")
        return Compiled(jit, constexprs)
    tail = tuple(constexprs[name] for name in jit.arg_names[len(args):])
    return Compiled(jit, constexprs, compiled, tail, torch.cuda.current_device())


class Launch:
    """One planned kernel launch, ``kernel[grid](*tensors, *dynamic, *scalars, **constexprs)``: ``scalars`` (sizes,
    strides) and ``constexprs`` (block sizes, flags, ``num_warps``) are the plan's; ``tensors`` and the ``dynamic``
    scalars (values that change from call to call under one plan, e.g. a decoding offset) are given per launch.
    On the fast path the first launch compiles and the later ones reuse its compiled kernel (see the module doc for
    what they must share)."""

    __slots__ = ("_compiled", "constexprs", "grid", "kernel", "scalars")

    def __init__(self, kernel, grid: tuple[int, ...], scalars: tuple, constexprs: Mapping[str, Any]) -> None:
        self.kernel, self.grid, self.scalars, self.constexprs = kernel, grid, scalars, constexprs
        self._compiled: Compiled | None = None

    def __call__(self, tensors: tuple, dynamic: tuple = ()) -> None:
        args = (*tensors, *dynamic, *self.scalars)
        if fast_path(tensors[0]):
            compiled = self._compiled
            if compiled is None:
                self._compiled = _compile(self.kernel, self.grid, args, self.constexprs)
                return
            if compiled.compiled is not None and compiled.fast(self.grid, args):
                return
        counts["plain"] += 1
        self.kernel[self.grid](*args, **self.constexprs)

    def __repr__(self) -> str:
        return f"Launch({getattr(self.kernel, '__name__', self.kernel)}, grid={self.grid})"


# ---------------------------------------------------------------------------------------------- launch records
#: compiled kernels by (kernel, caller key, device, argument signature), for :func:`launch`
_COMPILED = LaunchCache("compiled kernels", limit=8192)


def _arg_class(t) -> tuple:
    """What Triton specializes a pointer argument on (dtype, 16-byte alignment), or a TMA descriptor on (its
    tensor's dtype, block shape)."""
    if isinstance(t, torch.Tensor):
        return t.dtype, t.data_ptr() & 15 == 0
    return t.base.dtype, tuple(t.block_shape)


def launch(kernel, key: Hashable, grid: tuple[int, ...], tensors: tuple, scalars: tuple,
           constexprs: dict[str, Any] | Callable[[], dict[str, Any]], *, dynamic: int = 0) -> Compiled:
    """``kernel[grid](*tensors, *scalars, **constexprs)`` through the seam; returns its :class:`Compiled` for
    :func:`relaunch`.

    ``key`` is the caller's identity for ``constexprs`` (block sizes, flags, warps), which may be a function that
    returns them (called only for a signature not seen before). On the fast path the compiled kernels are kept by
    (kernel, key, device, each tensor's dtype and alignment (a TMA descriptor's dtype and block shape), the first
    ``dynamic`` scalars by specialization class, the rest by value): one C-level tuple instead of Triton's
    per-argument binding. ``tensors[0]`` must be a tensor (its device picks the path).
    """
    if not fast_path(tensors[0]):
        if callable(constexprs):
            constexprs = constexprs()
        entry = Compiled(kernel, constexprs)
        entry.plain(grid, (*tensors, *scalars))
        return entry
    device = torch.cuda.current_device()
    signature = (id(kernel), key, device, tuple([_arg_class(t) for t in tensors]),
                 tuple([scalar_class(a) for a in scalars[:dynamic]]) if dynamic else None,
                 scalars[dynamic:] if dynamic else scalars)
    hit = _COMPILED.get(signature)
    if hit is None:
        hit = _compile(kernel, grid, (*tensors, *scalars), constexprs() if callable(constexprs) else constexprs)
        _COMPILED.keep(signature, hit)
        return hit
    relaunch(hit, grid, tensors, scalars)
    return hit


def relaunch(entry: Compiled, grid: tuple[int, ...], tensors: tuple, scalars: tuple) -> None:
    """Launch again what :func:`launch` returned ``entry`` for, skipping its signature: the caller guarantees the
    same tensor dtypes and 16-byte alignment, the same non-dynamic scalars and the same device. For launches kept
    and repeated in a hot path (a backward on the autograd engine's thread, where every Python step costs several
    times its main-thread time)."""
    args = (*tensors, *scalars)
    if entry.compiled is None or not fast_path(tensors[0]) or not entry.fast(grid, args):
        entry.plain(grid, args)
