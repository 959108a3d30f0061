"""A hybrid-parallel training run: :class:`fuselab.dlrm.trainer.Trainer` on ``torch.distributed``.

One process per GPU (NCCL) or per CPU worker (gloo), started by ``torchrun`` or ``fuselab dlrm train --nproc N``.
What changes against one process (``docs/dlrm_distributed.md``):

* **model**: the tables are sharded by :func:`.plan.plan_sharding` (table-wise unless ``row_wise_share`` or a
  rank's memory budget splits a table) into a :class:`.embedding.ShardedEmbeddingCollection` with the fused
  embedding update (``kernels="fuselab"``) or the torch one; the dense part is replicated and its gradients are
  averaged by DDP (``eager``/``compile``) or by one flat all-reduce inside the captured step (``cuda_graph``);
* **data**: ``batch_size`` is the global batch; it must be a multiple of the world size; each rank reads only its
  rows of every batch (both loaders' ``part``), and evaluation gathers every rank's predictions;
* **checkpoints**: ``torch.distributed.checkpoint`` folders (:mod:`.checkpoint`), resumable at another world size;
* **stopping**: a signal or the time budget stops every rank at the same step (the ranks agree every
  :attr:`DistributedTrainer.AGREE_EVERY` steps), then the checkpoint is written collectively.

With one rank (``--nproc 1``) the same code runs without any collective: the reference of the scaling runs.
Rank 0 logs, shows progress and writes the JSON summary, profile and TensorBoard files.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config import DLRMConfig
from ..model import DLRM
from ..optim import Optimizers
from ..runtime import resolve_kernels
from ..step import GRAPH_MODES, TrainStep
from ..trainer import RunOptions, Trainer
from . import checkpoint as dckpt
from .embedding import ShardedEmbeddingCollection
from .local import fused_factory, torch_factory
from .parallel import DenseParts, DistributedDLRM, ParallelContext, gather_rows, init_from_env, shutdown
from .plan import ShardingPlan, plan_sharding

__all__ = ["DistributedTrainer", "build_hybrid"]


def _silent(*_args: Any, **_kwargs: Any) -> None:
    return None


def build_hybrid(cfg: DLRMConfig, sizes: list[int], ctx: ParallelContext, *, kernels: str, mode: str,
                 budget_bytes: int | None = None) -> tuple[DistributedDLRM, Optimizers, TrainStep, ShardingPlan]:
    """The hybrid-parallel model of ``cfg`` on this rank (tables ``sizes``), its optimizers and training step.

    Tables: :func:`.plan.plan_sharding` (``cfg.row_wise_share``; None: whole tables unless over ``budget_bytes``),
    the local module fused (``kernels="fuselab"``) or torch, the static exchange (uniform batches), pooled
    embeddings sent in bf16 under ``precision="bf16"``. Dense part: the DLRM's MLPs and interaction without
    tables, through DDP, or (``mode="cuda_graph"``) with the flat all-reduce inside the captured step."""
    share = cfg.row_wise_share if cfg.row_wise_share is not None else math.inf
    optimizer = cfg.embedding_optimizer
    plan = plan_sharding(sizes, cfg.embedding_dim, ctx.world_size, optimizer=optimizer,
                         budget_bytes=budget_bytes, row_wise_share=share)
    sparse = ShardedEmbeddingCollection(
        plan, ctx.rank, factory=fused_factory if kernels == "fuselab" else torch_factory, optimizer=optimizer,
        lr=cfg.lr_sparse, seed=cfg.seed, group=ctx.embedding_group, device=ctx.device,
        uniform_batch=True, comm_dtype=torch.bfloat16 if cfg.precision == "bf16" else None,
        multi_hot_sizes=cfg.multi_hot_sizes, pooling=cfg.pooling)
    dense = DLRM.from_config(dataclasses.replace(cfg, kernels=kernels), sizes, embeddings=False)
    model = DistributedDLRM(sparse, DenseParts(dense).to(ctx.device), device=ctx.device, ddp=mode not in GRAPH_MODES)
    optimizers = Optimizers(model, lr_dense=cfg.lr_dense, lr_sparse=cfg.lr_sparse)
    step = TrainStep(model, optimizers, precision=cfg.precision, mode=mode, compile_embedding=False,
                     grad_sync=model.reduce_gradients)
    return model, optimizers, step, plan


class DistributedTrainer(Trainer):
    """A training run of ``cfg`` on every rank of ``context`` (default: joined from torchrun's variables).

    Raises ``ValueError`` when ``batch_size`` is not a multiple of the world size, for ``shuffle="row"`` with
    ``data_on_device`` on several ranks, and (like :class:`~fuselab.dlrm.trainer.Trainer`) for bad configs or paths.
    """

    #: steps between two agreements of the ranks on stopping (a signal or the time budget)
    AGREE_EVERY = 8

    def __init__(self, cfg, data=None, options: RunOptions | None = None, log=print,
                 context: ParallelContext | None = None):
        on_cpu = str(cfg.device or "").startswith("cpu") or not torch.cuda.is_available()
        self._owns_group = context is None  # then run() leaves the process group at its end
        self.ctx = context or init_from_env(backend="gloo" if on_cpu else None)
        main = self.ctx.is_main
        opts = options or RunOptions()
        if not main:  # one writer of the run's files
            opts = dataclasses.replace(opts, progress=False, json_path=None, tensorboard_dir=None, profile_dir=None)
        super().__init__(cfg, data, opts, log=log if main else _silent)
        world = self.ctx.world_size
        if cfg.batch_size % world:
            raise ValueError(f"batch_size {cfg.batch_size} (the global batch) must be a multiple of the {world} ranks")
        self.device = self.ctx.device
        self.kernels = resolve_kernels(cfg.kernels, self.device)
        if cfg.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph needs a CUDA device, this run is on {self.device}")
        self._agreed_at, self._agreed = -1, (0, 0, 0)

    # ---------------------------------------------------------------------------------------------- build
    def _memory_budget(self) -> int | None:
        """Bytes of tables each rank may hold: 60% of the smallest free device memory among the ranks (None on
        CPU: unbounded)."""
        if self.device.type != "cuda":
            return None
        free = torch.tensor([torch.cuda.mem_get_info(self.device)[0]], device=self.device, dtype=torch.int64)
        if self.ctx.world_size > 1:
            dist.all_reduce(free, op=dist.ReduceOp.MIN, group=self.ctx.embedding_group)
        return int(0.6 * int(free))

    def _build_model(self) -> None:
        self.model, self.optimizers, self.train_step, self.plan = build_hybrid(
            self.cfg, self.sizes, self.ctx, kernels=self.kernels, mode=self.step_mode,
            budget_bytes=self._memory_budget())
        self.log(f"sharding plan over {self.ctx.world_size} rank(s):\n{self.plan.format_table()}")

    def _build_loaders(self, part: tuple[int, int] | None = None) -> None:
        super()._build_loaders((self.ctx.rank, self.ctx.world_size))

    def samples(self, batch) -> int:
        return len(batch) * self.ctx.world_size

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return gather_rows(tensor, group=self.ctx.embedding_group)

    # ---------------------------------------------------------------------------------------------- state
    def _dense_optimizer_state(self) -> dict[str, torch.Tensor]:
        return {str(k): t for k, t in enumerate(self.optimizers.dense_state)}

    def checkpoint(self, directory: str | Path | None = None) -> Path:
        """A sharded checkpoint of the current step (collective: every rank calls it)."""
        directory = directory if directory is not None else self.checkpoint_dir
        if directory is None:
            raise ValueError("no checkpoint folder")
        step = self.step_count
        extra = {"config": self.cfg.to_dict(), "kernels": self.kernels, "table_sizes": self.sizes,
                 "hashing": self.cfg.hashing, "schedule": self.schedule.to_dict(),
                 "epoch": step // self.per_epoch, "batch_in_epoch": step % self.per_epoch}
        return dckpt.save_checkpoint(directory, step, self.model.sparse, self.model.dense_module,
                                     self._dense_optimizer_state(), extra=extra)

    def restore(self, resume: str | Path) -> int:
        """Load a sharded checkpoint (saved at any world size; ``"latest"`` or a root folder: the newest complete
        and intact one there, falling back from a damaged latest one with a warning)."""
        root = (self.checkpoint_dir if self.checkpoint_dir is not None else self.interrupt_dir()) \
            if str(resume) == "latest" else Path(resume)
        meta = dckpt.load_checkpoint(root, self.model.sparse, self.model.dense_module, self._dense_optimizer_state(),
                                     fallback=True, log=self.log)
        extra = meta.get("extra", {})
        saved = extra.get("schedule")
        if saved is not None and saved != self.schedule.to_dict():
            self.log(f"note: keeping the learning-rate schedule of {root} ({saved}); this run's config differs")
            self.schedule = type(self.schedule)(**saved)
        self.step_count = self.first_step = int(meta["step"])
        self.last_good = (Path(meta["path"]), self.step_count)
        self.log(f"resumed from {meta['path']} at step {self.step_count} (saved by {meta['world_size']} rank(s))")
        return self.step_count

    # ---------------------------------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        """:meth:`Trainer.run` on every rank; leaves the process group afterwards when it joined it itself."""
        try:
            return super().run()
        finally:
            if self._owns_group:
                self._leave()

    def _leave(self) -> None:
        """Leave the process group this trainer joined: first free what holds its communicators (a CUDA graph
        with NCCL operations, pytorch/pytorch#115388; the DDP wrapper, whose reducer outliving its group ended the
        process with std::terminate at exit), then destroy it. The model stays usable on this rank's shards."""
        step = getattr(self, "train_step", None)
        if step is not None:
            step.release()
        model = getattr(self, "model", None)
        if model is not None:
            model.unwrap()
        gc.collect()
        shutdown()

    def _clean_checkpoints(self) -> None:
        """Rank 0 removes what killed saves left in the checkpoint folder (``.tmp-step-*`` folders)."""
        folder = self.interrupt_dir()
        if self.ctx.is_main and folder.is_dir():
            removed = dckpt.clean_root(folder)
            if removed:
                self.log(f"removed {len(removed)} unfinished checkpoint save(s) of an interrupted run in {folder}")

    def _agree_on_divergence(self, step: int | None) -> int | None:
        """The first diverged step over every rank (one all-reduce)."""
        if self.ctx.world_size == 1:
            return step
        none = 2**62
        flag = torch.tensor([step if step is not None else none], device=self.device, dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.ctx.embedding_group)
        return int(flag) if int(flag) != none else None

    def _latest_loss(self) -> float:
        """Rank 0's latest loss (several ranks: checked collectively, at the agreements of :meth:`_stopping`)."""
        if self.ctx.world_size == 1:
            return super()._latest_loss()
        return self.losses[-1].item()

    def _stopping(self) -> bool:
        """Every rank stops at the same step: the local reasons (signal, time budget, a loss that is not finite) are
        combined every :attr:`AGREE_EVERY` steps (one small all-reduce; the losses are checked on the device)."""
        if self.ctx.world_size == 1:
            return super()._stopping()
        step = self.step_count
        if step != self._agreed_at and step % self.AGREE_EVERY == 0:
            count = len(self.losses)
            fresh = self.losses[self.finite.checked:]
            flags = torch.tensor([self.signals.signum or 0, int(self._out_of_time), 0], device=self.device)
            if fresh:
                flags[2] = (~torch.isfinite(torch.stack(fresh))).any()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.ctx.embedding_group)
            self._agreed_at, self._agreed = step, tuple(int(x) for x in flags.tolist())
            if not self._agreed[2]:
                self.finite.passed(count)
        return any(self._agreed)

    def _interrupt_signal(self) -> int | None:
        if self.ctx.world_size == 1:
            return super()._interrupt_signal()
        return self._agreed[0] or None

    def _log_progress(self, bar, task, meter, writer) -> None:
        if self.ctx.is_main:  # the latest loss costs a host sync: rank 0 only
            super()._log_progress(bar, task, meter, writer)

    def summary(self) -> dict[str, Any]:
        """:meth:`Trainer.summary` with the global mean loss of every step (one all-reduce), the world size and
        the plan."""
        out = super().summary()
        if self.ctx.world_size > 1 and self.losses:
            losses = torch.stack(self.losses).float()
            dist.all_reduce(losses, group=self.ctx.embedding_group)
            out["losses"] = (losses / self.ctx.world_size).cpu().tolist()
        out.update(world_size=self.ctx.world_size, rank=self.ctx.rank, plan=self.plan.to_dict())
        return out
