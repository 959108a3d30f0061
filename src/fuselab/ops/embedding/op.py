"""Embedding bag collection: three :class:`~fuselab.ops.opdef.Op` and the public functional API.

* :data:`LOOKUP` (``fuselab::embedding_bag_lookup``): the pooled lookup, no autograd;
* :data:`UPDATE` (``fuselab::embedding_bag_update_``): the fused sparse optimizer update, mutating ``weight`` and
  ``state`` (``mutates_args``; its fake returns nothing);
* :data:`TRAIN` (``fuselab::embedding_bag_train``): the lookup whose backward is that update (FBGEMM's trick): it
  takes a placeholder tensor ``anchor`` that requires grad, so autograd calls the backward (:func:`_train_backward`),
  which applies the optimizer to ``weight`` in place through :data:`UPDATE` and returns no gradient at all: no
  dense ``(R, D)`` and no sparse COO gradient exist.

Eager calls skip the dispatcher (straight to the launchers; autograd through :data:`TRAIN`'s eager node);
``torch.compile`` always sees the custom ops. CUDA tensors run the Triton kernels, others the reference
(:mod:`fuselab.reference.embedding`), as :func:`fuselab.backend.triton_for` decides. An eager call whose key a
checked call kept skips the checks and the plan and repeats the kept launches; the backward's update repeats the one
kept under the forward's key and the gradient's layout. Nothing synchronises with the host (CUDA-graph capturable).
"""

from __future__ import annotations

import functools
from dataclasses import fields

import torch

from fuselab.backend import triton_for
from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD, EmbeddingOptimizer, embedding_optimizer
from fuselab.ops._recordop import RecordOp, layout, operand
from fuselab.reference import embedding as ref

from .launch import (
    DEFAULT_CONFIG,
    EmbeddingConfig,
    UpdateTensors,
    check,
    check_update,
    lookup_,
    lookup_again,
    update_,
    update_again,
)

__all__ = ["LOOKUP", "TRAIN", "UPDATE", "EmbeddingConfig", "embedding_bag_collection", "embedding_bag_lookup",
           "embedding_bag_update_"]

Tensor = torch.Tensor

_NO_GRADS = (None,) * 14  # TRAIN's inputs get no gradient: the update is applied in place


def _config(knobs: list[int]) -> EmbeddingConfig:
    return EmbeddingConfig(*knobs) if knobs else DEFAULT_CONFIG


def _knobs(config: EmbeddingConfig | None) -> list[int]:
    if config is None:
        return []
    if not isinstance(config, EmbeddingConfig):
        raise TypeError(f"config must be an EmbeddingConfig, got {type(config).__name__}")
    return [getattr(config, f.name) for f in fields(config)]


def _out_shape(weight: Tensor, ids: Tensor, table_sizes: Tensor, offsets: Tensor | None) -> tuple[int, int, int]:
    f_count = table_sizes.shape[0]
    batch = ids.shape[0] if offsets is None else (offsets.shape[0] - 1) // f_count
    return batch, f_count, weight.shape[1]


def _as_schema(optimizer: EmbeddingOptimizer) -> tuple[str, float]:
    """The optimizer as the custom ops' schema carries it: its name and its eps (0 for a kind without one)."""
    return optimizer.name, float(getattr(optimizer, "eps", 0.0))


@functools.cache
def _from_schema(name: str, eps: float) -> EmbeddingOptimizer:
    """The optimizer the schema's name and eps stand for (inside the ops)."""
    return embedding_optimizer(name, eps=eps)


# ---------------------------------------------------------------------------------------------- lookup
def _lookup(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
            pooling: str, knobs: list[int], *, prepared=None) -> tuple:
    """((B, F, D) pooled embeddings, record ``(launch record, shape)`` or None). ``prepared`` repeats a kept
    record's launch."""
    if prepared is not None:
        out = torch.empty(prepared[1], dtype=torch.float32, device=weight.device)
        lookup_again(prepared[0], out, weight, ids, table_sizes, row_offsets, offsets)
        return out, None
    if not triton_for(weight):
        return ref.lookup(weight, ids, table_sizes, row_offsets, offsets, pooling), None
    shape = _out_shape(weight, ids, table_sizes, offsets)
    out = torch.empty(shape, dtype=torch.float32, device=weight.device)
    record = lookup_(out, weight, ids, table_sizes, row_offsets, offsets, pooling, _config(knobs))
    return out, (None if record is None else (record, shape))


def _lookup_fake(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
                 pooling: str, knobs: list[int]) -> Tensor:
    return weight.new_empty(_out_shape(weight, ids, table_sizes, offsets), dtype=ref.compute_dtype(weight.dtype))


LOOKUP = RecordOp("fuselab::embedding_bag_lookup", eager=_lookup, fake=_lookup_fake)


# ---------------------------------------------------------------------------------------------- update
def _update(weight: Tensor, state: Tensor, seed: Tensor | None, lr: Tensor, grad: Tensor, ids: Tensor,
            offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str, eps: float,
            deterministic: bool, knobs: list[int], *, prepared=None) -> tuple:
    """((weight, state, seed) updated in place, launch record or None)."""
    tensors = UpdateTensors(weight, state, lr, seed, grad, ids, table_sizes, row_offsets, offsets)
    if prepared is not None:
        update_again(prepared, tensors)
        return (weight, state, seed), None
    if not triton_for(weight):
        ref.sparse_update_(weight, state, lr, grad, ids, table_sizes, row_offsets, offsets, pooling,
                           _from_schema(optimizer, eps))
        return (weight, state, seed), None
    record = update_(tensors, pooling, _from_schema(optimizer, eps), deterministic, _config(knobs))
    return (weight, state, seed), record


def _update_fake(weight: Tensor, state: Tensor, seed: Tensor | None, lr: Tensor, grad: Tensor, ids: Tensor,
                 offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str,
                 eps: float, deterministic: bool, knobs: list[int]) -> None:
    return None


UPDATE = RecordOp("fuselab::embedding_bag_update_", eager=_update, fake=_update_fake,
                  mutates_args=("weight", "state", "seed"))


# ---------------------------------------------------------------------------------------------- train
def _train(anchor: Tensor, weight: Tensor, state: Tensor, seed: Tensor | None, lr: Tensor, ids: Tensor,
           offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str, eps: float,
           deterministic: bool, knobs: list[int], *, prepared=None) -> tuple:
    """The lookup (its backward is :func:`_train_backward`)."""
    return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs, prepared=prepared)


def _train_fake(anchor: Tensor, weight: Tensor, state: Tensor, seed: Tensor | None, lr: Tensor, ids: Tensor,
                offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str,
                eps: float, deterministic: bool, knobs: list[int]) -> Tensor:
    return weight.new_empty(_out_shape(weight, ids, table_sizes, offsets), dtype=ref.compute_dtype(weight.dtype))


def _train_setup(ctx, inputs, output) -> None:
    """What the update needs, kept on ``ctx`` (not saved tensors): the update itself bumps ``weight``'s version, and
    a second lookup of the same weight before its backward must not trip the saved-tensor version check."""
    ctx.update_args = inputs[1:]  # weight, state, seed, lr, ids, offsets, table_sizes, row_offsets, pooling, ...


def _train_backward(ctx, grad: Tensor) -> tuple:
    """Apply the optimizer step of ``grad`` in place (:data:`UPDATE`); no input gets a gradient. In eager autograd
    the update's launches are kept under the forward's key and the gradient's layout."""
    weight, state, seed, lr, ids, offsets, table_sizes, row_offsets, *params = ctx.update_args
    key = getattr(ctx, "key", None)
    if key is not None:
        key = ("update", key, layout(grad))
    UPDATE.run_in_backward(ctx, (weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets, *params),
                           key)
    return _NO_GRADS


TRAIN = RecordOp("fuselab::embedding_bag_train", eager=_train, fake=_train_fake,
                 autograd=(_train_setup, _train_backward), differentiable=(0,))


# ---------------------------------------------------------------------------------------------- public API
def _lookup_key(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
                pooling: str, config: EmbeddingConfig | None) -> tuple | None:
    """Everything a lookup's checks and launch depend on besides tensor values (each operand's shape, device, dtype,
    strides, storage offset, 16-byte alignment; pooling, config), or None under ``torch.compile``. Raises
    AttributeError/TypeError for non-tensors (the checks name them)."""
    if torch.compiler.is_compiling():
        return None
    return (operand(weight), operand(ids), None if offsets is None else operand(offsets), operand(table_sizes),
            operand(row_offsets), pooling, config)


def _update_key(lookup_key: tuple | None, state: Tensor, seed: Tensor | None, lr: Tensor,
                optimizer: EmbeddingOptimizer, deterministic: bool, grad: Tensor | None = None) -> tuple | None:
    """:func:`_lookup_key` plus what an update's checks and launches depend on (the optimizer: kind and
    hyper-parameters; ``grad`` None: the backward's, keyed there by its layout)."""
    if lookup_key is None:
        return None
    return (lookup_key, operand(state), None if seed is None else operand(seed), operand(lr), optimizer,
            deterministic, None if grad is None else operand(grad))


def _kept(op: RecordOp, make_key, *args) -> tuple:
    """``(key, record kept under it)``; ``(None, None)`` when the key cannot be made or looked up (non-tensors,
    unhashable arguments: the checks name them) or under ``torch.compile``."""
    try:
        key = make_key(*args)
        return key, (None if key is None else op.launches.get(key))
    except (AttributeError, TypeError):
        return None, None


def embedding_bag_lookup(weight: Tensor, ids: Tensor, table_sizes: Tensor, row_offsets: Tensor,
                         offsets: Tensor | None = None, *, pooling: str = "sum",
                         config: EmbeddingConfig | None = None) -> Tensor:
    """Pooled embeddings of all F features in one launch: ``(B, F, D)``.

    Args:
        weight: ``(R, D)`` all tables stacked (float32, float16 or bfloat16 on the Triton path, read as fp32; any
            float on the reference path). The output is float32 for half-precision tables, else weight's dtype.
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
        metadata not int64), wrong ranks, F mismatch, offsets not ``(B*F + 1,)``, mixed devices, unknown pooling.
    """
    key, prepared = _kept(LOOKUP, _lookup_key, weight, ids, offsets, table_sizes, row_offsets, pooling, config)
    if prepared is None or not triton_for(weight):  # else a call of this key passed the checks before
        check(weight, ids, table_sizes, row_offsets, offsets, pooling)
        prepared = None
    return LOOKUP.run((weight, ids, offsets, table_sizes, row_offsets, pooling, _knobs(config)), key, prepared, False)


def embedding_bag_update_(weight: Tensor, state: Tensor, lr: Tensor, grad: Tensor, ids: Tensor,
                          table_sizes: Tensor, row_offsets: Tensor, offsets: Tensor | None = None, *,
                          pooling: str = "sum", optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                          deterministic: bool = True, config: EmbeddingConfig | None = None,
                          seed: Tensor | None = None) -> None:
    """Apply one ``optimizer`` step for the output gradient ``grad`` ``(B, F, D)`` of a lookup with these ids, in
    place on ``weight`` and ``state``; duplicate rows are summed first (deterministically unless
    ``deterministic=False`` with SGD, which uses atomics). ``state``: ``optimizer.state_shape(R, D)`` (``(R,)``
    row-wise Adagrad, ``(R, D)`` Adagrad; ignored for SGD). ``lr``: a 0-dim float tensor (read on the device:
    changing it needs no recompilation or graph capture).

    Half-precision weights (float16, bfloat16): the update's math is fp32 (``state`` float32) and the new weight is
    rounded stochastically (unbiased) from ``seed``, a 0-dim int64 tensor on the weight's device that every update
    advances by one (on the reference path, CPU tensors, the new weight is rounded to nearest and ``seed`` is not
    read). SGD with ``deterministic=False`` uses atomics only on fp32 weights.

    Raises: as :func:`embedding_bag_lookup`, and for ``state``/``lr``/``grad``/``seed`` of the wrong shape or dtype, an
    ``optimizer`` that is no :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer` (TypeError), or, on the
    Triton path, one the kernels do not implement (ValueError).
    """
    key, prepared = _kept(UPDATE, lambda: _update_key(
        _lookup_key(weight, ids, offsets, table_sizes, row_offsets, pooling, config), state, seed, lr, optimizer,
        deterministic, grad))
    if prepared is None or not triton_for(weight):
        batch, f_count, _ = check(weight, ids, table_sizes, row_offsets, offsets, pooling)
        check_update(weight, state, lr, grad, optimizer, batch, f_count, seed)
        prepared = None
    UPDATE.run((weight, state, seed, lr, grad, ids, offsets, table_sizes, row_offsets, pooling, *_as_schema(optimizer),
                bool(deterministic), _knobs(config)), key, prepared, False)


def embedding_bag_collection(weight: Tensor, state: Tensor, lr: Tensor, ids: Tensor, table_sizes: Tensor,
                             row_offsets: Tensor, offsets: Tensor | None = None, *, anchor: Tensor | None = None,
                             pooling: str = "sum", optimizer: EmbeddingOptimizer = ROWWISE_ADAGRAD,
                             deterministic: bool = True, config: EmbeddingConfig | None = None,
                             seed: Tensor | None = None) -> Tensor:
    """:func:`embedding_bag_lookup` whose backward is :func:`embedding_bag_update_` (``seed``: as there).

    When ``anchor`` (any tensor, e.g. an empty parameter) requires grad and grad mode is on, the output is attached
    to autograd through it: the backward of the output's gradient updates ``weight`` and ``state`` in place and
    gives ``anchor`` no gradient. Otherwise a plain lookup. Raises: as :func:`embedding_bag_update_`.
    """
    if not (anchor is not None and anchor.requires_grad and torch.is_grad_enabled()):
        return embedding_bag_lookup(weight, ids, table_sizes, row_offsets, offsets, pooling=pooling, config=config)
    key, prepared = _kept(TRAIN, lambda: _update_key(
        _lookup_key(weight, ids, offsets, table_sizes, row_offsets, pooling, config), state, seed, lr, optimizer,
        deterministic))
    if prepared is None or not triton_for(weight):
        batch, f_count, _ = check(weight, ids, table_sizes, row_offsets, offsets, pooling)
        check_update(weight, state, lr, None, optimizer, batch, f_count, seed)
        prepared = None
    return TRAIN.run((anchor, weight, state, seed, lr, ids, offsets, table_sizes, row_offsets, pooling,
                      *_as_schema(optimizer), bool(deterministic), _knobs(config)), key, prepared, True)
