"""One DLRM training step as a callable: forward, BCE-with-logits loss, backward, both updates, no host sync.

``TrainStep(model, optimizers, precision=..., mode=...)(dense, sparse, labels) -> 0-dim fp32 loss``.

Precision: ``"fp32"`` (IEEE fp32 matmuls: ``torch.set_float32_matmul_precision("highest")``), ``"tf32"``
(``"high"``: TF32 tensor-core matmuls), both set around each call and restored after it; ``"bf16"``: autocast to
bf16 over the MLPs and the interaction (the embedding tables, their lookup and the loss stay fp32; the process's
matmul precision is left alone).

Modes:

* ``"eager"``: ``zero_grad``, forward + loss, ``backward`` (the tables update themselves), ``optimizers.step()``.
* ``"compile"``: ``torch.compile`` of forward + loss (a capturable sparse arch, ``kernels="fuselab"``: the whole
  forward, the embedding collection included unless ``compile_embedding=False``; ``kernels="torch"``: everything
  after the lookup, which stays eager for its sparse gradient) and of the dense optimizer step
  (``compile_optimizer``).
* ``"cuda_graph"`` (a capturable sparse arch on CUDA only, ``kernels="fuselab"``: the torch path's sparse update
  synchronizes with the host):
  the first call copies the batch into static buffers, runs ``warmup_steps`` eager steps on a side stream with a
  zero gradient (warm-up does not train: the tables and their optimizer state are left bit for bit as they were by
  such an update, so that no copy of them is needed; the rest of the state is copied and restored), then captures the
  whole step
  (forward, loss, backward with the fused embedding update, dense update) in one CUDA graph; each later call
  copies its batch into the static buffers (skipped for a tensor that *is* the static buffer: write into
  :attr:`TrainStep.static_inputs` directly to avoid the copy) and replays. Shapes and dtypes are fixed by the
  first call: another shape raises ValueError. Learning rates changed with ``optimizers.set_lr`` reach the graph.
* ``"compile_graph"``: ``"compile"``'s compiled functions, warmed up (compiled) on the side stream, then captured
  as ``"cuda_graph"`` captures the eager step: Inductor's fused element-wise kernels without the launches.

``grad_sync`` (optional): called after every backward, before the updates (in the captured graph too): the
hybrid-parallel model's :meth:`~fuselab.dlrm.distributed.DistributedDLRM.reduce_gradients`.

``StepOptions.overlap`` (any mode): the lookup (with its exchanges) runs on a side stream beside the bottom MLP, and
its backward (the embedding update) beside the bottom MLP's backward and the dense updates
(:mod:`fuselab.dlrm.overlap`); the forward is then split into ``model.bottom_forward`` and ``model.top_forward``
(compiled separately in the compile modes, the lookup eager). The results are those of the step without it. Needs a
model whose dense gradients are not reduced by DDP (DDP expects one forward per backward): ValueError otherwise.

``StepOptions.pipeline`` (a model with :meth:`prefetch`, the hybrid-parallel one with its static exchange): each
call may name the next batch's ids, ``step(dense, sparse, labels, next_sparse=...)``; after the updates the step
sends them to their tables' owners (on the side stream with ``overlap``, beside the dense update), and the next call
on that same ``sparse`` tensor looks them up without exchanging them. A call on other ids (the first one, a batch
that was not announced) exchanges them first, outside the graph. The results are those of the step without it.

The returned loss is a fresh tensor (in graph mode a copy of the static one), so keeping it is safe.
Raises ValueError for an unknown precision or mode, and for ``"cuda_graph"`` on a CPU model or a sparse arch that
cannot be captured (``model.sparse_arch.capturable``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fuselab.core.compile import compile_quietly
from fuselab.core.precision import float32_matmul_precision
from fuselab.ops.embedding import EmbeddingBagCollection

from .optim import Optimizers
from .overlap import SideStream

PRECISIONS = ("fp32", "tf32", "bf16")
MODES = ("eager", "compile", "cuda_graph", "compile_graph")
#: the modes that capture the step in a CUDA graph
GRAPH_MODES = ("cuda_graph", "compile_graph")


@dataclass(frozen=True)
class StepOptions:
    """How a :class:`TrainStep` runs (module docstring): ``compile_options`` for ``torch.compile``;
    ``compile_embedding`` (compile the lookup with the rest of the forward when the sparse arch allows it);
    ``compile_optimizer`` (the dense update); ``warmup_steps`` (eager steps before a capture, >= 1); ``overlap``
    (the lookup on a side stream beside the bottom MLP); ``pipeline`` (the next batch's ids sent during this
    step)."""

    compile_options: dict[str, Any] = field(default_factory=dict)
    compile_embedding: bool = True
    compile_optimizer: bool = True
    warmup_steps: int = 3
    overlap: bool = False
    pipeline: bool = False


class TrainStep:
    """A training step of ``model`` with ``optimizers`` (see the module docstring for precision, modes and
    ``options``)."""

    def __init__(self, model: nn.Module, optimizers: Optimizers, *, precision: str = "fp32", mode: str = "eager",
                 options: StepOptions = StepOptions(), grad_sync: Callable[[], None] | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.model, self.optimizers, self.precision, self.mode = model, optimizers, precision, mode
        self.capturable = bool(model.sparse_arch.capturable)
        self.device = next(model.parameters()).device
        self.graphed = mode in GRAPH_MODES
        if self.graphed:
            if self.device.type != "cuda":
                raise ValueError(f"mode={mode!r}: cuda_graph needs a CUDA device, the model is on {self.device}")
            if not self.capturable:
                raise ValueError(f"mode={mode!r} needs kernels='fuselab' (and, on several ranks, whole tables): "
                                 "this sparse arch's update synchronizes with the host and cannot be captured")
        if options.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {options.warmup_steps}")
        if options.overlap and getattr(model, "ddp", False):
            raise ValueError("overlap splits the forward around the lookup, which DDP does not allow: build the "
                             "model with ddp=False (its step then reduces the gradients through grad_sync)")
        if options.pipeline and not getattr(model.sparse_arch, "static", False):
            raise ValueError("pipeline sends the next batch's ids ahead: it needs a model with prefetch() and a static "
                             "exchange (build_hybrid's, whole tables)")
        self.warmup_steps = options.warmup_steps
        self._grad_sync = grad_sync
        self._side = SideStream(self.device) if options.overlap else None
        self._pipeline = options.pipeline
        #: the ids the previous call sent ahead, and those this call sends (pipeline)
        self._promised: Tensor | None = None
        self._next: Tensor | None = None
        # forward + loss: one function of (dense, sparse, labels) when the lookup can be compiled with the rest
        self._whole = (self.capturable and options.compile_embedding and not options.overlap
                       and not options.pipeline)
        self._loss_fn = self._forward_loss if self._whole else self._dense_loss
        self._bottom, self._top_loss = self._bottom_forward, self._top_forward_loss
        self._dense_step = optimizers.dense_step
        if mode in ("compile", "compile_graph"):
            self._loss_fn = compile_quietly(self._loss_fn, **options.compile_options)
            if options.overlap:
                self._bottom = compile_quietly(self._bottom_forward, **options.compile_options)
                self._top_loss = compile_quietly(self._top_forward_loss, **options.compile_options)
            if options.compile_optimizer:
                self._dense_step = compile_quietly(optimizers.dense_step, **options.compile_options)
        self._graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: tuple[Tensor, Tensor, Tensor] | None = None
        self._static_loss: Tensor | None = None

    @property
    def side_stream(self) -> torch.cuda.Stream | None:
        """The stream the lookup runs on with ``overlap`` on CUDA (None otherwise)."""
        return self._side.stream if self._side is not None else None

    # -- the pieces -------------------------------------------------------------------------------------------
    def _autocast(self):
        # no autocast weight cache: a cache inside a CUDA graph capture would keep stale casts
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                              cache_enabled=False)

    def _forward_loss(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> Tensor:
        with self._autocast():
            logits = self.model.dense_forward(dense, self.model.sparse_forward(sparse))
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    def _dense_loss(self, dense: Tensor, emb: Tensor, labels: Tensor) -> Tensor:
        with self._autocast():
            logits = self.model.dense_forward(dense, emb)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    def _bottom_forward(self, dense: Tensor) -> Tensor:
        with self._autocast():
            return self.model.bottom_forward(dense)

    def _top_forward_loss(self, x: Tensor, emb: Tensor, labels: Tensor) -> Tensor:
        with self._autocast():
            logits = self.model.top_forward(x, emb)
        return F.binary_cross_entropy_with_logits(logits.float(), labels)

    def _sparse_forward(self, sparse: Tensor) -> Tensor:
        if self._pipeline:
            return self.model.sparse_forward(sparse, prefetched=True)
        return self.model.sparse_forward(sparse)

    def _overlapped_loss(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> Tensor:
        with self._side.fork(self.model.sparse_arch):
            emb = self._sparse_forward(sparse)
        x = self._bottom(dense)
        self._side.join(emb)
        return self._top_loss(x, emb, labels)

    def _loss(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> Tensor:
        if self._side is not None:
            return self._overlapped_loss(dense, sparse, labels)
        if self._whole:
            return self._loss_fn(dense, sparse, labels)
        return self._loss_fn(dense, self._sparse_forward(sparse), labels)

    def _matmul_precision(self):
        if self.precision == "bf16":
            return contextlib.nullcontext()
        return float32_matmul_precision("highest" if self.precision == "fp32" else "high")

    def _update(self) -> None:
        if self._grad_sync is not None:
            self._grad_sync()
        self._dense_step()
        if self._next is not None:  # pipeline: the next batch's ids, after this step's embedding update
            if self._side is not None:
                with self._side.after_its_work():
                    self.model.prefetch(self._next)
            else:
                self.model.prefetch(self._next)
        if self._side is not None:  # the embedding update ran beside the dense updates
            self._side.join()

    def _eager(self, dense: Tensor, sparse: Tensor, labels: Tensor, grad_scale: float = 1.0) -> Tensor:
        self.optimizers.zero_grad()
        loss = self._loss(dense, sparse, labels)
        (loss if grad_scale == 1.0 else loss * grad_scale).backward()
        self._update()
        return loss.detach()

    def _warm_up(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> None:
        """``warmup_steps`` steps on a zero gradient (what a capture needs run once: compilation, autotuning, the
        allocator's pools), the state as it was afterwards. A zero gradient's update leaves the tables and their
        optimizer state as they were (``w - lr·0``, ``state + 0²``, stochastic rounding of a value it can hold), so
        only the rest of the state is copied and restored: MLPerf's tables fill most of a GPU."""
        tables = {t.data_ptr() for m in self.model.modules() if isinstance(m, EmbeddingBagCollection)
                  for t in (m.weight, m.state) if t.numel()}
        state = [t for t in self._state() if t.data_ptr() not in tables]
        saved = [t.clone() for t in state]
        for _ in range(self.warmup_steps):
            self._eager(dense, sparse, labels, grad_scale=0.0)
        with torch.no_grad():
            for t, s in zip(state, saved):
                t.copy_(s)

    # -- the call ---------------------------------------------------------------------------------------------
    def __call__(self, dense: Tensor, sparse: Tensor, labels: Tensor, next_sparse: Tensor | None = None) -> Tensor:
        """dense [B, 13] fp32, sparse [B, F] int64, labels [B] fp32 -> the batch's mean loss (0-dim fp32).
        ``next_sparse`` (``pipeline`` only, else ValueError): the next call's ``sparse``, sent ahead."""
        if next_sparse is not None and not self._pipeline:
            raise ValueError("next_sparse needs StepOptions(pipeline=True)")
        with self._matmul_precision():
            if not self.graphed:
                self._announce(sparse, next_sparse)
                loss = self._eager(dense, sparse, labels)
            else:
                if self._graph is None:
                    self._capture(dense, sparse, labels, next_sparse)
                self._announce(sparse, next_sparse)
                self._load(dense, sparse, labels)
                if self._pipeline:  # the graph sends its static next ids: these, or (none named) this batch's again
                    self._copy_in("next_sparse", self._next, sparse if next_sparse is None else next_sparse)
                self._graph.replay()
                loss = self._static_loss.clone()
        self._promised = next_sparse
        return loss

    def _announce(self, sparse: Tensor, next_sparse: Tensor | None) -> None:
        """Pipeline: exchange this batch's ids now unless the previous call sent them ahead; name the ids this call
        sends (eager: ``next_sparse``; the graph: its static buffer, always)."""
        if not self._pipeline:
            return
        if self._promised is not sparse:
            self.model.prefetch(sparse)
        if not self.graphed:
            self._next = next_sparse

    def release(self) -> None:
        """Free the captured graph and its static buffers (the next call captures again). Call it before
        ``torch.distributed.destroy_process_group()`` when the graph holds NCCL operations: destroying the
        communicators while such a graph exists can hang (pytorch/pytorch#115388)."""
        if self._graph is not None:
            self._graph.reset()
        self._graph, self.static_inputs, self._static_loss = None, None, None
        if self.graphed:
            self._next = self._promised = None

    def _load(self, *batch: Tensor) -> None:
        for name, static, new in zip(("dense", "sparse", "labels"), self.static_inputs, batch):
            self._copy_in(name, static, new)

    @staticmethod
    def _copy_in(name: str, static: Tensor, new: Tensor) -> None:
        if new.shape != static.shape or new.dtype != static.dtype:
            raise ValueError(f"{name}: the CUDA graph was captured for {tuple(static.shape)} {static.dtype}, "
                             f"got {tuple(new.shape)} {new.dtype}")
        if new.data_ptr() != static.data_ptr():
            static.copy_(new, non_blocking=True)

    def _state(self) -> list[Tensor]:
        """Every tensor a step changes: the model's state (the tables' optimizer state included) and the dense
        optimizer's."""
        return [*self.model.state_dict().values(), *self.optimizers.dense_state]

    def _capture(self, dense: Tensor, sparse: Tensor, labels: Tensor, next_sparse: Tensor | None) -> None:
        self.static_inputs = tuple(t.detach().clone() for t in (dense, sparse, labels))
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            if self._pipeline:  # the graph sends the ids in this buffer ahead; warm-up starts from this batch's
                self._next = (sparse if next_sparse is None else next_sparse).detach().clone()
                self.model.prefetch(self.static_inputs[1])
            self._warm_up(*self.static_inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.optimizers.zero_grad()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = self._loss(*self.static_inputs)
            loss.backward()
            self._update()
        self._static_loss = loss.detach()
        self._graph = graph
        self._promised = None  # warm-up overwrote the ids sent ahead
