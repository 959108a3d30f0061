"""One way to define an op: an :class:`Op` turns one eager forward/backward pair into both the dispatcher-free eager
path and the ``torch.library`` custom op (its fake and its autograd) that ``torch.compile`` traces.

Contract (``docs/architecture.md`` has an example):

* ``eager(*inputs, prepared=None) -> (outputs, record)``: validated inputs -> allocate outputs, call the
  out-param launchers. ``record`` is whatever the launch returned for repeating it (or None); given
  ``prepared`` (a record an earlier call of the same key kept) it repeats that launch instead of planning one.
  Outputs are a tensor or a tuple (None entries allowed: the custom op returns empty tensors there); an op that
  mutates its inputs returns them.
* ``fake(*inputs) -> outputs``: typed like the custom op (its annotations give the schema), outputs of the
  right shape and dtype.
* ``setup_context(ctx, inputs, outputs)`` and ``backward(ctx, *grads) -> grads of the inputs``: the op's one
  autograd formula, registered on the custom op and run by the eager :class:`torch.autograd.Function` alike.
  The gradient of an output marked non-differentiable is None in the eager node (no zero-filled tensor is made
  for it) and zeros in the registered autograd: a backward ignores it. Every other output's gradient is a tensor
  (zeros where autograd did not reach the output) on both paths.
  A backward calls other ops through :meth:`Op.run_in_backward`: the custom op in the registered autograd (fake
  tensors under tracing), the eager path in the eager node. There ``ctx.key`` is the forward's launch key (see
  ``record_key`` for calls without one): the backward passes a key derived from it (plus the gradients'
  :func:`layout`) so that its launch, planned once, is repeated on the autograd thread.

:meth:`Op.run` is the one dispatch: under ``torch.compile`` the custom op; with autograd the eager Function;
else ``eager`` directly (the dispatcher costs tens of microseconds of host time per call). Given a ``key``
(everything the checks and the launch depend on besides tensor values, computed by the op's public function),
the launch record is kept in the op's :class:`LaunchCache` and later calls with that key skip checks and plans.

Every cache of launches, plans and scratch of the ops is a :class:`LaunchCache` or a :func:`memo` function: bounded,
and emptied together by :func:`clear` (the tuning context, :func:`fuselab.ops.tuning.override`, calls it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

#: entries a :class:`LaunchCache` holds before it is emptied (a run that meets ever new shapes)
MAX_PREPARED = 1024

_CACHES: list[LaunchCache] = []
_MEMOS: list[Callable[[], None]] = []


class LaunchCache:
    """A bounded dict of host state (prepared launches, plans, compiled entries), emptied when it holds ``limit``
    entries and by :func:`clear`. ``get`` is the dict's own method (no Python frame on a lookup)."""

    def __init__(self, name: str, limit: int = MAX_PREPARED) -> None:
        self.name = name
        self.limit = limit
        self.data: dict[Hashable, Any] = {}
        self.get = self.data.get
        _CACHES.append(self)

    def keep(self, key: Hashable, value: Any) -> None:
        """``self[key] = value``, emptying the cache first when it is full."""
        data = self.data
        if len(data) >= self.limit:
            data.clear()
        data[key] = value

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"LaunchCache({self.name!r}, {len(self.data)}/{self.limit})"


def memo(maxsize: int) -> Callable[[Callable], Callable]:
    """``functools.lru_cache(maxsize)`` (C-level lookups: planners run on every uncached launch) whose cache
    :func:`clear` empties too. For pure functions of hashable arguments (tuning included in them)."""
    def wrap(fn: Callable) -> Callable:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _MEMOS.append(cached.cache_clear)
        return cached
    return wrap


def clear() -> None:
    """Empty every launch cache and planner memo of the ops (kept launches, plans, compiled entries)."""
    for cache in _CACHES:
        cache.data.clear()
    for cache_clear in _MEMOS:
        cache_clear()


# ---------------------------------------------------------------------------------------------- launch keys
def _int_class(a: int) -> int:
    """What Triton specializes an int argument on: equal to 1, divisible by 16, fits in int32."""
    return (a == 1) + 2 * (a % 16 == 0) + 4 * (-(2**31) <= a < 2**31)


def scalar_class(a) -> object:
    """What Triton specializes a scalar argument on: :func:`_int_class` for ints, else the type."""
    return _int_class(a) if type(a) is int else type(a)


def layout(t: torch.Tensor) -> tuple:
    """What a launch repeated by :func:`~fuselab.ops._launch.relaunch` assumes of a tensor it is given anew (a
    gradient): dtype, strides, storage offset and 16-byte alignment equal to those of the tensor it was prepared
    with."""
    return t.dtype, t.stride(), t.storage_offset(), t.data_ptr() & 15


def operand(t: torch.Tensor) -> tuple:
    """What a launch kept for later calls (by the ops' call keys) assumes of an operand: shape, device, dtype,
    strides, storage offset and 16-byte alignment (what the checks, the plan and Triton's specialization read)."""
    return t.shape, t.device, t.dtype, t.stride(), t.storage_offset(), t.data_ptr() & 15



def _keep(cache: LaunchCache, key: Hashable, record: Any) -> None:
    """``cache.keep(key, record)``; a key holding an unhashable argument (a list the checks accepted) keeps nothing."""
    with contextlib.suppress(TypeError):
        cache.keep(key, record)


def _empty_for(outputs: Any, like: torch.Tensor) -> Any:
    """The custom op's outputs: None entries of a tuple as empty tensors (custom ops return tensors)."""
    if type(outputs) is tuple:
        return tuple(like.new_empty(0) if o is None else o for o in outputs)
    return outputs


class Op:
    """A fused op: its eager path, its ``torch.library`` custom op and one autograd formula (see the module doc).

    Args:
        name: the custom op's qualified name, ``"fuselab::<name>"``.
        eager: ``eager(*inputs, prepared=None) -> (outputs, record)``.
        fake: the custom op's fake, annotated: its signature is the op's schema.
        setup_context, backward: the autograd formula (None: not differentiable).
        mutates_args: names of the inputs written in place, the leading ones (the op returns them; the custom
            op has no autograd: in-place calls with grad run the eager Function, also under ``torch.compile``).
        differentiable: indices of the inputs that may require grad (checked per call, in order).
        record_key: for a call without a key, what of its launch record identifies the launch (``ctx.key`` of the
            backward then; None: no key, the backward plans its launch every time).
        composite: instead of a custom op, what ``torch.compile`` traces: a function of other ops (with their own
            autograd); the op is then an eager fast path only (``fake`` unused).
    """

    def __init__(self, name: str, *, eager: Callable, fake: Callable | None = None,
                 setup_context: Callable | None = None, backward: Callable | None = None,
                 mutates_args: Sequence[str] = (), differentiable: Sequence[int] = (0,),
                 composite: Callable | None = None, record_key: Callable[[Any], Hashable] | None = None) -> None:
        self.name = name
        self.record_key = record_key
        self.eager = eager
        self.mutates = tuple(mutates_args)
        self.differentiable = tuple(differentiable)
        self.launches = LaunchCache(name)
        self.setup_context = setup_context
        self.backward = backward
        if composite is not None:  # traced as other ops' composite: no custom op of its own
            self.custom = composite
        else:
            schema = torch.library.infer_schema(fake, mutates_args=self.mutates)
            self.custom = torch.library.custom_op(name, self._custom_impl, mutates_args=self.mutates, schema=schema)
            self.custom.register_fake(fake)
            if backward is not None and not self.mutates:
                self.custom.register_autograd(backward, setup_context=setup_context)
        self.function = None if backward is None else _eager_function(self)

    def _custom_impl(self, *inputs: Any) -> Any:
        outputs = self.eager(*inputs, prepared=None)[0]
        return None if self.mutates else _empty_for(outputs, inputs[0])

    def kept(self, key: Hashable | None) -> Any:
        """The record kept under ``key`` (None: no key, an unhashable one, or none kept)."""
        if key is None:
            return None
        try:
            return self.launches.get(key)
        except TypeError:  # an unhashable argument in the key: the checks name it
            return None

    def needs_grad(self, inputs: Sequence[Any]) -> bool:
        """Whether autograd records a call with ``inputs``."""
        if not torch.is_grad_enabled():
            return False
        for i in self.differentiable:
            t = inputs[i]
            if t is not None and t.requires_grad:
                return True
        return False

    def run(self, inputs: tuple, key: Hashable | None = None, prepared: Any = None,
            needs_grad: bool | None = None) -> Any:
        """The op on validated ``inputs``: custom op under ``torch.compile``, the eager Function under autograd,
        else ``eager``. ``key``: keep the launch record under it (``prepared``: the record kept, see
        :meth:`kept`). ``needs_grad``: :meth:`needs_grad` when the caller has it already."""
        if needs_grad is None:  # self.needs_grad(inputs), inlined: this runs on every call
            needs_grad = False
            if self.function is not None and torch.is_grad_enabled():
                for i in self.differentiable:
                    t = inputs[i]
                    if t is not None and t.requires_grad:
                        needs_grad = True
                        break
        if needs_grad and self.function is not None:
            if not self.mutates and torch.compiler.is_compiling():
                return self.custom(*inputs)
            return self.function.apply(*inputs, key, prepared)
        if prepared is not None:  # a kept launch: only eager calls make keys
            return self.eager(*inputs, prepared=prepared)[0]
        if torch.compiler.is_compiling():
            return self.custom(*inputs)
        outputs, record = self.eager(*inputs, prepared=None)
        if key is not None and record is not None:
            _keep(self.launches, key, record)
        return outputs

    def run_in_backward(self, ctx, inputs: tuple, key: Hashable | None = None) -> Any:
        """This op inside another op's ``backward``: in that op's eager node, :meth:`run` with ``key`` (its launch
        kept and repeated); in its registered autograd (``torch.compile``, AOT tracing, ``opcheck``: the tensors may
        be fake) the custom op."""
        if getattr(ctx, "eager", False) and not torch.compiler.is_compiling():
            return self.run(inputs, key, self.kept(key))
        return self.custom(*inputs)

    def __call__(self, *inputs: Any) -> Any:
        """:meth:`run` without a launch key."""
        return self.run(inputs)

    def __repr__(self) -> str:
        return f"Op({self.name!r})"


def _zeros_for_differentiable(grads: tuple, spec: tuple) -> tuple:
    """Zeros for the differentiable outputs autograd did not reach; None stays for the non-differentiable ones.

    An op with a non-differentiable output (bias_act's pre-activation, FusedLinear's matmul output) turns off
    autograd's own materialisation, which would allocate and zero-fill a gradient of that output's full size on
    every backward; ``spec`` (made in the forward) holds (shape, dtype, device) of each differentiable output."""
    return tuple(torch.zeros(s[0], dtype=s[1], device=s[2]) if g is None and s is not None else g
                 for g, s in zip(grads, spec))


def _eager_function(op: Op) -> type[torch.autograd.Function]:
    """The eager autograd node of ``op``: its ``eager`` forward, its ``setup_context`` and ``backward``."""
    n_dirty = len(op.mutates)  # the mutated inputs are the leading ones

    def forward(ctx, *args):
        # ctx in forward (no separate setup_context): Function.apply then skips binding default arguments through
        # inspect.signature, tens of microseconds per call
        *inputs, key, prepared = args
        outputs, record = op.eager(*inputs, prepared=prepared)
        if n_dirty:
            ctx.mark_dirty(*[t for t in inputs[:n_dirty] if t is not None])
        op.setup_context(ctx, inputs, outputs)
        non_differentiable = getattr(ctx, "non_differentiable", None)
        if non_differentiable:  # see _zeros_for_differentiable
            ctx.set_materialize_grads(False)
            ctx.zeros_spec = tuple(None if o is None or any(o is t for t in non_differentiable)
                                   else (o.shape, o.dtype, o.device)
                                   for o in (outputs if type(outputs) is tuple else (outputs,)))
        ctx.eager = True  # see Op.run_in_backward
        ctx.key = key
        if record is not None and not torch.compiler.is_compiling():
            if key is not None:
                _keep(op.launches, key, record)
            elif op.record_key is not None:
                ctx.key = ("record", op.record_key(record))
        return outputs

    def backward(ctx, *grads):
        spec = getattr(ctx, "zeros_spec", None)
        if spec is not None and None in grads:
            grads = _zeros_for_differentiable(grads, spec)
        return (*op.backward(ctx, *grads), None, None)

    name = op.name.split("::")[-1].title().replace("_", "") + "Function"
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})
