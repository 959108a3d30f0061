"""Embedding bag collection: all tables in one buffer, lookup of every feature in one launch, the optimizer update
fused into the backward (deterministic sort + segment reduce). See ``docs/embedding.md``.

Modules: :mod:`.kernels` (Triton), :mod:`.launch` (validation, launchers and their records,
:class:`EmbeddingConfig`), :mod:`.op` (the :class:`~fuselab.ops._recordop.RecordOp` objects: custom ops, fakes,
autograd, eager path; the functional API), :mod:`.module` (:class:`EmbeddingBagCollection`).
"""

from .launch import EmbeddingConfig
from .module import EmbeddingBagCollection
from .op import embedding_bag_collection, embedding_bag_lookup, embedding_bag_update_

__all__ = ["EmbeddingBagCollection", "EmbeddingConfig", "embedding_bag_collection", "embedding_bag_lookup",
           "embedding_bag_update_"]
