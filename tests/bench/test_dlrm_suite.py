"""The DLRM suite (``fuselab bench dlrm``): its shared model and float64 reference against ``fuselab.dlrm``'s model,
the stock PyTorch step against ``fuselab.dlrm``'s reference step, the ids as TorchRec/FBGEMM take them, the cost
model, and the lab run on a CPU (every provider checked, the figures in the JSON)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from fuselab.backend import forced
from fuselab.bench import BenchOptions, run
from fuselab.bench.ceilings import Ceilings
from fuselab.bench.check import check
from fuselab.bench.spec import BenchCase, CaseQuery, select_cases
from fuselab.bench.steps.model import DLRMShape, make_weights, reference_loss
from fuselab.bench.steps.peers import JaggedIds, upper_triangle_order
from fuselab.bench.steps.stock import StockDLRM, StockStep
from fuselab.bench.suites import dlrm as suite
from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.random import random_batches
from fuselab.dlrm.interaction.dcn import DCNConfig
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.step import TrainStep

CPU = torch.device("cpu")
CEILINGS = Ceilings(device_type="cpu", copy_gbps=10.0, copy_bytes=2**25, copy_method="fake", matmul_tflops=0.1)


def _dcn_setup() -> suite.Setup:
    """A small MLPerf-v2-shaped model: multi-hot bags of MLPerf's sizes, two cross layers of rank 4, D 8."""
    config = dataclasses.replace(load_config("mlperf-v2"), embedding_dim=8, bottom_mlp=[16, 8], top_mlp=[16, 1],
                                 interaction=DCNConfig(layers=2, low_rank=4), max_rows_per_table=None,
                                 cardinalities=[3 + 7 * t for t in range(26)])
    return suite.setup_of(config, 1.0)


def _batch(shape: DLRMShape, size: int, seed: int = 3):
    return random_batches(size, shape.table_sizes, "cpu", "powerlaw", count=1, seed=seed,
                          multi_hot_sizes=shape.bag_sizes)[0]


@pytest.mark.parametrize("which", ["tiny", "dcn"])
def test_reference_is_fuselab_dlrm_model_in_float64(which):
    """The suite's float64 reference and fuselab.dlrm's reference model, built by the suite's adapter with the
    shared weights, give the same loss: the adapter puts every weight where the model reads it."""
    shared = suite.setup("tiny", suite.CPU_SCALE) if which == "tiny" else _dcn_setup()
    model = suite.build_dlrm(shared, "torch", CPU).double()
    dense, ids, labels = _batch(shared.shape, 37)
    with torch.no_grad():
        ours = F.binary_cross_entropy_with_logits(model(dense.double(), ids), labels.double())
    ref = reference_loss(shared.weights, dense.double(), ids, labels.double(), chunk=10)
    assert abs(float(ours) - float(ref)) <= 1e-12 * abs(float(ref))
    other = make_weights(shared.shape, seed=1)
    assert abs(float(reference_loss(other, dense.double(), ids, labels.double())) - float(ref)) > 1e-4


@pytest.mark.parametrize("which", ["tiny", "dcn"])
def test_stock_model_is_the_reference_model(which):
    shared = suite.setup("tiny", suite.CPU_SCALE) if which == "tiny" else _dcn_setup()
    model = StockDLRM(shared.weights, CPU)
    dense, ids, labels = _batch(shared.shape, 29)
    with torch.no_grad():
        loss = model.dense.loss(dense, model.lookup(ids), labels)
    ref = reference_loss(shared.weights, dense.double(), ids, labels.double())
    assert abs(float(loss) - float(ref)) <= 1e-5 * abs(float(ref))


@pytest.mark.parametrize("which", ["tiny", "dcn"])
def test_stock_adagrad_step_trains_as_fuselab_dlrm_adagrad(which):
    """Three fp32 steps: the stock step with torch.optim.Adagrad on the sparse tables and the dense part, and
    fuselab.dlrm's reference step with element-wise Adagrad, from the same weights on the same batches, give the same
    losses: the stock step's updates are the model's Adagrad updates."""
    shared = suite.setup("tiny", suite.CPU_SCALE) if which == "tiny" else _dcn_setup()
    adagrad = dataclasses.replace(shared, config=dataclasses.replace(shared.config, optimizer="adagrad"))
    model = suite.build_dlrm(adagrad, "torch", CPU)
    theirs = TrainStep(model, Optimizers(model, lr_dense=0.05, lr_sparse=0.1))
    stock = StockStep(StockDLRM(shared.weights, CPU), sparse_optimizer="adagrad", lr_sparse=0.1, lr_dense=0.05,
                      eps=1e-8, compile=False)
    batches = [_batch(shared.shape, 16, seed) for seed in (1, 2, 3, 4)]
    ours = [float(stock(*b)) for b in batches]
    ref = [float(theirs(*b)) for b in batches]
    assert ours[0] != ours[-1]  # it trains
    for a, b in zip(ours, ref):
        assert abs(a - b) <= 1e-5 * abs(b), (ours, ref)


def test_stock_sgd_step_updates_only_looked_up_rows():
    shared = suite.setup("tiny", suite.CPU_SCALE)
    stock = StockStep(StockDLRM(shared.weights, CPU), sparse_optimizer="sgd", lr_sparse=0.5, lr_dense=0.05,
                      eps=1e-8, compile=False)
    dense, ids, labels = _batch(shared.shape, 8)
    before = stock.model.tables[0].weight.detach().clone()
    stock(dense, ids, labels)
    changed = (stock.model.tables[0].weight != before).any(1).nonzero().flatten()
    assert set(changed.tolist()) == set(ids[:, 0].tolist())
    with pytest.raises(ValueError, match="sparse_optimizer must be one of"):
        StockStep(stock.model, sparse_optimizer="adam", lr_sparse=0.1, lr_dense=0.1, eps=1e-8, compile=False)


def test_jagged_ids_are_bags_per_table():
    shape = _dcn_setup().shape
    ids = torch.arange(5 * shape.ids_per_sample).view(5, -1)
    values, offsets, lengths = JaggedIds(shape, CPU)(ids)
    prefix = [0, *torch.tensor(shape.bags).cumsum(0).tolist()]
    for f, n in enumerate(shape.bags):
        for b in range(5):
            bag = f * 5 + b
            assert int(lengths[bag]) == n
            assert values[offsets[bag]: offsets[bag + 1]].tolist() == ids[b, prefix[f]: prefix[f] + n].tolist()
    assert int(offsets[-1]) == ids.numel()


def test_upper_triangle_order_maps_torchrecs_pairs_to_ours():
    v = torch.randn(3, 6, 4, dtype=torch.float64)
    gram = v @ v.transpose(1, 2)
    li, lj = torch.tril_indices(6, 6, offset=-1)
    r, c = torch.triu_indices(6, 6, offset=1)
    assert torch.equal(gram[:, r, c], gram[:, li, lj][:, upper_triangle_order(6)])


def test_table_values_are_a_function_of_the_row():
    weights = suite.setup("tiny", suite.CPU_SCALE).weights
    shape = weights.shape
    full = weights.fill_tables_(torch.empty(shape.rows, shape.dim))
    t = 2
    first, n = shape.table_offsets[t], shape.table_sizes[t]
    rows = torch.randint(first, first + n, (50,))
    assert torch.equal(full[rows], weights.rows(rows, t))
    bound = 1 / math.sqrt(n)
    assert full[first: first + n].abs().max() <= bound and full[first: first + n].abs().max() > 0.9 * bound
    assert full[first: first + n].unique().numel() > 0.9 * n * shape.dim  # no repeated rows or columns


def test_flops_per_sample_of_the_shipped_configs():
    kaggle, mlperf = suite.setup("kaggle", 1e-4).shape, suite.setup("mlperf-v2", 1e-4).shape
    macs = 13 * 512 + 512 * 256 + 256 * 64 + 64 * 16 + 367 * 512 + 512 * 256 + 256 + 351 * 16
    assert kaggle.train_flops() == 3 * 2 * macs
    cross = 3 * 2 * 3456 * 512
    mlps = 13 * 512 + 512 * 256 + 256 * 128 + 3456 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256
    assert mlperf.train_flops() == 3 * (2 * (cross + mlps) + (214 - 26) * 128)
    assert 95e6 < mlperf.train_flops() < 97e6  # ≈ 96 MFLOP per sample (issue 39's count)
    assert mlperf.ids_per_sample == 214 and mlperf.interaction_width == 3456


def test_opt_in_cases_run_only_when_named():
    def case(label: str, opt_in: bool = False) -> BenchCase:
        return BenchCase(op="x", label=label, dtype=torch.float32, mode="step", bytes=1, flops=1, numel=1,
                         opt_in=opt_in)

    cases = [case("a-B=2"), case("b-B=2"), case("b-full-B=2", opt_in=True)]
    assert [c.label for c in select_cases(cases, None)] == ["a-B=2", "b-B=2"]
    assert [c.label for c in select_cases(cases, ["b"])] == ["b-B=2"]
    assert [c.label for c in select_cases(cases, ["b-full-B=2", "a"])] == ["a-B=2", "b-full-B=2"]
    cpu = suite.cases(CaseQuery("cpu", quick=True, dtypes=(torch.float32,)))
    assert [(c.label, c.dtype, c.mode, c.samples) for c in cpu] == [("tiny-B=8", torch.float32, "step", 8)]
    assert suite.cases(CaseQuery("cpu", modes=("fwd",))) == []


@pytest.mark.slow
def test_gpu_cases_and_the_full_size():
    """The GPU case list (built on the CPU: ids and their distinct rows of every case, ~10 s)."""
    gpu = suite.cases(CaseQuery("cuda"))
    labels = [c.label for c in gpu]
    assert labels == ["kaggle-B=65536", "kaggle-B=16384", "mlperf-v2-x0.1-B=65536", "mlperf-v2-x0.1-B=16384",
                      "mlperf-v2-full-B=65536"]
    assert all(c.mode == "step" and c.samples == c.numel and c.dtype == torch.bfloat16 for c in gpu)
    assert [c.opt_in for c in gpu] == [False] * 4 + [True]
    assert gpu[-1].params["scale"] == 1.0 and suite.setup("mlperf-v2", 1.0).shape.rows == 204_184_588


def test_a_wrong_step_fails_the_check():
    """The check compares the first step's loss: a step whose model starts from other weights is flagged."""
    case = suite.cases(CaseQuery("cpu", quick=True))[0]
    shared = suite.setup("tiny", suite.CPU_SCALE)
    good = StockStep(StockDLRM(shared.weights, CPU, torch.bfloat16), sparse_optimizer="sgd", lr_sparse=0.1,
                     lr_dense=0.1, eps=1e-8, compile=False)
    other = StockDLRM(make_weights(shared.shape, seed=5), CPU, torch.bfloat16)
    bad = StockStep(other, sparse_optimizer="sgd", lr_sparse=0.1, lr_dense=0.1, eps=1e-8, compile=False)
    assert check(suite.SPEC, case, lambda d, i, y, _: good(d, i, y)).ok
    result = check(suite.SPEC, case, lambda d, i, y, _: bad(d, i, y))
    assert not result.ok and result.error > result.tolerance


def test_lab_run_on_cpu(tmp_path):
    """``fuselab bench dlrm --quick`` on a CPU: an eager provider timed, fuselab's kernels checked under the
    interpreter, the CUDA-only and missing peers reported; the JSON holds samples/s and TFLOP/s, the plots are drawn.
    (The compiled providers: :func:`test_every_cpu_provider_is_correct`.)"""
    options = BenchOptions(ops=("dlrm",), quick=True, out=tmp_path, plot=True,
                           providers=("torch-eager", "fuselab-eager", "fuselab-graph", "torchrec-dmp"))
    (op_run,) = run(options, progress=False, ceilings=CEILINGS)
    status = {r.provider: r.status for r in op_run.results}
    assert status == {"torch-eager": "ok", "fuselab-eager": "interpreter: correctness only",
                      "fuselab-graph": "skipped", "torchrec-dmp": "not installed"}, op_run.results
    data = json.loads((tmp_path / "dlrm.json").read_text())
    (timed,) = [r for r in data["results"] if r["status"] == "ok"]
    assert timed["samples"] == 8 and timed["samples_per_s"] == pytest.approx(8 / (timed["median_ms"] * 1e-3))
    assert timed["tflops"] > 0 and timed["rel_error"] < 1e-2 and timed["mode"] == "step"
    assert (tmp_path / "dlrm_samples.png").stat().st_size > 0 and (tmp_path / "dlrm_roofline.png").exists()


@pytest.mark.slow
def test_every_cpu_provider_is_correct():
    """The compiled providers too (Inductor's C++ backend; fuselab's compiled step under the interpreter)."""
    case = suite.cases(CaseQuery("cpu", quick=True))[0]
    for provider in suite.SPEC.providers:
        if provider.cuda_only or provider.missing():
            continue
        with forced("triton") if provider.triton else contextlib.nullcontext():
            result = check(suite.SPEC, case, provider.build(case))
        assert result.ok, f"{provider.name}: {result.error:.2e}"


@pytest.mark.gpu
def test_every_provider_on_a_small_gpu_case():
    """On a GPU: every provider (TorchRec and FBGEMM where they import) starts from the shared weights and trains: its
    first-step loss within bf16 rounding of the float64 reference, and three more steps run."""
    case = suite._case("tiny", "tiny", suite.CPU_SCALE, 512, torch.bfloat16)
    device = torch.device("cuda")
    for provider in suite.SPEC.providers:
        if provider.missing():
            continue
        fn = provider.build(case)
        result = check(suite.SPEC, case, fn, device=device)
        assert result.ok, f"{provider.name}: {result.error:.2e}"
        args = suite.make_inputs(case, device)
        losses = [float(fn(*args)) for _ in range(3)]
        assert all(math.isfinite(x) for x in losses), provider.name


@pytest.mark.parametrize("ids", ["powerlaw", "uniform"])
def test_batches_in_range_and_power_law_skewed(ids):
    """The ids every provider gets (``fuselab.dlrm.data.random``): in each table's range; power-law ones skewed."""
    sizes = [3, 1000, 50_000]
    for dense, sparse, labels in random_batches(4096, sizes, "cpu", ids, count=2):
        assert dense.shape == (4096, 13) and labels.shape == (4096,) and sparse.dtype == torch.int64
        for t, n in enumerate(sizes):
            assert int(sparse[:, t].min()) >= 0 and int(sparse[:, t].max()) < n
        top_share = torch.unique(sparse[:, 2], return_counts=True)[1].max().item() / 4096
        assert top_share > 0.05 if ids == "powerlaw" else top_share < 0.01
