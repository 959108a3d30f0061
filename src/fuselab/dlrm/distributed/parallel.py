"""Process groups, the hybrid-parallel DLRM wrapper and the per-rank slice of the global batch.

* :func:`init_from_env` joins the job that ``torchrun`` (or :func:`.launch.spawn_local`) started: NCCL on CUDA, gloo
  on CPU, a timeout on every collective (a dead rank makes the others fail instead of hanging), and a second
  process group for the embedding exchanges.
* :class:`DistributedDLRM`: embeddings model-parallel (:class:`.embedding.ShardedEmbeddingCollection`), the dense
  part data-parallel through DDP (bucketed gradient all-reduce overlapped with the backward).
* :func:`local_slice` / :func:`slice_batch` / :func:`local_rows`: each rank reads only its part of a global batch;
  :func:`gather_rows` puts the parts back together (evaluation).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from ..data.partition import local_rows, local_slice
from .embedding import ShardedEmbeddingCollection

__all__ = ["DenseParts", "DistributedDLRM", "ParallelContext", "gather_rows", "init_from_env", "local_rows",
           "local_slice", "shutdown", "slice_bags", "slice_batch"]

#: no buffer broadcast at every forward (the dense part's buffers are constants): the argument's newer name where
#: this PyTorch has it (older ones know only ``broadcast_buffers``)
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                   else {"broadcast_buffers": False})

#: NVLink SHARP (multicast) off: the lent multi-GPU machines do not support it (NCCL and symmetric memory)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclass
class ParallelContext:
    """Where this process stands: global ``rank`` of ``world_size``, ``local_rank`` on its host, its ``device``,
    the ``backend`` and the process group of the embedding exchanges (``embedding_group``; None with one rank)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    embedding_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> ParallelContext:
    """Join the process group described by torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``). Without them (a plain ``python`` run): a one-rank context, no process group.

    ``backend``: ``nccl`` when CUDA is available, else ``gloo``. Each process uses ``cuda:LOCAL_RANK`` with NCCL.
    ``timeout_s`` bounds every collective. Sets NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (unless
    already set). Raises ``ValueError`` for inconsistent variables, an unknown backend, or NCCL with a
    ``LOCAL_RANK`` past the host's GPUs (one process per GPU).
    """
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    if "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return ParallelContext(0, 1, 0, device, backend or "none")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if backend == "nccl":
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise ValueError(f"LOCAL_RANK={local_rank} needs GPU {local_rank}, but this host has {gpus}: NCCL runs "
                             "one process per GPU (use the gloo backend, e.g. --device cpu, to run more processes "
                             "than GPUs)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    group = dist.new_group(backend=backend, timeout=timeout) if world > 1 else None
    return ParallelContext(rank, world, local_rank, device, backend, group)


def shutdown() -> None:
    """Leave the process group (no-op without one)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def abort() -> None:
    """Leave the process group without waiting for the other ranks (no-op without one): a rank that failed cannot
    know whether its peers sit in a collective it will never join, and NCCL's orderly destroy waits for them. NCCL's
    communicators are aborted; other backends' groups are destroyed (a local operation)."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()


def slice_batch(batch: Any, rank: int, world: int) -> Any:
    """This rank's part of a global batch: a tensor (dim 0), a tuple/list/dict of them, or a dataclass of them
    (``fuselab.dlrm``'s Batch). Bags (flat ids + offsets) must be split with :func:`slice_bags`."""
    if isinstance(batch, Tensor):
        return batch[local_slice(batch.shape[0], rank, world)]
    if dataclasses.is_dataclass(batch):
        return dataclasses.replace(batch, **{f.name: slice_batch(getattr(batch, f.name), rank, world)
                                            for f in dataclasses.fields(batch)})
    if isinstance(batch, dict):
        return {k: slice_batch(v, rank, world) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(slice_batch(v, rank, world) for v in batch)
    raise TypeError(f"slice_batch: cannot slice {type(batch).__name__}")


def slice_bags(ids: Tensor, offsets: Tensor, num_features: int, rank: int, world: int) -> tuple[Tensor, Tensor]:
    """This rank's samples of bags (flat ``ids``, ``offsets`` (B*F + 1,)): -> (ids, offsets starting at 0)."""
    part = local_slice((offsets.shape[0] - 1) // num_features, rank, world)
    lo, hi = offsets[part.start * num_features], offsets[part.stop * num_features]
    return ids[lo:hi], offsets[part.start * num_features: part.stop * num_features + 1] - lo


def gather_rows(tensor: Tensor, group=None) -> Tensor:
    """Every rank's ``tensor`` (any rows, same trailing shape and dtype) concatenated along dim 0 in rank order, on
    every rank (evaluation: predictions and labels of the whole global batch for the AUC). Collective; without a
    process group, ``tensor`` itself."""
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return tensor
    world = dist.get_world_size(group)
    rows = torch.tensor([tensor.shape[0]], device=tensor.device)
    counts = [torch.empty_like(rows) for _ in range(world)]
    dist.all_gather(counts, rows, group=group)
    sizes = [int(c) for c in counts]
    padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes)])


class DenseParts(nn.Module):
    """Everything of a DLRM after the lookup, without its tables: ``forward(dense (B, I), emb (B, F, D)) ->
    logits (B,)`` = ``over_arch(interaction_arch(dense_arch(dense), emb)).squeeze(1)``, sharing the modules of
    ``model`` (any object with those three attributes, e.g. :class:`fuselab.dlrm.model.DLRM`). DDP wraps this, so
    the embedding tables never enter DDP. Raises ``TypeError`` when an attribute is missing."""

    def __init__(self, model: nn.Module):
        super().__init__()
        for name in ("dense_arch", "interaction_arch", "over_arch"):
            if not isinstance(getattr(model, name, None), nn.Module):
                raise TypeError(f"DenseParts: the model has no module {name!r}")
        self.dense_arch, self.interaction_arch, self.over_arch = model.dense_arch, model.interaction_arch, \
            model.over_arch

    def forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        return self.top_forward(self.dense_arch(dense), emb)

    def top_forward(self, x: Tensor, emb: Tensor) -> Tensor:
        """x (B, D_dense) the dense arch's output, emb (B, F, D) -> logits (B,)."""
        return self.over_arch(self.interaction_arch(x, emb)).squeeze(1)


class DistributedDLRM(nn.Module):
    """Hybrid-parallel DLRM: ``forward(dense (B, I), ids (B, F) | (N,), offsets=None) -> dense_arch(dense,
    emb (B, F, D))``, the embeddings from ``sparse`` (model-parallel), ``dense_arch`` (every module after the
    lookup: bottom MLP, interaction, top MLP; ``forward(dense, emb) -> logits``) replicated across the ranks.

    Dense gradients are averaged over the ranks in one of two ways:

    * ``ddp=True`` (default): ``dense_arch`` wrapped in DDP when a process group with more than one rank exists
      (bucketed all-reduce overlapped with the backward; ``find_unused_parameters=False``, ``bucket_cap_mb``);
    * ``ddp=False``: the caller calls :meth:`reduce_gradients` after the backward: one all-reduce of every dense
      gradient in one flat buffer, on the embedding exchanges' process group (``sparse.group``). It has no
      host-side state, so a training step with it can be captured in a CUDA graph, where all of the step's
      collectives then run on one communicator in one order (NCCL can deadlock replaying graphs that hold the
      operations of several communicators).

    It offers the interface of :class:`fuselab.dlrm.model.DLRM` that :class:`fuselab.dlrm.step.TrainStep` and
    :class:`fuselab.dlrm.optim.Optimizers` use: ``sparse_arch`` (the sharded tables, which update themselves in the
    backward; ``capturable`` with a static exchange and fused local tables), ``sparse_forward(ids)``,
    ``dense_forward(dense, emb)``, :meth:`dense_parameters` and ``optimizer`` (the tables').
    """

    def __init__(self, sparse: ShardedEmbeddingCollection, dense_arch: nn.Module, *,
                 device: torch.device | None = None, bucket_cap_mb: float = 25.0, ddp: bool = True):
        super().__init__()
        self.sparse = sparse
        self.dense_module = dense_arch
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.ddp = ddp and self.world > 1
        if self.ddp:
            ids = [device] if device is not None and device.type == "cuda" else None
            self.dense = DistributedDataParallel(dense_arch, device_ids=ids, find_unused_parameters=False,
                                                 bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True,
                                                 **_NO_BUFFER_SYNC)
        else:
            self.dense = dense_arch

    @property
    def sparse_arch(self) -> ShardedEmbeddingCollection:
        return self.sparse

    @property
    def optimizer(self):
        """The tables' :class:`~fuselab.core.embedding_optimizer.EmbeddingOptimizer`."""
        return self.sparse.optimizer

    def forward(self, dense: Tensor, ids: Tensor, offsets: Tensor | None = None) -> Tensor:
        return self.dense(dense, self.sparse(ids, offsets))

    def sparse_forward(self, ids: Tensor, prefetched: bool = False) -> Tensor:
        """The lookup: ids (B, F), or (B, S) fixed-size bags -> (B, F, D) (collective); ``prefetched``: the ids
        were sent ahead by :meth:`prefetch`."""
        return self.sparse(ids, prefetched=prefetched)

    def prefetch(self, ids: Tensor) -> None:
        """Send a coming training batch's ids (B, S) to their tables' owners now
        (:meth:`ShardedEmbeddingCollection.prefetch`; collective)."""
        self.sparse.prefetch(ids)

    def dense_forward(self, dense: Tensor, emb: Tensor) -> Tensor:
        """Everything after the lookup (through DDP when it is on): dense (B, I), emb (B, F, D) -> logits (B,)."""
        return self.dense(dense, emb)

    def bottom_forward(self, dense: Tensor) -> Tensor:
        """The dense arch alone, dense (B, I) -> (B, D_dense), outside DDP: with ``ddp=False`` only (the step then
        reduces the gradients itself); with :meth:`top_forward` it splits :meth:`dense_forward` around the lookup's
        wait (:mod:`fuselab.dlrm.overlap`). Raises RuntimeError under DDP, which needs one forward per backward."""
        self._no_ddp("bottom_forward")
        return self.dense_module.dense_arch(dense)

    def top_forward(self, x: Tensor, emb: Tensor) -> Tensor:
        """The interaction and the over arch: x (B, D_dense), emb (B, F, D) -> logits (B,) (``ddp=False``)."""
        self._no_ddp("top_forward")
        return self.dense_module.top_forward(x, emb)

    def _no_ddp(self, name: str) -> None:
        if self.ddp:
            raise RuntimeError(f"{name} runs outside DDP: build the model with ddp=False and reduce the gradients "
                               "with reduce_gradients()")

    def dense_parameters(self) -> list[nn.Parameter]:
        return list(self.dense_module.parameters())

    def unwrap(self) -> None:
        """Drop the DDP wrapper (its reducer holds the process group): the dense part runs unwrapped from here on,
        without gradient averaging. For the end of a run, before the process group is destroyed."""
        self.dense, self.ddp = self.dense_module, False

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Average the dense gradients over the ranks (``ddp=False``; nothing with DDP or one rank): one
        all-reduce of a flat buffer, no host synchronization. Every rank must have gradients for the same
        parameters."""
        if self.ddp or self.world == 1:
            return
        grads = [p.grad for p in self.dense_module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.sparse.group)
        flat.div_(self.world)
        torch._foreach_copy_(grads, [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in grads]), grads)])
