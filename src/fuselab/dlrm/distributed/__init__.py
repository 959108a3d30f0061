"""DLRM past one GPU: sharding plan, model-parallel embeddings, data-parallel MLPs, sharded checkpoints, launch.

See ``docs/dlrm_distributed.md``. Modules: :mod:`.plan`, :mod:`.local`, :mod:`.embedding`, :mod:`.parallel`,
:mod:`.checkpoint`, :mod:`.launch`.
"""

from .embedding import ShardedEmbeddingCollection
from .local import fused_factory, init_rows, torch_factory
from .parallel import (
    DenseParts,
    DistributedDLRM,
    ParallelContext,
    gather_rows,
    init_from_env,
    local_rows,
    local_slice,
    shutdown,
    slice_bags,
    slice_batch,
)
from .plan import Shard, ShardingPlan, plan_sharding, row_bytes

__all__ = ["DenseParts", "DistributedDLRM", "ParallelContext", "Shard", "ShardedEmbeddingCollection", "ShardingPlan",
           "fused_factory", "gather_rows", "init_from_env", "init_rows", "local_rows",
           "local_slice", "plan_sharding", "row_bytes", "shutdown", "slice_bags", "slice_batch", "torch_factory"]
