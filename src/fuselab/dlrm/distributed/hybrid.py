"""The hybrid-parallel strategy of a training run: :class:`HybridParallel`, the
:class:`~fuselab.dlrm.parallelism.Parallelism` a :class:`fuselab.dlrm.trainer.Trainer` takes on ``torch.distributed``.

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
  :attr:`HybridParallel.AGREE_EVERY` steps, on the flags each sent one interval earlier, so that the host never
  waits for the step in flight), then the checkpoint is written collectively.

With one rank (``--nproc 1``) the same code runs without any collective: the reference of the scaling runs.
Rank 0 logs, shows progress and writes the JSON summary, profile and TensorBoard files.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..config import DLRMConfig
from ..memory import (
    GIB,
    RESERVE_BYTES,
    TABLE_DTYPE_BYTES,
    DoesNotFit,
    RunShape,
    data_bytes,
    non_table_bytes,
    run_shape,
    ways_out,
)
from ..model import DLRM
from ..optim import Optimizers
from ..parallelism import Restored, TrainingParts, local_stop
from ..step import GRAPH_MODES, StepOptions, TrainStep
from . import checkpoint as dckpt
from .embedding import ShardedEmbeddingCollection
from .local import fused_factory, torch_factory
from .parallel import DenseParts, DistributedDLRM, ParallelContext, abort, gather_rows, init_from_env, shutdown
from .plan import PlanDoesNotFit, ShardingPlan, plan_sharding

if TYPE_CHECKING:
    from ..trainer import RunOptions, Trainer

__all__ = ["HybridParallel", "build_hybrid"]


def build_hybrid(cfg: DLRMConfig, sizes: list[int], ctx: ParallelContext, *, kernels: str, mode: str,
                 budget_bytes: int | None = None, overlap: bool | None = None, replicate: bool | None = None,
                 pipeline: bool = False
                 ) -> tuple[DistributedDLRM, Optimizers, TrainStep, ShardingPlan]:
    """The hybrid-parallel model of ``cfg`` on this rank (tables ``sizes``), its optimizers and training step.

    Tables: :func:`.plan.plan_sharding` (``cfg.row_wise_share``; None: whole tables unless over ``budget_bytes``;
    ``replicate``: the tables cheaper to replicate than to exchange, for ``cfg.batch_size`` samples per step over
    all ranks, held by every rank; None: ``cfg.data_parallel_tables`` in the graph modes, where it was measured
    faster; in the eager modes it was measured slower: ``benchmarks/notes/dlrm_scaling.md``),
    the local module fused (``kernels="fuselab"``) or torch, the static exchange (uniform batches), pooled
    embeddings sent in bf16 under ``precision="bf16"``. Dense part: the DLRM's MLPs and interaction without
    tables, through DDP, or (the graph modes, and ``overlap``) with the flat all-reduce inside the step.
    ``overlap``: the lookup and its exchanges on a side stream beside the bottom MLP (:mod:`..overlap`); None:
    ``cfg.overlap`` on CUDA in the graph modes (in the eager and compile modes DDP overlaps its all-reduce).
    ``pipeline``: the step sends the next batch's ids ahead when told them (``StepOptions.pipeline``)."""
    share = cfg.row_wise_share if cfg.row_wise_share is not None else math.inf
    optimizer = cfg.embedding_optimizer
    bags = cfg.multi_hot_sizes
    if replicate is None:
        replicate = cfg.data_parallel_tables and mode in GRAPH_MODES
    plan = plan_sharding(sizes, cfg.embedding_dim, ctx.world_size, optimizer=optimizer,
                         budget_bytes=budget_bytes, row_wise_share=share,
                         pooling_factors=None if bags is None else [float(n) for n in bags],
                         global_batch=cfg.batch_size if replicate else None,
                         element_bytes=TABLE_DTYPE_BYTES[cfg.embedding_dtype],
                         wire_bytes=2 if cfg.precision == "bf16" else 4)
    sparse = ShardedEmbeddingCollection(
        plan, ctx.rank, factory=fused_factory if kernels == "fuselab" else torch_factory, optimizer=optimizer,
        lr=cfg.lr_sparse, seed=cfg.seed, group=ctx.embedding_group, device=ctx.device,
        uniform_batch=True, comm_dtype=torch.bfloat16 if cfg.precision == "bf16" else None,
        multi_hot_sizes=cfg.multi_hot_sizes, pooling=cfg.pooling, table_dtype=cfg.embedding_dtype)
    dense = DLRM.from_config(dataclasses.replace(cfg, kernels=kernels), sizes, embeddings=False)
    if overlap is None:
        overlap = cfg.overlap and ctx.device.type == "cuda" and mode in GRAPH_MODES
    model = DistributedDLRM(sparse, DenseParts(dense).to(ctx.device), device=ctx.device,
                            ddp=mode not in GRAPH_MODES and not overlap)
    optimizers = Optimizers(model, lr_dense=cfg.lr_dense, lr_sparse=cfg.lr_sparse)
    step = TrainStep(model, optimizers, precision=cfg.precision, mode=mode, grad_sync=model.reduce_gradients,
                     options=StepOptions(compile_embedding=False, overlap=overlap, pipeline=pipeline))
    return model, optimizers, step, plan


class _Agreement:
    """An all-reduce of stop flags in flight: their copy to the host (pinned, non-blocking on CUDA) and the number
    of losses they covered."""

    def __init__(self, flags: torch.Tensor, losses: int):
        self.losses = losses
        self.done: torch.cuda.Event | None = None
        if flags.is_cuda:
            self.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            self.host.copy_(flags, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()
        else:
            self.host = flags

    def result(self) -> tuple[int, ...]:
        if self.done is not None:
            self.done.synchronize()  # recorded an interval of steps ago: long done
        return tuple(int(x) for x in self.host.tolist())


class HybridParallel:
    """Tables sharded over the ranks of ``context`` (default: :meth:`join`, from torchrun's variables), the MLPs
    replicated: ``Trainer(cfg, data, options, parallelism=HybridParallel.join(cfg))``.

    ``check`` raises ``ValueError`` when ``batch_size`` is not a multiple of the world size. With one rank the same
    code runs without any collective."""

    #: steps between two agreements of the ranks on stopping (a signal, the time budget, a loss that is not finite):
    #: a collective between two replays of the captured step costs the Kaggle --nproc 2 run 6% every 8 steps
    #: (``benchmarks/notes/dlrm_scaling.md``); a stop then takes effect within two intervals
    AGREE_EVERY = 64

    def __init__(self, context: ParallelContext, *, owns_group: bool = False):
        self.ctx = context
        self.owns_group = owns_group  # then close() leaves the process group
        self.plan: ShardingPlan | None = None
        self._agreed_at, self._agreed = -1, (0, 0, 0)
        self._pending: _Agreement | None = None

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    @property
    def agrees_on_losses(self) -> bool:
        """Several ranks check their losses together, at the agreements of :meth:`stopping`."""
        return self.ctx.world_size > 1

    @classmethod
    def join(cls, cfg: DLRMConfig) -> HybridParallel:
        """Join the process group of torchrun's variables (gloo for a CPU run, else NCCL); :meth:`close` leaves it."""
        on_cpu = str(cfg.device or "").startswith("cpu") or not torch.cuda.is_available()
        return cls(init_from_env(backend="gloo" if on_cpu else None), owns_group=True)

    # ---------------------------------------------------------------------------------------------- setup
    def device(self, cfg: DLRMConfig) -> torch.device:
        return self.ctx.device

    def check(self, cfg: DLRMConfig) -> None:
        if cfg.batch_size % self.world_size:
            raise ValueError(f"batch_size {cfg.batch_size} (the global batch) must be a multiple of the "
                             f"{self.world_size} ranks")

    def rank_options(self, options: RunOptions) -> RunOptions:
        """The main rank writes the run's files and shows progress; the others none."""
        if self.is_main:
            return options
        return dataclasses.replace(options, progress=False, json_path=None, tensorboard_dir=None, profile_dir=None)

    def clean_checkpoints(self, folder: Path, log: Callable[[str], Any]) -> None:
        """Rank 0 removes what killed saves left in the checkpoint folder (``.tmp-step-*`` folders)."""
        if self.is_main and folder.is_dir():
            removed = dckpt.clean_root(folder)
            if removed:
                log(f"removed {len(removed)} unfinished checkpoint save(s) of an interrupted run in {folder}")

    def _memory_shape(self, trainer: Trainer) -> RunShape:
        """One rank's share of the run for the memory count: its batch and its part of the train split."""
        cfg, world = trainer.cfg, self.world_size
        start, stop = trainer.split["train"]
        data = data_bytes(cfg, trainer.ds.num_sparse, -(-(stop - start) // world))
        return run_shape(cfg, trainer.sizes, max(1, cfg.batch_size // world), data)

    def _memory_budget(self, shape: RunShape) -> int | None:
        """Bytes of tables (with their optimizer state) each rank may hold: the smallest free device memory among
        the ranks, less what the rest of a step needs at a rank's batch (:func:`..memory.non_table_bytes`) and the
        reserve for the CUDA context and workspaces (None on CPU: unbounded)."""
        device = self.ctx.device
        if device.type != "cuda":
            return None
        free = torch.tensor([torch.cuda.mem_get_info(device)[0]], device=device, dtype=torch.int64)
        if self.world_size > 1:
            dist.all_reduce(free, op=dist.ReduceOp.MIN, group=self.ctx.embedding_group)
        return max(0, int(free) - non_table_bytes(shape) - RESERVE_BYTES)

    def build(self, trainer: Trainer) -> TrainingParts:
        """The rank's parts (:func:`build_hybrid`); :class:`~..memory.DoesNotFit` naming the ways out when the
        tables do not fit the ranks' memory."""
        shape = self._memory_shape(trainer)
        budget = self._memory_budget(shape)
        try:
            model, optimizers, step, self.plan = build_hybrid(
                trainer.cfg, trainer.sizes, self.ctx, kernels=trainer.kernels, mode=trainer.step_mode,
                budget_bytes=budget)
        except PlanDoesNotFit as exc:
            room = f"{budget / GIB:.1f} GiB for tables on each of {self.world_size} rank(s) after the rest of a step"
            raise DoesNotFit("\n".join([f"{exc} ({room}); ways out:",
                                        *(f"  {w}" for w in ways_out(shape))])) from None
        trainer.log(f"sharding plan over {self.world_size} rank(s):\n{self.plan.format_table()}")
        return TrainingParts(model, optimizers, step)

    def loader_part(self) -> tuple[int, int] | None:
        return (self.rank, self.world_size)

    def gather(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        group = self.ctx.embedding_group
        return lambda tensor: gather_rows(tensor, group=group)

    # ---------------------------------------------------------------------------------------------- state
    @staticmethod
    def _dense_optimizer_state(trainer: Trainer) -> dict[str, torch.Tensor]:
        return {str(k): t for k, t in enumerate(trainer.optimizers.dense_state)}

    def save(self, trainer: Trainer, directory: Path, state: dict[str, Any]) -> Path:
        """A sharded checkpoint of the current step (collective: every rank calls it)."""
        model = trainer.model
        return dckpt.save_checkpoint(directory, trainer.step_count, model.sparse, model.dense_module,
                                     self._dense_optimizer_state(trainer), extra=state)

    def restore(self, trainer: Trainer, resume: str | Path) -> Restored:
        """Load a sharded checkpoint (saved at any world size; ``"latest"`` or a root folder: the newest complete
        and intact one there, falling back from a damaged latest one with a warning)."""
        root = (trainer.checkpoint_dir if trainer.checkpoint_dir is not None else trainer.interrupt_dir()) \
            if str(resume) == "latest" else Path(resume)
        model = trainer.model
        meta = dckpt.load_checkpoint(root, model.sparse, model.dense_module, self._dense_optimizer_state(trainer),
                                     fallback=True, log=trainer.log)
        return Restored(Path(meta["path"]), int(meta["step"]), meta.get("extra", {}).get("schedule"),
                        note=f" (saved by {meta['world_size']} rank(s))")

    # ---------------------------------------------------------------------------------------------- agreement
    def agree_on_divergence(self, step: int | None, device: torch.device) -> int | None:
        """The first diverged step over every rank (one all-reduce)."""
        if self.world_size == 1:
            return step
        none = 2**62
        flag = torch.tensor([step if step is not None else none], device=device, dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.ctx.embedding_group)
        return int(flag) if int(flag) != none else None

    def stopping(self, trainer: Trainer) -> bool:
        """Every rank stops at the same step: the local reasons (signal, time budget, a loss that is not finite) are
        combined every :attr:`AGREE_EVERY` steps by one small all-reduce, whose result is read at the next
        agreement, :attr:`AGREE_EVERY` steps later (on CUDA through pinned memory: reading it at once would make the
        host wait for the steps in flight and leave the GPU idle while it queues the next ones; measured in
        ``benchmarks/notes/dlrm_scaling.md``). Every rank reads the same result at the same step."""
        if self.world_size == 1:
            return local_stop(trainer)
        step = trainer.step_count
        if step != self._agreed_at and step % self.AGREE_EVERY == 0:
            self._agreed_at = step
            if self._pending is not None:
                self._agreed = self._pending.result()
                if not self._agreed[2]:
                    trainer.finite.passed(self._pending.losses)
            self._pending = self._agree(trainer)
        return any(self._agreed)

    def _agree(self, trainer: Trainer) -> _Agreement:
        """Launch the all-reduce of this rank's stop flags (signal, out of time, a non-finite loss since the last
        check), with the copy of its result to the host."""
        count = len(trainer.losses)
        fresh = trainer.losses[trainer.finite.checked:]
        flags = torch.zeros(3, dtype=torch.int64, device=trainer.device)
        flags[0], flags[1] = trainer.signals.signum or 0, int(trainer.out_of_time)  # fills: no copy from the host
        if fresh:
            flags[2] = (~torch.isfinite(torch.stack(fresh))).any()
        # on the default group: a collective outside the captured step on the embedding exchanges' communicator,
        # which the graphs use, stalled the --nproc 2 step (``benchmarks/notes/dlrm_scaling.md``)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return _Agreement(flags, count)

    def interrupt_signal(self, trainer: Trainer) -> int | None:
        if self.world_size == 1:
            return trainer.signals.signum
        return self._agreed[0] or None

    # ---------------------------------------------------------------------------------------------- end
    def summary(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """The global mean loss of every step (one all-reduce), the world size and the plan."""
        if self.world_size > 1 and trainer.losses:
            losses = torch.stack(trainer.losses).float()
            dist.all_reduce(losses, group=self.ctx.embedding_group)
            summary["losses"] = (losses / self.world_size).cpu().tolist()
        summary.update(world_size=self.world_size, rank=self.rank,
                       plan=self.plan.to_dict() if self.plan is not None else None)

    def close(self, trainer: Trainer, failed: bool = False) -> None:
        """Leave the process group when :meth:`join` joined it: first free what holds its communicators (a CUDA
        graph with NCCL operations, pytorch/pytorch#115388; the DDP wrapper, whose reducer outliving its group ended
        the process with std::terminate at exit), then destroy it, or with ``failed`` (this rank raised) abort it
        without waiting for the other ranks, which the launcher then stops. The model stays usable on this rank's
        shards."""
        if not self.owns_group:
            return
        step = getattr(trainer, "train_step", None)
        if step is not None:
            step.release()
        model = getattr(trainer, "model", None)
        if model is not None:
            model.unwrap()
        gc.collect()
        if failed:
            abort()
        else:
            shutdown()
