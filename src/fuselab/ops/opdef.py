"""One way to define an op: an :class:`Op` turns an op's forward/backward into both the dispatcher-free eager path and
the ``torch.library`` custom op (its fake and its autograd) that ``torch.compile`` traces. ``docs/architecture.md``
shows a complete op (``tests/ops/toy_op.py``).

Vocabulary, one word per idea:

* **call**: an op's ``<Op>Call``, made by its ``checks.validate(...)``: a frozen dataclass of the arguments as checked
  plus what the checks derived from them (rope: the rotary half, the table's reach). ``call.signature`` is everything
  the checks and the launch read besides the operands' values: per tensor its :func:`tensor_signature`, per-call
  scalars by :func:`scalar_class`, flags by value; None when the call cannot be repeated (under ``torch.compile``, an
  unhashable argument). ``call.arguments()`` gives the custom op's arguments after the operands.
* **operands**: what one call passes by value, in the custom op's order: its tensors, then the scalars whose value may
  change between calls of one signature (rope's int offset).
* **plan**: ``launch.plan(call, operands) -> <Op>Plan``, a frozen dataclass: ``plan.call``, output layouts and the
  planned kernel launches (:class:`fuselab.ops._launch.Launch`: grid, scalars, constexprs). It reads only what the
  signature holds of the operands, so one plan serves every call of its signature.
* **cache**: :attr:`Op.plans`, the op's plans by signature. A public function looks its signature up before it
  validates: a call whose signature was planned skips its checks and its plan. Checks of values (an int offset
  against the table, whether the actual tensors alias) run on every call.

An op is a subclass of :class:`Op` with the class attributes ``name``, ``schema`` (the custom op's, operands first),
``mutates`` (the operands written in place, leading), ``differentiable`` (operand indices) and the methods
``call_of(inputs, signed)`` (the custom op's inputs -> a call, unchecked: what the custom op and its autograd run on;
``signed``: compute the signature, False for fake tensors), ``plan(call, operands)``, ``forward(plan, operands) ->
outputs`` (allocate the outputs, launch), ``fake(call, operands) -> outputs`` and, when differentiable,
``setup_context(ctx, call, operands, outputs)`` and ``backward(ctx, *grads) -> one gradient per operand``. The
backward is registered on the custom op and run by the eager :class:`torch.autograd.Function` alike; it calls other
ops through :meth:`Op.run_in_backward`. ``ctx.call`` is the forward's call on both paths; ``ctx.eager`` is True in
the eager node, where the tensors are real and a backward call's signature may be derived from ``ctx.call``'s.
An output marked non-differentiable gets None as its gradient in the eager node (no zero-filled tensor is made) and
zeros in the registered autograd: a backward ignores it.

:meth:`Op.run` is the one dispatch: under ``torch.compile`` the custom op; with autograd the eager Function; else
``forward`` directly (the custom-op dispatcher costs tens of microseconds of host time per call).

Every cache of plans, launches and scratch of the ops is a :class:`LaunchCache` or a :func:`memo` function: bounded,
and emptied together by :func:`clear` (the tuning context, :func:`fuselab.ops.tuning.override`, calls it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, ClassVar

import torch

#: entries a :class:`LaunchCache` holds before it is emptied (a run that meets ever new shapes)
MAX_PREPARED = 1024

_CACHES: list[LaunchCache] = []
_MEMOS: list[Callable[[], None]] = []


class LaunchCache:
    """A bounded dict of host state (plans, compiled kernels, scratch), emptied when it holds ``limit`` entries and by
    :func:`clear`. ``get`` is the dict's own method (no Python frame on a lookup)."""

    def __init__(self, name: str, limit: int = MAX_PREPARED) -> None:
        self.name = name
        self.limit = limit
        self.data: dict[Hashable, Any] = {}
        self.get = self.data.get
        _CACHES.append(self)

    def keep(self, key: Hashable, value: Any) -> None:
        """``self[key] = value``, emptying the cache first when it is full; an unhashable key keeps nothing."""
        data = self.data
        if len(data) >= self.limit:
            data.clear()
        with contextlib.suppress(TypeError):
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
    """Empty every cache of the ops (plans, compiled kernels, planner memos)."""
    for cache in _CACHES:
        cache.data.clear()
    for cache_clear in _MEMOS:
        cache_clear()


# ---------------------------------------------------------------------------------------------- signatures
def _int_class(a: int) -> int:
    """What Triton specializes an int argument on: equal to 1, divisible by 16, fits in int32."""
    return (a == 1) + 2 * (a % 16 == 0) + 4 * (-(2**31) <= a < 2**31)


def scalar_class(a) -> object:
    """What a signature holds of a per-call scalar: Triton's specialization class for an int (:func:`_int_class`),
    else the type."""
    return _int_class(a) if type(a) is int else type(a)


def tensor_signature(t: torch.Tensor) -> tuple:
    """What a signature holds of a tensor: shape, device, dtype, strides, storage offset and 16-byte alignment (what
    checks, plans and Triton's specialization read)."""
    return t.shape, t.device, t.dtype, t.stride(), t.storage_offset(), t.data_ptr() & 15


def _empty_for(outputs: Any, like: torch.Tensor) -> Any:
    """The custom op's outputs: None entries of a tuple as empty tensors (custom ops return tensors)."""
    if type(outputs) is tuple:
        return tuple(like.new_empty(0) if o is None else o for o in outputs)
    return outputs


# ---------------------------------------------------------------------------------------------- the op
class Op:
    """A fused op (see the module doc): subclass it, then make one instance, which registers its custom op."""

    name: ClassVar[str]
    schema: ClassVar[str] = ""
    mutates: ClassVar[tuple[str, ...]] = ()
    differentiable: ClassVar[tuple[int, ...]] = (0,)
    #: instead of a custom op, what ``torch.compile`` traces: a function of the custom op's inputs made of other ops
    #: (with their own autograd); the op is then an eager fast path only (``fake`` unused)
    composite: ClassVar[Callable | None] = None
    setup_context: ClassVar[Callable | None] = None
    backward: ClassVar[Callable | None] = None

    def call_of(self, inputs: tuple, signed: bool) -> Any:
        raise NotImplementedError

    def plan(self, call: Any, operands: tuple) -> Any:
        raise NotImplementedError

    def forward(self, plan: Any, operands: tuple) -> Any:
        raise NotImplementedError

    def fake(self, call: Any, operands: tuple) -> Any:
        raise NotImplementedError

    def __init__(self) -> None:
        self.plans = LaunchCache(self.name)
        differentiable = type(self).backward is not None
        if self.composite is not None:
            self.custom = self.composite
        else:
            self.custom = torch.library.custom_op(self.name, self._custom_impl, mutates_args=self.mutates,
                                                  schema=self.schema)
            self.custom.register_fake(self._custom_fake)
            if differentiable and not self.mutates:
                self.custom.register_autograd(self._registered_backward, setup_context=self._registered_setup)
        self.function = _eager_function(self) if differentiable else None

    # ------------------------------------------------------------------------------------------ plans
    def cached(self, signature: Hashable | None) -> Any:
        """The plan of ``signature`` (None: no signature, an unhashable one, or none planned)."""
        if signature is None:
            return None
        try:
            return self.plans.get(signature)
        except TypeError:  # an unhashable argument: the checks name it
            return None

    def plan_of(self, call: Any, operands: tuple) -> Any:
        """The cached plan of ``call``'s signature, else a new one (kept when the call has a signature)."""
        plan = self.cached(call.signature)
        if plan is None:
            plan = self.plan(call, operands)
            if call.signature is not None:
                self.plans.keep(call.signature, plan)
        return plan

    # ------------------------------------------------------------------------------------------ dispatch
    def needs_grad(self, operands: Sequence[Any]) -> bool:
        """Whether autograd records a call with ``operands``."""
        if self.function is None or not torch.is_grad_enabled():
            return False
        for i in self.differentiable:
            t = operands[i]
            if t is not None and t.requires_grad:
                return True
        return False

    def run(self, call: Any, operands: tuple, plan: Any = None, needs_grad: bool | None = None) -> Any:
        """The op on a validated call: the custom op under ``torch.compile``, the eager Function under autograd, else
        ``forward``. ``plan``: the call's plan when the caller has it (from :meth:`cached`); ``needs_grad``:
        :meth:`needs_grad` when the caller has it."""
        if needs_grad is None:  # self.needs_grad(operands), inlined: this runs on every call
            needs_grad = False
            if self.function is not None and torch.is_grad_enabled():
                for i in self.differentiable:
                    t = operands[i]
                    if t is not None and t.requires_grad:
                        needs_grad = True
                        break
        if needs_grad and self.function is not None:
            if not self.mutates and torch.compiler.is_compiling():
                return self.custom(*operands, *call.arguments())
            return self.function.apply(call, plan, *operands)
        if plan is not None:  # a cached plan: only eager calls have one
            return self.forward(plan, operands)
        if torch.compiler.is_compiling():
            return self.custom(*operands, *call.arguments())
        return self.forward(self.plan_of(call, operands), operands)

    def run_in_backward(self, ctx, call: Any, operands: tuple, plan: Any = None) -> Any:
        """This op inside another op's ``backward``: in that op's eager node :meth:`run` (its plan cached by the
        call's signature); in its registered autograd (``torch.compile``, AOT tracing, ``opcheck``: the tensors may be
        fake) the custom op."""
        if getattr(ctx, "eager", False) and not torch.compiler.is_compiling():
            return self.run(call, operands, plan, False)
        return self.custom(*operands, *call.arguments())

    # ------------------------------------------------------------------------------------------ the custom op
    def _split(self, inputs: tuple, signed: bool) -> tuple[Any, tuple]:
        call = self.call_of(inputs, signed)
        return call, inputs[:len(inputs) - len(call.arguments())]

    def _custom_impl(self, *inputs: Any) -> Any:
        call, operands = self._split(inputs, True)
        outputs = self.forward(self.plan_of(call, operands), operands)
        return None if self.mutates else _empty_for(outputs, inputs[0])

    def _custom_fake(self, *inputs: Any) -> Any:
        call, operands = self._split(inputs, False)
        return self.fake(call, operands)

    def _registered_setup(self, ctx, inputs: tuple, output: Any) -> None:
        call, operands = self._split(inputs, False)
        ctx.call, ctx.n_arguments = call, len(inputs) - len(operands)
        self.setup_context(ctx, call, operands, output)

    def _registered_backward(self, ctx, *grads: Any) -> tuple:
        return (*self.backward(ctx, *grads), *(None,) * ctx.n_arguments)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# ---------------------------------------------------------------------------------------------- the eager node
def zeros_for_differentiable(grads: tuple, spec: tuple) -> tuple:
    """Zeros for the differentiable outputs autograd did not reach; None stays for the non-differentiable ones
    (``spec``: :func:`skip_zero_fill`'s)."""
    return tuple(torch.zeros(s[0], dtype=s[1], device=s[2]) if g is None and s is not None else g
                 for g, s in zip(grads, spec))


def skip_zero_fill(ctx, outputs: Any) -> None:
    """In an eager node's forward, after its setup: for an op with a non-differentiable output (bias_act's
    pre-activation, FusedLinear's matmul output) turn off autograd's zero materialisation, which would allocate and
    zero-fill a gradient of that output's full size on every backward; ``ctx.zeros_spec`` keeps (shape, dtype,
    device) of each differentiable output for :func:`zeros_for_differentiable`."""
    non_differentiable = getattr(ctx, "non_differentiable", None)
    if non_differentiable:
        ctx.set_materialize_grads(False)
        ctx.zeros_spec = tuple(None if o is None or any(o is t for t in non_differentiable)
                               else (o.shape, o.dtype, o.device)
                               for o in (outputs if type(outputs) is tuple else (outputs,)))


def _eager_function(op: Op) -> type[torch.autograd.Function]:
    """The eager autograd node of ``op``: its ``forward`` on ``(call, plan, *operands)``, its ``setup_context`` and
    ``backward``."""
    n_dirty = len(op.mutates)  # the mutated operands are the leading ones

    def forward(ctx, call, plan, *operands):
        # ctx in forward (no separate setup_context): Function.apply then skips binding default arguments through
        # inspect.signature, tens of microseconds per call
        if plan is None:
            plan = op.plan_of(call, operands)
        outputs = op.forward(plan, operands)
        if n_dirty:
            ctx.mark_dirty(*[t for t in operands[:n_dirty] if t is not None])
        ctx.call, ctx.eager = call, True
        op.setup_context(ctx, call, operands, outputs)
        skip_zero_fill(ctx, outputs)
        return outputs

    def backward(ctx, *grads):
        spec = getattr(ctx, "zeros_spec", None)
        if spec is not None and None in grads:
            grads = zeros_for_differentiable(grads, spec)
        return (None, None, *op.backward(ctx, *grads))

    name = op.name.split("::")[-1].title().replace("_", "") + "Function"
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})
