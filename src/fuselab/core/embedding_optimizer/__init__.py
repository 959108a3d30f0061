"""The embedding optimizer, defined once: what the tables' optimizer is (kind, hyper-parameters), the shape of its
state, its float64-capable reference update, and the element-wise rule the DLRM applies to its MLPs under the same
choice. The references, the fused embedding kernels' checks, the DLRM's parts and its sharding plan all take an
:class:`EmbeddingOptimizer`; its name is read once, where a config or the CLI is parsed
(:func:`embedding_optimizer`).

Importing this package does not import torch (the CLI lists the names when it builds its parser).

A new optimizer: one file here (a frozen dataclass subclassing :class:`EmbeddingOptimizer`) and one line in
:data:`EMBEDDING_OPTIMIZERS`. The fused kernels implement the kinds listed in ``fuselab.ops.embedding.launch``;
another kind runs on the torch paths (``kernels="torch"``) and is refused by the kernels with a message naming it.
"""

from __future__ import annotations

import dataclasses

from .adagrad import Adagrad, RowwiseAdagrad
from .base import EmbeddingOptimizer
from .sgd import SGD

#: every embedding optimizer by name (the names are the config's and the CLI's choices)
EMBEDDING_OPTIMIZERS: dict[str, type[EmbeddingOptimizer]] = {
    SGD.name: SGD,
    Adagrad.name: Adagrad,
    RowwiseAdagrad.name: RowwiseAdagrad,
}

#: the default of the embedding collection and its functions: row-wise Adagrad, eps 1e-8
ROWWISE_ADAGRAD = RowwiseAdagrad()

__all__ = ["EMBEDDING_OPTIMIZERS", "ROWWISE_ADAGRAD", "SGD", "Adagrad", "EmbeddingOptimizer", "RowwiseAdagrad",
           "embedding_optimizer"]


def embedding_optimizer(name: str, **options: float) -> EmbeddingOptimizer:
    """The optimizer called ``name``, with those of ``options`` it has as hyper-parameters (``eps`` for the Adagrad
    kinds; a DLRM config carries one ``adagrad_eps`` for every kind, so options a kind lacks are left out).

    Raises ValueError naming ``optimizer`` for an unknown name, and TypeError/ValueError naming a bad option."""
    kind = EMBEDDING_OPTIMIZERS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"optimizer must be one of {', '.join(EMBEDDING_OPTIMIZERS)}, got {name!r}")
    fields = {f.name for f in dataclasses.fields(kind)}
    return kind(**{key: value for key, value in options.items() if key in fields})
