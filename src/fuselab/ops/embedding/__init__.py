"""Embedding bag collection: all tables in one buffer, lookup of every feature in one launch, the optimizer update
fused into the backward (deterministic sort + segment reduce). See ``docs/embedding.md``.

Modules: :mod:`.kernels` (Triton), :mod:`.checks` (``validate_lookup``/``validate_update`` -> the calls,
:class:`EmbeddingConfig`), :mod:`.launch` (``plan_*(call, operands)`` and the launches of the lookup, the update's
pipeline and the training lookup), :mod:`.op` (the :class:`~fuselab.ops.opdef.Op` objects: custom ops, fakes,
autograd, eager path; the functional API), :mod:`.module` (:class:`EmbeddingBagCollection`).
"""

from .checks import EmbeddingConfig
from .module import EmbeddingBagCollection
from .op import embedding_bag_collection, embedding_bag_lookup, embedding_bag_update_

__all__ = ["EmbeddingBagCollection", "EmbeddingConfig", "embedding_bag_collection", "embedding_bag_lookup",
           "embedding_bag_update_"]
