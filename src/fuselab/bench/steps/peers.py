"""TorchRec and FBGEMM training steps for the DLRM suite (peers: only where ``torchrec`` and ``fbgemm_gpu`` import).

Written against torchrec 1.6.1 and fbgemm-gpu 1.6.0 (CUDA only). Both steps update the tables with FBGEMM's
table-batched embedding (TBE) and its row-wise Adagrad fused into the backward (``EXACT_ROWWISE_ADAGRAD``, the same
update as the other providers'); the dense parameters get ``torch.optim.Adagrad`` (:func:`~.stock.dense_adagrad`).

* :class:`DMPStep`: ``torchrec.models.dlrm.DLRM`` (``DLRM_DCN`` for cross layers) with its embedding collection
  sharded by ``DistributedModelParallel`` on one GPU: every table table-wise on the fused kernel
  (``EmbeddingComputeKernel.FUSED``), the optimizer attached with ``_apply_optimizer_in_backward`` (TorchRec's
  ``RowWiseAdagrad``). World size 1: the dense part is not wrapped in ``DistributedDataParallel`` (nothing to
  all-reduce) and runs eager, as TorchRec's model is written.
* :class:`TBEStep`: ``SplitTableBatchedEmbeddingBagsCodegen`` called directly on the batch's ids, then the dense part
  of :class:`~.stock.DenseParts` compiled by ``torch.compile``.

TorchRec's dot interaction keeps the upper triangle of the Gram matrix; the first top layer's columns are permuted
(:func:`upper_triangle_order`) so that both compute the model of :mod:`.model` from the same weights. Table weights
are fp32 when tables, row-wise state and a margin fit the device's free memory, else fp16 (FBGEMM has no bf16
tables here); ``table_precision`` says which.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.core.compile import compile_quietly
from fuselab.core.device import device_index

from .model import NUM_DENSE, DLRMShape, DLRMWeights, JaggedIds
from .stock import DenseParts, dense_adagrad

#: modules both peers need (the suite's providers declare them)
REQUIRES = ("torchrec", "fbgemm_gpu")
#: share of the device's free memory the tables and their row-wise state may take in fp32
FP32_SHARE = 0.6


def table_precision(shape: DLRMShape, device: torch.device) -> str:
    """``"fp32"`` when the tables and their row-wise state take under :data:`FP32_SHARE` of the free memory of
    ``device``, else ``"fp16"``."""
    free, _ = torch.cuda.mem_get_info(device_index(device))
    return "fp32" if shape.rows * (4 * shape.dim + 4) < FP32_SHARE * free else "fp16"


def upper_triangle_order(vectors: int) -> Tensor:
    """For each pair of TorchRec's order (upper triangle, row-major: ``(r, c)``, ``r < c``), its index in the lower
    triangle's row-major order of :mod:`.model` (the same dot product as pair ``(c, r)``)."""
    r, c = torch.triu_indices(vectors, vectors, offset=1)
    return c * (c - 1) // 2 + r


@torch.no_grad()
def load_dense_(linears: list[nn.Linear], layers, permute_first: Tensor | None = None, skip: int = 0) -> None:
    """Copy ``layers`` (``(weight, bias)`` pairs) into ``linears``; ``permute_first``: the first layer's columns after
    the first ``skip`` come in that order of the given weight's."""
    for k, (linear, (w, b)) in enumerate(zip(linears, layers, strict=True)):
        if k == 0 and permute_first is not None:
            w = torch.cat([w[:, :skip], w[:, skip:][:, permute_first]], dim=1)
        linear.weight.copy_(w)
        linear.bias.copy_(b)


def _autocast(device: torch.device, dtype: torch.dtype | None):
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype)


class TBEStep:
    """FBGEMM's TBE (row-wise Adagrad in its backward) for the tables, :class:`~.stock.DenseParts` compiled for the
    rest: ``step(dense, ids, labels) -> loss``."""

    def __init__(self, weights: DLRMWeights, device: torch.device, *, autocast: torch.dtype | None, lr_sparse: float,
                 lr_dense: float, eps: float):
        training = importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_training")
        common = importlib.import_module("fbgemm_gpu.split_table_batched_embeddings_ops_common")
        configs = importlib.import_module("fbgemm_gpu.split_embedding_configs")
        shape = self.shape = weights.shape
        self.table_precision = table_precision(shape, device)
        specs = [(n, shape.dim, common.EmbeddingLocation.DEVICE, common.ComputeDevice.CUDA) for n in shape.table_sizes]
        self.tbe = training.SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=configs.EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=lr_sparse, eps=eps,
            weights_precision=getattr(configs.SparseType, self.table_precision.upper()),
            pooling_mode=common.PoolingMode.SUM, bounds_check_mode=common.BoundsCheckMode.NONE, device=device)
        for t, table in enumerate(self.tbe.split_embedding_weights()):
            weights.fill_table_(table, t)
        self.ids = JaggedIds(shape, device)
        self.dense = DenseParts(weights, device, autocast)
        self.optimizer = dense_adagrad(list(self.dense.parameters()), lr_dense, eps)
        self.loss = compile_quietly(self.dense.loss, dynamic=False)

    def __call__(self, dense: Tensor, ids: Tensor, labels: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        values, offsets, _ = self.ids(ids)
        emb = self.tbe(values, offsets).view(ids.shape[0], self.shape.num_tables, self.shape.dim)
        loss = self.loss(dense, emb, labels)
        loss.backward()  # the tables are updated here
        self.optimizer.step()
        return loss.detach()


def _process_group(device: torch.device):
    """The default process group, made for one rank (NCCL, an in-memory store) when there is none."""
    dist = torch.distributed
    if not dist.is_initialized():
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    return dist.GroupMember.WORLD


def _dmp_model(weights: DLRMWeights, device: torch.device, precision: str) -> nn.Module:
    """TorchRec's DLRM of ``weights.shape`` (tables on the meta device, dense part on ``device`` with the weights)."""
    configs = importlib.import_module("torchrec.modules.embedding_configs")
    modules = importlib.import_module("torchrec.modules.embedding_modules")
    dlrm = importlib.import_module("torchrec.models.dlrm")
    shape = weights.shape
    data_type = getattr(configs.DataType, precision.upper())
    tables = [configs.EmbeddingBagConfig(num_embeddings=n, embedding_dim=shape.dim, name=f"table_{t}",
                                         feature_names=[f"feature_{t}"], data_type=data_type)
              for t, n in enumerate(shape.table_sizes)]
    collection = modules.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    with torch.device(device):
        if shape.interaction == "dot":
            model = dlrm.DLRM(embedding_bag_collection=collection, dense_in_features=NUM_DENSE,
                              dense_arch_layer_sizes=list(shape.bottom), over_arch_layer_sizes=list(shape.top),
                              dense_device=device)
        else:
            model = dlrm.DLRM_DCN(embedding_bag_collection=collection, dense_in_features=NUM_DENSE,
                                  dense_arch_layer_sizes=list(shape.bottom), over_arch_layer_sizes=list(shape.top),
                                  dcn_num_layers=shape.cross_layers, dcn_low_rank_dim=shape.cross_rank,
                                  dense_device=device)
    load_dense_([m for m in model.dense_arch.modules() if isinstance(m, nn.Linear)], weights.bottom)
    order = upper_triangle_order(shape.num_tables + 1) if shape.interaction == "dot" else None
    load_dense_([m for m in model.over_arch.modules() if isinstance(m, nn.Linear)], weights.top, order, shape.dim)
    if shape.interaction == "dcn":
        cross = model.inter_arch.crossnet
        with torch.no_grad():
            for layer, (v, w, b) in enumerate(weights.cross):
                cross.V_kernels[layer].copy_(v)
                cross.W_kernels[layer].copy_(w)
                cross.bias[layer].copy_(b)
    return model


class DMPStep:
    """TorchRec's ``DistributedModelParallel`` on one GPU (see the module docstring): ``step(dense, ids, labels) ->
    loss``."""

    def __init__(self, weights: DLRMWeights, device: torch.device, *, autocast: torch.dtype | None, lr_sparse: float,
                 lr_dense: float, eps: float):
        distributed = importlib.import_module("torchrec.distributed")
        planner = importlib.import_module("torchrec.distributed.planner")
        embeddingbag = importlib.import_module("torchrec.distributed.embeddingbag")
        types = importlib.import_module("torchrec.distributed.types")
        kernels = importlib.import_module("torchrec.distributed.embedding_types")
        optim = importlib.import_module("torchrec.optim")
        in_backward = importlib.import_module("torch.distributed.optim")
        shape = self.shape = weights.shape
        device = torch.device("cuda", device_index(device))  # TorchRec's sharding asks for an indexed device
        self.device, self.autocast = device, autocast
        self.table_precision = table_precision(shape, device)
        model = _dmp_model(weights, device, self.table_precision)
        in_backward._apply_optimizer_in_backward(optim.RowWiseAdagrad,
                                                 model.sparse_arch.embedding_bag_collection.parameters(),
                                                 {"lr": lr_sparse, "eps": eps})
        pg = _process_group(device)
        constraints = {f"table_{t}": planner.ParameterConstraints(
            sharding_types=[types.ShardingType.TABLE_WISE.value],
            compute_kernels=[kernels.EmbeddingComputeKernel.FUSED.value], pooling_factors=[float(bag)])
            for t, bag in enumerate(shape.bags)}
        topology = planner.Topology(world_size=1, compute_device="cuda",
                                    hbm_cap=torch.cuda.get_device_properties(device).total_memory)
        sharders = [embeddingbag.EmbeddingBagCollectionSharder()]
        plan = planner.EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
            model, sharders, pg)
        self.model = distributed.DistributedModelParallel(
            module=model, device=device, plan=plan, sharders=sharders, init_data_parallel=False,
            env=types.ShardingEnv.from_process_group(pg))
        dense = []
        for name, param in self.model.named_parameters():
            if "embedding_bag_collection" not in name:
                dense.append(param)
                continue
            table = name.rsplit(".", 2)[-2]
            if table.startswith("table_"):
                weights.fill_table_(param.data, int(table.removeprefix("table_")))
        self.optimizer = dense_adagrad(dense, lr_dense, eps)
        self.ids = JaggedIds(shape, device)
        self._features = importlib.import_module("torchrec.sparse.jagged_tensor").KeyedJaggedTensor
        self._keys = [f"feature_{t}" for t in range(shape.num_tables)]

    def features(self, ids: Tensor):
        """The batch's KeyedJaggedTensor: lengths per table known on the host (fixed bags), no synchronization."""
        values, offsets, lengths = self.ids(ids)
        per_key = [ids.shape[0] * n for n in self.shape.bags]
        starts = [0, *torch.tensor(per_key).cumsum(0).tolist()]
        return self._features(keys=self._keys, values=values, lengths=lengths, offsets=offsets, stride=ids.shape[0],
                              length_per_key=per_key, offset_per_key=starts)

    def __call__(self, dense: Tensor, ids: Tensor, labels: Tensor) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with _autocast(self.device, self.autocast):
            logits = self.model(dense, self.features(ids)).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        loss.backward()  # the tables are updated here
        self.optimizer.step()
        return loss.detach()
