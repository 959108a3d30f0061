"""The op helper of the ops that still keep launch records (``fuselab.nn.FusedLinear`` and the GEMM family): their
public functions compute a key, look up the record a checked call kept under it, and pass it back as ``prepared``.
Each moves to :class:`fuselab.ops.opdef.Op` (call, plan, one cache inside the op) when it is ported; the eager node's
gradient handling is :mod:`fuselab.ops.opdef`'s.

* ``eager(*inputs, prepared=None) -> (outputs, record)``: validated inputs -> allocate outputs, call the out-param
  launchers; ``record`` is what the launch returned for repeating it (None: nothing may be repeated); given
  ``prepared`` (a record kept under the same key) it repeats that launch.
* ``fake(*inputs)``: annotated like the custom op (its annotations give the schema).
* ``setup_context(ctx, inputs, outputs)``, ``backward(ctx, *grads)``: the one autograd formula; a backward calls
  other ops through :meth:`RecordOp.run_in_backward` with a key derived from ``ctx.key`` (the forward's) and the
  gradients' :func:`layout`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from .opdef import LaunchCache, _empty_for, skip_zero_fill, tensor_signature, zeros_for_differentiable

#: what a key of a kept launch holds of an operand (shape, device, dtype, strides, storage offset, alignment)
operand = tensor_signature


def layout(t: torch.Tensor) -> tuple:
    """What a repeated launch assumes of a tensor given anew (a gradient): dtype, strides, storage offset and 16-byte
    alignment equal to those of the tensor it was kept with."""
    return t.dtype, t.stride(), t.storage_offset(), t.data_ptr() & 15


class RecordOp:
    """A fused op on launch records: its eager path, its ``torch.library`` custom op and one autograd formula.

    Args:
        name: the custom op's qualified name, ``"fuselab::<name>"``.
        eager, fake: see the module doc.
        autograd: ``(setup_context, backward)``, or None: not differentiable.
        mutates_args: names of the inputs written in place, the leading ones.
        differentiable: indices of the inputs that may require grad.
        composite: instead of a custom op, what ``torch.compile`` traces (the op is an eager fast path only).
    """

    def __init__(self, name: str, *, eager: Callable, fake: Callable | None = None,
                 autograd: tuple[Callable, Callable] | None = None, mutates_args: Sequence[str] = (),
                 differentiable: Sequence[int] = (0,), composite: Callable | None = None) -> None:
        self.name = name
        self.eager = eager
        self.mutates = tuple(mutates_args)
        self.differentiable = tuple(differentiable)
        self.launches = LaunchCache(name)
        self.setup_context, self.backward = autograd if autograd is not None else (None, None)
        if composite is not None:
            self.custom = composite
        else:
            schema = torch.library.infer_schema(fake, mutates_args=self.mutates)
            self.custom = torch.library.custom_op(name, self._custom_impl, mutates_args=self.mutates, schema=schema)
            self.custom.register_fake(fake)
            if self.backward is not None and not self.mutates:
                self.custom.register_autograd(self.backward, setup_context=self.setup_context)
        self.function = None if self.backward is None else _eager_function(self)

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

    def run(self, inputs: tuple, key: Hashable | None = None, prepared: Any = None,
            needs_grad: bool | None = None) -> Any:
        """The op on validated ``inputs``: custom op under ``torch.compile``, the eager Function under autograd,
        else ``eager``. ``key``: keep the launch record under it (``prepared``: the record kept)."""
        if needs_grad is None:
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
            self.launches.keep(key, record)
        return outputs

    def run_in_backward(self, ctx, inputs: tuple, key: Hashable | None = None) -> Any:
        """This op inside another op's ``backward``: in that op's eager node, :meth:`run` with ``key``; in its
        registered autograd (the tensors may be fake) the custom op."""
        if getattr(ctx, "eager", False) and not torch.compiler.is_compiling():
            return self.run(inputs, key, self.kept(key))
        return self.custom(*inputs)

    def __call__(self, *inputs: Any) -> Any:
        """:meth:`run` without a launch key."""
        return self.run(inputs)

    def __repr__(self) -> str:
        return f"RecordOp({self.name!r})"


def _eager_function(op: RecordOp) -> type[torch.autograd.Function]:
    """The eager autograd node of ``op``: its ``eager`` forward, its ``setup_context`` and ``backward``."""
    n_dirty = len(op.mutates)

    def forward(ctx, *args):
        *inputs, key, prepared = args
        outputs, record = op.eager(*inputs, prepared=prepared)
        if n_dirty:
            ctx.mark_dirty(*[t for t in inputs[:n_dirty] if t is not None])
        op.setup_context(ctx, inputs, outputs)
        skip_zero_fill(ctx, outputs)
        ctx.eager = True
        ctx.key = key
        if record is not None and key is not None and not torch.compiler.is_compiling():
            op.launches.keep(key, record)
        return outputs

    def backward(ctx, *grads):
        spec = getattr(ctx, "zeros_spec", None)
        if spec is not None and None in grads:
            grads = zeros_for_differentiable(grads, spec)
        return (*op.backward(ctx, *grads), None, None)

    name = op.name.split("::")[-1].title().replace("_", "") + "Function"
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})
