"""Benchmark suite: one DLRM training step (forward, BCE-with-logits loss, backward, both updates), every provider
side by side on the same model, batch, precision and ids.

Cases (mode ``step``, bf16 autocast by default; ``--dtype fp32`` for IEEE fp32): the ``kaggle`` config (26 tables at
the Criteo Kaggle cardinalities, 33.8M rows, D 16, dot interaction) and the ``mlperf-v2`` config (MLPerf's
DLRM-DCNv2: D 128, multi-hot bags of 214 ids per sample, three cross layers of rank 512, tables capped at 40M rows)
with its tables scaled by :data:`MLPERF_SCALE` so that every provider fits one GPU; B 65536 and 16384. The
full-size MLPerf tables (204M rows, 105 GB in fp32) are the case ``mlperf-v2-full-B=65536``, run only when named
(``--case mlperf-v2-full-B=65536``). On a CPU: the ``tiny`` config on tables of the Kaggle cardinalities × 1e-4.
Ids are power-law (``fuselab.dlrm.data.random``), seeded: the same batch for every provider.

Providers, all starting from the same weights (:mod:`fuselab.bench.steps.model`), row-wise Adagrad for the tables and
element-wise Adagrad for the dense parameters wherever the provider has them:

* ``stock``: the strongest stock PyTorch step (:mod:`fuselab.bench.steps.stock`): per-table
  ``EmbeddingBag(sparse=True)`` with ``torch.optim.SGD`` (PyTorch's one sparse optimizer without a host
  synchronization), everything after the lookup compiled, a separate fused (or foreach) Adagrad for the dense part;
  ``stock-adagrad``: the same with ``torch.optim.Adagrad`` for the tables (element-wise; it synchronizes).
* ``torch-eager``, ``torch-compile``: ``fuselab dlrm train --kernels torch`` (``fuselab.dlrm``'s reference path).
* ``fuselab-eager``, ``fuselab-compile``, ``fuselab-graph``, ``fuselab-compile-graph``: ``--kernels fuselab``,
  eager, compiled, the whole step captured in one CUDA graph (``--cuda-graph``), and the compiled step captured
  (``--compile --cuda-graph``).
* ``torchrec-dmp``, ``fbgemm-tbe``: TorchRec's ``DistributedModelParallel`` and FBGEMM's TBE with the dense part
  compiled (:mod:`fuselab.bench.steps.peers`), where ``torchrec`` and ``fbgemm_gpu`` import.

Check: each provider's first-step loss against the float64 loss of the model at those weights
(:func:`fuselab.bench.steps.model.reference_loss`). Figures: samples/s, step time, TFLOP/s of the model's math
(:meth:`~fuselab.bench.steps.model.DLRMShape.train_flops`), the peak memory of a step (model and optimizer state
included), GB/s of the step's minimum bytes (:meth:`~fuselab.bench.steps.model.DLRMShape.step_bytes`). The
per-kernel table of one step: ``fuselab profile dlrm --provider fuselab-graph --mode step --dtype bf16``.

This module builds ``fuselab.dlrm`` models, so it sits above the ``dlrm`` layer; the lab loads it by name.
"""

from __future__ import annotations

import dataclasses
import functools
import gc

import torch

from fuselab.bench.spec import BenchCase, CaseQuery, OpSpec, Provider
from fuselab.bench.steps import peers
from fuselab.bench.steps.model import DLRMShape, DLRMWeights, make_weights, reference_loss
from fuselab.bench.steps.stock import StockDLRM, StockStep
from fuselab.dlrm.config import DLRMConfig, load_config
from fuselab.dlrm.data.random import random_batches
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES
from fuselab.dlrm.model import DLRM
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.step import StepOptions, TrainStep

#: the table scale of the default MLPerf cases: 20.4M rows, 10.4 GB of fp32 tables
MLPERF_SCALE = 0.1
CPU_SCALE = 1e-4
GPU_BATCHES = (65536, 16384)
#: CPU batches: the fuselab providers run their Triton kernels under the interpreter there, a few seconds per step at 8
CPU_BATCH, CPU_QUICK_BATCH = 16, 8
SEED = 0
OPTIMIZER = "rowwise_adagrad"
DEFAULT_DTYPES = (torch.bfloat16,)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every provider of a case shares: the model, its weights, the optimizer's hyper-parameters."""

    config: DLRMConfig
    weights: DLRMWeights
    lr_dense: float
    lr_sparse: float
    eps: float
    lr_sgd: float  # the stock step's table SGD

    @property
    def shape(self) -> DLRMShape:
        return self.weights.shape


def table_sizes(config: DLRMConfig, scale: float) -> tuple[int, ...]:
    """The tables of ``config`` at ``scale``: its cardinalities (capped at its ``max_rows_per_table``), else the
    Kaggle ones."""
    sizes = config.cardinalities or KAGGLE_CARDINALITIES
    cap = config.max_rows_per_table or max(sizes)
    return tuple(max(2, round(min(n, cap) * scale)) for n in sizes)


@functools.lru_cache(maxsize=4)
def setup(config_name: str, scale: float) -> Setup:
    """The shared :class:`Setup` of the built-in config ``config_name`` with its tables at ``scale`` (memoized: the
    cases of two batches share it)."""
    return setup_of(load_config(config_name), scale)


def setup_of(config: DLRMConfig, scale: float) -> Setup:
    """The :class:`Setup` of ``config`` (its optimizer set to row-wise Adagrad, with that optimizer's learning
    rates) with its tables at ``scale``."""
    config = dataclasses.replace(config, optimizer=OPTIMIZER, lr_dense=None, lr_sparse=None)
    inter = config.interaction
    dcn = inter.kind == "dcn"
    shape = DLRMShape(table_sizes(config, scale), config.embedding_dim, tuple(config.bottom_mlp),
                      tuple(config.top_mlp), inter.kind, inter.layers if dcn else 0, inter.low_rank if dcn else 0,
                      tuple(config.multi_hot_sizes) if config.multi_hot_sizes else None)
    sgd = config.learning_rates.get("sgd", [0.0, config.lr_sparse])[1]
    return Setup(config, make_weights(shape, SEED), config.lr_dense, config.lr_sparse, config.adagrad_eps, sgd)


@functools.lru_cache(maxsize=4)
def batch(config_name: str, scale: float, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(dense, ids, labels, distinct rows) of the case's batch on the CPU: power-law ids, seeded."""
    shape = setup(config_name, scale).shape
    dense, ids, labels = random_batches(size, shape.table_sizes, "cpu", "powerlaw", count=1, seed=SEED,
                                        multi_hot_sizes=shape.bag_sizes)[0]
    first = torch.tensor(shape.table_offsets)[torch.tensor(shape.column_tables)]
    seen = torch.zeros(shape.rows, dtype=torch.bool)
    seen[(ids + first).reshape(-1)] = True  # a sort of 14M ids would take seconds
    return dense, ids, labels, int(seen.sum())


def _case(name: str, config: str, scale: float, size: int, dtype: torch.dtype, opt_in: bool = False) -> BenchCase:
    shape = setup(config, scale).shape
    unique = batch(config, scale, size)[3]
    return BenchCase(op="dlrm", label=f"{name}-B={size}", dtype=dtype, mode="step",
                     bytes=shape.step_bytes(size, unique), flops=shape.train_flops() * size, numel=size, samples=size,
                     group=name, opt_in=opt_in, params={"config": config, "scale": scale, "batch": size})


def cases(query: CaseQuery) -> list[BenchCase]:
    if query.modes is not None and "step" not in query.modes:
        return []
    dtypes = [d for d in (query.dtypes or DEFAULT_DTYPES) if d in (torch.bfloat16, torch.float32)]
    if query.device_type != "cuda":
        size = CPU_QUICK_BATCH if query.quick else CPU_BATCH
        return [_case("tiny", "tiny", CPU_SCALE, size, d) for d in dtypes]
    batches = GPU_BATCHES[:1] if query.quick else GPU_BATCHES
    out = []
    for d in dtypes:
        out += [_case("kaggle", "kaggle", 1.0, b, d) for b in batches]
        out += [_case(f"mlperf-v2-x{MLPERF_SCALE:g}", "mlperf-v2", MLPERF_SCALE, b, d) for b in batches]
        out.append(_case("mlperf-v2-full", "mlperf-v2", 1.0, GPU_BATCHES[0], d, opt_in=True))
    return out


def make_inputs(case: BenchCase, device: torch.device) -> tuple:
    """(dense (B, 13), ids (B, S), labels (B,), the case's :class:`Setup`): the seeded batch on ``device``."""
    p = case.params
    dense, ids, labels, _ = batch(p["config"], p["scale"], p["batch"])
    return dense.to(device), ids.to(device), labels.to(device), setup(p["config"], p["scale"])


def reference(dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, shared: Setup) -> torch.Tensor:
    """The first step's loss: the float64 loss of the model at the shared weights."""
    return reference_loss(shared.weights, dense, ids, labels)


# -- the providers -------------------------------------------------------------------------------------------------
def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _fresh() -> None:
    """Free what earlier providers left (compiled graphs, cached blocks) before a provider builds its model."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _autocast(case: BenchCase) -> torch.dtype | None:
    return torch.bfloat16 if case.dtype == torch.bfloat16 else None


def build_dlrm(shared: Setup, kernels: str, device: torch.device) -> DLRM:
    """``fuselab.dlrm``'s model of the case on ``device`` with the shared weights: the one place that knows how a
    ``fuselab.dlrm`` model is built and where its parameters live."""
    with torch.device(device):
        model = DLRM.from_config(shared.config, list(shared.shape.table_sizes), kernels=kernels)
    weights = shared.weights
    with torch.no_grad():
        for arch, layers in ((model.dense_arch, weights.bottom), (model.over_arch, weights.top)):
            for layer, (w, b) in zip(arch.mlp, layers):
                layer.weight.zero_()  # the first layer's padded input columns stay zero
                layer.weight[:, :w.shape[1]].copy_(w)
                layer.bias.copy_(b)
    weights.fill_tables_(model.sparse_arch.weight.data)
    if weights.cross:
        cross = model.interaction_arch.crossnet
        with torch.no_grad():
            for layer, (v, w, b) in enumerate(weights.cross):
                cross.V[layer].copy_(v)
                cross.W[layer].copy_(w)
                cross.bias[layer].copy_(b)
    return model


def _dlrm_step(kernels: str, mode: str, overlap: bool = False):
    def build(case: BenchCase):
        _fresh()
        shared, device = setup(case.params["config"], case.params["scale"]), _device()
        model = build_dlrm(shared, kernels, device)
        optimizers = Optimizers(model, lr_dense=shared.lr_dense, lr_sparse=shared.lr_sparse)
        step = TrainStep(model, optimizers, precision="bf16" if _autocast(case) else "fp32", mode=mode,
                         options=StepOptions(compile_options={"dynamic": False}, overlap=overlap))
        return lambda dense, ids, labels, _shared: step(dense, ids, labels)

    return build


def _stock_step(sparse_optimizer: str):
    def build(case: BenchCase):
        _fresh()
        shared = setup(case.params["config"], case.params["scale"])
        model = StockDLRM(shared.weights, _device(), _autocast(case))
        lr = shared.lr_sgd if sparse_optimizer == "sgd" else shared.lr_sparse
        step = StockStep(model, sparse_optimizer=sparse_optimizer, lr_sparse=lr, lr_dense=shared.lr_dense,
                         eps=shared.eps, compile=True)
        return lambda dense, ids, labels, _shared: step(dense, ids, labels)

    return build


def _peer_step(cls):
    def build(case: BenchCase):
        _fresh()
        shared = setup(case.params["config"], case.params["scale"])
        step = cls(shared.weights, _device(), autocast=_autocast(case), lr_sparse=shared.lr_sparse,
                   lr_dense=shared.lr_dense, eps=shared.eps)
        return lambda dense, ids, labels, _shared: step(dense, ids, labels)

    return build


SPEC = OpSpec(
    name="dlrm",
    summary="DLRM training step (forward, loss, backward, both updates): stock PyTorch, --kernels torch, fuselab, "
            "TorchRec",
    cases=cases,
    make_inputs=make_inputs,
    reference=reference,
    providers=(
        Provider("stock", _stock_step("sgd"), description="per-table EmbeddingBag(sparse=True) + SGD, the rest "
                 "compiled, fused/foreach Adagrad for the dense part, BCEWithLogits"),
        Provider("stock-adagrad", _stock_step("adagrad"), description="the same with torch.optim.Adagrad for the "
                 "tables (element-wise, coalesces: host syncs)"),
        Provider("torch-eager", _dlrm_step("torch", "eager"), description="fuselab dlrm --kernels torch, eager"),
        Provider("torch-compile", _dlrm_step("torch", "compile"), description="--kernels torch, compiled"),
        Provider("fuselab-eager", _dlrm_step("fuselab", "eager"), triton=True, description="--kernels fuselab"),
        Provider("fuselab-compile", _dlrm_step("fuselab", "compile"), triton=True,
                 description="--kernels fuselab --compile"),
        Provider("fuselab-graph", _dlrm_step("fuselab", "cuda_graph"), triton=True, cuda_only=True,
                 description="--kernels fuselab --cuda-graph: the whole step in one CUDA graph"),
        Provider("fuselab-compile-graph", _dlrm_step("fuselab", "compile_graph"), triton=True, cuda_only=True,
                 description="--kernels fuselab --compile --cuda-graph: the compiled step in one CUDA graph"),
        Provider("fuselab-graph-overlap", _dlrm_step("fuselab", "cuda_graph", overlap=True), triton=True,
                 cuda_only=True, description="fuselab-graph with the lookup and the embedding update on a side "
                 "stream beside the bottom MLP"),
        Provider("fuselab-compile-graph-overlap", _dlrm_step("fuselab", "compile_graph", overlap=True),
                 triton=True, cuda_only=True, description="fuselab-compile-graph with the lookup on a side stream "
                 "(bottom MLP and the rest compiled apart)"),
        Provider("torchrec-dmp", _peer_step(peers.DMPStep), requires=peers.REQUIRES, cuda_only=True,
                 description="TorchRec DistributedModelParallel, one GPU, fused TBE, row-wise Adagrad in backward"),
        Provider("fbgemm-tbe", _peer_step(peers.TBEStep), requires=peers.REQUIRES, cuda_only=True,
                 description="FBGEMM SplitTableBatchedEmbeddingBagsCodegen (row-wise Adagrad), dense part compiled"),
    ),
    grad_args=lambda case: (),
    baseline="stock",
)
