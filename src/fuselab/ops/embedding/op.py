"""Embedding bag collection: three :class:`~fuselab.ops.opdef.Op` and the public functional API.

* :data:`LOOKUP` (``fuselab::embedding_bag_lookup``): the pooled lookup, no autograd;
* :data:`UPDATE` (``fuselab::embedding_bag_update_``): the fused sparse optimizer update, mutating ``weight``,
  its ``state`` and ``seed`` (``mutates``; its fake returns nothing);
* :data:`TRAIN` (``fuselab::embedding_bag_train``): the lookup whose backward is that update (FBGEMM's trick): it
  takes a placeholder tensor ``anchor`` that requires grad, so autograd calls the backward, which applies the
  optimizer to ``weight`` in place through :data:`UPDATE` and returns no gradient at all: no dense ``(R, D)`` and
  no sparse COO gradient exist.

A public function -> :func:`~fuselab.ops.embedding.checks.validate_lookup` /
:func:`~fuselab.ops.embedding.checks.validate_update` -> a call -> :mod:`~fuselab.ops.embedding.launch`'s plan ->
its launches. Eager calls skip the dispatcher (autograd through :data:`TRAIN`'s eager node); ``torch.compile`` always
sees the custom ops. CUDA tensors run the Triton kernels, others the reference (:mod:`fuselab.reference.embedding`),
as :func:`fuselab.backend.triton_for` decides. An eager call whose signature was planned skips the checks and the
plan; the overlap of the tensors an update writes with every other operand is checked on every call. The backward's
update is planned once under the forward's signature and the gradient's. Nothing synchronises with the host
(CUDA-graph capturable).
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from fuselab.backend import triton_for
from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer
from fuselab.ops.opdef import Op, tensor_signature
from fuselab.reference import embedding as ref

from . import checks, launch
from .checks import EmbeddingConfig, LookupArgs, LookupCall, UpdateArgs, UpdateCall

__all__ = ["LOOKUP", "TRAIN", "UPDATE", "EmbeddingConfig", "embedding_bag_collection", "embedding_bag_lookup",
           "embedding_bag_update_"]

Tensor = torch.Tensor

_NO_GRADS = (None,) * 9  # TRAIN's operands get no gradient: the update is applied in place
_UPDATE_ARGUMENTS = "str pooling, str optimizer, float eps, bool deterministic, SymInt[] knobs"
_INDEX = "Tensor ids, Tensor? offsets, Tensor table_sizes, Tensor row_offsets"


def _custom_signature(inputs: tuple) -> tuple:
    """The signature of a custom op's inputs: its tensors', its arguments by type and value."""
    return ("custom", *[tensor_signature(t) if isinstance(t, torch.Tensor) else
                        (tuple(t) if isinstance(t, list) else (type(t), t)) for t in inputs])


def _knobs_config(knobs: list[int]) -> EmbeddingConfig | None:
    return checks.config_of(knobs) if len(knobs) else None


class Lookup(Op):
    """``fuselab::embedding_bag_lookup``: the ``(B, F, D)`` pooled embeddings."""

    name = "fuselab::embedding_bag_lookup"
    schema = f"(Tensor weight, {_INDEX}, str pooling, SymInt[] knobs) -> Tensor"

    plan = staticmethod(launch.plan_lookup)
    forward = staticmethod(launch.lookup)

    def call_of(self, inputs: tuple, signed: bool) -> LookupCall:
        """Real tensors (the custom op run): the call a cached plan of their signature holds, else validated; fake
        ones: as they are."""
        weight, ids, offsets, table_sizes, row_offsets, pooling, knobs = inputs
        args = LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, _knobs_config(knobs))
        if not signed:
            return checks.unchecked_lookup(args, knobs, False)
        signature = _custom_signature(inputs)
        plan = self.cached(signature)
        return plan.call if plan is not None else checks.validate_lookup(args, signature)

    def fake(self, call: LookupCall, operands: tuple) -> Tensor:
        weight = operands[0]
        return weight.new_empty(call.shape, dtype=ref.compute_dtype(weight.dtype))


def _update_call_of(op: Op, inputs: tuple, args: LookupArgs, update: UpdateArgs, signed: bool) -> UpdateCall:
    """The call of :data:`UPDATE`'s or :data:`TRAIN`'s inputs (``args``, ``update``: taken from them), as
    :meth:`Lookup.call_of`; the writes are checked on every run of the custom op."""
    if not signed:
        return UpdateCall(checks.unchecked_lookup(args, inputs[-1], False), update.optimizer, update.deterministic)
    signature = _custom_signature(inputs)
    plan = op.cached(signature)
    if plan is None:
        return checks.validate_update(args, update, signature)
    checks.check_writes(args.weight, update.state, update.seed,
                        {"lr": update.lr, "grad": update.grad, "ids": args.ids, "offsets": args.offsets,
                         "table_sizes": args.table_sizes, "row_offsets": args.row_offsets})
    return plan.call


class Update(Op):
    """``fuselab::embedding_bag_update_``: the optimizer step of a lookup's output gradient, in place."""

    name = "fuselab::embedding_bag_update_"
    schema = (f"(Tensor(a0!) weight, Tensor(a1!) state, Tensor(a2!)? seed, Tensor lr, Tensor grad, {_INDEX}, "
              f"{_UPDATE_ARGUMENTS}) -> ()")
    mutates = ("weight", "state", "seed")

    plan = staticmethod(launch.plan_update)
    forward = staticmethod(launch.update)

    def call_of(self, inputs: tuple, signed: bool) -> UpdateCall:
        weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps, \
            deterministic, knobs = inputs
        args = LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, _knobs_config(knobs))
        return _update_call_of(self, inputs, args,
                               UpdateArgs(state, lr, seed, checks.optimizer_of(optimizer, eps), deterministic, grad),
                               signed)

    def fake(self, call: UpdateCall, operands: tuple) -> None:
        return None


class Train(Op):
    """``fuselab::embedding_bag_train``: the lookup (of ``weight``) whose backward applies :data:`UPDATE`."""

    name = "fuselab::embedding_bag_train"
    schema = (f"(Tensor anchor, Tensor weight, Tensor state, Tensor? seed, Tensor lr, {_INDEX}, "
              f"{_UPDATE_ARGUMENTS}) -> Tensor")
    differentiable = (0,)

    plan = staticmethod(launch.plan_train)
    forward = staticmethod(launch.train)

    def call_of(self, inputs: tuple, signed: bool) -> UpdateCall:
        _anchor, weight, state, seed, lr, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps, \
            deterministic, knobs = inputs
        args = LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, _knobs_config(knobs))
        return _update_call_of(self, inputs, args,
                               UpdateArgs(state, lr, seed, checks.optimizer_of(optimizer, eps), deterministic), signed)

    def fake(self, call: UpdateCall, operands: tuple) -> Tensor:
        weight = operands[1]
        return weight.new_empty(call.lookup.shape, dtype=ref.compute_dtype(weight.dtype))

    def setup_context(self, ctx, call: UpdateCall, operands: tuple, output: Tensor) -> None:
        """What the update needs, kept on ``ctx`` (not saved tensors): the update itself bumps ``weight``'s version,
        and a second lookup of the same weight before its backward must not trip the saved-tensor version check."""
        ctx.update_operands = operands[1:]  # weight, state, seed, lr, ids, offsets, table_sizes, row_offsets

    def backward(self, ctx, grad: Tensor) -> tuple:
        """Apply the optimizer step of ``grad`` in place (:data:`UPDATE`); no operand gets a gradient. In the eager
        node the update's plan is cached under the forward's signature and the gradient's, and ``grad`` is checked
        against the tensors the update writes (the forward checked the others)."""
        weight, state, seed, lr, ids, offsets, table_sizes, row_offsets = ctx.update_operands
        call = ctx.call
        eager = getattr(ctx, "eager", False)
        signature = None
        if eager and call.signature is not None:
            signature = ("update", call.signature, tensor_signature(grad))
        plan = UPDATE.cached(signature)
        update = plan.call if plan is not None else checks.with_signature(call, signature)
        if eager:
            checks.check_writes(weight, state, seed, {"grad": grad})
        UPDATE.run_in_backward(ctx, update, (weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets),
                               plan)
        return _NO_GRADS


LOOKUP = Lookup()
UPDATE = Update()
TRAIN = Train()


# ---------------------------------------------------------------------------------------------- public API
def _lookup_signature(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
                      pooling: str, config: EmbeddingConfig | None) -> Hashable | None:
    """Everything a lookup's checks and plan read besides tensor values (per tensor its
    :func:`~fuselab.ops.opdef.tensor_signature`; pooling and config by value), or None under ``torch.compile`` or
    for non-tensors (the checks name them)."""
    if torch.compiler.is_compiling():
        return None
    try:
        return (tensor_signature(weight), tensor_signature(ids), None if offsets is None else tensor_signature(offsets),
                tensor_signature(table_sizes), tensor_signature(row_offsets), pooling, config)
    except (AttributeError, TypeError):
        return None


def _update_signature(lookup: Hashable | None, state: Tensor, seed: Tensor | None, lr: Tensor,
                      optimizer: EmbeddingOptimizer, deterministic: bool,
                      grad: Tensor | None = None) -> Hashable | None:
    """:func:`_lookup_signature` plus what an update's checks and plan read (the optimizer: its kind and
    hyper-parameters; ``grad`` None: the training lookup's, whose backward adds the gradient's)."""
    if lookup is None:
        return None
    try:
        return (lookup, tensor_signature(state), None if seed is None else tensor_signature(seed),
                tensor_signature(lr), type(optimizer), optimizer, type(deterministic), deterministic,
                None if grad is None else tensor_signature(grad))
    except (AttributeError, TypeError):
        return None


def embedding_bag_lookup(weight: Tensor, ids: Tensor, table_sizes: Tensor, row_offsets: Tensor,
                         offsets: Tensor | None = None, *, pooling: str = "sum",
                         config: EmbeddingConfig | None = None) -> Tensor:
    """Pooled embeddings of all F features in one launch: ``(B, F, D)``.

    Args:
        weight: ``(R, D)`` all tables stacked (float32, float16 or bfloat16 and contiguous on the Triton path; any
            float on the reference path). The output is float32 for half-precision weights.
        ids: one id per feature ``(B, F)`` int64/int32 raw ids, or with ``offsets`` ``(N,)`` flat bag values.
            Feature ``f`` reads row ``row_offsets[f] + (id mod table_sizes[f])`` (non-negative modulus), so every
            id is in range by construction (already-hashed ids pass unchanged).
        table_sizes, row_offsets: ``(F,)`` int64 rows and first row of each table. Their values are trusted
            (checking them would synchronise with the device): positive sizes, tables inside ``weight``.
        offsets: ``(B*F + 1,)`` int64 CSR offsets; bag ``b*F + f`` of feature ``f`` is
            ``ids[offsets[b*F+f]:offsets[b*F+f+1]]``; empty bags give zeros. Values are clamped into ``[0, N]``
            (non-decreasing offsets starting at 0 and ending at N are the caller's contract, unchecked).
        pooling: ``sum`` or ``mean`` (bags).
        config: kernel tuning knobs (:class:`EmbeddingConfig`).

    Raises:
        TypeError/ValueError naming the argument: non-tensors, wrong dtypes (ids not int32/int64, offsets or table
        metadata not int64), wrong ranks, F mismatch, offsets not ``(B*F + 1,)``, mixed devices, unknown pooling, a
        config that is no EmbeddingConfig; on the Triton path a weight of another dtype or not contiguous.
    """
    operands = (weight, ids, offsets, table_sizes, row_offsets)
    signature = _lookup_signature(weight, ids, offsets, table_sizes, row_offsets, pooling, config)
    plan = LOOKUP.cached(signature)
    if plan is not None and triton_for(weight):  # a call of this signature passed the checks
        return LOOKUP.run(plan.call, operands, plan, False)
    call = checks.validate_lookup(LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, config),
                                  signature)
    return LOOKUP.run(call, operands, None, False)


def embedding_bag_update_(weight: Tensor, state: Tensor, lr: Tensor, grad: Tensor, ids: Tensor,
                          table_sizes: Tensor, row_offsets: Tensor, offsets: Tensor | None = None, *,
                          pooling: str = "sum", optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                          deterministic: bool = True, config: EmbeddingConfig | None = None,
                          seed: Tensor | None = None) -> None:
    """Apply one ``optimizer`` step for the output gradient ``grad`` ``(B, F, D)`` of a lookup with these ids, in
    place on ``weight`` and ``state``; duplicate rows are summed first (deterministically unless
    ``deterministic=False`` with SGD and an fp32 weight, which uses atomics). ``state``: ``optimizer.state_shape(R,
    D)`` (``(R,)`` row-wise Adagrad, ``(R, D)`` Adagrad; ignored for SGD), float32 for a half-precision weight.
    ``lr``: a 0-dim float tensor (read on the device: changing it needs no recompilation or graph capture).

    Half-precision weights (float16, bfloat16): the update's math is fp32 and the new weight is rounded
    stochastically (unbiased) from ``seed``, a 0-dim int64 tensor on the weight's device that every update advances
    by one (on the reference path, CPU tensors, the new weight is rounded to nearest and ``seed`` is not read).

    Raises: as :func:`embedding_bag_lookup`, and for ``state``/``lr``/``grad``/``seed`` of the wrong shape or
    dtype, an ``optimizer`` that is no :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer` (TypeError) or,
    on the Triton path, one the kernels do not implement (ValueError); ``weight``, ``state`` or ``seed`` (written in
    place) whose elements share memory, or that overlap each other or another argument (on every call).
    """
    operands = (weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets)
    signature = _update_signature(_lookup_signature(weight, ids, offsets, table_sizes, row_offsets, pooling, config),
                                  state, seed, lr, optimizer, deterministic, grad)
    plan = UPDATE.cached(signature)
    if plan is not None and triton_for(weight):
        checks.check_writes(weight, state, seed, {"lr": lr, "grad": grad, "ids": ids, "offsets": offsets,
                                                  "table_sizes": table_sizes, "row_offsets": row_offsets})
        UPDATE.run(plan.call, operands, plan, False)
        return
    call = checks.validate_update(LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, config),
                                  UpdateArgs(state, lr, seed, optimizer, deterministic, grad), signature)
    UPDATE.run(call, operands, None, False)


def embedding_bag_collection(weight: Tensor, state: Tensor, lr: Tensor, ids: Tensor, table_sizes: Tensor,
                             row_offsets: Tensor, offsets: Tensor | None = None, *, anchor: Tensor | None = None,
                             pooling: str = "sum", optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                             deterministic: bool = True, config: EmbeddingConfig | None = None,
                             seed: Tensor | None = None) -> Tensor:
    """:func:`embedding_bag_lookup` whose backward is :func:`embedding_bag_update_` (``seed``: as there).

    When ``anchor`` (any tensor, e.g. an empty parameter) requires grad and grad mode is on, the output is attached
    to autograd through it: the backward of the output's gradient updates ``weight`` and ``state`` in place and
    gives ``anchor`` no gradient. Otherwise a plain lookup. Raises: as :func:`embedding_bag_update_` (an output
    gradient that overlaps a written tensor: in the backward).
    """
    if not (anchor is not None and anchor.requires_grad and torch.is_grad_enabled()):
        return embedding_bag_lookup(weight, ids, table_sizes, row_offsets, offsets, pooling=pooling, config=config)
    operands = (anchor, weight, state, seed, lr, ids, offsets, table_sizes, row_offsets)
    signature = _update_signature(_lookup_signature(weight, ids, offsets, table_sizes, row_offsets, pooling, config),
                                  state, seed, lr, optimizer, deterministic)
    plan = TRAIN.cached(signature)
    if plan is not None and triton_for(weight):
        checks.check_writes(weight, state, seed, {"lr": lr, "ids": ids, "offsets": offsets,
                                                  "table_sizes": table_sizes, "row_offsets": row_offsets})
        return TRAIN.run(plan.call, operands, plan, True)
    call = checks.validate_update(LookupArgs(weight, ids, table_sizes, row_offsets, offsets, pooling, config),
                                  UpdateArgs(state, lr, seed, optimizer, deterministic), signature)
    return TRAIN.run(call, operands, None, True)
