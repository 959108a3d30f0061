"""Embedding bag collection: torch.library custom ops, fakes, autograd and the public functional API.

Custom ops (``torch.compile(fullgraph=True)`` traces them):

* ``fuselab::embedding_bag_lookup``: the pooled lookup, no autograd;
* ``fuselab::embedding_bag_update_``: the fused sparse optimizer update, mutating ``weight`` and ``momentum``;
* ``fuselab::embedding_bag_train``: the lookup whose backward is that update (FBGEMM's trick): it takes a
  placeholder tensor ``anchor`` that requires grad, so autograd calls the backward, which applies the optimizer
  to ``weight`` in place and returns no gradient at all: no dense ``(R, D)`` and no sparse COO gradient exist.

Eager calls skip the dispatcher (straight to the launchers; autograd through :class:`_TrainFunction`);
``torch.compile`` always sees the custom ops. CUDA tensors run the Triton kernels, others the reference
(:mod:`fuselab.reference.embedding`), as :func:`fuselab.backend.triton_for` decides.
"""

from __future__ import annotations

import torch

from fuselab.backend import triton_for
from fuselab.reference import embedding as ref

from .launch import DEFAULT_CONFIG, EmbeddingConfig, check, check_update, lookup_, update_

__all__ = ["EmbeddingConfig", "embedding_bag_collection", "embedding_bag_lookup", "embedding_bag_update_"]

Tensor = torch.Tensor


def _config(knobs: list[int]) -> EmbeddingConfig:
    return EmbeddingConfig(*knobs) if knobs else DEFAULT_CONFIG


def _knobs(config: EmbeddingConfig | None) -> list[int]:
    if config is None:
        return []
    if not isinstance(config, EmbeddingConfig):
        raise TypeError(f"config must be an EmbeddingConfig, got {type(config).__name__}")
    return [config.lookup_elements, config.update_elements, config.rows_block, config.carry_elements, config.num_warps]


def _out_shape(weight: Tensor, ids: Tensor, table_sizes: Tensor, offsets: Tensor | None) -> tuple[int, int, int]:
    f_count = table_sizes.shape[0]
    batch = ids.shape[0] if offsets is None else (offsets.shape[0] - 1) // f_count
    return batch, f_count, weight.shape[1]


def _lookup(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
            pooling: str, knobs: list[int]) -> Tensor:
    if not triton_for(weight):
        return ref.lookup(weight, ids, table_sizes, row_offsets, offsets, pooling)
    out = torch.empty(_out_shape(weight, ids, table_sizes, offsets), dtype=torch.float32, device=weight.device)
    lookup_(out, weight, ids, table_sizes, row_offsets, offsets, pooling, _config(knobs))
    return out


def _update(weight: Tensor, momentum: Tensor, lr: Tensor, grad: Tensor, ids: Tensor, offsets: Tensor | None,
            table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str, eps: float,
            deterministic: bool, knobs: list[int]) -> None:
    if not triton_for(weight):
        ref.sparse_update_(weight, momentum, lr, grad, ids, table_sizes, row_offsets, offsets, pooling, optimizer,
                           eps)
        return
    update_(weight, momentum, lr, grad, ids, table_sizes, row_offsets, offsets, pooling, optimizer, eps,
            deterministic, _config(knobs))


# ---------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("fuselab::embedding_bag_lookup", mutates_args=())
def _lookup_op(weight: Tensor, ids: Tensor, offsets: Tensor | None, table_sizes: Tensor, row_offsets: Tensor,
               pooling: str, knobs: list[int]) -> Tensor:
    return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs)


@_lookup_op.register_fake
def _(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs):
    return weight.new_empty(_out_shape(weight, ids, table_sizes, offsets))  # the kernels' fp32 is weight's dtype


@torch.library.custom_op("fuselab::embedding_bag_update_", mutates_args=("weight", "momentum"))
def _update_op(weight: Tensor, momentum: Tensor, lr: Tensor, grad: Tensor, ids: Tensor, offsets: Tensor | None,
               table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str, eps: float,
               deterministic: bool, knobs: list[int]) -> None:
    _update(weight, momentum, lr, grad, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps,
            deterministic, knobs)


@_update_op.register_fake
def _(weight, momentum, lr, grad, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps, deterministic,
      knobs):
    return None


@torch.library.custom_op("fuselab::embedding_bag_train", mutates_args=())
def _train_op(anchor: Tensor, weight: Tensor, momentum: Tensor, lr: Tensor, ids: Tensor, offsets: Tensor | None,
              table_sizes: Tensor, row_offsets: Tensor, pooling: str, optimizer: str, eps: float,
              deterministic: bool, knobs: list[int]) -> Tensor:
    return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs)


@_train_op.register_fake
def _(anchor, weight, momentum, lr, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps, deterministic,
      knobs):
    return weight.new_empty(_out_shape(weight, ids, table_sizes, offsets))  # the kernels' fp32 is weight's dtype


def _setup_context(ctx, inputs, output) -> None:
    _anchor, weight, momentum, lr, ids, offsets, table_sizes, row_offsets, *params = inputs
    ctx.save_for_backward(weight, momentum, lr, ids, offsets, table_sizes, row_offsets)
    ctx.params = params


def _backward(ctx, grad: Tensor) -> tuple:
    weight, momentum, lr, ids, offsets, table_sizes, row_offsets = ctx.saved_tensors
    torch.ops.fuselab.embedding_bag_update_(weight, momentum, lr, grad, ids, offsets, table_sizes, row_offsets,
                                            *ctx.params)
    return (None,) * 13


_train_op.register_autograd(_backward, setup_context=_setup_context)


class _TrainFunction(torch.autograd.Function):
    """Eager autograd straight to the lookup and the update (the custom-op dispatcher and its autograd wrapper cost
    tens of microseconds of host time per call); ``torch.compile`` traces ``fuselab::embedding_bag_train`` instead.
    The tensors for the backward are kept on ``ctx`` (not saved tensors): the update itself bumps ``weight``'s
    version, and a second lookup of the same weight before its backward must not trip the version check."""

    @staticmethod
    def forward(ctx, anchor, weight, momentum, lr, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps,
                deterministic, knobs):
        ctx.args = (weight, momentum, lr, ids, offsets, table_sizes, row_offsets, pooling, optimizer, eps,
                    deterministic, knobs)
        return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs)

    @staticmethod
    def backward(ctx, grad):
        weight, momentum, lr, ids, offsets, table_sizes, row_offsets, *params = ctx.args
        _update(weight, momentum, lr, grad, ids, offsets, table_sizes, row_offsets, *params)
        return (None,) * 13


# ---------------------------------------------------------------------------------------------- public API
def embedding_bag_lookup(weight: Tensor, ids: Tensor, table_sizes: Tensor, row_offsets: Tensor,
                         offsets: Tensor | None = None, *, pooling: str = "sum",
                         config: EmbeddingConfig | None = None) -> Tensor:
    """Pooled embeddings of all F features in one launch: ``(B, F, D)``.

    Args:
        weight: ``(R, D)`` all tables stacked (float32 on the Triton path; any float on the reference path).
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
    check(weight, ids, table_sizes, row_offsets, offsets, pooling)
    if not torch.compiler.is_compiling():  # eager: no dispatcher
        return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, _knobs(config))
    return torch.ops.fuselab.embedding_bag_lookup(weight, ids, offsets, table_sizes, row_offsets, pooling,
                                                  _knobs(config))


def embedding_bag_update_(weight: Tensor, momentum: Tensor, lr: Tensor, grad: Tensor, ids: Tensor,
                          table_sizes: Tensor, row_offsets: Tensor, offsets: Tensor | None = None, *,
                          pooling: str = "sum", optimizer: str = "rowwise_adagrad", eps: float = 1e-8,
                          deterministic: bool = True, config: EmbeddingConfig | None = None) -> None:
    """Apply one optimizer step for the output gradient ``grad`` ``(B, F, D)`` of a lookup with these ids, in place
    on ``weight`` and ``momentum``; duplicate rows are summed first (deterministically unless ``deterministic=False``
    with ``sgd``, which uses atomics). ``momentum``: ``(R,)`` rowwise_adagrad, ``(R, D)`` adagrad, ignored for sgd.
    ``lr``: a 0-dim float tensor (read on the device: changing it needs no recompilation or graph capture).

    Raises: as :func:`embedding_bag_lookup`, and for ``momentum``/``lr``/``grad`` of the wrong shape or dtype, an
    unknown optimizer, a negative eps.
    """
    batch, f_count, _ = check(weight, ids, table_sizes, row_offsets, offsets, pooling)
    check_update(weight, momentum, lr, grad, optimizer, eps, batch, f_count)
    args = (weight, momentum, lr, grad, ids, offsets, table_sizes, row_offsets, pooling, optimizer, float(eps),
            bool(deterministic), _knobs(config))
    if not torch.compiler.is_compiling():  # eager: no dispatcher
        _update(*args)
        return
    torch.ops.fuselab.embedding_bag_update_(*args)


def embedding_bag_collection(weight: Tensor, momentum: Tensor, lr: Tensor, ids: Tensor, table_sizes: Tensor,
                             row_offsets: Tensor, offsets: Tensor | None = None, *, anchor: Tensor | None = None,
                             pooling: str = "sum", optimizer: str = "rowwise_adagrad", eps: float = 1e-8,
                             deterministic: bool = True, config: EmbeddingConfig | None = None) -> Tensor:
    """:func:`embedding_bag_lookup` whose backward is :func:`embedding_bag_update_`.

    When ``anchor`` (any tensor, e.g. an empty parameter) requires grad and grad mode is on, the output is attached
    to autograd through it: the backward of the output's gradient updates ``weight`` and ``momentum`` in place and
    gives ``anchor`` no gradient. Otherwise a plain lookup. Raises: as :func:`embedding_bag_update_`.
    """
    batch, f_count, _ = check(weight, ids, table_sizes, row_offsets, offsets, pooling)
    train = anchor is not None and anchor.requires_grad and torch.is_grad_enabled()
    compiling = torch.compiler.is_compiling()
    knobs = _knobs(config)
    if not train:
        if not compiling:
            return _lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs)
        return torch.ops.fuselab.embedding_bag_lookup(weight, ids, offsets, table_sizes, row_offsets, pooling, knobs)
    check_update(weight, momentum, lr, None, optimizer, eps, batch, f_count)
    args = (anchor, weight, momentum, lr, ids, offsets, table_sizes, row_offsets, pooling, optimizer, float(eps),
            bool(deterministic), knobs)
    if not compiling:
        return _TrainFunction.apply(*args)
    return torch.ops.fuselab.embedding_bag_train(*args)
